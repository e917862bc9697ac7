"""The results store: atomic files, one row per cell, and resume after a run killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from budgets import scaled
from pflbench.config import CellConfig, cell_hash
from pflbench.simulator.rounds import CellResult
from pflbench.run.spec import load_spec
from pflbench.storage.store import Store, load_store


def result(status="finished", accuracy=0.5, error=None) -> CellResult:
    metrics = pd.DataFrame({"round": [1, 1], "client": [0, 1], "accuracy": [accuracy, accuracy]})
    rounds = pd.DataFrame({"round": [1], "bytes_up": [10]})
    summary = {
        "status": status,
        "final_accuracy": accuracy,
        "model": "mlp",
        "torch": "x",
        "dataset_checksum": "sha256:1",
    }
    return CellResult(status, metrics, rounds, summary, {"weights_round00001": np.eye(2)}, error)


def test_write_and_load(tmp_path):
    store = Store(tmp_path)
    cells = [
        CellConfig(algorithm="fedavg", dataset="synthetic", seed=s, hp={}, partition_params={"alpha": 0.1})
        for s in (0, 1)
    ]
    store.write(cells[0], result(error=None))
    folder = store.write(cells[1], result("failed", error="Traceback ...\nRuntimeError: boom"))
    assert store.status(cells[0]) == "finished" and store.status(cells[1]) == "failed"
    assert (folder / "error.txt").read_text().endswith("RuntimeError: boom")
    config = json.loads((folder / "config.json").read_text())
    assert config["hash"] == cell_hash(cells[1]) and config["cell"]["seed"] == 1
    assert set(config["versions"]) == {"pflbench", "torch", "python"} and config["dataset_checksum"] == "sha256:1"
    assert np.load(folder / "artifacts" / "arrays.npz")["weights_round00001"].shape == (2, 2)

    # A rerun replaces the old result completely.
    store.write(cells[1], result(accuracy=0.75))
    assert not (folder / "error.txt").exists()
    table = load_store(tmp_path).set_index("seed")
    assert list(table["status"]) == ["finished", "finished"] and table.loc[1, "final_accuracy"] == 0.75
    assert table.loc[0, "partition_params.alpha"] == 0.1 and table.loc[0, "resolved_model"] == "mlp"
    assert table.loc[0, "model"] == "auto" and table.loc[0, "hash"] == cell_hash(cells[0])
    assert pd.read_parquet(Path(table.loc[1, "path"]) / "metrics.parquet")["accuracy"].tolist() == [0.75, 0.75]


def test_cells_without_summary_are_not_results(tmp_path):
    assert load_store(tmp_path / "missing").empty
    half = tmp_path / "0123456789ab"
    half.mkdir()
    (half / "config.json").write_text("{}")
    (half / ".metrics.parquet.x.tmp").write_text("partial")
    assert load_store(tmp_path).empty


SPEC = {
    "name": "resume",
    "matrix": {"algorithm": ["fedavg", "local"], "dataset": ["synthetic"], "seed": [0, 1, 2, 3]},
    "defaults": {
        "partition": "pathological",
        "partition_params": {"classes_per_client": 2, "samples_per_client": 40},
        "clients": 4,
        "rounds": 10,
        "dataset_options": {"num_samples": 800},
    },
}


def run_cli(spec: Path, results: Path, data: Path) -> subprocess.Popen:
    env = {**os.environ, "PFLBENCH_DATA": str(data), "PFLBENCH_DATA_MIRROR": str(data / "no-mirror")}
    command = [sys.executable, "-m", "pflbench.cli", "run", str(spec), "--results", str(results), "--no-ray"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summaries(results: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in results.glob("*/summary.json")}


def test_resume_after_sigkill(tmp_path):
    spec, results, data = tmp_path / "resume.yaml", tmp_path / "results", tmp_path / "data"
    spec.write_text(yaml.safe_dump(SPEC))
    expected = {cell_hash(c) for c in load_spec(spec).cells}
    assert len(expected) == 8

    first = run_cli(spec, results, data)
    while len(summaries(results)) < 3 and first.poll() is None:  # however long a loaded machine takes
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = summaries(results)
    assert first.returncode == -signal.SIGKILL
    assert 3 <= len(before) < len(expected), "the kill should land part-way"
    assert len(load_store(results)) == len(before)  # readable as it was left

    second = run_cli(spec, results, data)
    output, _ = second.communicate(timeout=scaled(120))  # a bound on a hang, scaled by the load
    assert second.returncode == 0, output
    assert f"8 cells, {len(before)} with results in {results}, {8 - len(before)} to run" in output
    after = summaries(results)
    assert set(after) == expected  # nothing lost, nothing extra
    assert all(after[key] == text for key, text in before.items())  # finished cells were not run again
    table = load_store(results)
    assert len(table) == 8 and table["hash"].is_unique and set(table["status"]) == {"finished"}
    assert not list(results.rglob("*.tmp"))
    assert all(
        len(pd.read_parquet(Path(p) / "metrics.parquet")) == SPEC["defaults"]["rounds"] * 4 for p in table["path"]
    )
