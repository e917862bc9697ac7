"""Ray's GPU scheduling of cells, without a GPU: Ray is started with one declared GPU on this CPU
machine, and tasks ask for what the runner asks for a cell (`task_resources`). Cells of `resources.gpus`
1/8 are packed 8 to the GPU at once (a ninth waits), each told GPU 0 (CUDA_VISIBLE_DEVICES), where the
cell's "cuda" device is that GPU."""

from __future__ import annotations

import os
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from budgets import scaled  # noqa: E402

from pflbench.run.ray_cluster import ray_capacity, task_resources  # noqa: E402
from pflbench.run.spec_schema import Resources  # noqa: E402

# Ray workers cannot import this test module by name: its functions travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def ray_with_one_gpu():
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    ray.init(num_cpus=9, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class Gate:
    """Counts the tasks that are running at once; releases them when told."""

    def __init__(self):
        self.inside = 0
        self.most = 0
        self.open = False

    def enter(self) -> int:
        self.inside += 1
        self.most = max(self.most, self.inside)
        return self.inside

    def leave(self) -> None:
        self.inside -= 1

    def release(self) -> None:
        self.open = True

    def is_open(self) -> bool:
        return self.open

    def state(self) -> tuple[int, int]:
        return self.inside, self.most


def cell_probe(gate) -> dict:
    """What a cell's task sees: its GPU ids, CUDA_VISIBLE_DEVICES, and the device the runner gives a
    cell with GPUs ("cuda", i.e. the first visible GPU: the one Ray assigned)."""
    from pflbench.simulator.execution import ExecutionOptions

    ray.get(gate.enter.remote())
    # Until the test opens the gate (it always does, or ends Ray): a task that left early on a clock, while
    # the other workers were still starting on a busy machine, let the ninth in and failed the count.
    deadline = time.monotonic() + 600
    while not ray.get(gate.is_open.remote()) and time.monotonic() < deadline:
        time.sleep(0.05)
    ray.get(gate.leave.remote())
    return {
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": ExecutionOptions().on("cuda").device,
    }


def wait_inside(gate, count: int, refs, seconds: float = 180) -> None:
    """Until `count` tasks are inside the gate (worker processes start slowly on a busy machine: the bound is
    scaled by the load, tests/budgets.py); a task that failed is raised at once."""
    deadline = time.monotonic() + scaled(seconds)
    while ray.get(gate.state.remote())[0] < count:
        assert time.monotonic() < deadline, f"{ray.get(gate.state.remote())[0]} of {count} tasks inside the gate"
        done, _ = ray.wait(refs, num_returns=1, timeout=0.1)
        if done:
            ray.get(done)  # raises the task's error; a task cannot finish while the gate is closed
            raise AssertionError("a task finished while the gate was closed")


def test_cells_of_one_eighth_gpu_run_eight_at_once_on_gpu_zero(ray_with_one_gpu):
    resources = Resources(cpus=1, gpus=0.125)
    assert ray_capacity(ray.cluster_resources(), resources) == 8
    gate = Gate.remote()
    task = ray.remote(cell_probe).options(**task_resources(resources))
    refs = [task.remote(gate) for _ in range(9)]
    wait_inside(gate, 8, refs)
    time.sleep(1.0)  # a ninth task, were it scheduled, would be inside by now
    inside, most = ray.get(gate.state.remote())
    assert inside == 8 and most == 8, (inside, most)  # eight share the GPU; the ninth waits for a slot
    ray.get(gate.release.remote())
    seen = ray.get(refs, timeout=scaled(120))
    assert ray.get(gate.state.remote())[1] == 8
    assert all(s["gpu_ids"] == ["0"] and s["visible"] == "0" and s["device"] == "cuda" for s in seen), seen


def test_a_cell_of_a_whole_gpu_runs_alone(ray_with_one_gpu):
    resources = Resources(cpus=1, gpus=1)
    assert ray_capacity(ray.cluster_resources(), resources) == 1
    gate = Gate.remote()
    task = ray.remote(cell_probe).options(**task_resources(resources))
    refs = [task.remote(gate) for _ in range(2)]
    wait_inside(gate, 1, refs)
    time.sleep(1.0)
    assert ray.get(gate.state.remote()) == (1, 1)
    ray.get(gate.release.remote())
    assert all(s["visible"] == "0" for s in ray.get(refs, timeout=scaled(120)))
    assert ray.get(gate.state.remote())[1] == 1
