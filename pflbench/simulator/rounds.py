"""The round driver: the whole life of one cell (dataset -> partition -> rounds -> metrics).

`run_cell` is what the runner, the sweep and the tests call; `run_rounds` drives an algorithm's hooks
round by round on a built `Federation` (`pflbench bench` and tests call it and `run_round` directly).
A round, as driven here (`run_round`; the hooks are `pflbench.algorithm.Algorithm`'s, each given the
round's context, a frozen `pflbench.round_context.Round` made by `Federation.round`):

    download = configure; state = receive; state = local_train; upload = send (a Payload whose uploads
    lost to system.dropout are marked); aggregate on the uploads that arrived. A server that updates
    after each client gets each client's upload during local_train instead: the method hands it over
    with `rnd.deliver` (the round's channel to the server, `with_server`), and aggregate_client
    receives it unless dropout lost it. The method is the cell's as `build_cell` builds it: a knob
    that acts on the method wraps it there, once (`pflbench.simulator.cell_method`); the driver knows no knob.
    every eval_every rounds (and the last): score personalized() on the evaluated splits, after local
    adaptation too (finetune_epochs), and the newcomers' models in a cell with unseen clients, each
    population through its own `pflbench.serving.Serving`.

Divergence is a result (status "diverged"), not an exception; any other exception propagates to the
caller (the runner records it as failed).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pflbench import streams
from pflbench.algorithm import Algorithm, AnyAlgorithm, get_algorithm
from pflbench.simulator.cell_method import cell_method, check_cell_method
from pflbench.config import CellConfig
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.federation import EVALUATED, Federation, federation_device
from pflbench.simulator.metrics import METRIC_COLUMNS, ROUND_COLUMNS, client_rows, summarize
from pflbench.newcomers.scoring import score_newcomers
from pflbench.payload import Payload
from pflbench.round_context import ClientRound
from pflbench.serving import Serving, score
from pflbench.simulator.training import Diverged
from pflbench.api_types import CellResult as CellResult  # defined with the method API's types

if TYPE_CHECKING:
    from pflbench.data.dataset import Dataset
    from pflbench.data.partitioning import ClientSplits

    # What the round loop asks of its checkpointer: pflbench.storage.checkpoint.Checkpointer, not imported here even
    # for type checking (that would pull pflbench.storage.checkpoint into the engine's import cycle).
    class Resumed(Protocol):
        @property
        def round(self) -> int: ...
        @property
        def elapsed(self) -> float: ...
        @property
        def loop(self) -> dict: ...

    class RoundCheckpointer(Protocol):
        def resume(
            self, fed: Federation, algorithm: AnyAlgorithm, provenance: dict | None = None
        ) -> Resumed | None: ...
        def after_round(
            self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float
        ) -> None: ...
        def summary(self) -> dict: ...


def prepare_cell(
    cell: CellConfig, data_root: str | Path | None = None, mirror: str | Path | None = None
) -> tuple[Dataset, ClientSplits]:
    """Load the cell's dataset and its (cached, shared) partition. Raises clear errors early."""
    from pflbench.data import data_root as resolve_root, load_dataset
    from pflbench.data.partitioning import make_splits

    dataset = load_dataset(cell.dataset, root=data_root, mirror=mirror, **cell.dataset_options)
    splits = make_splits(
        dataset.labels.numpy(),
        dataset.num_classes,
        scheme=cell.partition,
        params=cell.partition_params,
        num_clients=cell.clients,
        seed=cell.seed,
        train_fraction=cell.train_fraction,
        val_fraction=cell.val_fraction,
        cache_dir=Path(resolve_root(data_root)) / "cache" / "partitions",
        dataset_key=f"{cell.dataset}-{dataset.checksum}",
    )
    return dataset, splits


def check_evaluated(evaluate: tuple[str, ...]) -> tuple[str, ...]:
    evaluate = tuple(dict.fromkeys(evaluate))
    if not evaluate or any(name not in EVALUATED for name in evaluate):
        raise ValueError(f"evaluate must name one or both of {EVALUATED}, got {evaluate!r}")
    return evaluate


