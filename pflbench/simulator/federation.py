"""The Federation: what an algorithm may use about the simulated clients of one cell.

One cell's data on the device (features, labels, every client's splits), its models, the sampling
schedule, and the engine's services to the algorithm's hooks: local training (batched across
clients), evaluation of every client's model, local adaptation, communication accounting, the system
and privacy knobs' per-client plans. The round driver that calls the hooks is `pflbench.simulator.rounds`.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast, overload

import numpy as np
import torch
from torch import Tensor

from pflbench import streams
from pflbench.simulator import shifts
from pflbench.streams import Kind, StreamLike
from pflbench.config import CellConfig
from pflbench.engine import Budget, Engine
from pflbench.engine import TrainResult as TrainResult  # the engine interface's, importable here as before
from pflbench.simulator.execution import ExecutionOptions
from pflbench.data.normalization import normalized_for_cell
from pflbench.simulator.models import build_model, client_groups, default_model, is_heterogeneous
from pflbench.newcomers.ids import newcomer_ids, seen_ids
from pflbench.simulator.privacy import PrivacyPlan
from pflbench.simulator.rendezvous import membership
from pflbench.round_context import Round, round_number, work_of
from pflbench.simulator.system import SystemPlan, cut
from pflbench.simulator.client_model import ClientModel, to_channels_last
from pflbench.simulator.training import (
    SGD,
    Objective,
    State,
    batch_plan,
    cross_entropy,
    evaluate_client_splits,
    train_clients,
)

if TYPE_CHECKING:
    from pflbench.data.dataset import Dataset
    from pflbench.data.partitioning import ClientSplits


def sample_schedule(num_clients: int, participation: float, rounds: int, seed: int) -> np.ndarray:
    """The sampled clients of every round, drawn once from the seed: [rounds, per_round], sorted.
    Every algorithm run with the same seed sees the same clients in the same rounds."""
    per_round = max(1, round(participation * num_clients))
    rng = streams.generator(seed, "schedule", kind="numpy")
    return np.stack([np.sort(rng.choice(num_clients, per_round, replace=False)) for _ in range(rounds)])


SPLITS = ("train", "val", "test")
EVALUATED = ("test", "val")  # what a benchmark run evaluates; a tuning run evaluates ("val",) only


def federation_device(execution: ExecutionOptions) -> torch.device:
    """The torch device a cell's Federation runs on (the runner decides `execution.device` first)."""
    return torch.device(execution.device or "cpu")


@dataclass
class CellData:
    """What every population of one cell shares — the trained clients' Federation and the newcomers'
    (pflbench.newcomers): the cell's data on the device (normalised, shifted), its models, its
    optimizer, how it runs, and the system knob's plan. Built once per cell (`cell_data`); a
    Federation holds one population of it (`Federation.of_clients`)."""

    cell: CellConfig
    execution: ExecutionOptions
    device: torch.device
    features: Tensor
    labels: Tensor
    shifts: object
    num_classes: int
    input_shape: tuple
    _split_names: list[str]
    heterogeneous: bool
    model_name: str
    _model: ClientModel | None
    group_names: list[str]
    _partition_groups: list  # each group's partition ids; a Federation maps them to its positions
    models: list[ClientModel]
    sgd: SGD
    batched: bool
    compiled: bool
    channels_last: bool
    client_threads: int
    system: SystemPlan | None
    static_step: bool = False  # the batched plain step through static buffers (a CUDA graph on CUDA)


