"""Out of memory (pflbench/runner.py): a cell that runs out of memory is recorded as failed with the reason
"out of memory (peak N MB)" while the others go on; a Ray worker that Ray's memory monitor killed is
named the same way in the retry note and the failed result."""
from __future__ import annotations

import io
import re

import pytest
import torch
from rich.console import Console

from pflbench.algorithm import ALGORITHMS
from pflbench.runner import RunOptions, is_out_of_memory, out_of_memory, run_plan, worker_lost
from pflbench.spec import parse_spec
from pflbench.store import Store

FedAvg = ALGORITHMS.get("fedavg")


class RunsOutOfMemory(FedAvg):
    """FedAvg whose second round asks torch's CPU allocator for 256 TiB (a real allocation that fails,
    as it does under a memory limit)."""

    name = "test-oom-fedavg"

    def local_train(self, rnd, state):
        if rnd.number == 2:
            torch.empty(2 ** 48, dtype=torch.uint8)
        return super().local_train(rnd, state)


def test_a_cell_out_of_memory_is_failed_with_its_peak_and_the_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS._entries, RunsOutOfMemory.name, RunsOutOfMemory)
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    plan = parse_spec({
        "name": "oom",
        "matrix": {"algorithm": [RunsOutOfMemory.name, "fedavg"], "dataset": ["synthetic"],
                   "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}], "seed": [0]},
        "defaults": {"clients": 5, "rounds": 3, "lr": 0.05, "dataset_options": {"num_samples": 600}},
    })
    options = RunOptions(results=tmp_path / "results", data_root=tmp_path / "data", use_ray=False)
    output = io.StringIO()
    report = run_plan(plan, options, Console(file=output, width=400))
    assert report.exit_code == 1
    store = Store(options.results)
    failing, other = plan.cells
    assert store.status(failing) == "failed" and store.status(other) == "finished"
    assert re.fullmatch(r"out of memory \(peak \d+ MB\)", store.summary(failing)["error"])
    assert "DefaultCPUAllocator: can't allocate memory" in (store.cell_dir(failing) / "error.txt").read_text()


def test_what_counts_as_out_of_memory():
    assert is_out_of_memory(MemoryError()) and is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("x"))


def test_a_ray_worker_killed_for_memory_is_named_out_of_memory_with_the_last_peak_its_cell_reported():
    exceptions = pytest.importorskip("ray.exceptions")
    assert worker_lost(exceptions.OutOfMemoryError("Task was killed due to the node running low on memory."),
                       812) == "out of memory (peak 812 MB)"
    assert worker_lost(exceptions.WorkerCrashedError(), 812) == "Ray worker lost (WorkerCrashedError; last reported peak 812 MB)"
    assert worker_lost(exceptions.WorkerCrashedError(), None) == "Ray worker lost (WorkerCrashedError)"
    assert out_of_memory(None) == "out of memory (peak not reported)"