def run_cell(
    cell: CellConfig,
    *,
    data_root: str | Path | None = None,
    mirror: str | Path | None = None,
    execution: ExecutionOptions = ExecutionOptions(),
    on_round: Callable[[dict], None] | None = None,
    evaluate: tuple[str, ...] = EVALUATED,
    checkpointer: RoundCheckpointer | None = None,
    stop_after: int | None = None,
) -> CellResult:
    """Run one cell to the end (or its first `stop_after` rounds: `run_rounds`). A cell from a spec is
    resolved already (`pflbench.simulator.resolve`); any other is resolved here first, through the same checks (a
    ValueError names what is wrong).

    `evaluate` lists the splits evaluated every eval round; without "test" (hyperparameter tuning:
    `evaluate=("val",)`) the test indices are withheld from the run altogether (see `Federation`).
    `checkpointer` (a `pflbench.storage.checkpoint.Checkpointer`): resume from and write round checkpoints."""
    from pflbench.simulator.resolve import ensure_resolved

    evaluate = check_evaluated(evaluate)
    cell = ensure_resolved(cell)
    dataset, splits = prepare_cell(cell, data_root, mirror)
    with cell_global_rng(cell.seed, federation_device(execution)):
        fed, algorithm = build_cell(cell, dataset, splits, execution, withhold_test="test" not in evaluate)
        return run_rounds(
            fed,
            algorithm,
            on_round=on_round,
            evaluate=evaluate,
            checkpointer=checkpointer,
            stop_after=stop_after,
            provenance={"dataset_checksum": dataset.checksum, "torch": torch.__version__, "device": fed.device.type},
        )


def build_cell(
    cell: CellConfig, dataset: Dataset, splits: ClientSplits, execution: ExecutionOptions, withhold_test: bool = False
) -> tuple[Federation, Algorithm]:
    """The cell's Federation and its method (the algorithm with the cell's hyperparameters, as the cell's
    knobs run it: `pflbench.simulator.cell_method`), from `prepare_cell`'s data; call it inside `cell_global_rng`,
    as `run_cell` does."""
    algorithm_cls = get_algorithm(cell.algorithm)
    fed = Federation(cell, dataset, splits, execution, algorithm_cls.capabilities.batched, withhold_test=withhold_test)
    return fed, cell_method(algorithm_cls, cell, fed)


@contextmanager
def cell_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """torch's global generator seeded from the cell's seed for the cell's run, the caller's state
    restored after it. What draws from it (dropout layers: MobileNetV3, VGG8) then draws the same in any
    process, whatever ran there before: a Ray worker runs cell after cell, `--no-ray` runs a whole plan
    in one process, and `pflbench rerun`/`verify` run one cell alone. Everything else random is drawn
    from named streams of the cell's seed (pflbench.streams; this one is "global")."""
    devices = [device.index or 0] if device.type == "cuda" else []
    # `streams.torch_global`'s fork without its lock: the cell holds this generator for its whole run
    with torch.random.fork_rng(devices=devices):
        streams.seed_torch_global(seed, "global")
        yield


def run_round(
    algorithm: Algorithm, rnd: int, clients: Tensor, timing: dict | None = None, fed: Federation | None = None
) -> tuple[Payload, Payload]:
    """One round of the algorithm's hooks, each given the round's context (`Federation.round`); returns
    what was sent down and what the clients sent up (the uploads lost to `system.dropout` marked, and
    counted 0 bytes). Only the uploads that arrived are aggregated, and nothing when none did. `timing`,
    if given, gets the seconds of local training ("train"); the other hooks are the server's share.
    `fed`: the cell's Federation (default: the one the algorithm was built with, its `engine`). A method
    that a knob of the cell would wrap, built by hand, is refused (`check_cell_method`, as `run_rounds`)."""
    fed = fed if fed is not None else cast(Federation, algorithm.engine)
    check_cell_method(algorithm, fed)
    context = fed.round(rnd, clients)
    download = algorithm.configure(context)
    configured = with_server(algorithm, fed, context.with_download(download))
    state = algorithm.receive(configured, download)
    train_start = time.perf_counter()
    state = algorithm.local_train(configured, state)
    if timing is not None:
        timing["train"] = time.perf_counter() - train_start
    upload = algorithm.send(configured, state).delivered(fed.arrived(rnd, clients))
    arrived = upload.arrived()
    if len(arrived):
        algorithm.aggregate(configured, arrived)
    return download, upload


