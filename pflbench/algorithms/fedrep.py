"""FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021, "Exploiting Shared Representations for
Personalized Federated Learning").

What the paper says: the model is a shared representation (the body) followed by a personal head.
In every round a selected client receives the global body, then (1) trains its own head for tau_h
local epochs with the body fixed, and (2) trains the body for tau_b epochs with its new head fixed;
it sends back the body only, which the server averages. Heads never leave the clients. The head is
the final linear classifier; the paper's experiments train the head for many more epochs than the
body, since updating the small head is cheap. The personalized model of a client is the global body
with its own head.

What the official code (lgcollins/FedRep, commit d82e629) does: `models/Update.py` (LocalUpdate.train,
lines 576-615) runs `local_ep` epochs in all, the first `local_ep - local_rep_ep` on the head (body
frozen) and the last `local_rep_ep` on the body (head frozen). `utils/options.py` line 39:
`--local_rep_ep` default 1; the CIFAR-10 2-shard script runs `--local_ep 11 --local_rep_ep 1` (10
head epochs, 1 body epoch); its CIFAR-10 5-shard, CIFAR-100, FEMNIST and Sent140 scripts run
`--local_ep 15 --local_rep_ep 5` (10 head epochs, 5 body epochs). So 10 head epochs everywhere, 1 body
epoch by default. (FL-bench's `--train_body_epoch` default is 1 as well.)

Where the paper is silent / what was chosen here:
- Head = the last `personal_layers` layers (`fed.model.split_layers`; default 1, the classifier),
  body = the rest, including BatchNorm layers and their statistics (shared; FedRep does not keep
  them local).
- `head_epochs` default 10 and `body_epochs` default 1: the official code's values (above). The cell's
  `local_epochs` therefore does not set FedRep's local work (as in the official code, where the head
  and body epochs are FedRep's own); `body_epochs: null` trains the body for the cell's
  `local_epochs` instead (10 body epochs in Table 1, 2 in the quick table; measured:
  docs/algorithms/fedrep.md).
- Both phases use the cell's optimizer settings (lr, momentum, weight decay, batch size); the head
  phase uses its own batch order (stream `HEAD_STREAM`), the body phase the engine's default one.
  BatchNorm statistics follow both phases' forward passes.
- Every client's head starts from the common initial model's head; clients not sampled keep theirs.
- Aggregation of the body: the engine's sample-size-weighted mean (the official code weights by
  client data size; the paper writes a plain mean, which is the same for equal client sizes).
- Communication: the body down and up; the head never appears in what is sent (tested).
- Batched: yes, both phases are `fed.train` calls with `trainable=` the phase's tensors.
- Unseen clients: a newcomer gets the global body and fits its own head on its train split with
  the body frozen, for `head_epochs` (the paper's procedure for new clients, Section 5).
- Cost: a round makes head_epochs + body_epochs passes over the client's data (the head phase's
  backward stops at the head; measured: docs/algorithms/fedrep.md).
"""

from __future__ import annotations

from pydantic import Field

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams, Serving
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State


class FedRepHP(Hyperparams):
    head_epochs: int = Field(10, ge=0)
    body_epochs: int | None = Field(1, ge=1)  # official --local_rep_ep; None: the cell's local_epochs
    personal_layers: int = Field(1, ge=1)


@ALGORITHMS.register(
    "fedrep",
    card=Card(
        display_name="FedRep",
        family="personal layers",
        row_order=6,
        paper="Collins, Hassani, Mokhtari & Shakkottai, ICML 2021",
        personalizes="the head (classifier), trained first with the shared representation fixed",
    ),
)
class FedRep(FedAvg[FedRepHP]):
    state_rebuilt = ("_head", "_head_params", "_body_params")  # the head / body split, from the hyperparameters
    HEAD_STREAM = streams.salted_batches("fedrep.head", 0xFE0E)

    quick_hp = {"head_epochs": 1}  # small smoke cells (tests)

    search_space = {"head_epochs": ("int", 1, 15), "body_epochs": ("int", 1, 5), "personal_layers": ("choice", [1, 2])}

    def setup(self) -> None:
        super().setup()
        _, self._head = self.engine.model.split_layers(self.hp.personal_layers)
        params = self.engine.model.param_names
        self._head_params = [n for n in params if n in self._head]
        self._body_params = [n for n in params if n not in self._head]

    def is_local(self, name: str) -> bool:
        return name in self._head

    def newcomer_models(self, serving: Serving) -> State:
        return self.fit_local_part(serving, self.hp.head_epochs, trainable=self._head_params)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        if self.hp.head_epochs:
            state = self.engine.train(
                rnd, clients, state, trainable=self._head_params, epochs=self.hp.head_epochs, stream=self.HEAD_STREAM
            ).state
        return self.engine.train(rnd, clients, state, trainable=self._body_params, epochs=self.hp.body_epochs).state
