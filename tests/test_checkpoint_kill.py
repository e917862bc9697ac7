"""kill -9 anywhere: a `pflbench run` process killed (SIGKILL, no chance to clean up) after a round
checkpoint exists, or while one is being written, is run again and gives the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from budgets import scaled
from checkpoint_helpers import assert_same_result
from pflbench.storage.checkpoint import CHECKPOINT, CheckpointProblem, read_header

PFLBENCH = [sys.executable, "-c", "import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))"]
ROUNDS = 40
SPEC = f"""
name: kill
matrix:
  algorithm: [pfedla]
  dataset: [synthetic]
  partition: [{{scheme: pathological, params: {{classes_per_client: 3}}}}]
  seed: [0]
defaults: {{clients: 5, rounds: {ROUNDS}, local_epochs: 2, lr: 0.05, eval_every: 5, dataset_options: {{num_samples: 1000}}}}
resources: {{cpus: 1}}
"""
# Run with checkpoints every 2 rounds; the child of the writing-kill test stops inside the write.
ARGS = ["--no-ray", "--checkpoint-every", "2", "--checkpoint-minutes", "0"]
STOP_IN_WRITE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import pflbench.storage.store as store
    real, writes = store.atomic_write, []

    def atomic_write(path, write):
        if Path(path).name != "checkpoint.pt" or len(writes) + 1 < int(os.environ["STOP_AT_WRITE"]):
            writes.append(path)
            return real(path, write)
        def half(tmp):  # half of the file on disk, then wait for the kill inside the write
            write(tmp)
            data = Path(tmp).read_bytes()
            Path(tmp).write_bytes(data[: len(data) // 2])
            Path(os.environ["SIGNAL_FILE"]).touch()
            time.sleep(600)
        return real(path, half)

    store.atomic_write = atomic_write
    from pflbench.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    (root / "spec.yaml").write_text(SPEC)
    env = {
        **os.environ,
        "PFLBENCH_DATA": str(root / "data"),
        "PFLBENCH_DATA_MIRROR": str(root / "no-mirror"),
        "OMP_NUM_THREADS": "1",
    }
    done = run(root, "uninterrupted", env)
    assert done.returncode == 0, done.stdout + done.stderr
    return root, env, cell_folder(root / "uninterrupted")


def run(root: Path, store: str, env: dict, extra=()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PFLBENCH, "run", str(root / "spec.yaml"), "--results", str(root / store), *ARGS, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def cell_folder(store: Path) -> Path:
    folders = [p for p in store.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert len(folders) == 1, folders
    return folders[0]


def wait_for(condition, process, what: str, timeout: float = 120.0):
    timeout = scaled(timeout)  # a bound on a hang: a loaded machine's slow start-up is not one (tests/budgets.py)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"the run ended before {what}: {process.stdout.read()}")
        time.sleep(0.02)
    pytest.fail(f"no {what} within {timeout} s")


def checkpoint_round(store: Path) -> int | None:
    for path in store.glob(f"*/{CHECKPOINT}"):
        try:
            return read_header(path)["round"]
        except (OSError, CheckpointProblem):
            return None
    return None


def test_a_killed_cell_resumes_from_its_checkpoint_and_gives_the_uninterrupted_result(setup):
    root, env, reference = setup
    store = root / "killed"
    process = subprocess.Popen(
        [*PFLBENCH, "run", str(root / "spec.yaml"), "--results", str(store), *ARGS],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    at = wait_for(lambda: (checkpoint_round(store) or 0) >= 4 and checkpoint_round(store), process, "checkpoint")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    folder = cell_folder(store)
    assert not (folder / "summary.json").exists(), "the cell finished before the kill"
    assert (folder / "claim.json").exists()  # the dead runner's claim: the rerun takes it over, then resumes
    again = run(root, "killed", env)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed_at = checkpoint_round_from(again.stdout)
    assert resumed_at is not None and resumed_at >= at, again.stdout
    assert_same_result(folder, reference)
    assert not (folder / CHECKPOINT).exists()  # removed once the result is written
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["resumed_from_round"] == resumed_at and summary["checkpoint_seconds"] > 0


def checkpoint_round_from(output: str) -> int | None:
    import re

    found = re.search(rf"resumed at round (\d+) of {ROUNDS}", output)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("stop_at_write", [3])
def test_a_kill_while_a_checkpoint_is_written_leaves_the_previous_one_and_the_rerun_matches(setup, stop_at_write):
    """The third write (round 6): the checkpoint of round 4 is still whole, and the rerun resumes there."""
    root, env, reference = setup
    store = root / f"killed-writing-{stop_at_write}"
    signal_file = root / f"writing-{stop_at_write}"
    process = subprocess.Popen(
        [sys.executable, "-c", STOP_IN_WRITE, "run", str(root / "spec.yaml"), "--results", str(store), *ARGS],
        env={**env, "STOP_AT_WRITE": str(stop_at_write), "SIGNAL_FILE": str(signal_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for(signal_file.exists, process, "checkpoint write")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    folder = cell_folder(store)
    assert list(folder.glob(f".{CHECKPOINT}.*.tmp")), "the kill did not land inside the write"
    previous = checkpoint_round(store)
    assert previous == (None if stop_at_write == 1 else 2 * (stop_at_write - 1))
    again = run(root, store.name, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert checkpoint_round_from(again.stdout) == previous
    assert "set aside" not in again.stdout
    assert_same_result(folder, reference)
    assert not list(folder.glob(f".{CHECKPOINT}.*.tmp"))
