"""`pflbench run SPEC`: run every cell of a spec that has no result yet, in parallel on Ray (a local
instance by default, an existing cluster with --ray-address/RAY_ADDRESS) or in this process
(--no-ray, --workers 1), with a live progress display, and record each cell in the results store.

One cell never stops the others: an exception is recorded as "failed" with its traceback, a NaN as
"diverged". Results and round checkpoints are written into the driver's store only, so a cluster
needs no shared results folder (pflbench/run/checkpoint_relay.py). Every node needs the data: a worker on
another node than the driver's checks that it has the dataset and partition the driver prepared, and
its cell fails with one message naming the node and the path where it does not (pflbench/run/node_data.py;
a worker never downloads).

Preemption (pflbench/run/preemption.py): SIGTERM or a first Ctrl-C stops a run's running cells at the end
of the round in progress, with a checkpoint of that round (or at once when the round has not ended
within `grace_seconds`; that round's work is lost), starts no new cell, and ends the run with
`PREEMPTED_EXIT` and one line naming each stopped cell and the round the next run resumes at. On Ray
the driver passes the stop to its cells through the progress board (`BoardStop`). A second Ctrl-C
cancels the running cells and exits at once (130); their results are simply absent, and the next run
starts them again from their last checkpoints.

A full disk (pflbench/storage/store.py's `DiskFull`: a checkpoint, a result or a claim that cannot be written for
lack of space): the cell being run or recorded stops without a result (its previous checkpoint, if
any, stays whole), no further cell is started, and the run ends with `DISK_FULL_EXIT` and one line
naming the file, the bytes it needed, the bytes free and the round the next run resumes the cell at.
Finished cells stay as they are; a run after space is freed continues.

Out of memory: a cell that cannot allocate (MemoryError; torch's CPU allocator failing, "can't
allocate memory"; torch.OutOfMemoryError on a GPU), and a Ray worker that Ray's memory monitor kills
(`ray.exceptions.OutOfMemoryError`), are reported as "out of memory (peak N MB)" with the cell (the
peak: the process's largest resident set, as the cell's last round reported it on Ray); a Ray cell is
retried at most `retries` times like any lost worker, then recorded as failed with that reason. A
worker the kernel's OOM killer ends (a cgroup's memory limit) is, to Ray, a worker that died
(WorkerCrashedError): it is told apart by the kernel's count of OOM kills of the worker's memory
cgroup, which rose since the cell's last round (pflbench/run/oom_kills.py), and named and retried the same
way ("out of memory (peak N MB): the kernel's OOM killer ended its worker"); the peak is the one the
cell's last round reported.

Round checkpoints (pflbench/storage/checkpoint.py): a running cell writes `<results>/<hash>/checkpoint.pt`
by the `checkpoint_every` / `checkpoint_minutes` policy, and a run that finds one continues the cell
from it ("resumed at round R of N"): after a kill, a Ctrl-C, a runner taking over an abandoned claim,
or a Ray worker or node that was lost. A lost worker's cell is retried up to `retries` times (then it
is "failed") and resumes from its checkpoint. On Ray a cell's checkpoints go through a keeper actor on
the driver's node into the driver's store (pflbench/run/checkpoint_relay.py), so a retry resumes from the
last one on whichever node it lands, the lost node's included. A cell group's cells (pflbench/simulator/groups.py)
are recorded each as it finishes: on Ray their results are relayed to the driver while the group's
other cells run (pflbench/run/result_relay.py); in-process each is written from its own thread
(`GroupRecorder`). A finished or diverged cell's checkpoint is removed once its result is
written (`keep_checkpoints` keeps it); a failed cell's is kept, so the next run continues it.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from pflbench.storage.checkpoint import DEFAULT_MINUTES, CheckpointFile, CheckpointPolicy, Checkpointer
from pflbench.config import CellConfig, cell_hash
from pflbench.run.display import PROBLEMS, Display, label, make_console, print_summary
from pflbench.simulator.execution import ExecutionOptions
from pflbench.run.preemption import (
    DEFAULT_GRACE_SECONDS,
    PREEMPTED_EXIT,
    Preempted,
    Preemption,
    StopRequest,
    keeping_signals,
    running_cell,
)
from pflbench.run.node_data import DataFingerprint, NodeDataError, check_node_data, fingerprint
from pflbench.run.ray_cluster import ClusterError, connect_ray, on_driver_node, ray_capacity, task_resources, this_node
from pflbench.run.spec import Plan, Resources, describe_partition
from pflbench.storage.store import COMPLETE, DAMAGED, HEARTBEAT, SET_ASIDE, DiskFull, Store
from pflbench.run.trackers import CellTracking, TrackerOptions, cell_tracking

if TYPE_CHECKING:
    from pflbench.run.checkpoint_relay import RelayedCheckpointFile
    from pflbench.simulator.groups import GroupRun
    from pflbench.simulator.rounds import CellResult

    # Where a cell's checkpoint is read and written: this machine's files, or on a Ray worker the keeper's
    # (a RelayedCheckpointFile has CheckpointFile's methods; `Checkpointer` names only CheckpointFile).
    CheckpointFiles = CheckpointFile | RelayedCheckpointFile


@dataclass(frozen=True)
class RunOptions:
    results: Path = Path("results")
    data_root: Path | None = None  # None: $PFLBENCH_DATA or ./data
    mirror: Path | None = None  # None: $PFLBENCH_DATA_MIRROR
    use_ray: bool = True
    workers: int | None = None  # cells at once; None: as many as Ray's resources allow
    ray_address: str | None = None
    force: bool = False  # rerun cells that already have a result
    execution: ExecutionOptions = ExecutionOptions()  # how cells run (device None: cuda for cells given GPUs)
    checkpoint_every: int = 0  # rounds between round checkpoints (0: by time only)
    checkpoint_minutes: float = DEFAULT_MINUTES  # at most this much wall time between checkpoints (0: not by time)
    keep_checkpoints: bool = False  # leave a finished cell's last checkpoint in the store
    keep_checkpoints_from: int = 0  # also keep a copy of every checkpoint from this round on (<store>/_kept/; 0: none)
    retries: int = 2  # Ray: reruns of a cell whose worker was lost (it resumes from its checkpoint)
    trackers: TrackerOptions = TrackerOptions()  # stream each cell's rounds to TensorBoard/W&B/MLflow (trackers.py)
    grace_seconds: float = (
        DEFAULT_GRACE_SECONDS  # after SIGTERM: how long the round in progress may take (preemption.py)
    )

    def __post_init__(self) -> None:
        _ = self.checkpoint_policy  # ValueError before any work
        if not self.grace_seconds >= 0:
            raise ValueError(f"grace seconds must be >= 0, got {self.grace_seconds!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {self.retries!r}")

    @property
    def checkpoint_policy(self) -> CheckpointPolicy:
        return CheckpointPolicy(
            self.checkpoint_every, self.checkpoint_minutes, self.keep_checkpoints, self.keep_checkpoints_from
        )

    plugins: tuple = ()  # the plugins the cells use, shipped to Ray workers (pflbench.loader.plugins)


@dataclass
class RunReport:
    outcomes: dict[str, str | None]  # every planned cell's hash -> its status after the run
    ran: int = 0
    elsewhere: int = 0  # cells another runner sharing the store had finished or was running
    skipped_datasets: dict[str, int] = field(default_factory=dict)  # optional dataset -> cells left out
    interrupted: bool = False
    stopped: RunStopped | None = None  # why the run stopped before its last cell (preempted, disk full)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.stopped is not None:
            return self.stopped.exit_code
        return 1 if any(status in PROBLEMS for status in self.outcomes.values()) else 0


class PrepareError(RuntimeError):
    """A cell's dataset or partition cannot be made; nothing has run."""


