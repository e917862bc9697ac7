"""One cell run: its checkpointer, its tracking and progress hooks, and the outcome recorded as a result (finished, diverged, failed, out of memory); a cell group the same way."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pflbench.config import CellConfig, cell_hash
from pflbench.run.memory import is_out_of_memory, out_of_memory, peak_mb
from pflbench.run.options import RunOptions
from pflbench.run.preemption import (
    Preempted,
    StopRequest,
    running_cell,
)
from pflbench.run.spec import Resources
from pflbench.run.trackers import CellTracking, cell_tracking
from pflbench.storage.checkpoint import Checkpointer, CheckpointFile
from pflbench.storage.store import SET_ASIDE, DiskFull

if TYPE_CHECKING:
    from pflbench.run.checkpoint_relay import RelayedCheckpointFile
    from pflbench.simulator.groups import GroupRun
    from pflbench.simulator.rounds import CellResult

    # Where a cell's checkpoint is read and written: this machine's files, or on a Ray worker the keeper's
    # (a RelayedCheckpointFile has CheckpointFile's methods; `Checkpointer` names only CheckpointFile).
    CheckpointFiles = CheckpointFile | RelayedCheckpointFile


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

    from pflbench.loader.plugins import activate
    from pflbench.run.cost import measured
    from pflbench.simulator.rounds import run_cell

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


def posting(board: Any, key: str) -> Callable[[dict], None]:
    """A Ray cell's round reports, posted to the progress board as the driver's display needs them."""
    return lambda info: board.post.remote(key, progress_of(info))


def noting(board: Any, key: str) -> Callable[[str], None]:
    """A Ray cell's notes, posted to the progress board."""
    return lambda text: board.note.remote(key, text)


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

    from pflbench.loader.plugins import activate
    from pflbench.run.cost import measuring
    from pflbench.simulator.groups import GroupRun, run_group

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
