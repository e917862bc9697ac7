"""Preemption (pflbench/run/preemption.py): SIGTERM or Ctrl-C while a `pflbench run --no-ray` cell runs.

The signal is sent by the run itself at a known point (a child script wraps the engine: the end of round
K, or inside round K), with `signal.raise_signal`, whose Python handler runs before the call returns:
no test waits on the machine's speed. The deadline test waits on an alarm of 0.5 s against a round that
never ends by itself, so it cannot race either."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkpoint_helpers import assert_same_result
from pflbench.storage.checkpoint import CHECKPOINT, read_header
from pflbench.run.preemption import PREEMPTED_EXIT, Preempted, Preemption

ROUNDS = 12
SPEC = f"""
name: preempt
matrix:
  algorithm: [fedavg]
  dataset: [synthetic]
  partition: [{{scheme: pathological, params: {{classes_per_client: 3}}}}]
  seed: [0, 1]
defaults: {{clients: 5, rounds: {ROUNDS}, local_epochs: 1, lr: 0.05, eval_every: 2, dataset_options: {{num_samples: 600}}}}
resources: {{cpus: 1}}
"""
# The child: `pflbench run` with signals sent from inside the first cell (env SIGNALS: "SIGTERM@5" at the
# end of round 5, "SIGINT@3,SIGINT@3" twice there, "SIGTERM@7:in-round" inside round 7, which then waits
# for the grace deadline, "SIGINT@3:saved" once round 3's checkpoint is written). Only the first cell (seed 0)
# sends them.
SIGNALLING = textwrap.dedent("""
    import os, signal, sys, time
    import pflbench.storage.checkpoint as checkpoint
    import pflbench.simulator.rounds as rounds

    plan = [item.split("@") for item in os.environ["SIGNALS"].split(",")]
    end_of_round = checkpoint.Checkpointer.after_round
    run_round = rounds.run_round

    def signals(rnd, where, cell):
        for name, at in plan:
            at, _, place = at.partition(":")
            if cell.seed == 0 and int(at) == rnd and (place or "end") == where:
                signal.raise_signal(getattr(signal, name))

    def after_round(self, rnd, fed, algorithm, loop, elapsed):
        signals(rnd, "end", self.cell)
        return end_of_round(self, rnd, fed, algorithm, loop, elapsed)

    def in_round(algorithm, rnd, clients, timing=None, fed=None):
        signals(rnd, "in-round", fed.cell)
        if any(at.endswith(f"{rnd}:in-round") for _, at in plan) and fed.cell.seed == 0:
            time.sleep(600)  # a round that does not end: the grace deadline stops it
        return run_round(algorithm, rnd, clients, timing, fed)

    save = checkpoint.Checkpointer.save

    def saved(self, rnd, fed, algorithm, loop, elapsed):
        save(self, rnd, fed, algorithm, loop, elapsed)
        signals(rnd, "saved", self.cell)

    checkpoint.Checkpointer.after_round = after_round
    checkpoint.Checkpointer.save = saved
    rounds.run_round = in_round
    from pflbench.cli import main
    sys.exit(main(sys.argv[1:]))
""")
PFLBENCH = [sys.executable, "-c", "import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))"]
ARGS = ["--no-ray", "--checkpoint-minutes", "0"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    (root / "spec.yaml").write_text(SPEC)
    env = {
        **os.environ,
        "PFLBENCH_DATA": str(root / "data"),
        "PFLBENCH_DATA_MIRROR": str(root / "no-mirror"),
        "OMP_NUM_THREADS": "1",
    }
    done = run(root, "uninterrupted", env)
    assert done.returncode == 0, done.stdout + done.stderr
    return root, env, cells(root / "uninterrupted")


def run(root: Path, store: str, env: dict, extra=(), signals: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", SIGNALLING] if signals else PFLBENCH
    return subprocess.run(
        [*command, "run", str(root / "spec.yaml"), "--results", str(root / store), *ARGS, *extra],
        env={**env, **({"SIGNALS": signals} if signals else {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def cells(store: Path) -> dict[int, Path]:
    """The store's cell folders by seed."""
    found = {}
    for folder in store.iterdir():
        if folder.is_dir() and not folder.name.startswith("_") and (folder / "config.json").exists():
            found[json.loads((folder / "config.json").read_text())["cell"]["seed"]] = folder
    return found