def cell_data(
    cell: CellConfig,
    dataset: Dataset,
    splits: ClientSplits,
    execution: ExecutionOptions,
    algorithm_batched: bool,
    withhold_test: bool,
) -> CellData:
    """The cell's `CellData` (see `Federation` for the arguments and their defaults)."""
    device = federation_device(execution)
    # Normalisation statistics of the trained clients' train splits (pflbench.data.normalization).
    dataset = normalized_for_cell(
        dataset, cell.normalization, splits, seen_ids(cell.unseen_fraction, splits.num_clients, cell.seed)
    )
    # Feature and concept shift (pflbench.simulator.shifts), applied once to every partition client's samples.
    features, labels, applied = shifts.apply(
        cell, dataset, splits, dataset.normalized(device), dataset.labels.to(device)
    )
    heterogeneous = is_heterogeneous(cell.model)
    if not heterogeneous:
        model_name = default_model(dataset.input_shape) if cell.model == "auto" else cell.model
        model = ClientModel(build_model(model_name, dataset.input_shape, dataset.num_classes))
        groups = [(model_name, list(range(splits.num_clients)))]
    else:  # one architecture per group of clients (pflbench.simulator.models.client_groups)
        model_name, model = cell.model, None
        groups = client_groups(cell.model, splits.num_clients)
    # Model heterogeneity: group g's clients share architecture `models[g]`; a homogeneous cell
    # is one group. Algorithms train and evaluate one group at a time (`by_group`).
    group_names = [name for name, _ in groups]
    models = (
        [model]
        if model is not None
        else [ClientModel(build_model(name, dataset.input_shape, dataset.num_classes)) for name in group_names]
    )
    # How it runs (pflbench.simulator.execution): none of it changes what the cell computes.
    channels_last = execution.use_channels_last(device, any(m.has_conv for m in models))
    for m in models:
        m.channels_last = channels_last
    if channels_last and features.dim() == 4:  # batches gathered from it keep the order
        features = to_channels_last(features)
    return CellData(
        cell=cell,
        execution=execution,
        device=device,
        features=features,
        labels=labels,
        shifts=applied,
        num_classes=dataset.num_classes,
        input_shape=tuple(features.shape[1:]),  # one sample, as models receive it
        _split_names=[name for name in SPLITS if not (withhold_test and name == "test")],
        heterogeneous=heterogeneous,
        model_name=model_name,
        _model=model,
        group_names=group_names,
        _partition_groups=[ids for _, ids in groups],
        models=models,
        sgd=SGD(cell.lr, cell.momentum, cell.weight_decay),
        batched=execution.batched(device, algorithm_batched),
        compiled=execution.compiled(),
        channels_last=channels_last,
        client_threads=execution.side_by_side(device, torch.get_num_threads()),
        # System heterogeneity: drawn once from the seed over partition ids (None when off).
        system=SystemPlan.from_cell(cell),
        static_step=execution.static_step(device),
    )


