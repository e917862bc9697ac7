"""The engine interface: everything a method may ask of the engine, and nothing else.

A method (`pflbench.algorithm.Algorithm`) reaches the engine through `self.engine`, and an evaluation
hook reaches the population it serves through `serving.clients` (`pflbench.serving.Serving`): both
are an `Engine`. It offers

- the clients and their models: how many (`num_clients`, their partition ids `client_ids`), where
  they train (`device`), the architecture (`model`; one per group in a heterogeneous cell: `models`,
  `heterogeneous`, `group_names`, `group_clients`, `group_of`, `model_of`, `by_group`), its initial
  state (`init_state`), the shape of a sample (`input_shape`) and the number of classes (`num_classes`);
- the clients' data: their split sizes (`train_sizes`, `split_sizes`, `split_names`), their sample ids
  (`sample_ids`) and the samples themselves (`data`, `num_samples`), for methods that run their own
  models;
- the budget: the cell's rounds, clients per round, local epochs and batch size (`budget`, a
  `Budget`), the optimizer's settings (`sgd`) and whether clients train batched (`batched`);
- training: local SGD of some clients from a state with an objective (`train`, batched across
  clients; `train_pooled`), the batch plans it follows (`local_plans`, `batch_generators`), and the
  after-adaptation protocol (`adapt_locally`);
- evaluation: the accuracy and loss of each client's model on its own split (`evaluate`,
  `evaluate_personalized_splits`);
- named random streams of the cell's seed (`generator`, `torch_global`, `seed_torch_global`;
  pflbench.streams), so a method draws nothing that is not reproducible;
- the tensors that never leave a client whatever the method (`kept_local`: the privacy knob's).

What the clients upload reaches the server through the engine, never through a method's own check:
the round's upload when `send` returns it, or, for a server that updates after each client, each
client's upload as `local_train` hands it over (`rnd.deliver`, pflbench.round_context); the engine
applies the system and privacy knobs to both.

The cell's configuration is not handed over: what a method needs of it is a typed value here (the
budget, the optimizer, the streams), and the rest is the engine's (the schedule, the knobs' plans, the
data's splits and shifts, how the cell runs). `pflbench.simulator.federation.Federation` implements it; mypy
checks that it does (`_implements`, in pflbench.simulator.federation). A method type-checked against `Engine` uses
nothing else.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, overload

import numpy as np
import torch
from torch import Tensor

from pflbench.api_types import SGD, Objective, State, cross_entropy
from pflbench.round_context import Round
from pflbench.streams import StreamLike

if TYPE_CHECKING:  # the one engine type the interface names: the model (pflbench.simulator.client_model)
    from pflbench.simulator.client_model import ClientModel

__all__ = ["MEMBERS", "Budget", "Engine", "TrainResult"]


@dataclass(frozen=True)
class Budget:
    """The cell's budget, as a method may read it: `rounds` of training, `clients_per_round` sampled
    in each, `local_epochs` of local SGD (what `Engine.train` does with epochs=None) on batches of
    `batch_size` samples."""

    rounds: int
    clients_per_round: int
    local_epochs: int
    batch_size: int


@dataclass
class TrainResult:
    """What local training gives back (`Engine.train`, `Engine.train_pooled`): the trained `state`
    ([len(clients), ...], or [1, ...] pooled), `loss`, the mean local loss per trained client, and
    `steps`, the SGD steps each took (a straggler's fewer: its share of the plan; SCAFFOLD's control
    variates divide by it)."""

    state: State
    loss: Tensor  # [K]: mean local loss per trained client
    steps: Tensor  # [K] int64, on the CPU: the steps of each trained client's batch plan


class Engine(Protocol):
    """What a method may ask of the engine (module doc). Clients are positions 0..num_clients-1 of
    this population; a State is a dict of tensors stacked over clients ([K, ...])."""

    # ---- the clients and their models ----------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        """Clients of this population (positions 0..num_clients-1)."""
        ...

    @property
    def client_ids(self) -> np.ndarray:
        """[num_clients]: each position's client id in the cell's partition (what the metrics name)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the engine keeps the clients' data and trains."""
        ...

    @property
    def model(self) -> ClientModel:
        """The clients' one architecture (its tensors' names, layers, forward); RuntimeError in a
        heterogeneous cell, whose groups of clients have one each (`models`)."""
        ...

    @property
    def models(self) -> list[ClientModel]:
        """The architecture of each group of clients (one group in a homogeneous cell)."""
        ...

    @property
    def heterogeneous(self) -> bool:
        """Whether the clients have different architectures (several groups)."""
        ...

    @property
    def group_names(self) -> list[str]:
        """Each group's model name."""
        ...

    @property
    def group_clients(self) -> list[Tensor]:
        """Each group's clients (positions, on the device)."""
        ...

    @property
    def group_of(self) -> Tensor:
        """[num_clients]: each client's group."""
        ...

    def model_of(self, clients: Tensor) -> ClientModel:
        """The architecture shared by `clients` (ValueError if they have different ones)."""
        ...

    def by_group(self, clients: Tensor) -> list[tuple[int, Tensor]]:
        """(group, positions into `clients`) for each architecture among `clients`, in group order."""
        ...

    def init_state(self, num: int, group: int | None = None, model: ClientModel | None = None) -> State:
        """`num` copies of the initial model (drawn from the cell's seed), stacked: of the cell's
        architecture, of group `group`'s, or of `model` (a method's own ClientModel)."""
        ...

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample, as models receive it."""
        ...

    @property
    def num_classes(self) -> int:
        """Classes of the dataset."""
        ...

    # ---- the clients' data ------------------------------------------------------------------------
    @property
    def train_sizes(self) -> Tensor:
        """[num_clients]: each client's training samples (on the device)."""
        ...

    def split_sizes(self, split: str) -> Tensor:
        """[num_clients]: each client's samples in `split` (zeros for a withheld split)."""
        ...

    @property
    def split_names(self) -> list[str]:
        """The splits this population holds ("test" is absent where it is withheld: tuning)."""
        ...

    def sample_ids(self, client: int, split: str = "train") -> Tensor:
        """Client `client`'s sample ids in `split`, for `data`."""
        ...

    def data(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs, labels) of the samples `ids` (any shape), on the device."""
        ...

    @property
    def num_samples(self) -> int:
        """Samples in the cell's data: the length of a per-sample `targets` table (`train`)."""
        ...

    # ---- the budget ---------------------------------------------------------------------------------
    @property
    def budget(self) -> Budget:
        """The cell's rounds, clients per round, local epochs and batch size."""
        ...

    @property
    def sgd(self) -> SGD:
        """The cell's optimizer settings (learning rate, momentum, weight decay) and its update rule."""
        ...

    @property
    def batched(self) -> bool:
        """Whether the engine trains clients batched (one call for all); False: one client at a time."""
        ...

    # ---- training ---------------------------------------------------------------------------------
    def train(
        self,
        rnd: int | Round,
        clients: Tensor,
        state: State,
        *,
        objective: Objective = cross_entropy,
        aux: State | None = None,
        trainable: list[str] | None = None,
        epochs: int | None = None,
        steps: int | None = None,
        split: str = "train",
        stream: StreamLike | None = None,
        model: ClientModel | None = None,
        targets: Tensor | None = None,
    ) -> TrainResult:
        """Local SGD of `clients` from `state` ([len(clients), ...]) on their own `split`: `epochs`
        (None: the budget's local epochs; 0: no step) or `steps`, minimizing `objective` (with `aux`,
        per-client tensors it reads), on the `trainable` tensors only (None: every parameter). `rnd`:
        the round's context for a round's local training (a straggler does its share of the work), a
        round number otherwise. `stream`: the batch order's random stream (default "batches"); `model`:
        another architecture than the clients' own; `targets`: a per-sample table (`num_samples` rows)
        the objective receives instead of the labels. Returns the trained state and each client's loss."""
        ...

    def train_pooled(
        self, rnd: int | Round, clients: Tensor, state: State, *, epochs: int | None = None
    ) -> TrainResult:
        """One model (`state`, [1, ...]) trained on the union of `clients`' train splits."""
        ...

    def local_plans(
        self,
        rnd: int | Round,
        clients: Tensor,
        *,
        epochs: int | None = None,
        steps: int | None = None,
        split: str = "train",
        stream: StreamLike | None = None,
    ) -> list[Tensor]:
        """The batch plan `train` follows for each of `clients`: positions into the client's `split`
        sample ids, [steps, batch_size] (for a method with its own training loop: `pflbench.kit.steps`)."""
        ...

    def batch_generators(
        self, rnd: int | Round, clients: Tensor, *, stream: StreamLike | None = None
    ) -> list[torch.Generator]:
        """One generator per client of the random `stream` (default "batches") in round `rnd`."""
        ...

    def adapt_locally(self, personal: State | list[State], rnd: int, epochs: int) -> State | list[State]:
        """Every client's model after `epochs` of plain local SGD on its own train split (the
        after-local-adaptation protocol), as new tensors."""
        ...

    # ---- evaluation -------------------------------------------------------------------------------
    def evaluate(self, state: State, split: str = "test", clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Accuracy and loss of each client's model (rows of `state`; of `clients`, default every
        client) on its own `split`."""
        ...

    def evaluate_personalized_splits(
        self, personal: State | list[State], splits: tuple[str, ...]
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """split -> (accuracy [N], loss [N]) of every client's model: a State [N, ...], or in a
        heterogeneous cell one State per group (rows: `group_clients[g]`)."""
        ...

    # ---- named random streams (pflbench.streams) ---------------------------------------------------
    @overload
    def generator(
        self,
        stream: StreamLike,
        round: int | None = None,
        client: int | None = None,
        *,
        kind: Literal["torch"] = "torch",
    ) -> torch.Generator: ...
    @overload
    def generator(
        self, stream: StreamLike, round: int | None = None, client: int | None = None, *, kind: Literal["numpy"]
    ) -> np.random.Generator: ...
    def generator(
        self, stream: StreamLike, round: int | None = None, client: int | None = None, *, kind: str = "torch"
    ) -> torch.Generator | np.random.Generator:
        """A fresh generator of `stream` for the cell's seed (and `round`, `client` where it is drawn
        per round or per client): `streams.generator`."""
        ...

    def torch_global(
        self, stream: StreamLike, round: int | None = None, client: int | None = None
    ) -> AbstractContextManager[None]:
        """While the block runs, torch's global generator is `stream`'s (e.g. to initialize an
        nn.Module): `streams.torch_global`."""
        ...

    def seed_torch_global(self, stream: StreamLike, round: int | None = None, client: int | None = None) -> None:
        """Seed torch's global generator from `stream` (for draws that read it: dropout layers)."""
        ...

    # ---- the privacy knob -------------------------------------------------------------------------
    @property
    def kept_local(self) -> frozenset[str]:
        """Tensors that never leave a client whatever the method (the privacy knob's BatchNorm statistics)."""
        ...


# The interface's members, in the order documented above (tests/test_engine_interface.py checks both).
MEMBERS: tuple[str, ...] = tuple(name for name in vars(Engine) if not name.startswith("_"))
