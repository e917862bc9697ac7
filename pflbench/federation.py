"""The federation engine: one cell's data on the device, client sampling, local training,
evaluation of every client's personalized model, and communication accounting.

`run_cell` is the whole life of one cell (dataset -> partition -> rounds -> metrics); the runner
calls it, tests call it, `pflbench bench` times its pieces.
"""
from __future__ import annotations

import copy
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pflbench import shifts
from pflbench.algorithm import Algorithm, get_algorithm
from pflbench.config import CellConfig
from pflbench.models import build_model, client_groups, default_model, is_heterogeneous
from pflbench.privacy import PrivacyPlan, privatize_upload
from pflbench.system import SystemPlan
from pflbench.newcomers import check_unseen, newcomer_ids, newcomer_summary, score_newcomers, seen_ids, trained_rows
from pflbench.training import (SGD, ClientModel, Diverged, Objective, State, batch_plan, cross_entropy,
                               evaluate_client_splits, payload_bytes, to_channels_last, train_clients)

CLIENT_BATCHING = ("auto", "on", "off")


@dataclass
class TrainResult:
    state: State
    loss: Tensor  # mean local loss per trained client


def sample_schedule(num_clients: int, participation: float, rounds: int, seed: int) -> np.ndarray:
    """The sampled clients of every round, drawn once from the seed: [rounds, per_round], sorted.
    Every algorithm run with the same seed sees the same clients in the same rounds."""
    per_round = max(1, round(participation * num_clients))
    rng = np.random.default_rng([seed, 0x5A3])
    return np.stack([np.sort(rng.choice(num_clients, per_round, replace=False)) for _ in range(rounds)])


def choose_batching(requested: str, device: torch.device, algorithm_batched: bool) -> bool:
    """Batched local training pays off where small per-client batches would leave the device idle
    (GPUs). On a CPU a loop over clients at batch 32 is as fast as one big batch and avoids vmap's
    overhead (measured with `pflbench bench`), so `auto` loops there."""
    if requested not in CLIENT_BATCHING:
        raise ValueError(f"client_batching must be one of {CLIENT_BATCHING}, got {requested!r}")
    if not algorithm_batched:
        return False
    if requested == "auto":
        return device.type == "cuda"
    return requested == "on"


# --- compiled training steps (pflbench.training's module doc): an execution option like
# client_batching, not part of the cell's identity. `auto` is the eager step: with channels-last
# convolutions and client threads the eager loop path trains the CNN faster than the compiled step on
# a CPU (pflbench bench, 2 threads: 7,631 vs 5,877 samples/s on Fashion-MNIST's shape, 4,940 vs 5,058
# on CIFAR's before client threads, which the compiled step does not use); CUDA was not measured.
COMPILED_TRAINING = ("auto", "on", "off")


def choose_compiled(requested: str) -> bool:
    if requested not in COMPILED_TRAINING:
        raise ValueError(f"compiled_training must be one of {COMPILED_TRAINING}, got {requested!r}")
    return requested == "on"


# --- channels-last convolutions (pflbench.training's module doc): an execution option like
# compiled_training, not part of the cell's identity. `auto`: on for convolutional models on a CPU,
# where oneDNN's channels-last kernels train the CNN 1.3-1.5x faster (pflbench bench); off on CUDA,
# where it was not measured.
CHANNELS_LAST = ("auto", "on", "off")


def choose_channels_last(requested: str, device: torch.device, models: list[ClientModel]) -> bool:
    if requested not in CHANNELS_LAST:
        raise ValueError(f"channels_last must be one of {CHANNELS_LAST}, got {requested!r}")
    wanted = device.type == "cpu" if requested == "auto" else requested == "on"
    return wanted and any(model.has_conv for model in models)


# --- client threads (pflbench.training's module doc): the loop path trains and evaluates clients side
# by side on the cell's CPU threads, one intra-op thread each; an execution option, not in the hash.
# `auto`: on for a CPU with more than one torch thread; off on CUDA (one device, one stream).
CLIENT_THREADS = ("auto", "off")


def choose_client_threads(requested: str, device: torch.device) -> int:
    """How many clients the loop path runs side by side (1: one after another)."""
    if requested not in CLIENT_THREADS:
        raise ValueError(f"client_threads must be one of {CLIENT_THREADS}, got {requested!r}")
    return torch.get_num_threads() if requested == "auto" and device.type == "cpu" else 1