# ---- one cell, wherever it runs -----------------------------------------------------------------


def peak_mb() -> int:
    """This process's largest resident set so far, in MB (Linux reports ru_maxrss in KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def out_of_memory(peak: int | None) -> str:
    """The reason a cell that ran out of memory is given (one line)."""
    return f"out of memory (peak {peak} MB)" if peak is not None else "out of memory (peak not reported)"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: MemoryError, torch's OutOfMemoryError (CUDA) or its
    CPU allocator's RuntimeError (what a memory limit, e.g. RLIMIT_AS or an overcommit policy, gives)."""
    import torch

    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


def failed_result(error: str) -> CellResult:
    import pandas as pd

    from pflbench.simulator.rounds import CellResult

    return CellResult("failed", pd.DataFrame(), pd.DataFrame(), {"status": "failed"}, {}, error)


def cell_checkpointer(
    cell: CellConfig,
    options: RunOptions,
    note: Callable[[str], None] | None = None,
    files: CheckpointFiles | None = None,
    preemption: StopRequest | None = None,
) -> Checkpointer:
    """The cell's round checkpoints, next to its results in the store (`files`: read and written
    elsewhere than this machine's files, e.g. the driver's store from a Ray worker; `preemption`: where
    a stop is asked for, pflbench/run/preemption.py)."""
    root = Path(options.results)
    return Checkpointer(
        root / cell_hash(cell),
        cell,
        options.checkpoint_policy,
        set_aside_dir=root / SET_ASIDE,
        note=note,
        files=cast("CheckpointFile | None", files),
        preemption=preemption,
    )


def execute_cell(
    cell: CellConfig,
    resources: Resources,
    options: RunOptions,
    report: Callable[[dict], None] | None = None,
    note: Callable[[str], None] | None = None,
    checkpoints: bool = True,
    stop_after: int | None = None,
    checkpoint_files: CheckpointFiles | None = None,
    preemption: StopRequest | None = None,
) -> CellResult:
    """Run one cell here (the driver or a Ray worker) with torch limited to the cell's CPU share,
    continuing from its checkpoint if it has one (`note` gets "resumed at round R of N" and the like).
    Returns a CellResult; an exception becomes a "failed" result carrying its traceback.
    `checkpoints=False`: from round 1, no checkpoint read or written (a rerun that checks the stored
    result must not trust, or leave, one); `stop_after`: only the first rounds (`run_rounds`);
    `checkpoint_files`: where the checkpoint is kept, if not in the store's folder on this machine;
    `preemption`: a stop on SIGTERM / Ctrl-C raises `Preempted` (with the rounds done and the round the
    next run resumes at), never a failed result (pflbench/run/preemption.py)."""
    import torch

    from pflbench.simulator.rounds import run_cell
    from pflbench.loader.plugins import activate
    from pflbench.run.cost import measured

    # Threads beyond the cell's share oversubscribe the cores that the other cells use; on a busy
    # 2-core machine that made a small cell 10-100x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(options.execution.threads or max(1, int(resources.cpus)))
    # Trackers (trackers.py), here: on the Ray worker or in this process, the cell's run continued on resume.
    tracking = cell_tracking(cell, options.trackers, Path(options.results), note) if checkpoints else None
    on_round = report if tracking is None else _tracked(tracking, report)
    result: CellResult | None = None
    checkpointer = cell_checkpointer(cell, options, note, checkpoint_files, preemption) if checkpoints else None
    try:
        activate(options.plugins, cell)  # a Ray worker loads the user's plugins (the driver has them)
        execution = options.execution.on("cuda" if resources.gpus > 0 else "cpu")
        with running_cell(preemption):
            # peak memory and machine (pflbench/run/cost.py); the device is decided (`on`): a str
            result = measured(
                cast(str, execution.device),
                lambda: run_cell(
                    cell,
                    data_root=options.data_root,
                    mirror=options.mirror,
                    execution=execution,
                    on_round=on_round,
                    checkpointer=checkpointer,
                    stop_after=stop_after,
                ),
            )
    except Preempted as stop:
        if stop.in_round and checkpointer is not None:  # stopped by the deadline: what the checkpointer knows
            stop.rounds_done, stop.resumes_at = checkpointer.rounds_done, checkpointer.latest_round
        raise
    except DiskFull:  # not the cell's failure: the machine's (its result could not be written either)
        raise
    except Exception as error:  # out of memory: the traceback, then the reason as its last line (the summary's "error")
        oom = f"{out_of_memory(peak_mb())}\n" if is_out_of_memory(error) else ""
        result = failed_result(traceback.format_exc() + oom)
    finally:
        torch.set_num_threads(threads)
        if tracking is not None and result is not None:
            tracking.finish(result)
    return result


def _tracked(tracking: CellTracking | None, report: Callable[[dict], None] | None) -> Callable[[dict], None]:
    """The round loop's callback: the cell's trackers get each round, then `report` (where given)."""

    def on_round(info: dict) -> None:
        if tracking is not None:
            tracking.on_round(info)
        if report is not None:
            report(info)

    return on_round


def _posting(board: Any, key: str) -> Callable[[dict], None]:
    """A Ray cell's round reports, posted to the progress board as the driver's display needs them."""
    return lambda info: board.post.remote(key, progress_of(info))


def _noting(board: Any, key: str) -> Callable[[str], None]:
    """A Ray cell's notes, posted to the progress board."""
    return lambda text: board.note.remote(key, text)


# ---- executors ----------------------------------------------------------------------------------

DISK_FULL_EXIT = 74  # sysexits' EX_IOERR: a write failed for lack of space; free some and run again


