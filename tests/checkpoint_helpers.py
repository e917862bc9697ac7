"""Interrupt a cell after a round, resume it in a fresh Federation and algorithm, and compare with the
uninterrupted run (shared by tests/test_checkpoint.py and the kill tests)."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pflbench.metrics import RUN_RECORD_KEYS
from pflbench.checkpoint import CheckpointPolicy, Checkpointer
from pflbench.rounds import run_cell

# Columns and summary keys that are timings or records of how the run went, not results.
TIMING_COLUMNS = {"wall_time", "adapt_time", "train_time", "server_time", "eval_time"}
EXECUTION_KEYS = RUN_RECORD_KEYS | {"newcomer_time_total"}


class Interrupted(Exception):
    """Stands in for a kill right after the checkpoint of round `at`."""


class InterruptingCheckpointer(Checkpointer):
    """Writes a checkpoint after round `at` (and by its policy), then stops the run."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at = at

    def after_round(self, rnd, fed, algorithm, loop, elapsed):
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


def uninterrupted(cell, data_root, **run):
    fresh_process_random_state()
    return run_cell(cell, data_root=data_root, **run)


def interrupted_and_resumed(cell, folder, data_root, at: int, **run):
    """Run `cell` until the checkpoint after round `at`, then run it again from that checkpoint
    (a new Federation and algorithm, as in a new process). Returns (result, notes)."""
    notes: list[str] = []
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


def differences(one, other) -> list[str]:
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
            same = np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" else bool((pd.Series(x) == pd.Series(y)).all())
            if not same:
                found.append(f"{name}.{column} differs")
    keys = {k for k in set(one.summary) | set(other.summary) if k not in EXECUTION_KEYS and not k.endswith("_time_total")}
    for key in sorted(keys):
        x, y = one.summary.get(key, "<missing>"), other.summary.get(key, "<missing>")
        if not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
            found.append(f"summary[{key}]: {x!r} != {y!r}")
    if set(one.artifacts) != set(other.artifacts):
        found.append(f"artifacts {sorted(one.artifacts)} != {sorted(other.artifacts)}")
    else:
        found += [f"artifact {k} differs" for k in one.artifacts
                  if not np.array_equal(one.artifacts[k], other.artifacts[k],
                                        equal_nan=one.artifacts[k].dtype.kind in "fc")]
    return found


def assert_same_result(folder: Path, reference: Path) -> None:
    """Two stored cells (store folders) hold the same result bit for bit, timings and run records excepted."""
    for name in ("metrics.parquet", "rounds.parquet"):
        a, b = pd.read_parquet(folder / name), pd.read_parquet(reference / name)
        columns = [c for c in a.columns if c not in TIMING_COLUMNS]
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    one, other = (json.loads((f / "summary.json").read_text()) for f in (folder, reference))
    keys = {k for k in one if k not in RUN_RECORD_KEYS and not k.endswith("_time_total")}
    assert {k: one[k] for k in keys} == {k: other.get(k) for k in keys}
