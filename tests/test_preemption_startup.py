"""SIGTERM or Ctrl-C at any moment of a command's start-up (pflbench/run/preemption.py's `startup_signals`,
pflbench/cli's `main`): before the run's own handlers are in place (imports, the spec, the partitions) the
command says in one line that nothing was started and exits with PREEMPTED_EXIT; while Ray starts, Ray's own
SIGTERM handler (which exits) is kept out, and the run stops before its first cell, preempted. Never a
silent exit 143.

Whether the handler is in place is read from the kernel (/proc/PID/status, SigCgt), not guessed from a clock:
the test that signals after one second, as a user's `pflbench run spec & sleep 1; kill -TERM $!` does, skips
where the interpreter had not even reached pflbench's entry point by then (a premise it cannot decide)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pflbench.run.preemption import PREEMPTED_EXIT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the handlers in place")

PFLBENCH = [sys.executable, "-c", "import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))"]
SPEC = """
name: startup
matrix: {algorithm: [fedavg], dataset: [synthetic], seed: [0, 1]}
defaults: {clients: 3, rounds: 3, eval_every: 1, dataset_options: {num_samples: 300}}
resources: {cpus: 1}
"""
NOTHING_STARTED = "during start-up: nothing was started; run the same command again"


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler of its own for `signum` (the kernel's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {
        **os.environ,
        "PFLBENCH_DATA": str(tmp_path / "data"),
        "PFLBENCH_DATA_MIRROR": str(tmp_path / "no-mirror"),
        "OMP_NUM_THREADS": "1",
        "RAY_ADDRESS": "",
    }
    return tmp_path, env


def start(command: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_as_soon_as_pflbench_handles_it_says_nothing_was_started_and_exits_75(setup, signum):
    """The earliest moment: the handlers are in place (SigCgt shows SIGTERM's: Python's own SIGINT handler is
    there from the interpreter's start), the heavy imports still to come."""
    root, env = setup
    process = start([*PFLBENCH, "run", str(root / "spec.yaml"), "--results", str(root / "store"), "--no-ray"], env)
    while not catches(process.pid, signal.SIGTERM):
        assert process.poll() is None, process.communicate()
        time.sleep(0.001)
    process.send_signal(signum)
    out, err = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT, (out, err)
    assert err.strip().splitlines() == [f"{signal.Signals(signum).name} {NOTHING_STARTED}"], err
    assert not (root / "store").exists() or not list((root / "store").glob("*/summary.json"))


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_pflbench_started_and_sent_sigterm_one_second_later_exits_75(setup, command):
    """`pflbench run spec & sleep 1; kill -TERM $!` (and the same of `pflbench sweep`)."""
    root, env = setup
    args = (
        ["run", str(root / "spec.yaml"), "--results", str(root / "store")]
        if command == "run"
        else [
            "sweep",
            "--algo",
            "fedavg",
            "--spec",
            str(root / "spec.yaml"),
            "--trials",
            "1",
            "--results",
            str(root / "store"),
            "--out",
            str(root / "tuned"),
        ]
    )
    process = start([*PFLBENCH, *args], env)
    time.sleep(1)
    if not catches(process.pid, signal.SIGTERM):
        process.kill()
        process.communicate()
        pytest.skip(
            f"the interpreter had not reached pflbench's entry point 1 s after it started (load "
            f"{os.getloadavg()[0]:.1f}): the premise cannot be decided here"
        )
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT, (out, err)
    assert f"SIGTERM {NOTHING_STARTED}" in err or "preempted (SIGTERM)" in err, err
    assert "Traceback" not in err, err


# The child: `pflbench run` on Ray, with SIGTERM raised in this process the moment `ray.init` returns, before
# pflbench's run could take the signal back from a handler Ray installed during it.
SIGTERM_AFTER_RAY_INIT = textwrap.dedent("""
    import signal, sys
    import ray

    real = ray.init

    def init(*args, **kwargs):
        context = real(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        return context

    ray.init = init
    from pflbench.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_sigterm_while_ray_starts_stops_the_run_before_its_first_cell(setup):
    """Neither of Ray's SIGTERM handlers is in the driver's way: not its Python one (it exits), nor its C++
    failure handler, which prints a stack ("*** SIGTERM received") and arms a 3-second alarm that aborts
    the process: a run that had stopped within those 3 s died of SIGALRM (exit -14)."""
    pytest.importorskip("ray")
    root, env = setup
    process = start(
        [
            sys.executable,
            "-c",
            SIGTERM_AFTER_RAY_INIT,
            "run",
            str(root / "spec.yaml"),
            "--results",
            str(root / "store"),
            "--workers",
            "2",
            "--checkpoint-minutes",
            "0",
        ],
        env,
    )
    out, err = process.communicate(timeout=600)
    assert process.returncode == PREEMPTED_EXIT, (out, err)
    assert "preempted (SIGTERM) on Ray: no cell was running" in out, (out, err)
    assert "SIGTERM received" not in err, err
    assert not list((root / "store").glob("*/summary.json")), out