class RunStopped(Exception):
    """The run stopped before its last cell; `line` says why, where and how it continues (one line);
    `exit_code`: PREEMPTED_EXIT or DISK_FULL_EXIT."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line)
        self.line, self.exit_code = line, exit_code


def disk_full_line(full: DiskFull, cell: CellConfig | None, store: Store, others: tuple[CellConfig, ...] = ()) -> str:
    """The one line a run stopped by a full disk ends with (module doc): `cell`, the one whose write failed,
    and `others`, the cells stopped with it (on Ray: those running at the time, cancelled)."""
    line = f"{full}; the run stopped starting cells"
    if cell is not None:
        line += f"; cell {cell_hash(cell)} ({label(cell)}) has no result and the next run {resumes(cell, store)}"
    for other in others:
        line += f"; cell {cell_hash(other)} ({label(other)}) stopped with it: the next run {resumes(other, store)}"
    return line + "; free space and run the same command again"


def resumes(cell: CellConfig, store: Store) -> str:
    """Where the next run continues `cell`, from the checkpoint in the store ("resumes it at round 4 of 12")."""
    at = checkpoint_round(cell, store)
    return (
        f"resumes it at round {at} of {cell.rounds}"
        if at is not None
        else "starts it from round 1 (it has no checkpoint)"
    )


def preempted_line(stop: Preempted, cell: CellConfig | None, grace_seconds: float) -> str:
    """The one line a preempted run ends with: the cell, the round, where the next run resumes."""
    if cell is None:
        return f"preempted ({stop.signal}) between cells: no cell was running; run the same command again to continue"
    return f"preempted ({stop.signal}): {stopped_cell(stop, cell, grace_seconds)}"


def stopped_cell(stop: Preempted, cell: CellConfig, grace_seconds: float) -> str:
    """One preempted cell, in words: the round it stopped at, where the next run resumes it."""
    return f"cell {cell_hash(cell)} ({label(cell)}): {stopped_at(stop, cell.rounds, grace_seconds)}"


def stopped_at(stop: Preempted, rounds: int, grace_seconds: float) -> str:
    """Where a preempted cell or sweep trial of `rounds` rounds stopped and where the next run resumes it."""
    where = next_run(stop.resumes_at, rounds)
    if stop.in_round and stop.rounds_done is None:
        done = f"still in a round {grace_seconds:g} s after the signal, stopped at once"
    elif stop.in_round:
        assert stop.rounds_done is not None  # (the branch above)
        done = f"round {stop.rounds_done + 1} of {rounds} had not ended {grace_seconds:g} s after the signal"
    elif stop.checkpoint_error:
        done = f"stopped after round {stop.rounds_done} of {rounds} without a checkpoint ({stop.checkpoint_error})"
    else:
        done = f"checkpoint written after round {stop.rounds_done} of {rounds}"
    return f"{done}; {where}"


def next_run(resumes_at: int | None, rounds: int) -> str:
    """Where the next run continues a stopped cell or trial whose checkpoint is of round `resumes_at`."""
    return (
        f"the next run resumes at round {resumes_at} of {rounds}"
        if resumes_at is not None
        else "the next run starts it from round 1 (it has no checkpoint)"
    )


def execute_group(
    cells: list[CellConfig],
    resources: Resources,
    options: RunOptions,
    reports: list[Callable[[dict], None] | None],
    notes: list[Callable[[str], None] | None],
    preemption: StopRequest | None = None,
    checkpoint_files: list[CheckpointFiles | None] | None = None,
    on_finished: Callable[[int, CellResult], None] | None = None,
) -> GroupRun:
    """Run `cells` here (the driver or a Ray worker) as one cell group (pflbench.simulator.groups), each
    continuing from its checkpoint if it has one, with torch limited to one cell's CPU share
    `resources` (in lock-step one cell computes at a time). `reports[i]`, `notes[i]`,
    `checkpoint_files[i]`: cell i's, as `execute_cell` takes them. Returns a `pflbench.simulator.groups.GroupRun`:
    per cell what `execute_cell` would return (a failed cell carries its traceback), or, for a cell
    stopped by a preemption or a full disk, that exception (`stopped`). Each cell's summary gets the
    group's peak memory until the cell finished, and the machine. `on_finished(i, result)`: cell i's
    result, complete, as soon as the cell finishes (pflbench.simulator.groups.run_group), on the cell's thread."""
    import torch

    from pflbench.run.cost import measuring
    from pflbench.simulator.groups import GroupRun, run_group
    from pflbench.loader.plugins import activate

    threads = torch.get_num_threads()
    torch.set_num_threads(options.execution.threads or max(1, int(resources.cpus)))
    execution = options.execution.on("cuda" if resources.gpus > 0 else "cpu")
    checkpoint_files = checkpoint_files or [None] * len(cells)
    trackings = [cell_tracking(cell, options.trackers, Path(options.results), note) for cell, note in zip(cells, notes)]
    on_round: list[Callable[[dict], None] | None] = [
        _tracked(tracking, report) for tracking, report in zip(trackings, reports)
    ]
    checkpointers = [
        cell_checkpointer(cell, options, note, files, preemption)
        for cell, note, files in zip(cells, notes, checkpoint_files)
    ]
    outcome: GroupRun | None = None
    finished: set[int] = set()  # cells whose trackers are finished (their result handed on)
    try:
        for cell in cells:
            activate(options.plugins, cell)
        with running_cell(preemption), measuring(cast(str, execution.device)) as facts:  # the device is decided

            def finish(i: int, result: CellResult) -> None:
                result.summary.update(facts())  # the group's peak memory so far, and the machine
                tracking = trackings[i]
                finished.add(i)
                if tracking is not None:
                    tracking.finish(result)
                if on_finished is not None:
                    on_finished(i, result)

            outcome = run_group(
                cells,
                data_root=options.data_root,
                mirror=options.mirror,
                execution=execution,
                checkpointers=checkpointers,
                on_round=on_round,
                passthrough=(Preempted, DiskFull),
                on_finished=finish,
            )
    except (Preempted, DiskFull):  # the grace deadline (raised in this thread), a full disk: the caller's
        raise
    except Exception as error:  # the group itself could not run (a plugin, the machine): each cell fails alike
        oom = f"{out_of_memory(peak_mb())}\n" if is_out_of_memory(error) else ""
        failed = failed_result(traceback.format_exc() + oom)
        outcome = GroupRun([failed] * len(cells), [None] * len(cells), [False] * len(cells), [None] * len(cells))
    finally:
        torch.set_num_threads(threads)
        for i, (tracking, result) in enumerate(
            zip(trackings, outcome.results if outcome is not None else [None] * len(cells))
        ):
            if tracking is not None and result is not None and i not in finished:
                tracking.finish(result)
    return outcome


def run_in_process(
    cells: list[CellConfig],
    plan: Plan,
    options: RunOptions,
    store: Store,
    display: Display,
    preemption: Preemption | None = None,
) -> None:
    """The cells one by one in this process, or as cell groups where the execution options form them
    (`run_groups_in_process`); `RunStopped` when `preemption` stops the run (module doc)."""
    import torch

    if plan.resources.gpus > 0 and not torch.cuda.is_available():
        raise PrepareError(
            f"the spec asks for {plan.resources.gpus:g} GPU per cell but this machine has none; "
            f"run with --set resources.gpus=0"
        )
    preemption = preemption or Preemption()
    if options.execution.grouped(options.execution.device or ("cuda" if plan.resources.gpus > 0 else "cpu")):
        run_groups_in_process(cells, plan, options, store, display, preemption)
        return
    for cell in cells:
        if preemption.requested:
            raise RunStopped(
                preempted_line(
                    Preempted(cast(str, preemption.signal)),
                    None,  # requested: a signal
                    preemption.grace_seconds,
                ),
                PREEMPTED_EXIT,
            )
        try:
            if not take(cell, store, options, display):
                continue
            display.update(cell, {"round": 0})
            with preemption.cell_running():
                result = execute_cell(
                    cell,
                    plan.resources,
                    options,
                    report=partial(display.update, cell),
                    note=partial(display.note, cell),
                    preemption=preemption,
                )
            record(cell, result, store, options, display)
        except Preempted as stop:
            store.release(cell)  # no result: the next run continues it from its checkpoint
            raise RunStopped(preempted_line(stop, cell, preemption.grace_seconds), PREEMPTED_EXIT) from None
        except DiskFull as full:
            store.release(cell)
            raise RunStopped(disk_full_line(full, cell, store), DISK_FULL_EXIT) from None


