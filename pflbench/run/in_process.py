"""Running cells in this process (`--no-ray`, `--workers 1`): one after another, or as cell groups."""

from __future__ import annotations

from functools import partial
from typing import cast

from pflbench.config import CellConfig
from pflbench.run.cell import execute_cell, execute_group
from pflbench.run.display import Display
from pflbench.run.options import PrepareError, RunOptions
from pflbench.run.preemption import (
    PREEMPTED_EXIT,
    Preempted,
    Preemption,
)
from pflbench.run.recording import GroupRecorder, record, take
from pflbench.run.spec import Plan
from pflbench.run.options import RunStopped
from pflbench.run.stops import DISK_FULL_EXIT, disk_full_line, preempted_line, stopped_cell
from pflbench.storage.store import DiskFull, Store


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
        stop_if_requested(preemption)
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
        stop_if_requested(preemption)
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


def stop_if_requested(preemption: Preemption) -> None:
    """RunStopped (exit 75) when a signal asked the run to stop before its next cell started."""
    if preemption.requested:
        line = preempted_line(Preempted(cast(str, preemption.signal)), None, preemption.grace_seconds)
        raise RunStopped(line, PREEMPTED_EXIT)
