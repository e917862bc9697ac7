"""Recording a cell: its result written to the store, the claim a runner takes on a cell before running it, and a cell group's cells recorded each as it finishes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pflbench.config import CellConfig
from pflbench.run.display import Display
from pflbench.run.options import RunOptions
from pflbench.run.stops import NO_CHECKPOINT, checkpoint_round
from pflbench.storage.store import COMPLETE, Store

if TYPE_CHECKING:
    from pflbench.simulator.rounds import CellResult


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
