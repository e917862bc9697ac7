"""Ray: a cell whose worker process is killed (SIGKILL) is retried and resumes from its checkpoint,
ending with the in-process run's result; with no retries left it is recorded as failed."""
from __future__ import annotations

import io
import os
import re
import signal
import threading
import time

import pandas as pd
import pytest
from rich.console import Console

from checkpoint_helpers import TIMING_COLUMNS
from pflbench.checkpoint import CHECKPOINT, CheckpointProblem, read_header
from pflbench.runner import RunOptions, run_plan
from pflbench.spec import parse_spec
from pflbench.store import Store

ROUNDS = 30


def plan():
    return parse_spec({
        "name": "ray-retry",
        "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"],
                   "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}], "seed": [0]},
        "defaults": {"clients": 5, "rounds": ROUNDS, "local_epochs": 2, "lr": 0.05, "eval_every": 5,
                     "dataset_options": {"num_samples": 1000}},
        "resources": {"cpus": 1},
    })


def kill_the_writer(store_root, killed: list, at_least: int = 3, timeout: float = 240.0) -> None:
    """Kill -9 the process that wrote the cell's checkpoint (the Ray worker) once it reached `at_least`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not killed:
        for path in store_root.glob(f"*/{CHECKPOINT}"):
            try:
                header = read_header(path)
            except (OSError, CheckpointProblem):
                continue
            if header["round"] >= at_least:
                assert header["pid"] != os.getpid(), "the cell ran in this process, not on a Ray worker"
                os.kill(header["pid"], signal.SIGKILL)
                killed.append(header["round"])
                return
        time.sleep(0.02)


@pytest.mark.parametrize("retries", [1, 0])
def test_a_lost_ray_worker_is_retried_and_resumes_from_its_checkpoint(tmp_path, monkeypatch, retries):
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    data = tmp_path / "data"
    reference = RunOptions(results=tmp_path / "in-process", data_root=data, use_ray=False)
    if retries:
        assert run_plan(plan(), reference, Console(file=io.StringIO())).exit_code == 0
    options = RunOptions(results=tmp_path / "ray", data_root=data, use_ray=True, workers=2,
                         checkpoint_every=1, checkpoint_minutes=0, retries=retries)
    killed: list = []
    killer = threading.Thread(target=kill_the_writer, args=(tmp_path / "ray", killed), daemon=True)
    killer.start()
    output = io.StringIO()
    report = run_plan(plan(), options, Console(file=output, width=300))
    killer.join(timeout=1)
    text = output.getvalue()
    assert killed, f"no checkpoint to kill the worker after: {text}"
    cell = plan().cells[0]
    store = Store(tmp_path / "ray")
    if not retries:
        assert report.exit_code == 1 and store.status(cell) == "failed"
        assert "after 0 retries" in store.summary(cell)["error"]
        assert store.checkpoint_path(cell).exists()  # kept: the next run continues the cell
        return
    assert report.exit_code == 0, text
    resumed = re.search(rf"resumed at round (\d+) of {ROUNDS}", text)
    assert "retry 1 of 1" in text and resumed and int(resumed.group(1)) >= killed[0], text
    for name in ("metrics.parquet", "rounds.parquet"):
        a = pd.read_parquet(store.cell_dir(cell) / name)
        b = pd.read_parquet(Store(reference.results).cell_dir(cell) / name)
        columns = [c for c in a.columns if c not in TIMING_COLUMNS]
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    assert store.summary(cell)["resumed_from_round"] == int(resumed.group(1))
    assert not store.checkpoint_path(cell).exists()