def with_server(algorithm: Algorithm, fed: Federation, rnd: ClientRound) -> ClientRound:
    """`rnd` with the engine's channel to the server (`ClientRound.deliver`): one client's upload, handed
    over during local training, reaches `algorithm.aggregate_client` unless `system.dropout` loses it;
    `deliver` returns what arrived (None: lost). `algorithm` is the method as the round runs it (a
    knob's wrapper may change what leaves the client on the way)."""

    def deliver(upload: Payload) -> Payload | None:
        arrived = upload.delivered(fed.arrived(served, upload.clients)).arrived()
        if not len(arrived):
            return None
        algorithm.aggregate_client(served, arrived)
        return arrived

    served = dataclasses.replace(rnd, deliver=deliver)
    return served


class CellRecord:
    """What a running cell has recorded so far: per-client metrics rows, per-round rows, artifacts,
    and how it ended (status, the round it diverged at). A round checkpoint keeps `LOOP` of it."""

    LOOP = ("metric_rows", "round_rows", "artifacts", "adapt_diverged", "newcomer_time", "last_eval")

    def __init__(self, fed: Federation):
        self.start = time.perf_counter()
        self.metric_rows: list[dict] = []
        self.round_rows: list[dict] = []
        self.artifacts: dict[str, np.ndarray] = {}
        self.status: str = "finished"
        self.diverged_round: int | None = None
        self.error: str | None = None
        self.adapt_diverged: list[int] = []
        self.newcomer_time = 0.0
        self.last_eval: dict | None = None
        # metrics columns of every row (client_rows's **flags: after *sizes, a dict[str, bool] there
        # reads to mypy as if it could fill val_samples)
        self.flags: dict[str, Any] = {} if fed.newcomers is None else {"newcomer": False}
        self.sizes = fed.split_sizes("test").tolist(), fed.split_sizes("val").tolist()  # per client, fixed

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def loop_state(self) -> dict:
        return {key: getattr(self, key) for key in self.LOOP}

    def restore(self, loop: dict, elapsed: float) -> None:
        """Continue from a checkpoint's record (its wall time counted as already spent)."""
        for key in self.LOOP:
            setattr(self, key, loop[key])
        self.start -= elapsed

    def diverged(self, rnd: int, why: Exception | str) -> None:
        self.status, self.diverged_round, self.error = "diverged", rnd, f"round {rnd}: {why}"

    def add_round(
        self, rnd: int, clients: Tensor, download: Payload, upload: Payload, seconds: float, train_seconds: float
    ) -> tuple[Tensor, Tensor]:
        bytes_down, bytes_up = download.nbytes, upload.nbytes
        self.round_rows.append(
            {
                "round": rnd,
                "clients": len(clients),
                "bytes_down": int(bytes_down.sum()),
                "bytes_up": int(bytes_up.sum()),
                "wall_time": seconds,
                "adapt_time": 0.0,
                "train_time": train_seconds,
                "eval_time": 0.0,
                "server_time": seconds - train_seconds,
            }
        )
        return bytes_down, bytes_up

    def add_clients(self, rows: list[dict]) -> None:
        now = self.elapsed()
        self.metric_rows.extend({**row, "wall_time": now} for row in rows)


