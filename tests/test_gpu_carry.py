"""A checkpoint carried between GPU loans keeps its code version across commits that do not touch what the
cell computes (pflbench.storage.code_version.source_files: what the round loop, the cell groups' runner and the
algorithm import), and is refused across one that does: a git checkout of pflbench, a tiny cell stopped by
SIGTERM after its first round checkpoint, then run again after an unrelated commit (it resumes) and after a
related one (its checkpoint is set aside, naming the code version, and the cell starts over)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from budgets import scaled

REPO = Path(__file__).resolve().parents[1]

SPEC = """
name: tiny-carry
matrix:
  algorithm: [local]
  dataset: [{name: synthetic, options: {num_samples: 400}}]
  partition: [{scheme: pathological, params: {classes_per_client: 4, samples_per_client: 40}}]
  clients: [3]
  seed: [0]
defaults: {rounds: 100000, eval_every: 100000, local_epochs: 1, batch_size: 16, lr: 0.05}
resources: {cpus: 1, gpus: 0}
"""


def git(tree: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def commit_change(tree: Path, relative: str) -> None:
    path = tree / relative
    path.write_text(path.read_text() + "\n# a change in a later commit\n")
    git(tree, "commit", "-qam", f"change {relative}")


def run_until(tree: Path, tmp: Path, done, seconds: float = 300) -> str:
    """`pflbench run` of the tiny cell from `tree`, SIGTERMed once `done(output so far, store)` holds (the
    preemption path: a checkpoint of the round, then exit). Its output."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PFLBENCH_DATA": str(tmp / "data"), "PYTHONUNBUFFERED": "1"}
    log = tmp / "run.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pflbench.cli",
                "run",
                str(tmp / "tiny.yaml"),
                "--no-ray",
                "--device",
                "cpu",
                "--results",
                str(tmp / "store"),
                "--checkpoint-every",
                "1",
            ],
            cwd=tmp,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        began, seconds = time.monotonic(), scaled(seconds)  # a bound on a hang, scaled by the load
        try:
            while not done(log.read_text(), tmp / "store"):
                assert process.poll() is None, f"the run ended on its own:\n{log.read_text()[-3000:]}"
                assert time.monotonic() - began < seconds, f"nothing after {seconds} s:\n{log.read_text()[-3000:]}"
                time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=scaled(120))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return log.read_text()


def checkpointed(_: str, store: Path) -> bool:
    return any(store.glob("*/checkpoint.pt"))


def resumed_or_set_aside(output: str, store: Path) -> bool:
    return ("resumed at round" in output or "set aside" in output) and checkpointed(output, store)


def test_a_carried_cell_resumes_across_an_unrelated_commit_and_is_refused_across_a_related_one(tmp_path):
    tree = tmp_path / "checkout"
    shutil.copytree(REPO / "pflbench", tree / "pflbench", ignore=shutil.ignore_patterns("__pycache__"))
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "the commit a loan ran")
    (tmp_path / "tiny.yaml").write_text(SPEC)

    first = run_until(tree, tmp_path, checkpointed)
    assert "resumed at round" not in first

    # the run machinery, a report and the execution options: nothing the cell computes
    for unrelated in (
        "pflbench/run/runner.py",
        "pflbench/storage/store.py",
        "pflbench/cli/run.py",
        "pflbench/simulator/execution.py",
        "pflbench/reports/tables.py",
    ):
        commit_change(tree, unrelated)
    second = run_until(tree, tmp_path, resumed_or_set_aside)
    assert "resumed at round" in second and "set aside" not in second, second[-3000:]

    commit_change(tree, "pflbench/simulator/training.py")  # the local step every row runs
    third = run_until(tree, tmp_path, resumed_or_set_aside)
    assert "from another code version" in third and "resumed at round" not in third, third[-3000:]


def test_the_code_version_follows_the_algorithms_imports():
    """Each algorithm's version covers its own file and the engine it imports, not another algorithm's file,
    the runner, the store, the CLI or the reports; the execution options are left out (what they decide that
    changes rounding is in the header's execution path)."""
    from pflbench.algorithm import ALGORITHMS
    from pflbench.storage.code_version import source_files

    pfedme, fedavg = source_files(ALGORITHMS.get("pfedme")), source_files(ALGORITHMS.get("fedavg"))
    assert "algorithms/pfedme.py" in pfedme and "algorithms/pfedme.py" not in fedavg
    for names in (pfedme, fedavg):
        assert {
            "pflbench/simulator/rounds.py",
            "pflbench/simulator/groups.py",
            "pflbench/simulator/training.py",
            "pflbench/simulator/federation.py",
            "pflbench/storage/checkpoint.py",
            "pflbench/simulator/static_step.py",
            "pflbench/simulator/captured.py",
            "pflbench/simulator/models.py",
            "pflbench/data/cifar_jpeg.py",
        } <= set(names)
        assert not {
            "pflbench/run/runner.py",
            "pflbench/storage/store.py",
            "pflbench/cli/run.py",
            "pflbench/simulator/execution.py",
            "pflbench/studies/publish.py",
        } & set(names)
        assert not any(name.startswith(("pflbench/reports/", "/")) for name in names)


def test_the_captured_step_keeps_a_carried_cell_only_once_verified(monkeypatch):
    """A checkpoint written on CUDA with the static (captured) step resumes eagerly, and the other way round,
    only once the `graphs` verdict is set (CUDA_GRAPHS_VERIFIED: captured bit-identical to eager); any other
    difference of the execution path refuses it either way."""
    from pflbench.storage.code_version import same_path

    eager = {"device": "cuda", "batched": True, "compiled": False, "channels_last": False, "client_threads": 1}
    captured = {**eager, "static_step": True}
    monkeypatch.setattr("pflbench.simulator.execution.CUDA_GRAPHS_VERIFIED", False)
    assert same_path(captured, captured) and same_path(eager, eager)
    assert not same_path(captured, eager) and not same_path(eager, captured)
    monkeypatch.setattr("pflbench.simulator.execution.CUDA_GRAPHS_VERIFIED", True)
    assert same_path(captured, eager) and same_path(eager, captured)
    assert not same_path({**captured, "batched": False}, eager) and not same_path(None, eager)
