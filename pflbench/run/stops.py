"""How a run stops short and says so: a full disk (`DISK_FULL_EXIT`), a preemption (the round the next run resumes at), a cell that has no checkpoint yet."""

from __future__ import annotations

import os
from pathlib import Path

from pflbench.config import CellConfig, cell_hash
from pflbench.run.display import label
from pflbench.run.preemption import (
    Preempted,
)
from pflbench.storage.store import DiskFull, Store


DISK_FULL_EXIT = 74  # sysexits' EX_IOERR: a write failed for lack of space; free some and run again


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


# A cell whose runner was killed (its claim abandoned) before it wrote a checkpoint, e.g. a cell shorter than
# --checkpoint-minutes (default 5) without --checkpoint-every: said, not restarted silently.
NO_CHECKPOINT = "no checkpoint: starting from round 1 (an earlier run of this cell was stopped before it wrote one)"


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