def run_rounds(
    fed: Federation,
    algorithm: Algorithm,
    on_round: Callable[[dict], None] | None = None,
    provenance: dict | None = None,
    evaluate: tuple[str, ...] = EVALUATED,
    checkpointer: RoundCheckpointer | None = None,
    stop_after: int | None = None,
    set_up: bool = False,
) -> CellResult:
    """The cell's rounds of `algorithm`, the cell's method as `build_cell` builds it (a method built by
    hand that a knob of the cell would wrap is refused before anything runs, naming what builds it as
    the cell runs it: `pflbench.simulator.cell_method.check_cell_method`), with every client's personalized model evaluated on the `evaluate` splits
    every eval_every rounds (columns of a split not evaluated are NaN). With the cell's
    `finetune_epochs` > 0 the same models are also scored after local adaptation (`*_adapted`
    columns; `Algorithm.adapt_locally`), which never feeds back into training; its seconds are counted
    apart (`adapt_time`), not in the round's `wall_time`. `on_round` gets, after each round,
    {round, rounds, mean_accuracy, mean_val_accuracy} (the latest evaluation, or None), the round's row
    (`round_row`: bytes, seconds) and the per-client rows this round's evaluation added (`client_rows`:
    empty between evaluations) — the same rows the result's tables will hold.
    `checkpointer` (pflbench.storage.checkpoint): asked once for a checkpoint to resume from, told at the end
    of every round (it writes one when due). `stop_after`: run only rounds 1..stop_after of the cell
    as configured (nothing else changes: its schedule, evaluation rounds and knobs' plans are the full
    run's), so their metrics are the full run's first rounds (`pflbench verify --rounds`); the summary
    says `stopped_after`. `set_up`: the algorithm's `setup` has run already (`pflbench.simulator.groups`)."""
    evaluate = check_evaluated(evaluate)
    check_cell_method(algorithm, fed)  # a method built by hand that the cell's knobs would wrap: refused
    cell = fed.cell
    if not set_up:
        algorithm.setup()
    record = CellRecord(fed)
    first_round = 1
    resumed = checkpointer.resume(fed, algorithm, provenance) if checkpointer is not None else None
    if resumed is not None:  # continue after the checkpoint's round, with what the loop had recorded
        first_round = resumed.round + 1
        record.restore(resumed.loop, resumed.elapsed)
    last_round = cell.rounds if stop_after is None else max(0, min(cell.rounds, stop_after))
    for rnd in range(first_round, last_round + 1):
        round_start = time.perf_counter()
        clients = torch.as_tensor(fed.schedule[rnd - 1], device=fed.device)
        timing: dict = {}
        try:
            download, upload = run_round(algorithm, rnd, clients, timing, fed)
        except Diverged as err:
            record.diverged(rnd, err)
            break
        sent = record.add_round(rnd, clients, download, upload, time.perf_counter() - round_start, timing["train"])
        scored = len(record.metric_rows)
        if (rnd % cell.eval_every == 0 or rnd == cell.rounds) and not evaluate_round(
            fed, algorithm, rnd, clients, sent, evaluate, record
        ):
            break
        if on_round is not None:
            on_round(
                {
                    "round": rnd,
                    "rounds": cell.rounds,
                    **(record.last_eval or {"mean_accuracy": None, "mean_val_accuracy": None}),
                    "round_row": dict(record.round_rows[-1]),
                    "client_rows": record.metric_rows[scored:],
                }
            )
        algorithm.check_state()  # an attribute a checkpoint would lose fails the cell (pflbench.algorithm)
        if checkpointer is not None:
            checkpointer.after_round(rnd, fed, algorithm, record.loop_state(), record.elapsed())
    metrics = pd.DataFrame(record.metric_rows, columns=METRIC_COLUMNS + list(record.flags))
    rounds = pd.DataFrame(record.round_rows, columns=ROUND_COLUMNS)
    facts = {
        "model": fed.model_name,
        "client_batching": "batched" if fed.batched else "loop",
        **(provenance or {}),
        **cell_facts(fed, algorithm, rounds, record, evaluate),
        **(checkpointer.summary() if checkpointer is not None else {}),
        **({"stopped_after": last_round} if last_round < cell.rounds else {}),
    }
    summary = summarize(metrics, rounds, record.status, record.diverged_round, record.elapsed(), facts)
    return CellResult(
        record.status, metrics, rounds, summary, record.artifacts, record.error, type(algorithm).card.as_dict()
    )