class Federation:
    """The simulated clients of one cell: the engine's side of what a method may ask of it
    (`pflbench.engine.Engine`, which it implements; a method is handed this object as that interface).

    `withhold_test=True` (tuning) leaves the clients' test indices out entirely: they are never read
    from `splits`, and `fed.splits` has no "test" entry, so nothing in the run can look at them.

    Unseen clients (pflbench.newcomers): this Federation holds the seen clients only, and `newcomers`
    (None without the knob) is a Federation of its own over the held-out ones, for evaluation alone,
    made from the same `CellData` (`of_clients`)."""

    def __init__(
        self,
        cell: CellConfig,
        dataset: Dataset,
        splits: ClientSplits,
        execution: ExecutionOptions = ExecutionOptions(),
        algorithm_batched: bool = True,
        withhold_test: bool = False,
    ) -> None:
        data = cell_data(cell, dataset, splits, execution, algorithm_batched, withhold_test)
        self._serve(data, splits, seen_ids(cell.unseen_fraction, splits.num_clients, cell.seed))
        # Privacy heterogeneity: drawn once from the seed over partition ids (None when off), for the
        # trained clients' schedule; the newcomers share it and never train a round.
        self.privacy = PrivacyPlan.from_cell(cell, self.client_ids[self.schedule], self.num_clients, self.models)
        self.newcomers: Federation | None = None
        if cell.unseen_fraction:
            self.newcomers = Federation.of_clients(
                data, splits, newcomer_ids(cell.unseen_fraction, splits.num_clients, cell.seed), self.privacy
            )

    @classmethod
    def of_clients(
        cls, data: CellData, splits: ClientSplits, client_ids: np.ndarray, privacy: PrivacyPlan | None
    ) -> Federation:
        """A Federation over the partition's clients `client_ids` of the cell whose `data` it shares."""
        fed = cls.__new__(cls)
        fed._serve(data, splits, client_ids)
        fed.privacy, fed.newcomers = privacy, None
        return fed

    def _serve(self, data: CellData, splits: ClientSplits, client_ids: np.ndarray) -> None:
        """This Federation: the cell's `data` for the clients `client_ids`."""
        self.cell_data = data
        self.cell, self.execution, self.device = data.cell, data.execution, data.device
        self.features, self.labels, self.shifts = data.features, data.labels, data.shifts
        self.num_classes, self.input_shape, self._split_names = data.num_classes, data.input_shape, data._split_names
        self.heterogeneous, self.model_name, self._model = data.heterogeneous, data.model_name, data._model
        self.group_names, self._partition_groups, self.models = data.group_names, data._partition_groups, data.models
        self.sgd, self.batched, self.compiled = data.sgd, data.batched, data.compiled
        self.channels_last, self.client_threads, self.system = data.channels_last, data.client_threads, data.system
        self.static_step = data.static_step
        self._hold(splits, client_ids)

    def _hold(self, splits: ClientSplits, client_ids: np.ndarray) -> None:
        """Make this Federation hold the partition's clients `client_ids` (positions 0..len-1)."""
        self.client_ids = client_ids  # position -> partition client id
        self.num_clients = len(client_ids)
        self.splits = {
            name: [
                torch.as_tensor(getattr(splits, name)[c], dtype=torch.long, device=self.device)
                for c in client_ids.tolist()
            ]
            for name in self._split_names
        }
        self.train_sizes = torch.tensor([len(splits.train[c]) for c in client_ids.tolist()], device=self.device)
        position = {c: k for k, c in enumerate(client_ids.tolist())}
        self.group_clients = [
            torch.as_tensor([position[c] for c in ids if c in position], dtype=torch.long, device=self.device)
            for ids in self._partition_groups
        ]
        self.group_of = torch.zeros(self.num_clients, dtype=torch.long, device=self.device)
        for g, ids in enumerate(self.group_clients):
            self.group_of[ids] = g
        sampled_from = self.num_clients if self.cell.unseen_fraction else self.cell.clients
        self.schedule = sample_schedule(sampled_from, self.cell.participation, self.cell.rounds, self.cell.seed)
        self.budget = Budget(self.cell.rounds, self.schedule.shape[1], self.cell.local_epochs, self.cell.batch_size)

    @property
    def model(self) -> ClientModel:
        """The cell's one architecture. A heterogeneous cell has several (`models`, `model_of`)."""
        if self._model is None:
            raise RuntimeError(
                f"cell model {self.cell.model!r} gives clients different architectures: "
                f"use fed.models[g] / fed.model_of(clients) / fed.by_group(clients)"
            )
        return self._model

    def model_of(self, clients: Tensor) -> ClientModel:
        """The architecture shared by `clients` (ValueError if they have different ones)."""
        if self._model is not None:
            return self._model
        groups = torch.unique(self.group_of[clients])
        if len(groups) != 1:
            raise ValueError(
                f"clients {clients.tolist()} have different architectures "
                f"({[self.group_names[g] for g in groups.tolist()]}); split them with fed.by_group"
            )
        return self.models[int(groups[0])]

    def by_group(self, clients: Tensor) -> list[tuple[int, Tensor]]:
        """(group, positions into `clients`) for each architecture among `clients`, in group order."""
        groups = self.group_of[clients]
        return [(g, torch.nonzero(groups == g).flatten()) for g in torch.unique(groups).tolist()]

    def init_state(self, num: int, group: int | None = None, model: ClientModel | None = None) -> State:
        """`num` copies of the initial model (drawn from the cell's seed), stacked; in a heterogeneous
        cell, of group `group`'s architecture; of `model` where given (a method's own)."""
        if model is None:
            model = self.model if group is None else self.models[group]
        return model.init(num, self.cell.seed, self.device)

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
        self, stream: StreamLike, round: int | None = None, client: int | None = None, *, kind: Kind = "torch"
    ) -> torch.Generator | np.random.Generator:
        """A fresh generator of the cell's random `stream` (`pflbench.streams.generator`)."""
        return streams.generator(self.cell.seed, stream, round, client, kind=kind)

    def torch_global(
        self, stream: StreamLike, round: int | None = None, client: int | None = None
    ) -> AbstractContextManager[None]:
        """torch's global generator as the cell's `stream`'s for a block (`pflbench.streams.torch_global`)."""
        return streams.torch_global(self.cell.seed, stream, round, client)

    def seed_torch_global(self, stream: StreamLike, round: int | None = None, client: int | None = None) -> None:
        """Seed torch's global generator from the cell's `stream` (`pflbench.streams.seed_torch_global`)."""
        streams.seed_torch_global(self.cell.seed, stream, round, client)

    @property
    def kept_local(self) -> frozenset[str]:
        """Tensors that never leave a client under the privacy knob (none when it is off)."""
        return frozenset() if self.privacy is None else self.privacy.kept_local

    def round(self, number: int, clients: Tensor) -> Round:
        """Round `number`'s context for the sampled `clients` (what the engine hands the hooks): with
        the system knob, every client's share of its local work this round (`system.stragglers`)."""
        work = None if self.system is None else tuple(self.system.work[number - 1, self.client_ids].tolist())
        return Round(number, clients, work)

    def batch_generators(
        self, rnd: int | Round, clients: Tensor, *, stream: StreamLike | None = None
    ) -> list[torch.Generator]:
        """One generator per client of the random `stream` (default "batches": the batch order) in round
        `rnd`, keyed by partition id: the same for every algorithm and for both training paths."""
        stream = streams.BATCHES if stream is None else stream
        number = round_number(rnd)
        # keyed by partition id (-1: pooled data)
        return [
            streams.generator(self.cell.seed, stream, number, int(self.client_ids[c]) if c >= 0 else c)
            for c in clients.tolist()
        ]

    def train(
        self,
        rnd: int | Round,
        clients: Tensor,
        state: State,
        *,
        objective: Objective = cross_entropy,
        aux: State | None = None,
        trainable: Iterable[str] | None = None,
        epochs: int | None = None,
        steps: int | None = None,
        split: str = "train",
        stream: StreamLike | None = None,
        model: ClientModel | None = None,
        targets: Tensor | None = None,
    ) -> TrainResult:
        """Local SGD of the sampled clients from `state` ([len(clients), ...]) on their own data:
        `epochs` (None: the cell's local_epochs; 0: no step) or a fixed number of `steps`, on the
        batch plan of `local_plans`. `model` trains another architecture than the clients' own (e.g. a
        shared global model in a heterogeneous cell); `targets`, a per-sample table indexed like the
        dataset's labels, is what the objective receives instead of the labels (e.g. labels with a
        teacher's logits, for distillation). `stream`: the batch order's random stream (default
        "batches", pflbench.streams). `rnd`: the round's context (`Round`) for a round's
        local training, whose stragglers do their share of the work; a round number otherwise."""
        plans = self.local_plans(rnd, clients, epochs=epochs, steps=steps, split=split, stream=stream)
        return self._train_on(
            [self.splits[split][c] for c in clients.tolist()],
            plans,
            model or self.model_of(clients),
            state,
            objective=objective,
            aux=aux,
            trainable=trainable,
            targets=targets,
        )

    def train_pooled(
        self, rnd: int | Round, clients: Tensor, state: State, *, epochs: int | None = None
    ) -> TrainResult:
        """One model (`state`, [1, ...]) trained on the union of `clients`' train splits, shuffled
        together: centralized training of the samples those clients hold (the `centralized` reference)."""
        pooled = [torch.cat([self.splits["train"][c] for c in clients.tolist()])]
        generators = self.batch_generators(rnd, torch.tensor([-1]))  # no client has id -1
        return self._train_on(pooled, self._plans([len(pooled[0])], generators, epochs, None), self.model, state)

    def _train_on(
        self,
        indices: list[Tensor],
        plans: list[Tensor],
        model: ClientModel,
        state: State,
        *,
        objective: Objective = cross_entropy,
        aux: State | None = None,
        trainable: Iterable[str] | None = None,
        targets: Tensor | None = None,
    ) -> TrainResult:
        """SGD of the models in `state` (row k on the sample ids `indices[k]`, following `plans[k]`):
        what `train` and `train_pooled` share."""
        member = membership()  # a cell of a group trains through its rendezvous (pflbench.simulator.rendezvous)
        train = train_clients if member is None else member.train_clients
        new_state, loss = train(
            model,
            state,
            self.features,
            self.labels if targets is None else targets,
            indices,
            plans,
            self.sgd,
            objective=objective,
            aux=aux,
            trainable=trainable,
            batched=self.batched,
            compiled=self.compiled,
            threads=self.client_threads,
            static=self.static_step,
        )
        return TrainResult(new_state, loss, torch.tensor([len(plan) for plan in plans], dtype=torch.int64))

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
        """The engine's batch plan of each of `clients` in round `rnd`: positions into the client's
        `split` sample ids, [steps, batch_size] (`pflbench.simulator.training.batch_plan`), for `epochs` (None:
        the cell's local_epochs; 0: no step) or a fixed number of `steps`, in the batch order of
        `batch_generators(rnd, clients, stream=stream)` (default "batches"). Given the round's
        context (`Round`: a round's local training), each straggler's plan is
        cut to its share of the work (`system.stragglers`); given a round number (evaluation's
        adaptation, newcomers' fits, ...) nothing is cut. Every trainer plans here: `train`, the custom
        steps of `pflbench.kit.steps`, and algorithms with their own training loops."""
        plans = self._plans(
            [len(self.splits[split][c]) for c in clients.tolist()],
            self.batch_generators(rnd, clients, stream=stream),
            epochs,
            steps,
        )
        work = work_of(rnd, clients)
        return plans if work is None else cut(plans, work)

    def sample_ids(self, client: int, split: str = "train") -> Tensor:
        """Client `client`'s (a position) sample ids in `split`, for `data`."""
        return self.splits[split][client]

    def data(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs, labels) of the samples `ids` (any shape; e.g. a step of `steps.step_ids`): the
        cell's data after its shifts, on the device. For algorithms that run their own models."""
        return self.features[ids], self.labels[ids]

    @property
    def num_samples(self) -> int:
        """Samples in the cell's data: the length of a per-sample `targets` table (`train`)."""
        return len(self.labels)

    @property
    def split_names(self) -> list[str]:
        """The splits this Federation holds ("test" is absent where it is withheld: tuning)."""
        return list(self._split_names)

    def _plans(
        self, sizes: list[int], generators: list[torch.Generator], epochs: int | None, steps: int | None
    ) -> list[Tensor]:
        # None is the only "the cell's default" marker: an explicit 0 means no epoch
        epochs = self.cell.local_epochs if epochs is None else epochs
        return batch_plan(sizes, self.cell.batch_size, epochs, steps, generators)

    def arrived(self, rnd: int | Round, clients: Tensor) -> Tensor | None:
        """[K] bool: whose upload reaches the server in round `rnd` (None: every upload, no dropout)."""
        if self.system is None:
            return None
        return self.system.arrived(round_number(rnd), torch.as_tensor(self.client_ids, device=clients.device)[clients])

    def privatize(self, rnd: int | Round, client: int, update: State) -> State:
        """One client's update (unstacked tensors) as it
        leaves the client under the `privacy` knob (clipped and noised); unchanged when it is off."""
        if self.privacy is None:
            return update
        return self.privacy.privatize(round_number(rnd), int(self.client_ids[client]), update)

    def adapt_locally(self, personal: State | list[State], rnd: int, epochs: int) -> State | list[State]:
        """Every client's model in `personal` after `epochs` of local SGD on its own train split: the
        after-local-adaptation protocol (FL-bench's "after", FedRep's and pFedLA's code's
        "acc_after", FedAvg-FT). Cross-entropy on all parameters with the cell's optimizer settings,
        momentum starting from zero, whatever the algorithm's own local objective is: one rule for
        every method, so the protocol measures the model, not the method's training loop.
        The batch order is the one each client would draw in round `rnd + 1`, so for plain local
        training the adapted model of round r is exactly the model of round r + 1. Returns new
        tensors; `personal` (possibly the algorithm's own state) is not modified."""
        # a homogeneous cell's `personal` is one State, a heterogeneous cell's a list of them
        if not self.heterogeneous:
            everyone = torch.arange(self.num_clients, device=self.device)
            return self.train(rnd + 1, everyone, cast(State, personal), epochs=epochs).state
        return [
            self.train(rnd + 1, ids, state, epochs=epochs).state if len(ids) else state
            for ids, state in zip(self.group_clients, cast("list[State]", personal))
        ]

    def split_sizes(self, split: str) -> Tensor:
        """Samples per client in `split` ([N]; zeros for a withheld split)."""
        if split not in self.splits:
            return torch.zeros(self.num_clients, dtype=torch.long)
        return torch.tensor([len(i) for i in self.splits[split]])

    def evaluate(self, state: State, split: str = "test", clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Accuracy and loss of each client's model (rows of `state`) on its own `split`."""
        return self.evaluate_splits(state, (split,), clients)[split]

    def evaluate_splits(
        self, state: State, splits: tuple[str, ...], clients: Tensor | None = None
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """`evaluate` on several splits in one pass over each client's samples: split -> (accuracy, loss)."""
        ids = range(self.num_clients) if clients is None else clients.tolist()
        model = self.model if clients is None else self.model_of(clients)
        results = evaluate_client_splits(
            model,
            state,
            self.features,
            self.labels,
            [[self.splits[split][c] for c in ids] for split in splits],
            batched=self.batched,
            threads=self.client_threads,
        )
        return dict(zip(splits, results))

    def evaluate_personalized(self, personal: State | list[State], split: str = "test") -> tuple[Tensor, Tensor]:
        """Accuracy and loss [N] of every client's model: `personal` is a State [N, ...], or in a
        heterogeneous cell a list with one State per group (rows: `group_clients[g]`)."""
        return self.evaluate_personalized_splits(personal, (split,))[split]

    def evaluate_personalized_splits(
        self, personal: State | list[State], splits: tuple[str, ...]
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """`evaluate_personalized` on several splits in one pass: split -> (accuracy, loss)."""
        if not self.heterogeneous:  # one State; a heterogeneous cell's: a list of them
            return self.evaluate_splits(cast(State, personal), splits)
        results = {}
        for split in splits:
            accuracy = torch.full((self.num_clients,), float("nan"), device=self.device)
            results[split] = (accuracy, accuracy.clone())
        for g, ids in enumerate(self.group_clients):
            if len(ids):
                for split, (accuracy, loss) in self.evaluate_splits(
                    cast("list[State]", personal)[g], splits, ids
                ).items():
                    results[split][0][ids], results[split][1][ids] = accuracy, loss
        return results


if TYPE_CHECKING:

    def _implements(federation: Federation) -> Engine:
        """mypy's check that the Federation is an Engine (pflbench.engine)."""
        return federation
