"""Checks a method's author runs in their own tests: `check_resume(cell, data_root)` runs a cell
uninterrupted, then runs it again stopped right after the checkpoint of a round (through the checkpoint
machinery, as a kill after that checkpoint leaves it) and resumed from that checkpoint in a new
Federation and algorithm, as a new process would, and fails naming what differs where the two are not
the same bit for bit (timings and run records excepted). `pflbench new algorithm` puts it in the test
it writes.

Resuming right needs every attribute a round changes declared (pflbench.algorithm: `state`,
`state_objects`, `state_rebuilt`) and every random draw from a named stream of the cell's seed
(pflbench.streams)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pflbench.algorithm import AnyAlgorithm
from pflbench.api_types import CellResult
from pflbench.storage.checkpoint import CheckpointPolicy, Checkpointer
from pflbench.config import CellConfig
from pflbench.simulator.federation import Federation
from pflbench.simulator.metrics import RUN_RECORD_KEYS
from pflbench.simulator.rounds import run_cell

__all__ = [
    "Interrupted",
    "InterruptingCheckpointer",
    "check_resume",
    "differences",
    "interrupted_and_resumed",
    "uninterrupted",
]

# Columns and summary keys that are timings or records of how the run went, not results.
TIMING_COLUMNS = {"wall_time", "adapt_time", "train_time", "server_time", "eval_time"}
EXECUTION_KEYS = RUN_RECORD_KEYS | {"newcomer_time_total"}


class Interrupted(Exception):
    """Stands in for a kill right after the checkpoint of round `at`."""


class InterruptingCheckpointer(Checkpointer):
    """Writes a checkpoint after round `at` (and by its policy), then stops the run."""

    def __init__(self, *args: Any, at: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.at = at

    def after_round(self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float) -> None:
        super().after_round(rnd, fed, algorithm, loop, elapsed)
        if rnd == self.at:
            self.save(rnd, fed, algorithm, loop, elapsed)
            raise Interrupted(rnd)


def fresh_process_random_state() -> None:
    """The global generators as a new process starts them. The engine does not seed torch's global
    generator per cell (dropout draws from it), so two runs compare only from the same start; the
    resumed run starts from whatever state and must get it back from the checkpoint."""
    torch.manual_seed(20260)
    np.random.seed(20260)
    random.seed(20260)


def uninterrupted(cell: CellConfig, data_root: str | Path | None, **run: Any) -> CellResult:
    fresh_process_random_state()
    return run_cell(cell, data_root=data_root, **run)


def interrupted_and_resumed(
    cell: CellConfig, folder: str | Path, data_root: str | Path | None, at: int, **run: Any
) -> tuple[CellResult, list[str]]:
    """Run `cell` until the checkpoint after round `at`, then run it again from that checkpoint
    (a new Federation and algorithm, as in a new process). Returns (result, notes)."""
    notes: list[str] = []
    folder = Path(folder)
    fresh_process_random_state()
    first = InterruptingCheckpointer(folder, cell, CheckpointPolicy(every=0, minutes=0), at=at, note=notes.append)
    try:
        run_cell(cell, data_root=data_root, checkpointer=first, **run)
    except Interrupted:
        pass
    else:
        raise AssertionError(f"the run was not interrupted after round {at}")
    torch.manual_seed(99)  # the resumed run starts elsewhere: the checkpoint must restore it
    second = Checkpointer(folder, cell, CheckpointPolicy(every=0, minutes=0), note=notes.append)
    return run_cell(cell, data_root=data_root, checkpointer=second, **run), notes


def differences(one: CellResult, other: CellResult) -> list[str]:
    """Where two CellResults differ bit for bit (timings and execution records excepted)."""
    found = []
    if one.status != other.status:
        found.append(f"status {one.status} != {other.status}")
    for name in ("metrics", "rounds"):
        a, b = getattr(one, name), getattr(other, name)
        columns = [c for c in a.columns if c not in TIMING_COLUMNS]
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            found.append(f"{name}: shape {a.shape} != {b.shape}")
            continue
        for column in columns:
            x, y = a[column].to_numpy(), b[column].to_numpy()
            same = (
                np.array_equal(x, y, equal_nan=True)
                if x.dtype.kind == "f"
                else bool((pd.Series(x) == pd.Series(y)).all())
            )
            if not same:
                found.append(f"{name}.{column} differs")
    keys = {
        k for k in set(one.summary) | set(other.summary) if k not in EXECUTION_KEYS and not k.endswith("_time_total")
    }
    for key in sorted(keys):
        x, y = one.summary.get(key, "<missing>"), other.summary.get(key, "<missing>")
        if not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
            found.append(f"summary[{key}]: {x!r} != {y!r}")
    if set(one.artifacts) != set(other.artifacts):
        found.append(f"artifacts {sorted(one.artifacts)} != {sorted(other.artifacts)}")
    else:
        found += [
            f"artifact {k} differs"
            for k in one.artifacts
            if not np.array_equal(one.artifacts[k], other.artifacts[k], equal_nan=one.artifacts[k].dtype.kind in "fc")
        ]
    return found


def check_resume(
    cell: CellConfig, folder: str | Path, data_root: str | Path | None = None, at: int | None = None, **run: Any
) -> CellResult:
    """AssertionError naming what differs unless `cell`, stopped after the checkpoint of round `at`
    (default: half its rounds) and resumed from it, gives the uninterrupted run's result bit for bit.
    `folder`: where the checkpoint is written (a fresh folder). Returns the uninterrupted result."""
    at = max(1, cell.rounds // 2) if at is None else at
    if not 1 <= at < cell.rounds:
        raise ValueError(f"at={at}: a cell of {cell.rounds} rounds resumes after rounds 1..{cell.rounds - 1}")
    whole = uninterrupted(cell, data_root, **run)
    if whole.status != "finished":
        raise AssertionError(f"the uninterrupted run did not finish ({whole.status}): {whole.error}")
    resumed, notes = interrupted_and_resumed(cell, folder, data_root, at, **run)
    if f"resumed at round {at} of {cell.rounds}" not in notes:
        raise AssertionError(f"the second run did not resume from round {at}'s checkpoint: {notes}")
    found = differences(whole, resumed)
    if found:
        raise AssertionError(
            f"{cell.algorithm} resumed after round {at} differs from the uninterrupted run: "
            f"{'; '.join(found)} (declared state: pflbench.algorithm; named random streams: "
            f"pflbench.streams)"
        )
    return whole