def evaluate_round(
    fed: Federation,
    algorithm: Algorithm,
    rnd: int,
    clients: Tensor,
    sent: tuple[Tensor, Tensor],
    evaluate: tuple[str, ...],
    record: CellRecord,
) -> bool:
    """Score every client's personalized model at round `rnd` (and after adaptation, and the
    newcomers'), into `record`; False when the cell diverged here."""
    eval_start = time.perf_counter()
    serving = Serving(rnd, fed, adapt_epochs=fed.cell.finetune_epochs)  # the trained clients
    try:  # forming personalized models may train too (e.g. FedBABU's fine-tuning)
        personal = algorithm.personalized()
    except Diverged as err:
        record.diverged(rnd, err)
        return False
    scores = score(algorithm, serving, personal, evaluate)
    watched = evaluate[0]  # the test loss; the val loss where only val is evaluated (tuning)
    if not torch.isfinite(scores[watched][1]).all():
        record.diverged(rnd, f"non-finite {watched} loss")
        return False
    record.round_rows[-1]["eval_time"] = time.perf_counter() - eval_start
    adapted = {}
    if serving.adapt_epochs:
        adapt_start = time.perf_counter()
        try:  # a model that diverges when adapted leaves that round's adapted scores NaN
            adapted = score(algorithm, serving, algorithm.adapt_locally(serving, personal), evaluate)
        except Diverged:
            record.adapt_diverged.append(rnd)
        record.round_rows[-1]["adapt_time"] = time.perf_counter() - adapt_start
    del personal
    bytes_down, bytes_up = (dict(zip(clients.tolist(), values.tolist())) for values in sent)  # by position
    record.add_clients(
        client_rows(rnd, fed.client_ids, scores, adapted, *record.sizes, bytes_down, bytes_up, **record.flags)
    )
    if fed.newcomers is not None:  # unseen clients: served through their own context (pflbench.newcomers)
        newcomers = Serving(rnd, fed.newcomers, newcomers=True, adapt_epochs=fed.cell.finetune_epochs)
        rows, seconds = score_newcomers(algorithm, newcomers, evaluate)
        record.add_clients(rows)
        record.newcomer_time += seconds
    for key, value in algorithm.artifacts().items():
        record.artifacts[f"{key}_round{rnd:05d}"] = value
    record.last_eval = {"mean_accuracy": _mean(scores, "test"), "mean_val_accuracy": _mean(scores, "val")}
    return True


def _mean(scores: dict, split: str) -> float | None:
    return float(scores[split][0].mean()) if split in scores else None


def cell_facts(
    fed: Federation, algorithm: Algorithm, rounds: pd.DataFrame, record: CellRecord, evaluate: tuple[str, ...]
) -> dict:
    """How the cell ran and what its knobs did, for the summary."""
    facts: dict[str, Any] = {} if evaluate == EVALUATED else {"evaluated": list(evaluate)}
    if fed.system is not None:  # what the system knob did, for the report
        ran = fed.client_ids[fed.schedule[: len(rounds)]]  # partition ids
        facts.update(
            {
                "system_stragglers": np.flatnonzero(fed.system.straggler).tolist(),
                "system_dropped_uploads": int(np.take_along_axis(fed.system.dropped[: len(ran)], ran, 1).sum()),
                "system_mean_work": float(np.take_along_axis(fed.system.work[: len(ran)], ran, 1).mean()),
            }
        )
    facts.update(algorithm.facts())  # the method's (a knob's wrapper adds its own: pflbench.simulator.cell_method)
    facts.update({f"{part}_time_total": float(rounds[f"{part}_time"].sum()) for part in ("train", "server", "eval")})
    facts.update(
        compiled_training=fed.compiled,
        channels_last=fed.channels_last,
        client_threads=fed.client_threads if not fed.batched else 1,
        compile_seconds=float(sum(m.compile_seconds for m in fed.models)),
    )
    if fed.cell.finetune_epochs:
        facts.update(
            {"adapt_time_total": float(rounds["adapt_time"].sum()), "adapt_diverged_rounds": record.adapt_diverged}
        )
    if fed.newcomers is not None:
        facts.update({"newcomers": fed.newcomers.client_ids.tolist(), "newcomer_time_total": record.newcomer_time})
    return facts