def run_groups_in_process(
    cells: list[CellConfig], plan: Plan, options: RunOptions, store: Store, display: Display, preemption: Preemption
) -> None:
    """`run_in_process` with cell groups (pflbench.simulator.groups.form_groups): a group's cells are claimed
    together, run together and recorded each as a cell alone is, as soon as it finishes (`GroupRecorder`:
    a cell of few rounds is in the store while its group's slower cells run, and a kill then loses only
    those). On a preemption every running cell stops at the end of its round with a checkpoint (the
    first cell to end its round ends the grace deadline for the others, which end theirs in lock-step),
    and the run ends with one line naming each."""
    from pflbench.simulator.groups import form_groups

    for group in form_groups(cells):
        if preemption.requested:
            raise RunStopped(
                preempted_line(
                    Preempted(cast(str, preemption.signal)),
                    None,  # requested: a signal
                    preemption.grace_seconds,
                ),
                PREEMPTED_EXIT,
            )
        taken: list[CellConfig] = []
        recorder = GroupRecorder(taken, store, options, display)
        try:
            taken += [cell for cell in group if take(cell, store, options, display)]
            if not taken:
                continue
            for cell in taken:
                display.update(cell, {"round": 0})
            with preemption.cell_running():
                outcome = execute_group(
                    taken,
                    plan.resources,
                    options,
                    [partial(display.update, cell) for cell in taken],
                    [partial(display.note, cell) for cell in taken],
                    preemption,
                    on_finished=recorder.finished,
                )
        except Preempted as stop:  # the grace deadline, inside a round: no cell still running has a result
            unfinished = recorder.close()
            for cell in unfinished:
                store.release(cell)
            raise RunStopped(
                f"preempted ({stop.signal}): "
                + "; ".join(stopped_cell(stop, cell, preemption.grace_seconds) for cell in unfinished),
                PREEMPTED_EXIT,
            ) from None
        except DiskFull as full:
            for cell in recorder.close():
                store.release(cell)
            raise RunStopped(disk_full_line(full, taken[0] if taken else None, store), DISK_FULL_EXIT) from None
        recorder.close()
        preempted: list[str] = []
        first_full: tuple[BaseException, CellConfig] | None = None
        for i, (cell, result, stopped_by) in enumerate(zip(taken, outcome.results, outcome.stopped)):
            if i in recorder.recorded and recorder.recorded[i] is None:
                continue  # recorded as it finished
            if stopped_by is not None:
                store.release(cell)  # no result: the next run continues it from its checkpoint
                if isinstance(stopped_by, Preempted):
                    preempted.append(stopped_cell(stopped_by, cell, preemption.grace_seconds))
                else:
                    first_full = first_full or (stopped_by, cell)
                continue
            try:
                if i not in recorder.recorded:  # not handed on as it finished (the group itself failed)
                    record(cell, result, store, options, display)
                else:
                    raise cast(Exception, recorder.recorded[i])  # recording it failed, on the cell's thread
            except DiskFull as error:
                for rest in taken[i:]:
                    store.release(rest)
                raise RunStopped(disk_full_line(error, cell, store), DISK_FULL_EXIT) from None
        if first_full is not None:  # a DiskFull (run_group's passthrough: Preempted or DiskFull)
            raise RunStopped(disk_full_line(cast(DiskFull, first_full[0]), first_full[1], store), DISK_FULL_EXIT)
        if preempted:
            raise RunStopped(f"preempted ({preemption.signal}): " + "; ".join(preempted), PREEMPTED_EXIT)


class GroupRecorder:
    """Records the cells of an in-process group, each as it finishes (`finished`: `execute_group`'s
    `on_finished`, on the cell's thread), as `record` records a cell alone: a cell of few rounds is in
    the store, its checkpoint removed and its claim released while its group's slower cells still run,
    so a run killed then resumes only those. A recording's error (a full disk) is kept for the caller,
    which handles it once the group has ended (`recorded[i]`: None, or the error). Once `close`d (the
    run stops), a cell finishing late is not recorded: its claim is given up and the next run
    continues it from its checkpoint."""

    def __init__(self, cells: list[CellConfig], store: Store, options: RunOptions, display: Display) -> None:
        import threading

        self.cells, self.store, self.options, self.display = cells, store, options, display
        self.recorded: dict[int, Exception | None] = {}
        self.lock = threading.Lock()  # one recording at a time; `close` waits for one under way
        self.closed = False

    def finished(self, i: int, result: CellResult) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                record(self.cells[i], result, self.store, self.options, self.display)
                self.recorded[i] = None
            except Exception as error:
                self.recorded[i] = error

    def close(self) -> list[CellConfig]:
        """No more recordings; the cells not recorded."""
        with self.lock:
            self.closed = True
            return [cell for i, cell in enumerate(self.cells) if i not in self.recorded]


def record(cell: CellConfig, result: CellResult, store: Store, options: RunOptions, display: Display) -> None:
    """Write a cell's result, then drop its checkpoint (a failed cell keeps it: the next run continues)."""
    store.write(cell, result)
    if result.status in COMPLETE and not options.keep_checkpoints:
        store.remove_checkpoint(cell)
    store.release(cell)
    display.done(cell, result)


def take(cell: CellConfig, store: Store, options: RunOptions, display: Display) -> bool:
    """Whether this runner runs `cell` now: not if another runner sharing the store finished it
    meanwhile or holds its claim (the claim is ours when this returns True)."""
    if not options.force and store.status(cell) in COMPLETE:
        display.elsewhere += 1
        return False
    if not store.claim(cell):
        display.elsewhere += 1
        return False
    if not options.force and store.status(cell) in COMPLETE:  # finished between the check and the claim
        store.release(cell)
        display.elsewhere += 1
        return False
    if store.took_over(cell) and checkpoint_round(cell, store) is None:  # else "resumed at round R" follows
        display.note(cell, NO_CHECKPOINT)
    return True


# A cell whose runner was killed (its claim abandoned) before it wrote a checkpoint, e.g. a cell shorter than
# --checkpoint-minutes (default 5) without --checkpoint-every: said, not restarted silently.
NO_CHECKPOINT = "no checkpoint: starting from round 1 (an earlier run of this cell was stopped before it wrote one)"


class Heartbeat:
    """Refreshes this runner's claims every HEARTBEAT seconds while cells run (a daemon thread)."""

    def __init__(self, store: Store):
        import threading

        self.store, self.stop = store, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="pflbench-claims")

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            self.store.heartbeat()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.store.release_all()  # interrupted or crashed cells are free for the next runner at once


class ProgressBoard:
    """A Ray actor (no CPU) that running cells post their latest round to; the driver polls it."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}
        self.notes: list[tuple[str, str]] = []
        self.stop: str | None = None  # the signal the driver was stopped by (pflbench/run/preemption.py)

    def post(self, key: str, info: dict) -> None:
        self.latest[key] = info

    def note(self, key: str, text: str) -> None:
        self.notes.append((key, text))

    def latest_of(self, key: str) -> dict | None:
        return self.latest.get(key)

    def snapshot(self) -> tuple[dict[str, dict], list[tuple[str, str]]]:
        """The latest round of every cell, and the notes posted since the last snapshot."""
        notes, self.notes = self.notes, []
        return self.latest, notes

    def request_stop(self, signal_name: str) -> None:
        """The driver was asked to stop (pflbench/run/preemption.py): its cells stop at the end of their round."""
        self.stop = signal_name

    def stop_requested(self) -> str | None:
        return self.stop


def start_board() -> Any:  # a Ray actor handle of a ProgressBoard
    """A ProgressBoard as a Ray actor on the driver's node (no CPU): a lost node must not take it along."""
    import ray

    return ray.remote(num_cpus=0)(ProgressBoard).options(scheduling_strategy=on_driver_node()).remote()


