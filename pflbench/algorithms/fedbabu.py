"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Toward Enhanced Representation for Federated Image
Classification"): FedAvg over the *body* only. The *head* (the last linear classifier) keeps its random
initialization throughout federated training — never updated, never sent, identical on every client
because all clients start from the same initial model — and each client fine-tunes for
personalization only at evaluation time.

What the paper says: body = every layer but the last linear layer; the head is randomly initialized
and frozen during local updates and aggregation; personalization fine-tunes on each client's own
training data for tau_f epochs, with the same optimizer settings as local training, and its
personalized results fine-tune the *whole* model (body and head; the paper also studies fine-tuning
parts of it) with tau_f = 5 in its main tables (tau_f from 1 to 20 in its ablations).

Chosen here:
- head = the last layer (`ClientModel.layers`, by position; no hard-coded names).
- `finetune_epochs` default 5 (the paper's tau_f), search int 1..10; `finetune` default "full"
  (the paper's choice), or "head" for head-only fine-tuning. lr/momentum/batch size: the cell's.
- Fine-tuning runs in `personalized()` on ALL clients (not only the ones sampled that round), from the
  current global body with the initial head, with a fixed batch order (round 0, its own stream) so that
  it does not depend on when it is evaluated; it never touches the global or client state (what is
  federated stays body-only). Its result is cached until the next aggregation, so asking twice costs
  nothing. Cost: finetune_epochs local epochs on every client per evaluation (`eval_every`).
- Unseen clients: a newcomer gets exactly what a trained client gets, the global body with the
  initial head fine-tuned on its own train split (the paper's personalization is this fine-tuning).
- A fine-tuning that diverges makes the evaluated models non-finite, so the engine records the
  cell as diverged at that round instead of failing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams, Payload, Serving
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import Diverged, State

if TYPE_CHECKING:
    from pflbench.engine import Engine


FINETUNE_STREAM = streams.salted_batches(
    "fedbabu.finetune", 0xBAB0
)  # batch order of the evaluation-time fine-tuning, distinct from the rounds'


class FedBABUHP(Hyperparams):
    finetune_epochs: int = Field(5, ge=0)
    finetune: Literal["full", "head"] = "full"


@ALGORITHMS.register(
    "fedbabu",
    card=Card(
        display_name="FedBABU",
        family="personal layers",
        paper="Oh, Kim & Yun, ICLR 2022",
        personalizes="the whole model, by local fine-tuning of the federated body (trained with a fixed random head)",
    ),
)
class FedBABU(FedAvg[FedBABUHP]):
    # Checkpoints: FedAvg's models, the aggregations' count and the fine-tuned models of the last evaluation
    # (kept while no aggregation followed); the head / body split is the model's.
    state = (*FedAvg.state, "_version", "_cached")
    state_rebuilt = ("_head", "_body_params")
    quick_hp = {"finetune_epochs": 1}  # small smoke cells (tests)

    search_space = {"finetune_epochs": ("int", 1, 10)}

    def setup(self) -> None:
        super().setup()
        _, self._head = self.engine.model.split_layers(1)
        self._body_params = [n for n in self.engine.model.param_names if n not in self._head]
        self._version = 0
        self._cached: tuple[int, State] | None = None

    def is_local(self, name: str) -> bool:
        return name in self._head  # the frozen head: never sent, never aggregated

    def local_train(self, rnd: ClientRound, state: State) -> State:
        return self.engine.train(rnd, rnd.clients, state, trainable=self._body_params).state

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        super().aggregate(rnd, upload)
        self._version += 1

    def personalized(self) -> State:
        if self._cached is not None and self._cached[0] == self._version:
            return self._cached[1]
        start = self.global_with_local()  # global body + each client's (initial) head
        tuned = self.finetune(self.engine, start)
        self._cached = (self._version, tuned)
        return tuned

    def finetune(self, fed: Engine, start: State) -> State:
        """`start`'s models fine-tuned on `fed`'s clients' train splits (NaN where that diverged)."""
        if self.hp.finetune_epochs == 0:
            return start
        everyone = torch.arange(fed.num_clients, device=fed.device)
        trainable = (
            fed.model.param_names
            if self.hp.finetune == "full"
            else [n for n in fed.model.param_names if n in self._head]
        )
        try:
            return fed.train(
                0, everyone, start, trainable=trainable, epochs=self.hp.finetune_epochs, stream=FINETUNE_STREAM
            ).state
        except Diverged:
            return {n: torch.full_like(t, float("nan")) if t.is_floating_point() else t for n, t in start.items()}

    def newcomer_models(self, serving: Serving) -> State:
        return self.finetune(serving.clients, self.fit_local_part(serving, 0))  # global body + initial head