SPLITS = ("train", "val", "test")
EVALUATED = ("test", "val")  # what a benchmark run evaluates; a tuning run evaluates ("val",) only


class Federation:
    """What an algorithm may use about the simulated clients of one cell.

    `withhold_test=True` (tuning) leaves the clients' test indices out entirely: they are never read
    from `splits`, and `fed.splits` has no "test" entry, so nothing in the run can look at them."""

    def __init__(self, cell: CellConfig, dataset, splits, device: str | torch.device = "cpu",
                 client_batching: str = "auto", algorithm_batched: bool = True, withhold_test: bool = False,
                 compiled_training: str = "off", channels_last: str = "auto", client_threads: str = "auto"):
        self.cell = cell
        self.device = torch.device(device)
        # Feature and concept shift (pflbench.shifts), applied once to every partition client's samples.
        self.features, self.labels, self.shifts = shifts.apply(cell, dataset, splits, dataset.normalized(self.device),
                                                               dataset.labels.to(self.device))
        self.num_classes = dataset.num_classes
        self._split_names = [name for name in SPLITS if not (withhold_test and name == "test")]
        self.heterogeneous = is_heterogeneous(cell.model)
        if not self.heterogeneous:
            model_name = default_model(dataset.input_shape) if cell.model == "auto" else cell.model
            self.model_name = model_name
            self._model = ClientModel(build_model(model_name, dataset.input_shape, dataset.num_classes))
            groups = [(model_name, list(range(splits.num_clients)))]
        else:  # one architecture per group of clients (pflbench.models.client_groups)
            self.model_name = cell.model
            self._model = None
            groups = client_groups(cell.model, splits.num_clients)
        # Model heterogeneity: group g's clients share architecture `models[g]`; a homogeneous cell
        # is one group. Algorithms train and evaluate one group at a time (`by_group`).
        self.group_names = [name for name, _ in groups]
        self._partition_groups = [ids for _, ids in groups]  # by partition id; `_hold` maps them to positions
        self.models = [self._model] if self._model is not None else [
            ClientModel(build_model(name, dataset.input_shape, dataset.num_classes)) for name in self.group_names]
        self.sgd = SGD(cell.lr, cell.momentum, cell.weight_decay)
        self.batched = choose_batching(client_batching, self.device, algorithm_batched)
        self.compiled = choose_compiled(compiled_training)
        self.channels_last = choose_channels_last(channels_last, self.device, self.models)
        for model in self.models:
            model.channels_last = self.channels_last
        if self.channels_last and self.features.dim() == 4:  # batches gathered from it keep the order
            self.features = to_channels_last(self.features)
        self.client_threads = choose_client_threads(client_threads, self.device)
        # Unseen clients (pflbench.newcomers): this Federation holds the seen clients only, and
        # `newcomers` (None without the knob) the held-out ones, for evaluation alone.
        self._hold(splits, seen_ids(cell.unseen_fraction, splits.num_clients, cell.seed))
        # System and privacy heterogeneity: drawn once from the seed over partition ids (None when off),
        # for the trained clients' schedule; the newcomers' copy shares them and never trains a round.
        self.system = SystemPlan.from_cell(cell)
        self.privacy = PrivacyPlan.from_cell(cell, self.client_ids[self.schedule], self.num_clients, self.models)
        self.local_round: int | None = None  # the round whose local training is running (stragglers)
        self.newcomers: Federation | None = None
        if cell.unseen_fraction:
            self.newcomers = copy.copy(self)
            self.newcomers._hold(splits, newcomer_ids(cell.unseen_fraction, splits.num_clients, cell.seed))

    def _hold(self, splits, client_ids: np.ndarray) -> None:
        """Make this Federation hold the partition's clients `client_ids` (positions 0..len-1)."""
        self.client_ids = client_ids  # position -> partition client id
        self.num_clients = len(client_ids)
        self.splits = {name: [torch.as_tensor(getattr(splits, name)[c], dtype=torch.long, device=self.device)
                              for c in client_ids.tolist()] for name in self._split_names}
        self.train_sizes = torch.tensor([len(splits.train[c]) for c in client_ids.tolist()], device=self.device)
        position = {c: k for k, c in enumerate(client_ids.tolist())}
        self.group_clients = [torch.as_tensor([position[c] for c in ids if c in position], dtype=torch.long,
                                              device=self.device) for ids in self._partition_groups]
        self.group_of = torch.zeros(self.num_clients, dtype=torch.long, device=self.device)
        for g, ids in enumerate(self.group_clients):
            self.group_of[ids] = g
        sampled_from = self.num_clients if self.cell.unseen_fraction else self.cell.clients
        self.schedule = sample_schedule(sampled_from, self.cell.participation, self.cell.rounds, self.cell.seed)

    @property
    def model(self) -> ClientModel:
        """The cell's one architecture. A heterogeneous cell has several (`models`, `model_of`)."""
        if self._model is None:
            raise RuntimeError(f"cell model {self.cell.model!r} gives clients different architectures: "
                               f"use fed.models[g] / fed.model_of(clients) / fed.by_group(clients)")
        return self._model

    def model_of(self, clients: Tensor) -> ClientModel:
        """The architecture shared by `clients` (ValueError if they have different ones)."""
        if self._model is not None:
            return self._model
        groups = torch.unique(self.group_of[clients])
        if len(groups) != 1:
            raise ValueError(f"clients {clients.tolist()} have different architectures "
                             f"({[self.group_names[g] for g in groups.tolist()]}); split them with fed.by_group")
        return self.models[int(groups[0])]

    def by_group(self, clients: Tensor) -> list[tuple[int, Tensor]]:
        """(group, positions into `clients`) for each architecture among `clients`, in group order."""
        groups = self.group_of[clients]
        return [(g, torch.nonzero(groups == g).flatten()) for g in torch.unique(groups).tolist()]

    def init_state(self, num: int, group: int | None = None) -> State:
        """`num` copies of the initial model (drawn from the cell's seed), stacked; in a heterogeneous
        cell, of group `group`'s architecture."""
        if group is None:
            return self.model.init(num, self.cell.seed, self.device)
        return self.models[group].init(num, self.cell.seed, self.device)

    def batch_generators(self, rnd: int, clients: Tensor, salt: int = 0) -> list[torch.Generator]:
        """One generator per client for its batch order in round `rnd`: the same for every algorithm
        and for both training paths."""
        gens = []
        for c in clients.tolist():
            c = int(self.client_ids[c]) if c >= 0 else c  # keyed by partition id (-1: pooled data)
            digest = hashlib.sha256(f"{self.cell.seed}/{rnd}/{c}/{salt}".encode()).digest()
            gens.append(torch.Generator().manual_seed(int.from_bytes(digest[:8], "little")))
        return gens

    def train(self, rnd: int, clients: Tensor, state: State, *, objective: Objective = cross_entropy,
              aux: State | None = None, trainable=None, epochs: int | None = None,
              steps: int | None = None, split: str = "train", salt: int = 0,
              model: ClientModel | None = None, targets: Tensor | None = None) -> TrainResult:
        """Local SGD of the sampled clients from `state` ([len(clients), ...]) on their own data:
        `epochs` (default: the cell's local_epochs) or a fixed number of `steps`. `model` trains
        another architecture than the clients' own (e.g. a shared global model in a heterogeneous
        cell); `targets`, a per-sample table indexed like the dataset's labels, is what the objective
        receives instead of the labels (e.g. labels with a teacher's logits, for distillation)."""
        return self._train_on([self.splits[split][c] for c in clients.tolist()],
                              self.batch_generators(rnd, clients, salt), model or self.model_of(clients), state,
                              epochs=epochs, steps=steps, objective=objective, aux=aux, trainable=trainable,
                              targets=targets, cut=(rnd, clients.tolist()))

    def train_pooled(self, rnd: int, clients: Tensor, state: State, *, epochs: int | None = None) -> TrainResult:
        """One model (`state`, [1, ...]) trained on the union of `clients`' train splits, shuffled
        together: centralized training of the samples those clients hold (the `centralized` reference)."""
        pooled = torch.tensor([-1])  # generator key of the pooled data: no client has id -1
        return self._train_on([torch.cat([self.splits["train"][c] for c in clients.tolist()])],
                              self.batch_generators(rnd, pooled), self.model, state, epochs=epochs)

    def _train_on(self, indices: list[Tensor], generators: list[torch.Generator], model: ClientModel,
                  state: State, *, epochs: int | None = None, steps: int | None = None,
                  objective: Objective = cross_entropy, aux: State | None = None, trainable=None,
                  targets: Tensor | None = None, cut: tuple[int, list[int]] | None = None) -> TrainResult:
        """SGD of the models in `state` (row k on the sample ids `indices[k]`, batch order from
        `generators[k]`): what `train` and `train_pooled` share. `cut` = (round, clients): the plans
        are the local work of those clients in that round (stragglers cut them: `local_plans`)."""
        plans = batch_plan([len(i) for i in indices], self.cell.batch_size, epochs or self.cell.local_epochs,
                           steps, generators)
        if cut is not None:
            plans = self.local_plans(*cut, plans)
        new_state, loss = train_clients(model, state, self.features, self.labels if targets is None else targets,
                                        indices, plans, self.sgd, objective=objective, aux=aux,
                                        trainable=trainable, batched=self.batched, compiled=self.compiled,
                                        threads=self.client_threads)
        return TrainResult(new_state, loss)

    def local_plans(self, rnd: int, clients: list[int], plans: list[Tensor]) -> list[Tensor]:
        """The batch plans of `clients`, cut to each straggler's share of the work when they are the
        local training of round `rnd` (`system.stragglers`); unchanged otherwise (e.g. evaluation's
        adaptation, or a knob that is off). Algorithms that build their own plans pass them here."""
        if self.system is None or self.local_round != rnd:
            return plans
        return self.system.cut(rnd, [int(self.client_ids[c]) for c in clients], plans)  # plans keyed by partition id

    def arrived(self, rnd: int, clients: Tensor) -> Tensor | None:
        """[K] bool: whose upload reaches the server in round `rnd` (None: every upload, no dropout)."""
        return None if self.system is None else self.system.arrived(rnd, torch.as_tensor(self.client_ids, device=clients.device)[clients])

    def privatize(self, rnd: int, client: int, update: State) -> State:
        """For algorithms with `dp_upload = "self"`: one client's update (unstacked tensors) as it
        leaves the client under the `privacy` knob (clipped and noised); unchanged when it is off."""
        return update if self.privacy is None else self.privacy.privatize(rnd, int(self.client_ids[client]), update)

    def adapt_locally(self, personal: State | list[State], rnd: int, epochs: int) -> State | list[State]:
        """Every client's model in `personal` after `epochs` of local SGD on its own train split: the
        after-local-adaptation protocol (FL-bench's "after", FedRep's and pFedLA's code's
        "acc_after", FedAvg-FT). Cross-entropy on all parameters with the cell's optimizer settings,
        momentum starting from zero, whatever the algorithm's own local objective is: one rule for
        every method, so the protocol measures the model, not the method's training loop.
        The batch order is the one each client would draw in round `rnd + 1`, so for plain local
        training the adapted model of round r is exactly the model of round r + 1. Returns new
        tensors; `personal` (possibly the algorithm's own state) is not modified."""
        if not self.heterogeneous:
            everyone = torch.arange(self.num_clients, device=self.device)
            return self.train(rnd + 1, everyone, personal, epochs=epochs).state
        return [self.train(rnd + 1, ids, state, epochs=epochs).state if len(ids) else state
                for ids, state in zip(self.group_clients, personal)]

    def split_sizes(self, split: str) -> Tensor:
        """Samples per client in `split` ([N]; zeros for a withheld split)."""
        if split not in self.splits:
            return torch.zeros(self.num_clients, dtype=torch.long)
        return torch.tensor([len(i) for i in self.splits[split]])

    def evaluate(self, state: State, split: str = "test", clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Accuracy and loss of each client's model (rows of `state`) on its own `split`."""
        return self.evaluate_splits(state, (split,), clients)[split]

    def evaluate_splits(self, state: State, splits: tuple[str, ...],
                        clients: Tensor | None = None) -> dict[str, tuple[Tensor, Tensor]]:
        """`evaluate` on several splits in one pass over each client's samples: split -> (accuracy, loss)."""
        ids = range(self.num_clients) if clients is None else clients.tolist()
        model = self.model if clients is None else self.model_of(clients)
        results = evaluate_client_splits(model, state, self.features, self.labels,
                                         [[self.splits[split][c] for c in ids] for split in splits],
                                         batched=self.batched, threads=self.client_threads)
        return dict(zip(splits, results))

    def evaluate_personalized(self, personal: State | list[State], split: str = "test") -> tuple[Tensor, Tensor]:
        """Accuracy and loss [N] of every client's model: `personal` is a State [N, ...], or in a
        heterogeneous cell a list with one State per group (rows: `group_clients[g]`)."""
        return self.evaluate_personalized_splits(personal, (split,))[split]

    def evaluate_personalized_splits(self, personal: State | list[State],
                                     splits: tuple[str, ...]) -> dict[str, tuple[Tensor, Tensor]]:
        """`evaluate_personalized` on several splits in one pass: split -> (accuracy, loss)."""
        if not self.heterogeneous:
            return self.evaluate_splits(personal, splits)
        results = {}
        for split in splits:
            accuracy = torch.full((self.num_clients,), float("nan"), device=self.device)
            results[split] = (accuracy, accuracy.clone())
        for g, ids in enumerate(self.group_clients):
            if len(ids):
                for split, (accuracy, loss) in self.evaluate_splits(personal[g], splits, ids).items():
                    results[split][0][ids], results[split][1][ids] = accuracy, loss
        return results


@dataclass
class CellResult:
    status: str                       # "finished" | "diverged" | "failed"
    metrics: pd.DataFrame             # per eval round and client: accuracy, loss, val_accuracy, bytes, ...
    rounds: pd.DataFrame              # per round: bytes_up, bytes_down, train_loss, wall_time
    summary: dict
    artifacts: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None


def worst_fraction_mean(values: np.ndarray, fraction: float = 0.1) -> float:
    """Mean of the worst `fraction` of clients (at least one)."""
    count = max(1, math.ceil(fraction * len(values)))
    return float(np.sort(values)[:count].mean())


def prepare_cell(cell: CellConfig, data_root=None, mirror=None):
    """Load the cell's dataset and its (cached, shared) partition. Raises clear errors early."""
    from pflbench.data import data_root as resolve_root, load_dataset
    from pflbench.partitioning import make_splits

    dataset = load_dataset(cell.dataset, root=data_root, mirror=mirror, **cell.dataset_options)
    splits = make_splits(dataset.labels.numpy(), dataset.num_classes, scheme=cell.partition,
                         params=cell.partition_params, num_clients=cell.clients, seed=cell.seed,
                         train_fraction=cell.train_fraction, val_fraction=cell.val_fraction,
                         cache_dir=Path(resolve_root(data_root)) / "cache" / "partitions",
                         dataset_key=f"{cell.dataset}-{dataset.checksum}")
    return dataset, splits


def check_evaluated(evaluate: tuple[str, ...]) -> tuple[str, ...]:
    evaluate = tuple(dict.fromkeys(evaluate))
    if not evaluate or any(name not in EVALUATED for name in evaluate):
        raise ValueError(f"evaluate must name one or both of {EVALUATED}, got {evaluate!r}")
    return evaluate


def run_cell(cell: CellConfig, *, data_root=None, mirror=None, device: str = "cpu",
             client_batching: str = "auto", compiled_training: str = "off", channels_last: str = "auto",
             client_threads: str = "auto", on_round: Callable[[dict], None] | None = None,
             evaluate: tuple[str, ...] = EVALUATED) -> CellResult:
    """Run one cell to the end. Divergence is a result (status "diverged"), not an exception;
    any other exception propagates to the caller (the runner records it as failed).

    `evaluate` lists the splits evaluated every eval round; without "test" (hyperparameter tuning:
    `evaluate=("val",)`) the test indices are withheld from the run altogether (see `Federation`)."""
    evaluate = check_evaluated(evaluate)
    algorithm_cls = get_algorithm(cell.algorithm)
    hp = algorithm_cls.parse_hyperparams(cell.hp)
    algorithm_cls.check_models(cell.model)  # a heterogeneous cell needs an algorithm that supports it
    shifts.resolve(cell.feature_shift, cell.concept_shift, cell.clients)  # a bad shift setting, before any work
    algorithm_cls.check_knobs(cell)  # system / privacy knobs the algorithm cannot honour
    check_unseen(cell)  # newcomers: an algorithm that cannot serve them is refused before any work
    dataset, splits = prepare_cell(cell, data_root, mirror)
    fed = Federation(cell, dataset, splits, device, client_batching, algorithm_cls.batched,
                     withhold_test="test" not in evaluate, compiled_training=compiled_training,
                     channels_last=channels_last, client_threads=client_threads)
    algorithm = algorithm_cls(fed, hp)
    return run_rounds(fed, algorithm, on_round=on_round, evaluate=evaluate, provenance={
        "dataset_checksum": dataset.checksum, "torch": torch.__version__, "device": fed.device.type})


def run_round(algorithm: Algorithm, rnd: int, clients: Tensor, timing: dict | None = None) -> tuple[State, State]:
    """One round of the algorithm's hooks; returns what was sent down and what reached the server
    (with dropped uploads or DP, one dict per client, {} for a dropped one). `timing`, if given, gets
    the seconds of local training ("train"); the other hooks are the server's share."""
    fed = algorithm.fed
    download = algorithm.configure(rnd, clients)
    state = algorithm.receive(rnd, clients, download)
    fed.local_round = rnd  # stragglers cut this round's local work
    train_start = time.perf_counter()
    try:
        state = algorithm.local_train(rnd, clients, state)
    finally:
        fed.local_round = None
    if timing is not None:
        timing["train"] = time.perf_counter() - train_start
    upload = algorithm.send(rnd, clients, state)
    arrived = fed.arrived(rnd, clients)
    engine_dp = fed.privacy is not None and algorithm.dp_upload in ("model", "update")
    if arrived is None and not engine_dp:
        algorithm.aggregate(rnd, clients, upload)
        return download, upload
    received = (privatize_upload(fed.privacy, algorithm.dp_upload, rnd,
                                 torch.as_tensor(fed.client_ids)[clients.cpu()], download, upload, arrived)
                if engine_dp else [u if arrived is None or arrived[k] else {}
                                   for k, u in enumerate(_per_client(upload, len(clients)))])
    positions = torch.arange(len(clients), device=clients.device)
    if arrived is not None:
        positions = positions[arrived]
    if isinstance(upload, dict):  # restack what arrived, as the algorithm's aggregate expects (without
        # the tensors that never leave a client under DP: pflbench.privacy, BatchNorm statistics)
        stacked = {n: torch.stack([received[k][n] for k in positions.tolist()]) if len(positions)
                   else t[:0] for n, t in upload.items() if not len(positions) or n in received[int(positions[0])]}
    else:
        stacked = [received[k] for k in positions.tolist()]
    algorithm.aggregate_arrived(rnd, clients, stacked, positions)
    return download, received


def _per_client(upload, count: int) -> list:
    """An upload as one dict per client (rows of a stacked State, or the list it already is)."""
    if isinstance(upload, list):
        return upload
    return [{n: t[k] for n, t in upload.items()} for k in range(count)]


METRIC_COLUMNS = ["round", "client", "accuracy", "loss", "val_accuracy", "val_loss",
                  "accuracy_adapted", "loss_adapted", "val_accuracy_adapted", "val_loss_adapted",
                  "test_samples", "val_samples", "bytes_down", "bytes_up", "wall_time"]
ROUND_COLUMNS = ["round", "clients", "bytes_down", "bytes_up", "wall_time", "adapt_time",
                 "train_time", "server_time", "eval_time"]  # seconds per round: local training,
# the other hooks (configure/receive/send/aggregate), forming and scoring the personalized models


def run_rounds(fed: Federation, algorithm: Algorithm, on_round=None, provenance: dict | None = None,
               evaluate: tuple[str, ...] = EVALUATED) -> CellResult:
    """The cell's rounds, with every client's personalized model evaluated on the `evaluate` splits
    every eval_every rounds (columns of a split not evaluated are NaN). With the cell's
    `finetune_epochs` > 0 the same models are also scored after local adaptation (`*_adapted`
    columns; `Algorithm.adapt`), which never feeds back into training; its seconds are counted
    apart (`adapt_time`), not in the round's `wall_time`. `on_round` gets, after each round,
    {round, rounds, mean_accuracy, mean_val_accuracy} (the latest evaluation, or None)."""
    evaluate = check_evaluated(evaluate)
    cell = fed.cell
    algorithm.setup()
    metric_rows, round_rows, artifacts = [], [], {}
    status, diverged_round, error = "finished", None, None
    adapt_diverged: list[int] = []
    test_samples, val_samples = fed.split_sizes("test").tolist(), fed.split_sizes("val").tolist()
    start = time.perf_counter()
    last_eval: dict | None = None
    missing = (torch.full((fed.num_clients,), math.nan),) * 2
    newcomer_flag = {} if fed.newcomers is None else {"newcomer": False}
    newcomer_time = 0.0
    for rnd in range(1, cell.rounds + 1):
        round_start = time.perf_counter()
        clients = torch.as_tensor(fed.schedule[rnd - 1], device=fed.device)
        timing: dict = {}
        try:
            download, upload = run_round(algorithm, rnd, clients, timing)
        except Diverged as err:
            status, diverged_round, error = "diverged", rnd, f"round {rnd}: {err}"
            break
        bytes_down, bytes_up = payload_bytes(download), payload_bytes(upload)
        round_rows.append({"round": rnd, "clients": len(clients),
                           "bytes_down": int(bytes_down.sum()), "bytes_up": int(bytes_up.sum()),
                           "wall_time": time.perf_counter() - round_start, "adapt_time": 0.0})
        round_rows[-1].update(train_time=timing["train"], eval_time=0.0,  # timing breakdown
                              server_time=round_rows[-1]["wall_time"] - timing["train"])
        if rnd % cell.eval_every == 0 or rnd == cell.rounds:
            eval_start = time.perf_counter()  # timing breakdown
            try:  # forming personalized models may train too (e.g. FedBABU's fine-tuning)
                personal = algorithm.personalized()
            except Diverged as err:
                status, diverged_round, error = "diverged", rnd, f"round {rnd}: {err}"
                break
            results = algorithm.evaluate_splits(personal, evaluate)
            watched = evaluate[0]  # the test loss; the val loss where only val is evaluated (tuning)
            if not torch.isfinite(results[watched][1]).all():
                status, diverged_round, error = "diverged", rnd, f"round {rnd}: non-finite {watched} loss"
                break
            round_rows[-1]["eval_time"] = time.perf_counter() - eval_start  # timing breakdown
            adapted = {}
            if cell.finetune_epochs:
                adapt_start = time.perf_counter()
                try:  # a model that diverges when adapted leaves that round's adapted scores NaN
                    tuned = algorithm.adapt_locally(personal, rnd, cell.finetune_epochs)
                    adapted = algorithm.evaluate_splits(tuned, evaluate)
                except Diverged:
                    adapt_diverged.append(rnd)
                del personal
                round_rows[-1]["adapt_time"] = time.perf_counter() - adapt_start
            accuracy, loss = results.get("test", missing)
            val_accuracy, val_loss = results.get("val", missing)
            accuracy_a, loss_a = adapted.get("test", missing)
            val_accuracy_a, val_loss_a = adapted.get("val", missing)
            sent_down = dict(zip(clients.tolist(), bytes_down.tolist()))
            sent_up = dict(zip(clients.tolist(), bytes_up.tolist()))
            for c in range(fed.num_clients):
                metric_rows.append({
                    "round": rnd, "client": int(fed.client_ids[c]), "accuracy": float(accuracy[c]), "loss": float(loss[c]),
                    "val_accuracy": float(val_accuracy[c]), "val_loss": float(val_loss[c]),
                    "accuracy_adapted": float(accuracy_a[c]), "loss_adapted": float(loss_a[c]),
                    "val_accuracy_adapted": float(val_accuracy_a[c]), "val_loss_adapted": float(val_loss_a[c]),
                    "test_samples": test_samples[c], "val_samples": val_samples[c],
                    "bytes_down": sent_down.get(c, 0), "bytes_up": sent_up.get(c, 0),
                    "wall_time": time.perf_counter() - start, **newcomer_flag})
            if fed.newcomers is not None:  # unseen clients: their models scored apart (pflbench.newcomers)
                rows, seconds = score_newcomers(algorithm, fed.newcomers, rnd, evaluate, cell.finetune_epochs)
                metric_rows.extend({**row, "wall_time": time.perf_counter() - start} for row in rows)
                newcomer_time += seconds
            for key, value in algorithm.artifacts().items():
                artifacts[f"{key}_round{rnd:05d}"] = value
            last_eval = {"mean_accuracy": float(accuracy.mean()) if "test" in results else None,
                         "mean_val_accuracy": float(val_accuracy.mean()) if "val" in results else None}
        if on_round is not None:
            on_round({"round": rnd, "rounds": cell.rounds,
                      **(last_eval or {"mean_accuracy": None, "mean_val_accuracy": None})})
    metrics = pd.DataFrame(metric_rows, columns=METRIC_COLUMNS + list(newcomer_flag))
    rounds = pd.DataFrame(round_rows, columns=ROUND_COLUMNS)
    extra = {} if evaluate == EVALUATED else {"evaluated": list(evaluate)}
    if fed.system is not None:  # what the system knob did, for the report
        ran = fed.client_ids[fed.schedule[: len(rounds)]]  # partition ids
        extra.update({"system_stragglers": np.flatnonzero(fed.system.straggler).tolist(),
                      "system_dropped_uploads": int(np.take_along_axis(fed.system.dropped[: len(ran)], ran, 1).sum()),
                      "system_mean_work": float(np.take_along_axis(fed.system.work[: len(ran)], ran, 1).mean())})
    if fed.privacy is not None:
        extra.update(fed.privacy.summary())
    extra.update({f"{part}_time_total": float(rounds[f"{part}_time"].sum())  # timing breakdown
                  for part in ("train", "server", "eval")})
    extra.update(compiled_training=fed.compiled, channels_last=fed.channels_last,
                 client_threads=fed.client_threads if not fed.batched else 1,
                 compile_seconds=float(sum(m.compile_seconds for m in fed.models)))
    if cell.finetune_epochs:
        extra.update({"adapt_time_total": float(rounds["adapt_time"].sum()),
                      "adapt_diverged_rounds": adapt_diverged})
    if fed.newcomers is not None:
        extra.update({"newcomers": fed.newcomers.client_ids.tolist(), "newcomer_time_total": newcomer_time})
    summary = summarize(metrics, rounds, status, diverged_round, fed, time.perf_counter() - start,
                        {**(provenance or {}), **extra})
    return CellResult(status, metrics, rounds, summary, artifacts, error)


def summarize(metrics: pd.DataFrame, rounds: pd.DataFrame, status: str, diverged_round, fed: Federation,
              wall_time: float, provenance: dict) -> dict:
    summary = {"status": status, "rounds_completed": int(len(rounds)), "diverged_round": diverged_round,
               "bytes_down_total": int(rounds["bytes_down"].sum()), "bytes_up_total": int(rounds["bytes_up"].sum()),
               "wall_time": wall_time, "model": fed.model_name,
               "client_batching": "batched" if fed.batched else "loop", **provenance}
    everyone, metrics = metrics, trained_rows(metrics)  # newcomers' rows have their own summaries
    summary.update(newcomer_summary(everyone, protocol_summary))
    if len(metrics):
        summary.update(protocol_summary(metrics, ""))
        summary.update(protocol_summary(metrics, "_adapted"))
        per_round = metrics.groupby("round")["accuracy"].mean()
        if per_round.notna().all():  # selection on the test split: kept, and only ever shown labeled so
            summary.update({"best_accuracy": float(per_round.max()), "best_round": int(per_round.idxmax())})
    return summary


def protocol_summary(metrics: pd.DataFrame, model: str = "") -> dict:
    """The summaries of one scored model (`model`: "" as delivered, "_adapted" after local adaptation):

    - `final_accuracy{model}`: mean over clients at the last evaluation round, with
      `final_worst10_accuracy{model}`, `final_loss{model}` and `final_accuracy{model}_pooled` (pooled
      over all clients' test samples: sample-weighted, as pFedHN's code reports);
    - `bestval_accuracy{model}`: the mean test accuracy at `bestval_round{model}`, the round whose
      mean *validation* accuracy is highest (the first such round), with the same variants; no
      summary here selects a round on the test split;
    - `final_val_accuracy{model}`, `best_val_accuracy{model}`.
    A round whose clients are not all scored (split withheld, adaptation diverged) is never selected."""
    out: dict = {}
    test, val = f"accuracy{model}", f"val_accuracy{model}"
    if test not in metrics or val not in metrics:  # stores written before the column existed
        return out
    last_round = metrics["round"].max()

    def at(rnd: int, key: str) -> None:
        rows = metrics[metrics["round"] == rnd]
        values = rows[test].to_numpy(dtype=float)
        out[f"{key}_accuracy{model}"] = float(values.mean())
        out[f"{key}_worst10_accuracy{model}"] = worst_fraction_mean(values)
        if key == "final":
            out[f"final_loss{model}"] = float(rows[f"loss{model}"].mean())
        if "test_samples" in rows and rows["test_samples"].sum() > 0:
            weights = rows["test_samples"].to_numpy(dtype=float)
            out[f"{key}_accuracy{model}_pooled"] = float((values * weights).sum() / weights.sum())

    grouped = metrics.groupby("round")
    scored = grouped[test].apply(lambda v: v.notna().all())
    if scored.get(last_round, False):
        at(last_round, "final")
    val_scored = grouped[val].apply(lambda v: v.notna().all())
    if val_scored.get(last_round, False):
        out[f"final_val_accuracy{model}"] = float(metrics.loc[metrics["round"] == last_round, val].mean())
    val_mean = grouped[val].mean()[val_scored]
    if len(val_mean):
        out[f"best_val_accuracy{model}"] = float(val_mean.max())
        chosen = val_mean[scored.reindex(val_mean.index, fill_value=False)]
        if len(chosen):
            rnd = int(chosen.idxmax())
            out[f"bestval_round{model}"] = rnd
            at(rnd, "bestval")
    return out