class BoardStop:
    """A Ray worker's `StopRequest`: the driver's stop, read from the progress board (at most every
    `every` seconds, so a cell of short rounds does not wait on the board each round)."""

    def __init__(self, board: Any, every: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.board, self.every, self.clock = board, every, clock
        self.signal: str | None = None
        self._asked = float("-inf")

    @property
    def requested(self) -> bool:
        import ray

        if self.signal is None and self.clock() - self._asked >= self.every:
            self._asked = self.clock()
            self.signal = ray.get(self.board.stop_requested.remote())
        return self.signal is not None

    def round_ended(self) -> None:
        pass


def _ray_task(
    cell: CellConfig,
    resources: Resources,
    options: RunOptions,
    board: Any,
    checkpoint_files: CheckpointFiles | None,
    data: DataFingerprint | None,
) -> CellResult | Preempted:
    """One attempt of a cell on a Ray worker: its progress to `board`, its checkpoints through
    `checkpoint_files` (the driver's store), its data checked first where this is not the driver's node."""
    from pflbench.run.oom_kills import OomKills

    key = cell_hash(cell)
    board.post.remote(key, {"round": 0, "oom_kills": OomKills.here()})  # the count a death in round 1 is judged by
    missing = node_data_problem(cell, data)
    if missing is not None:
        return missing
    try:
        return execute_cell(
            cell,
            resources,
            options,
            report=lambda info: board.post.remote(key, progress_of(info)),
            note=lambda text: board.note.remote(key, text),
            checkpoint_files=checkpoint_files,
            preemption=BoardStop(board),
        )
    except Preempted as stop:  # handed back as a value: the driver records no result
        return stop


def node_data_problem(cell: CellConfig, data: DataFingerprint | None) -> CellResult | None:
    """On a Ray worker on another node than the driver's: the failed result of a cell whose data this
    node lacks (one message naming the node and the path), else None."""
    import ray

    if data is None or data.driver_node == ray.get_runtime_context().get_node_id():
        return None
    try:
        check_node_data(cell, data, this_node())
    except NodeDataError as error:
        return failed_result(str(error))
    except Exception:
        return failed_result(traceback.format_exc())
    return None


def _ray_group_task(
    cells: list[CellConfig],
    resources: Resources,
    options: RunOptions,
    board: Any,
    checkpoint_files: list[CheckpointFiles | None],
    data: list[DataFingerprint | None],
    relay: Any = None,
    attempts: list[int] | None = None,
) -> list:
    """One attempt of a cell group on a Ray worker (`_ray_task` for each of its cells, in one process as
    `execute_group` runs them): per cell, in order, its result, or the `Preempted` / `DiskFull` that
    stopped it (handed back as values: the driver records no result for it). A cell whose data this
    node lacks fails alone; the others run as the group. With `relay` (pflbench/run/result_relay.py) each
    cell's result goes to the driver as the cell finishes, under its attempt `attempts[i]`, and its
    place in the returned list says `RELAYED`."""
    import ray

    from pflbench.run.oom_kills import OomKills
    from pflbench.run.result_relay import RELAYED

    keys = [cell_hash(cell) for cell in cells]
    kills = OomKills.here()
    for key in keys:
        board.post.remote(key, {"round": 0, "oom_kills": kills})  # the count a death in round 1 is judged by
    outcomes: list = [node_data_problem(cell, fingerprint) for cell, fingerprint in zip(cells, data)]
    relayed: set[int] = set()

    def hand_on(i: int, result: CellResult) -> None:
        """Cell i's result to the driver now (cell i of `cells`); kept for the return value where refused."""
        if relay is not None and attempts is not None:
            try:
                accepted = ray.get(relay.put.remote(keys[i], attempts[i], result))
            except ray.exceptions.RayError:  # the relay is gone (the driver too): the return value carries it
                accepted = False
            if accepted:
                relayed.add(i)

    for i, outcome in enumerate(outcomes):
        if outcome is not None:
            hand_on(i, outcome)
    runnable = [i for i, outcome in enumerate(outcomes) if outcome is None]
    if runnable:
        try:
            run = execute_group(
                [cells[i] for i in runnable],
                resources,
                options,
                [_posting(board, keys[i]) for i in runnable],
                [_noting(board, keys[i]) for i in runnable],
                preemption=BoardStop(board),
                checkpoint_files=[checkpoint_files[i] for i in runnable],
                on_finished=lambda j, result: hand_on(runnable[j], result),
            )
        except (Preempted, DiskFull) as stop:  # the whole group's: every cell not finished stops without a result
            for i in runnable:
                outcomes[i] = stop
        else:
            for i, result, stopped_by in zip(runnable, run.results, run.stopped):
                outcomes[i] = stopped_by if stopped_by is not None else result
    return [RELAYED if i in relayed else outcome for i, outcome in enumerate(outcomes)]


def progress_of(info: dict) -> dict:
    """What the driver's progress display needs of a round's report (not its rows: those stay with the
    cell's trackers, on the worker), and what tells a worker killed for memory (its peak, the kernel's
    count of OOM kills: pflbench/run/oom_kills.py)."""
    from pflbench.run.oom_kills import OomKills

    return {
        **{key: info[key] for key in PROGRESS_KEYS if key in info},
        "peak_mb": peak_mb(),
        "oom_kills": OomKills.here(),
    }


PROGRESS_KEYS = ("round", "rounds", "mean_accuracy", "mean_val_accuracy")


def run_on_ray(
    cells: list[CellConfig],
    plan: Plan,
    options: RunOptions,
    store: Store,
    display: Display,
    data: dict[str, DataFingerprint] | None = None,
    preemption: Preemption | None = None,
) -> None:
    """Run `cells` as Ray tasks (`data`: each cell's DataFingerprint by hash, checked on other nodes), one
    task per cell, or per cell group where the execution options form groups (pflbench.simulator.groups: one task
    with `group_resources`; each of its cells is recorded as it finishes, its result relayed to the driver
    while the others run (pflbench/run/result_relay.py); a lost group is retried as a group of the cells it
    had not finished, each from its own checkpoint; `workers` then counts groups).
    A stop asked for through `preemption` reaches the running cells through the board: they stop at the
    end of their round with a checkpoint, or are cancelled `grace_seconds` after the signal; no other
    cell starts, and `RunStopped` says where each stopped cell resumes (module doc). The scheduling
    itself: `RayRun`."""
    import ray

    try:
        with keeping_signals():  # a SIGTERM while Ray starts reaches `preemption`
            owned = connect_ray(options.ray_address, options.workers, plan.resources.cpus)
    except ClusterError as error:
        raise PrepareError(str(error)) from None
    if preemption is not None:
        preemption.take_signals()  # ray.init replaced SIGTERM's handler with one that exits
    running: dict = {}  # each running unit's task (its ObjectRef) -> the unit's cells
    try:
        if plan.resources.gpus > 0 and not ray.cluster_resources().get("GPU", 0):
            raise PrepareError(
                f"the spec asks for {plan.resources.gpus:g} GPU per cell but the Ray cluster has "
                f"none; run with --set resources.gpus=0"
            )
        RayRun(cells, plan, options, store, display, data or {}, preemption, running).loop()
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        if owned:
            ray.shutdown()


class RayRun:
    """One `run_on_ray`'s scheduling: the units of work (a cell alone, or a cell group run as one task),
    the driver-side actors (progress board, checkpoint keeper, result relay), and one method per event of
    `loop`: a unit started, a grouped cell's result relayed, a unit's task ended or lost, a stop asked for,
    a full disk."""

    def __init__(
        self,
        cells: list[CellConfig],
        plan: Plan,
        options: RunOptions,
        store: Store,
        display: Display,
        data: dict[str, DataFingerprint],
        preemption: Preemption | None,
        running: dict,
    ) -> None:
        import ray

        from pflbench.run.checkpoint_relay import start_keeper
        from pflbench.simulator.groups import form_groups, group_resources
        from pflbench.run.result_relay import start_relay

        self.plan, self.options, self.store, self.display, self.preemption = plan, options, store, display, preemption
        self.running = running
        self.worker_options = replace(options, results=Path(options.results).absolute())  # checkpoints, from any cwd
        # On the driver's node, as the store: a lost node must take neither with it.
        self.board = start_board()
        self.keeper = start_keeper(self.worker_options.results)
        driver_node = ray.get_runtime_context().get_node_id()
        self.data = {key: replace(value, driver_node=driver_node) for key, value in data.items()}
        # A lost worker's cell is retried here, not by Ray, so that each retry is said and bounded.
        self.task = ray.remote(_ray_task).options(**task_resources(plan.resources))
        # Units of work: a cell alone, or a cell group (pflbench.simulator.groups) where the execution options form
        # them; a group is one task with the resources the group needs (`group_resources`).
        grouped = options.execution.grouped(options.execution.device or ("cuda" if plan.resources.gpus > 0 else "cpu"))
        self.waiting = form_groups(cells) if grouped else [[cell] for cell in cells]
        self.relay = start_relay() if grouped else None  # a group's cells' results, as each finishes
        self.recorded: set[str] = set()  # the cells of running groups whose results came through the relay
        self.attempts: dict[str, int] = {}
        self.by_key = {cell_hash(cell): cell for cell in cells}
        # Claim cells only as they can start, so that runners sharing the store split the matrix.
        widest = group_resources(plan.resources, max(map(len, self.waiting), default=1)) if grouped else plan.resources
        self.limit = options.workers or ray_capacity(ray.cluster_resources(), widest) or len(self.waiting)
        self.stopping_since: float | None = None
        self.latest_peak: dict[str, int] = {}  # each cell's worker's peak memory, as its last round reported it
        self.stopped: list[str] = []  # the preempted cells, in words
        self.stopped_keys: set[str] = set()  # and their hashes
        self.in_hand: list[CellConfig] = []  # the unit whose ended task is being handled (out of `running`)

    def loop(self) -> None:
        """Start units as capacity allows, record each as it ends, until none waits or runs (or a stop
        asked for has ended them all). Where the signal reached every process of the job at once (a
        scheduler's `scancel`, a Kubernetes pod's termination), Ray's own processes end with the driver's
        stop under way: a Ray error then is the job ending, not a fault (`ended_with_the_job`)."""
        import ray

        try:
            self.schedule()
        except (ray.exceptions.RayError, ConnectionError):
            if not self.signalled():
                raise
            self.ended_with_the_job()
        if self.stopping_since is not None or self.stopped:
            assert self.preemption is not None  # stopping: it was requested
            raise RunStopped(
                f"preempted ({self.preemption.signal}) on Ray: "
                + ("; ".join(self.stopped) if self.stopped else "no cell was running")
                + "; run the same command again to continue",
                PREEMPTED_EXIT,
            )

    def signalled(self, wait: float = 2.0) -> bool:
        """Whether a stop was asked for, allowing the signal `wait` seconds to reach this process after Ray's
        own processes (signalled at the same moment) were seen ending."""
        if self.preemption is None:
            return False
        deadline = time.monotonic() + wait
        while not self.preemption.requested and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs here, as soon as the signal arrives
        return self.preemption.requested

    def ended_with_the_job(self) -> None:
        """The signal ended Ray's processes (the keeper's and the workers' included): every unfinished cell
        stops where its last checkpoint in the store is, without another call to Ray (its processes are
        gone or going; a call could wait for them)."""
        assert self.preemption is not None and self.preemption.signal is not None  # (signalled)
        # The dropped tasks' errors are these workers' ends, said below: not Ray's "unhandled error" lines too.
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        units = [*self.running.values(), self.in_hand]
        cells = {cell_hash(cell): cell for unit in units for cell in self.unfinished(unit)}
        for cell in cells.values():
            if cell_hash(cell) not in self.stopped_keys:
                self.store.release(cell)
                self.stopped_keys.add(cell_hash(cell))
                self.stopped.append(
                    f"cell {cell_hash(cell)} ({label(cell)}): {ENDED_BY_THE_SIGNAL}; "
                    f"{next_run(checkpoint_round(cell, self.store), cell.rounds)}"
                )
        self.running.clear()
        self.stopping_since = self.stopping_since or time.monotonic()

    def schedule(self) -> None:
        """`loop`'s work: start, wait, record, show progress."""
        import ray

        while self.waiting or self.running:
            if self.preemption is not None and self.preemption.requested and self.stopping_since is None:
                self.stopping_since = time.monotonic()
                self.waiting.clear()
                ray.get(self.board.request_stop.remote(self.preemption.signal))
            if self.stopping_since is not None and time.monotonic() - self.stopping_since > self.options.grace_seconds:
                self.cancel_after_grace()
                break
            while self.waiting and len(self.running) < self.limit:
                taken = [cell for cell in self.waiting.pop(0) if take(cell, self.store, self.options, self.display)]
                if taken:
                    self.start(taken)
            done, _ = ray.wait(list(self.running), num_returns=1, timeout=0.5)
            self.drain()  # before the ended tasks' values: a relayed result has come in by the time its task ends
            for ref in done:
                self.ended(ref)
            self.show_progress()

    def unfinished(self, unit: list[CellConfig]) -> list[CellConfig]:
        """The cells of a running unit whose results have not come through the relay."""
        return [cell for cell in unit if cell_hash(cell) not in self.recorded]

    def drain(self) -> None:
        """Record each grouped cell whose result the relay received since the last drain."""
        import ray

        if self.relay is None:
            return
        for key, result in ray.get(self.relay.drain.remote()):
            cell = self.by_key[key]
            self.recorded.add(key)
            try:
                ray.get(self.keeper.close.remote(key))  # no late write of its checkpoint after this
            except ray.exceptions.RayError:
                pass
            try:
                record(cell, result, self.store, self.options, self.display)
            except DiskFull as error:
                raise self.disk_full(error, cell, [cell]) from None

    def start(self, unit: list[CellConfig]) -> None:
        """Open each cell's next attempt with the keeper (only it may write the cell's checkpoint), then run
        the cell, or the group, as one task."""
        import ray

        from pflbench.run.checkpoint_relay import RelayedCheckpointFile
        from pflbench.simulator.groups import group_resources

        files: list[CheckpointFiles | None] = []
        for cell in unit:
            key = cell_hash(cell)
            attempt = self.attempts.get(key, 0)
            ray.get(self.keeper.open.remote(key, attempt))
            if self.relay is not None and len(unit) > 1:
                ray.get(self.relay.open.remote(key, attempt))
            self.board.post.remote(key, {"round": 0})  # nothing of an earlier attempt is taken for this one's
            files.append(RelayedCheckpointFile(self.keeper, key, attempt))
        ref: ray.ObjectRef  # of a cell's outcome, or of a group's outcomes (a list)
        if len(unit) == 1:
            ref = self.task.remote(
                unit[0],
                self.plan.resources,
                self.worker_options,
                self.board,
                files[0],
                self.data.get(cell_hash(unit[0])),
            )
        else:
            group_task = ray.remote(_ray_group_task).options(
                **task_resources(group_resources(self.plan.resources, len(unit)))
            )
            ref = group_task.remote(
                unit,
                self.plan.resources,
                self.worker_options,
                self.board,
                files,
                [self.data.get(cell_hash(cell)) for cell in unit],
                self.relay,
                [self.attempts.get(cell_hash(cell), 0) for cell in unit],
            )
        self.running[ref] = unit

    def ended(self, ref: Any) -> None:
        """A unit's task ended: record each of its cells not yet recorded, or, where its worker was lost,
        retry the unit or record it failed (`lost`)."""
        import ray

        unit = self.in_hand = self.running.pop(ref)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayError as error:  # the worker died, was killed, ran out of memory
            outcome = self.lost(unit, error)
            if outcome is None:
                return
            unit, value = outcome
        full = None
        for i, (cell, result) in enumerate(zip(unit, value if len(unit) > 1 else [value])):
            if cell_hash(cell) in self.recorded:  # recorded as it finished: its place says RELAYED
                continue
            if isinstance(result, Preempted):
                self.stop(cell, result)
                continue
            try:
                ray.get(self.keeper.close.remote(cell_hash(cell)))  # no late write of a lost attempt after this
            except ray.exceptions.RayError:  # the keeper is gone: nothing can write through it either
                pass
            if isinstance(result, DiskFull):  # a group's cell stopped by a full disk: no result
                self.store.release(cell)
                full = full or (result, cell)
                continue
            try:
                record(cell, result, self.store, self.options, self.display)
            except DiskFull as error:
                raise self.disk_full(error, cell, unit[i:]) from None
        if full is not None:
            raise self.disk_full(full[0], full[1], []) from None

    def lost(self, unit: list[CellConfig], error: Exception) -> tuple[list[CellConfig], Any] | None:
        """A unit whose worker was lost: None where nothing is left to record (each cell recorded through
        the relay, stopped by a stop asked for, or started again: a retry, from its checkpoint), else the
        cells still to record and their failed results (a list for a group, as a group task returns)."""
        import ray

        if self.relay is not None and len(unit) > 1:  # what the lost group finished is recorded, and only that
            for cell in unit:
                ray.get(self.relay.close.remote(cell_hash(cell)))
            self.drain()
        unit = self.unfinished(unit)
        if not unit:
            return None
        if isinstance(error, DiskFull):  # the keeper could not write its checkpoint: as in process
            raise self.disk_full(error, unit[0], unit) from None
        if self.stopping_since is not None or self.signalled(wait=0):  # ended by the same signal: no retry now
            for cell in unit:
                self.stop(cell, None)
            return None
        whys = []
        for cell in unit:  # a group's cells were lost together: each is retried, from its checkpoint
            key = cell_hash(cell)
            self.attempts[key] = self.attempts.get(key, 0) + 1
            last = ray.get(self.board.latest_of.remote(key)) or {}  # what this attempt posted last
            oom = last.get("oom_kills")
            killed = oom is not None and not isinstance(error, ray.exceptions.OutOfMemoryError) and oom.rose()
            whys.append(worker_lost(error, last.get("peak_mb", self.latest_peak.get(key)), oom_killed=killed))
        tried = max(self.attempts[cell_hash(cell)] for cell in unit)
        retries = self.options.retries
        if tried <= retries:
            for cell, why in zip(unit, whys):
                self.display.note(
                    cell,
                    f"{why}; retry {tried} of {retries}, from its checkpoint where it has one"
                    + (f" (its group of {len(unit)} cells again)" if len(unit) > 1 else ""),
                )
            self.start(unit)
            return None
        value = [
            failed_result(f"Ray: {type(error).__name__}: {error}\n{why} (after {retries} retries)\n") for why in whys
        ]
        return unit, (value if len(unit) > 1 else value[0])

    def stop(self, cell: CellConfig, why: Preempted | None) -> None:
        """A preempted cell (`why`; None: its worker was ended by the signal too): no result; its claim and
        its attempt (keeper, relay) closed."""
        import ray

        try:
            ray.get(self.keeper.close.remote(cell_hash(cell)))
            if self.relay is not None:
                ray.get(self.relay.close.remote(cell_hash(cell)))
        except ray.exceptions.RayError:
            pass
        self.store.release(cell)
        self.stopped_keys.add(cell_hash(cell))
        if why is None:
            self.stopped.append(
                f"cell {cell_hash(cell)} ({label(cell)}): {ENDED_BY_THE_SIGNAL}; "
                f"{next_run(checkpoint_round(cell, self.store), cell.rounds)}"
            )
            return
        if why.in_round:
            why.resumes_at = checkpoint_round(cell, self.store)
        self.stopped.append(stopped_cell(why, cell, self.options.grace_seconds))

    def cancel_after_grace(self) -> None:
        """`grace_seconds` after a stop was asked for: what came through the relay recorded, every running
        unit cancelled, its unfinished cells stopped (that round's work lost)."""
        import ray

        self.drain()
        assert self.preemption is not None  # stopping: it was requested, so it has a signal
        for ref, unit in list(self.running.items()):
            ray.cancel(ref, force=True)
            for cell in self.unfinished(unit):
                self.stop(cell, Preempted(cast(str, self.preemption.signal), in_round=True))
        self.running.clear()

    def disk_full(self, full: BaseException, cell: CellConfig, unit: list[CellConfig]) -> RunStopped:
        """A full disk: the unit's cells released, every other running task cancelled; the line names each
        cell stopped without a result (the unit's and the cancelled tasks' unfinished cells)."""
        import ray

        stopped = dict.fromkeys(cell_hash(other) for other in unit)
        for other in unit:
            self.store.release(other)
        for ref, running in list(self.running.items()):
            ray.cancel(ref, force=True)
            for other in self.unfinished(running):
                self.store.release(other)
                stopped[cell_hash(other)] = None
        others = tuple(self.by_key[key] for key in stopped if key != cell_hash(cell))
        # a DiskFull, here or through the Ray errors that wrapped it
        return RunStopped(disk_full_line(cast(DiskFull, cause_of(full)), cell, self.store, others), DISK_FULL_EXIT)

    def show_progress(self) -> None:
        """The board's latest round of each running cell on the display, and the notes cells posted."""
        import ray

        latest, notes = ray.get(self.board.snapshot.remote())
        self.latest_peak.update({key: info["peak_mb"] for key, info in latest.items() if "peak_mb" in info})
        for key, text in notes:  # a cell that finished since it posted still gets its note
            if key in self.by_key:
                self.display.note(self.by_key[key], text)
        for unit in self.running.values():
            for cell in self.unfinished(unit):
                if cell_hash(cell) in latest:
                    self.display.update(cell, latest[cell_hash(cell)])


ENDED_BY_THE_SIGNAL = "its worker was ended by the same signal"


def worker_lost(error: Exception, peak: int | None, oom_killed: bool = False) -> str:
    """Why a cell's Ray worker was lost, in words: out of memory (Ray's memory monitor killed it, or,
    `oom_killed`, the kernel's OOM killer: pflbench/run/oom_kills.py) or lost."""
    import ray

    if isinstance(error, ray.exceptions.OutOfMemoryError):
        return out_of_memory(peak)
    if oom_killed:
        return f"{out_of_memory(peak)}: the kernel's OOM killer ended its worker ({type(error).__name__})"
    return f"Ray worker lost ({type(error).__name__}" + (
        f"; last reported peak {peak} MB)" if peak is not None else ")"
    )


def cause_of(error: BaseException) -> BaseException:
    """The exception a Ray error wraps, through every task and actor it crossed (a RayTaskError's
    text is its traceback; the cause's is the one line)."""
    while (cause := getattr(error, "cause", None)) is not None and cause is not error:
        error = cause
    return error


def checkpoint_round(cell: CellConfig, store: Store) -> int | None:
    """The round of the cell's checkpoint in the store (None: none, or unreadable)."""
    return round_of_checkpoint(store.checkpoint_path(cell))


def round_of_checkpoint(path: Path) -> int | None:
    """The round of the checkpoint at `path` (None: none, or unreadable)."""
    from pflbench.storage.checkpoint import CheckpointProblem, read_header

    try:
        return read_header(path)["round"]
    except (OSError, CheckpointProblem):
        return None


# ---- preparation ----------------------------------------------------------------------------------


def prepare_partitions(
    cells: list[CellConfig], plan: Plan, options: RunOptions, console: Console
) -> tuple[list[CellConfig], dict[str, int], dict[str, DataFingerprint]]:
    """Build every distinct partition once, before any training: workers then find it in the cache,
    and an impossible partition stops the run before it starts. Cells of an optional dataset that
    cannot be loaded here are left out; returns the cells to run, {dataset: cells left out} and each
    cell's DataFingerprint by hash (what a worker on another node checks: pflbench/run/node_data.py)."""
    from pflbench.data import DatasetNotFoundError
    from pflbench.simulator.rounds import prepare_cell

    groups: dict[tuple, CellConfig] = {}
    group_of: dict[str, tuple] = {}
    for cell in cells:
        key = (
            cell.dataset,
            json.dumps(cell.dataset_options, sort_keys=True),
            cell.partition,
            json.dumps(cell.partition_params, sort_keys=True),
            cell.clients,
            cell.seed,
            cell.train_fraction,
            cell.val_fraction,
        )
        groups.setdefault(key, cell)
        group_of[cell_hash(cell)] = key
    prints: dict[tuple, DataFingerprint] = {}
    driver = this_node()
    missing: set[str] = set()
    with console.status("") as status:
        for i, (key, cell) in enumerate(groups.items(), 1):
            if cell.dataset in missing:
                continue
            status.update(
                f"preparing partitions {i}/{len(groups)}: {cell.dataset} {describe_partition(cell)} "
                f"{cell.clients} clients seed {cell.seed}"
            )
            try:
                dataset, splits = prepare_cell(cell, options.data_root, options.mirror)
                # options.data_root: resolved by run_plan
                prints[key] = fingerprint(dataset, splits, cast(Path, options.data_root), options.mirror, driver)
                del dataset, splits
            except DatasetNotFoundError as error:
                if cell.dataset not in plan.optional_datasets:
                    raise PrepareError(str(error)) from None
                missing.add(cell.dataset)
            except ValueError as error:  # PartitionError, a bad dataset option
                raise PrepareError(f"{label(cell)}: {error}") from None
    skipped = Counter(cell.dataset for cell in cells if cell.dataset in missing)
    kept = [cell for cell in cells if cell.dataset not in missing]
    return kept, dict(skipped), {cell_hash(cell): prints[group_of[cell_hash(cell)]] for cell in kept}


# ---- the run ------------------------------------------------------------------------------------


def run_plan(plan: Plan, options: RunOptions = RunOptions(), console: Console | None = None) -> RunReport:
    """Run the plan's cells that have no result yet (all of them with `force`); see the module doc."""
    from pflbench.data import data_mirror, data_root
    from pflbench.loader.plugins import sources_for

    console = console or make_console()
    # Absolute paths, resolved here once: Ray workers may start elsewhere and without our environment.
    # The user's plugins travel with the cells: a worker loads exactly the code the cells were planned with.
    options = replace(
        options,
        data_root=data_root(options.data_root),
        mirror=data_mirror(options.mirror),
        plugins=sources_for(plan.cells),
    )
    store = Store(options.results)
    before = {cell_hash(cell): store.status(cell) for cell in plan.cells}
    for cell in plan.cells:
        if before[cell_hash(cell)] == DAMAGED:
            problems = "; ".join(f"{p.file}: {p.what}" for p in store.check(store.cell_dir(cell)))
            kept = store.set_aside(cell)
            before[cell_hash(cell)] = None
            console.print(
                f"[yellow]note:[/] cell {cell_hash(cell)} ({escape(label(cell))}) was damaged ({escape(problems)}); "
                f"its files are kept in {escape(str(kept))} and it runs again",
                highlight=False,
            )
    todo = [cell for cell in plan.cells if options.force or before[cell_hash(cell)] not in COMPLETE]
    report = RunReport(outcomes=dict(before))
    scale = f" (scale {plan.scale})" if len(plan.scales) > 1 else ""
    console.print(
        f"{escape(plan.name)}{scale}: {len(plan.cells)} cells, {len(plan.cells) - len(todo)} with results in "
        f"{escape(str(options.results))}, {len(todo)} to run",
        highlight=False,
    )
    if not todo:
        print_summary(console, plan, store, report, 0.0)
        return report
    todo, report.skipped_datasets, data = prepare_partitions(todo, plan, options, console)
    notes = skipped_dataset_notes(report.skipped_datasets, options)
    record_skipped_datasets(store, plan, notes)
    for dataset, note in notes.items():
        console.print(
            f"[yellow]note:[/] dataset {escape(repr(dataset))} cannot be loaded here: {escape(note['reason'])}; "
            f"its {note['cells']} cells are left out and the run goes on without it. "
            f"{escape(note['how_to_provide'])}",
            highlight=False,
        )
        report.outcomes = {
            k: v
            for k, v in report.outcomes.items()
            if k not in {cell_hash(c) for c in plan.cells if c.dataset == dataset}
        }
    in_process = not options.use_ray or options.workers == 1
    where = (
        "in this process"
        if in_process
        else (
            f"on Ray ({options.ray_address or os.environ.get('RAY_ADDRESS') or 'local instance'}"
            + (f", {options.workers} workers" if options.workers else "")
            + ")"
        )
    )
    console.print(
        f"running {len(todo)} cells {where}, {plan.resources.cpus:g} CPU"
        + (f" and {plan.resources.gpus:g} GPU" if plan.resources.gpus else "")
        + " each",
        highlight=False,
    )
    started = time.perf_counter()
    preemption = Preemption(options.grace_seconds, on_request=lambda name: acknowledge(name, options.grace_seconds))
    with Display(console, len(todo)) as display, Heartbeat(store), preemption.installed():
        try:
            if in_process:
                run_in_process(todo, plan, options, store, display, preemption)
            else:
                run_on_ray(todo, plan, options, store, display, data, preemption)
        except RunStopped as stop:
            report.stopped = stop
        except KeyboardInterrupt:
            report.interrupted = True
    report.ran = sum(display.counts.values())
    report.elsewhere = display.elsewhere
    if display.elsewhere:
        console.print(
            f"[yellow]note:[/] {display.elsewhere} cells were finished or being run by another runner "
            f"sharing {escape(str(options.results))}; run again later to pick up any it did not finish",
            highlight=False,
        )
    report.outcomes.update({cell_hash(c): store.status(c) for c in todo})
    print_summary(console, plan, store, report, time.perf_counter() - started)
    if report.stopped is not None:
        console.print(f"[yellow]{escape(report.stopped.line)}[/]", highlight=False, soft_wrap=True)
    return report


def acknowledge(signal_name: str, grace_seconds: float) -> None:
    """The line a first SIGTERM / Ctrl-C gets at once (from the signal handler: one unbuffered write)."""
    text = (
        f"{signal_name}: stopping at the end of the round in progress (at most {grace_seconds:g} s), with a "
        f"checkpoint; Ctrl-C again to stop at once\n"
    )
    try:
        os.write(2, text.encode())
    except OSError:
        pass


NOTES = "_notes.json"  # in the store: what a run left out (read by `pflbench report`)


def skipped_dataset_notes(skipped: dict[str, int], options: RunOptions) -> dict[str, dict]:
    """Why each optional dataset was left out, where it was looked for, and how to provide it."""
    looked = [f"data root {options.data_root}"] + (
        [f"mirror {options.mirror}"] if options.mirror else ["no mirror ($PFLBENCH_DATA_MIRROR unset, no --from)"]
    )
    return {
        dataset: {
            "cells": count,
            "reason": f"no copy found ({'; '.join(looked)}) and it could not be downloaded",
            "looked_in": [str(options.data_root)] + ([str(options.mirror)] if options.mirror else []),
            "how_to_provide": "Provide it with `--from DIR` / $PFLBENCH_DATA_MIRROR (an offline mirror folder) or "
            f"`pflbench data prepare {dataset}` (download into the data root, where a network is available).",
        }
        for dataset, count in skipped.items()
    }


def record_skipped_datasets(store: Store, plan: Plan, notes: dict[str, dict]) -> None:
    """Keep `<store>/_notes.json` current: this run's skipped datasets are added, the plan's datasets
    that were available this time are removed (the report shows what is still missing)."""
    from pflbench.storage.store import read_json_dict, write_json

    path = store.root / NOTES
    try:
        data = read_json_dict(path)
    except (OSError, ValueError):
        data = {}
    skipped: dict = cast(dict, data.get("skipped_datasets")) if isinstance(data.get("skipped_datasets"), dict) else {}
    for dataset in {cell.dataset for cell in plan.cells} - set(notes):
        skipped.pop(dataset, None)
    skipped.update({dataset: {**note, "spec": plan.name} for dataset, note in notes.items()})
    if skipped or path.exists():
        write_json(path, {**data, "skipped_datasets": skipped})
