"""Interrupt a cell after a round, resume it in a fresh Federation and algorithm, and compare with the
uninterrupted run (shared by tests/test_checkpoint.py and the kill tests): pflbench.run.testing's, and the
comparison of stored cells."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pflbench.simulator.metrics import RUN_RECORD_KEYS
from pflbench.run.testing import (  # shipped to plugin authors (pflbench.run.testing); importable from here as before
    EXECUTION_KEYS as EXECUTION_KEYS,
    TIMING_COLUMNS,
    Interrupted as Interrupted,
    InterruptingCheckpointer as InterruptingCheckpointer,
    differences as differences,
    fresh_process_random_state as fresh_process_random_state,
    interrupted_and_resumed as interrupted_and_resumed,
    uninterrupted as uninterrupted,
)


def assert_same_result(folder: Path, reference: Path) -> None:
    """Two stored cells (store folders) hold the same result bit for bit, timings and run records excepted."""
    for name in ("metrics.parquet", "rounds.parquet"):
        a, b = pd.read_parquet(folder / name), pd.read_parquet(reference / name)
        columns = [c for c in a.columns if c not in TIMING_COLUMNS]
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    one, other = (json.loads((f / "summary.json").read_text()) for f in (folder, reference))
    keys = {k for k in one if k not in RUN_RECORD_KEYS and not k.endswith("_time_total")}
    assert {k: one[k] for k in keys} == {k: other.get(k) for k in keys}
