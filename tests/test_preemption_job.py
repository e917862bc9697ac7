"""SIGTERM to every process of a Ray job at once, as SLURM's `scancel` and Kubernetes' pod termination send it
(pflbench/run/on_ray.py's `RayRun.loop`): the driver, Ray's own processes and the workers running the cells all get
the signal. The run ends with one "preempted" line and PREEMPTED_EXIT, without a Ray traceback, and every round
checkpoint written before the signal is still there for the next run.

The test waits on events, not on the machine's speed: it signals once each cell has a checkpoint on disk."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflbench.storage.checkpoint import CHECKPOINT, read_header
from pflbench.run.preemption import PREEMPTED_EXIT

pytest.importorskip("ray")

PFLBENCH = [sys.executable, "-c", "import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))"]
ROUNDS = 100000  # never ends by itself: the signal ends it
SPEC = f"""
name: scancel
matrix:
  algorithm: [fedavg]
  dataset: [synthetic]
  partition: [{{scheme: pathological, params: {{classes_per_client: 3}}}}]
  seed: [0, 1]
defaults: {{clients: 5, rounds: {ROUNDS}, lr: 0.05, eval_every: 1000, dataset_options: {{num_samples: 600}}}}
resources: {{cpus: 1}}
"""
WAIT = 600.0  # for Ray to start and both cells to write a checkpoint: an upper bound, never reached when all is well


def session_processes(session: int) -> list[int]:
    """Every process of the session (`scancel` signals every process of the job's cgroup: here, its session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile
                pass
    return found


def checkpoints(store: Path) -> dict[str, int]:
    """Each cell's checkpoint round, where its checkpoint is whole."""
    rounds = {}
    for path in store.glob(f"*/{CHECKPOINT}"):
        try:
            rounds[path.parent.name] = read_header(path)["round"]
        except Exception:  # being renamed into place, or not yet whole
            pass
    return rounds


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the job's processes")
def test_sigterm_to_every_process_of_a_ray_job_ends_it_preempted_with_its_checkpoints_kept(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    store = tmp_path / "store"
    env = {
        **os.environ,
        "PFLBENCH_DATA": str(tmp_path / "data"),
        "PFLBENCH_DATA_MIRROR": str(tmp_path / "no-mirror"),
        "OMP_NUM_THREADS": "1",
        "RAY_ADDRESS": "",
    }
    log = (tmp_path / "log").open("w+")
    driver = subprocess.Popen(
        [
            *PFLBENCH,
            "run",
            str(tmp_path / "spec.yaml"),
            "--results",
            str(store),
            "--workers",
            "2",
            "--checkpoint-every",
            "1",
            "--checkpoint-minutes",
            "0",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while len(before := checkpoints(store)) < 2:
            assert driver.poll() is None, Path(log.name).read_text()
            if time.monotonic() > deadline:
                pytest.fail(f"no checkpoint of both cells within {WAIT:g} s:\n{Path(log.name).read_text()}")
            time.sleep(0.2)
        for pid in session_processes(driver.pid):  # all at once, as a scheduler does
            os.kill(pid, signal.SIGTERM)
        code = driver.wait(timeout=WAIT)
    finally:
        for pid in session_processes(driver.pid):
            os.kill(pid, signal.SIGKILL)
    output = Path(log.name).read_text()
    assert code == PREEMPTED_EXIT, output
    assert "Traceback" not in output and "Unhandled error" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("preempted")]
    assert len(lines) == 1, output
    after = checkpoints(store)
    assert set(after) == set(before) and all(after[key] >= before[key] for key in before), (before, after, output)
    for key, at in after.items():  # the line says where each cell resumes: its checkpoint's round
        assert re.search(rf"cell {key} \([^)]*\): [^;]*; the next run resumes at round {at} of {ROUNDS}", lines[0]), (
            lines[0]
        )
    assert not list(store.glob("*/claim.json")), output  # released: the next run takes them at once
