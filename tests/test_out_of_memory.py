"""Out of memory (pflbench/run/memory.py): a cell that runs out of memory is recorded as failed with the reason
"out of memory (peak N MB)" while the others go on; a Ray worker that Ray's memory monitor killed is
named the same way in the retry note and the failed result (from constructed Ray errors), and so is a
real Ray worker that the kernel's OOM killer ends under a memory cgroup's limit (pflbench/run/oom_kills.py;
that test needs root and a memory cgroup, and says why it skips otherwise)."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pflbench.algorithm import ALGORITHMS
from pflbench.config import cell_hash
from pflbench.run.memory import is_out_of_memory, out_of_memory, worker_lost
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import Store

FedAvg = ALGORITHMS.get("fedavg")


class RunsOutOfMemory(FedAvg):
    """FedAvg whose second round asks torch's CPU allocator for 256 TiB (a real allocation that fails,
    as it does under a memory limit)."""

    name = "test-oom-fedavg"

    def local_train(self, rnd, state):
        if rnd.number == 2:
            torch.empty(2**48, dtype=torch.uint8)
        return super().local_train(rnd, state)


def test_a_cell_out_of_memory_is_failed_with_its_peak_and_the_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS._entries, RunsOutOfMemory.name, RunsOutOfMemory)
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    plan = parse_spec(
        {
            "name": "oom",
            "matrix": {
                "algorithm": [RunsOutOfMemory.name, "fedavg"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0],
            },
            "defaults": {"clients": 5, "rounds": 3, "lr": 0.05, "dataset_options": {"num_samples": 600}},
        }
    )
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
    assert (
        worker_lost(exceptions.OutOfMemoryError("Task was killed due to the node running low on memory."), 812)
        == "out of memory (peak 812 MB)"
    )
    assert (
        worker_lost(exceptions.WorkerCrashedError(), 812)
        == "Ray worker lost (WorkerCrashedError; last reported peak 812 MB)"
    )
    assert worker_lost(exceptions.WorkerCrashedError(), None) == "Ray worker lost (WorkerCrashedError)"
    assert worker_lost(exceptions.WorkerCrashedError(), 812, oom_killed=True) == (
        "out of memory (peak 812 MB): the kernel's OOM killer ended its worker (WorkerCrashedError)"
    )
    assert out_of_memory(None) == "out of memory (peak not reported)"


def test_the_kernels_count_of_oom_kills_is_read_from_cgroup_v1_v2_and_vmstat_files(tmp_path):
    from pflbench.run.oom_kills import count_file, read_count

    files = {
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",  # cgroup v1
        "memory.events": "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n",  # v2
        "vmstat": "pgfault 10\noom_kill 7\n",
        "nothing": "low 0\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert [read_count(tmp_path / name) for name in files] == [3, 2, 7, None]
    assert read_count(tmp_path / "missing") is None
    assert count_file() is None or read_count(count_file()) is not None  # this process's, where this machine has one


# ---- a real Ray worker under a memory limit, ended by the kernel's OOM killer -----------------------

GREEDY_AVG = '''
"""FedAvg whose Ray worker, at the start of round 1, moves itself into a new memory cgroup under {parent}
(no limit yet: what round 1 allocates never presses on one), and at the start of round 2 limits that
cgroup to what it holds plus {margin_mb} MB and asks for {ask_mb} MB, touching them: the kernel's OOM
killer ends it within that margin and the cgroup's reclaimable page cache. Never in the test's own
process."""
import os
from pathlib import Path

import ray

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg
from pflbench.run.preemption import current

PARENT = Path({parent!r})


@ALGORITHMS.register("greedy-fedavg")
class GreedyFedAvg(FedAvg):
    def configure(self, rnd):
        group = PARENT / f"{prefix}{{os.getpid()}}"
        if os.getpid() != {test_pid} and rnd.number == 1:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        if os.getpid() != {test_pid} and rnd.number == 2:
            # Round 1's report (with the new cgroup's count of OOM kills) has reached the driver's board:
            # the board runs one caller's calls in order.
            ray.get(current().board.stop_requested.remote())
            held = int((group / {usage_file!r}).read_text())
            (group / {limit_file!r}).write_text(str(held + {margin_mb} * 2 ** 20))
            hog = bytearray({ask_mb} * 2 ** 20)  # zero-filled: every page is touched
            del hog
        return super().configure(rnd)
'''
PREFIX = f"pflbench-oom-test-{os.getpid()}-"  # this test process's cgroups only: suites may run side by side


def memory_cgroup() -> tuple[Path, str, str]:
    """A memory cgroup this process may make children in (this process's own: cgroup v1's memory
    hierarchy, or v2 with the memory controller given to its children) and the names of a child's limit
    and usage files; skips the test, saying why, where there is none (not root, no writable cgroup, a
    container)."""
    from pflbench.run.oom_kills import CGROUP_ROOT

    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, limit_file = CGROUP_ROOT / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
            usage_file = "memory.usage_in_bytes"
            break
    else:
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
        parent, limit_file, usage_file = CGROUP_ROOT / (path or "").lstrip("/"), "memory.max", "memory.current"
        if path is None or "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            pytest.skip(
                "no memory cgroup to limit a worker in: neither cgroup v1's memory hierarchy nor v2 with "
                "the memory controller enabled for this process's cgroup's children"
            )
    probe = parent / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
        (probe / limit_file).write_text(str(2**30))
    except OSError as error:
        pytest.skip(
            f"cannot make a memory-limited cgroup under {parent} ({error.strerror}): needs root, or a "
            f"cgroup delegated to this user"
        )
    finally:
        if probe.exists():
            probe.rmdir()
    return parent, limit_file, usage_file


def remove_cgroups(parent: Path) -> list[Path]:
    """The test's cgroups under `parent`, removed (a killed worker's is empty once it is gone); returns them."""
    groups = sorted(parent.glob(f"{PREFIX}*"))
    for group in groups:
        deadline = time.monotonic() + 30
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    return groups


@pytest.mark.slow
def test_a_ray_worker_that_the_kernels_oom_killer_ends_is_out_of_memory_retried_then_failed_and_the_other_cell_finishes(
    tmp_path, monkeypatch, fresh_plugins
):
    """A real worker under a real memory limit (a memory cgroup made by this test, which needs root): the
    kernel's OOM killer ends it (SIGKILL; Ray sees a worker that died); the runner tells it from another
    death by the cgroup's count of OOM kills, says so in the retry note with the cell's id, retries it
    `retries` times (each attempt is killed again: one cgroup each) and then records it as failed with
    that reason; the other cell finishes."""
    ray = pytest.importorskip("ray")
    parent, limit_file, usage_file = memory_cgroup()
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    plugin = tmp_path / "greedy_avg.py"
    plugin.write_text(
        GREEDY_AVG.format(
            parent=str(parent),
            margin_mb=64,
            ask_mb=1024,
            test_pid=os.getpid(),
            prefix=PREFIX,
            limit_file=limit_file,
            usage_file=usage_file,
        )
    )
    plan = parse_spec(
        {
            "name": "oom-killed",
            "plugins": [str(plugin)],
            "matrix": {
                "algorithm": ["greedy-fedavg", "fedavg"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0],
            },
            "defaults": {"clients": 5, "rounds": 3, "lr": 0.05, "dataset_options": {"num_samples": 600}},
            "resources": {
                "cpus": 1
            },  # one cell at a time on this Ray's one CPU: the other cell after the greedy one's tries
        }
    )
    options = RunOptions(
        results=tmp_path / "results", data_root=tmp_path / "data", use_ray=True, retries=1, checkpoint_minutes=0
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    output = io.StringIO()
    try:
        report = run_plan(plan, options, Console(file=output, width=400))
    finally:
        ray.shutdown()
        groups = remove_cgroups(parent)
    text = output.getvalue()
    greedy, other = plan.cells
    store = Store(options.results)
    assert report.exit_code == 1, text
    assert store.status(other) == "finished", text
    assert store.status(greedy) == "failed", text
    why = (
        r"out of memory \(peak \d+ MB\): the kernel's OOM killer ended its worker "
        r"\(\w+Error\)"
    )  # WorkerCrashedError in Ray 2.60
    assert re.search(
        rf"note: greedy-fedavg .*{cell_hash(greedy)}: {why}; retry 1 of 1, from its checkpoint where "
        rf"it has one",
        text,
    ), text
    assert re.fullmatch(rf"{why} \(after 1 retries\)", store.summary(greedy)["error"]), store.summary(greedy)["error"]
    assert len(groups) == 2  # the first attempt and its one retry, each killed in its own cgroup