def only_folder(store: Path) -> Path:
    folders = [p for p in store.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert len(folders) == 1, folders  # the second cell was never started
    return folders[0]


def resumed_at(output: str) -> int | None:
    found = re.search(rf"resumed at round (\d+) of {ROUNDS}", output)
    return int(found.group(1)) if found else None


def one_line(output: str, start: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(start)]
    assert len(lines) == 1, output
    return lines[0]


def test_sigterm_checkpoints_the_round_in_progress_and_the_next_run_resumes_there_bit_identical(setup):
    root, env, reference = setup
    stopped = run(root, "sigterm", env, signals="SIGTERM@5")
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stdout + stopped.stderr
    folder = only_folder(root / "sigterm")
    line = one_line(stopped.stdout, "preempted (SIGTERM): cell ")
    assert line.startswith(f"preempted (SIGTERM): cell {folder.name} (fedavg")
    assert line.endswith(f"checkpoint written after round 5 of {ROUNDS}; the next run resumes at round 5 of {ROUNDS}")
    assert "Traceback" not in stopped.stdout + stopped.stderr
    assert "SIGTERM: stopping at the end of the round in progress" in stopped.stderr
    assert read_header(folder / CHECKPOINT)["round"] == 5  # with checkpoints by time only: the preemption's
    assert not (folder / "summary.json").exists() and not (folder / "claim.json").exists()

    again = run(root, "sigterm", env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert resumed_at(again.stdout) == 5
    done = cells(root / "sigterm")
    for seed in (0, 1):
        assert_same_result(done[seed], reference[seed])
    assert json.loads((done[0] / "summary.json").read_text())["resumed_from_round"] == 5
    assert not (done[0] / CHECKPOINT).exists()


def test_a_second_ctrl_c_stops_at_once_and_the_last_checkpoint_is_resumed(setup):
    root, env, reference = setup
    stopped = run(root, "ctrl-c", env, extra=["--checkpoint-every", "2"], signals="SIGINT@3,SIGINT@3")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert "preempted" not in stopped.stdout and "Traceback" not in stopped.stdout + stopped.stderr
    folder = only_folder(root / "ctrl-c")
    assert read_header(folder / CHECKPOINT)["round"] == 2  # round 3's end was never reached
    again = run(root, "ctrl-c", env, extra=["--checkpoint-every", "2"])
    assert again.returncode == 0 and resumed_at(again.stdout) == 2, again.stdout + again.stderr
    assert_same_result(cells(root / "ctrl-c")[0], reference[0])


def test_two_quick_ctrl_cs_after_the_round_ended_on_the_first_keep_its_checkpoint_and_exit_75(setup):
    """The second Ctrl-C comes once the round ended on the first and its checkpoint is written: the run ends as
    the first asked (exit 75, the next run resumes there), the second only acknowledged."""
    root, env, reference = setup
    stopped = run(root, "ctrl-c-twice", env, signals="SIGINT@3,SIGINT@3:saved")
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stdout + stopped.stderr
    assert "SIGINT: already stopping, the checkpoint of the round just ended is being kept" in stopped.stderr
    line = one_line(stopped.stdout, "preempted (SIGINT): cell ")
    assert line.endswith(
        f"checkpoint written after round 3 of {ROUNDS}; the next run resumes at round 3 of {ROUNDS}"
    ), line
    assert read_header(only_folder(root / "ctrl-c-twice") / CHECKPOINT)["round"] == 3
    again = run(root, "ctrl-c-twice", env)
    assert again.returncode == 0 and resumed_at(again.stdout) == 3, again.stdout + again.stderr
    assert_same_result(cells(root / "ctrl-c-twice")[0], reference[0])


def test_a_round_that_does_not_end_within_the_grace_period_stops_at_once_and_resumes_from_the_last_checkpoint(setup):
    root, env, reference = setup
    stopped = run(
        root, "deadline", env, extra=["--checkpoint-every", "2", "--grace-seconds", "0.5"], signals="SIGTERM@7:in-round"
    )
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stdout + stopped.stderr
    folder = only_folder(root / "deadline")
    line = one_line(stopped.stdout, "preempted (SIGTERM): cell ")
    assert line.endswith(
        f"round 7 of {ROUNDS} had not ended 0.5 s after the signal; the next run resumes at round 6 of {ROUNDS}"
    ), line
    assert read_header(folder / CHECKPOINT)["round"] == 6
    assert not list(folder.glob(".*.tmp")) and not (folder / "summary.json").exists()
    again = run(root, "deadline", env, extra=["--checkpoint-every", "2"])
    assert again.returncode == 0 and resumed_at(again.stdout) == 6, again.stdout + again.stderr
    assert_same_result(cells(root / "deadline")[0], reference[0])


def test_the_signal_handlers_are_the_callers_again_after_a_run_and_a_second_signal_interrupts():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    preemption = Preemption(grace_seconds=10)
    with preemption.installed():
        signal.raise_signal(signal.SIGTERM)
        assert preemption.requested and preemption.signal == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(Preempted), Preemption(grace_seconds=0).installed() as at_once, at_once.cell_running():
        signal.raise_signal(signal.SIGTERM)  # no grace: the cell stops inside its round
    with pytest.raises(ValueError, match="grace seconds"):
        Preemption(grace_seconds=-1)
