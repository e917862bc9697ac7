"""A sweep's trials keep their round checkpoints through the driver's keeper (issue 60, part 4): a trial
whose worker is killed is restarted by Ray Tune and resumes from its checkpoint, and a sweep that ended
with an errored trial is continued by `--resume`; either way the trial reports, round by round, the
same validation accuracy and loss, bit for bit, as an uninterrupted trial of the same values. A sweep
whose driver gets SIGTERM (preemption) checkpoints its trial at the end of the round in progress,
exits with status 75 and one line, and `--resume` continues the trial from that round.

The kill is real (SIGKILL to the trial's own worker process, from a plugin algorithm at the start of a
chosen round, once), and so is the signal (SIGTERM to the sweep's driver, from the trial at the start of
a chosen round): their moment is fixed by the round, not by a sleep. The two-node version (the trial's
whole node lost) is in tests/test_multinode.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from budgets import scaled

from pflbench.run.checkpoint_relay import CheckpointKeeper, StaleAttempt
from pflbench.simulator.execution import ExecutionOptions
from pflbench.run.spec import parse_spec

ROUNDS = 5
KILL_ROUND = 3  # the worker dies at the start of this round, after the checkpoint of the round before
# The bound of every wait here on another process (a hang is caught; a busy machine's slow start is not one),
# scaled by the load when the module is loaded (tests/budgets.py): about 60 s on a quiet machine.
BOUND = scaled(240)

DYING_AVG = '''
"""FedAvg whose trial, at the start of round {kill_round}, once per {gate} (the file `stopped` says it
happened) and never in the test's own process, {what}; every round is traced."""
import os
import signal
import time
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg

GATE = Path({gate!r})


@ALGORITHMS.register("dying-fedavg")
class DyingFedAvg(FedAvg):
    def configure(self, rnd):
        with open(GATE / "trace.txt", "a") as trace:
            trace.write(f"{{rnd.number}} {{os.getpid()}}\\n")
        if rnd.number == {kill_round} and os.getpid() != {test_pid} and not (GATE / "stopped").exists():
            (GATE / "stopped").touch()
            {action}
        return super().configure(rnd)
'''
KILL = "os.kill(os.getpid(), signal.SIGKILL)"
WAIT = (
    f"deadline = time.monotonic() + {BOUND:.0f}  # the test kills the sweep's driver meanwhile\n"
    "            while time.monotonic() < deadline:\n"
    "                time.sleep(0.1)\n"
    "            raise RuntimeError('the test never killed the driver')"
)
# SIGTERM to the sweep's driver (this test's process), then wait, bounded, until the driver's stop reached
# this trial: the end of this round is where the trial must stop.
SIGTERM_DRIVER = (
    "from pflbench.run.preemption import current\n"
    "            os.kill({driver}, signal.SIGTERM)\n"
    f"            deadline = time.monotonic() + {BOUND:.0f}\n"
    "            while not current().requested:\n"
    "                if time.monotonic() > deadline:\n"
    "                    raise RuntimeError('the driver\\'s stop never reached this trial')\n"
    "                time.sleep(0.05)"
)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for this file's sweeps (each would start and stop its own otherwise)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def dying_sweep_base(tmp_path: Path, action: str = KILL):
    """The base cell (and its resources) of a sweep of the dying FedAvg, its spec written to
    tmp_path/base.yaml, and its gate folder."""
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin = tmp_path / "dying_avg.py"
    what = {KILL: "kills its own process (SIGKILL)", WAIT: "waits for the test to kill the sweep's driver"}.get(
        action, "sends SIGTERM to the sweep's driver"
    )
    plugin.write_text(
        DYING_AVG.format(gate=str(gate), kill_round=KILL_ROUND, test_pid=os.getpid(), what=what, action=action)
    )
    spec = {
        "name": "dying",
        "plugins": [str(plugin)],
        "matrix": {"algorithm": "dying-fedavg", "dataset": "synthetic"},
        "defaults": {
            "clients": 3,
            "rounds": ROUNDS,
            "eval_every": 1,
            "local_epochs": 1,
            "lr": 0.05,
            "dataset_options": {"num_samples": 300},
        },
        "resources": {"cpus": 1},
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(spec))
    plan = parse_spec(spec)
    return plan.cells[0], plan.resources, gate


def trace_of(gate: Path) -> list[tuple[int, int]]:
    """(round, pid) of every round the trial started, in order."""
    return [tuple(map(int, line.split())) for line in (gate / "trace.txt").read_text().splitlines()]


def uninterrupted_reports(base, values: dict, data_root: Path) -> pd.DataFrame:
    """The trial of `values` run here, without checkpoints or interruption: what it reports, per round."""
    from ray import tune

    from pflbench.loader.plugins import sources_for
    from pflbench.tuning.trial import run_trial

    reports = []
    real = tune.report
    tune.report = lambda metrics, **_: reports.append(metrics)
    try:
        run_trial(
            values,
            base=base.model_dump(mode="json"),
            cpus=1,
            data_root=str(data_root),
            mirror=None,
            execution=ExecutionOptions(device="cpu"),
            plugins=sources_for([base]),
        )
    finally:
        tune.report = real
    return pd.DataFrame(
        [{"round": r["round"], "val_accuracy": r["val_accuracy"], "val_loss": r["val_loss"]} for r in reports]
    )


def assert_same_reports(folder: Path, reference: pd.DataFrame) -> None:
    """The sweep's trials.parquet holds the uninterrupted trial's rounds, exactly (each round once)."""
    stored = pd.read_parquet(folder / "trials.parquet")
    assert list(stored["round"]) == list(range(1, ROUNDS + 1)) and stored["val_loss"].notna().all()
    columns = ["round", "val_accuracy", "val_loss"]
    pd.testing.assert_frame_equal(stored[columns].reset_index(drop=True), reference[columns], check_exact=True)


def test_the_keeper_gives_a_trials_checkpoint_to_its_latest_start_only(tmp_path):
    """`begin`: each start of a trial (which Tune restarts, not the driver) opens the next attempt; an
    earlier start's late write is refused, and the checkpoint must carry the trial's cell hash."""
    from pflbench.storage.checkpoint import CheckpointProblem, encode_checkpoint

    keeper = CheckpointKeeper(str(tmp_path / "checkpoints"))
    data = encode_checkpoint({"hash": "cellhash", "round": 2, "rounds": 5}, {"round": 2})
    first = keeper.begin("trial_1", "cellhash")
    keeper.write("trial_1", first, data)
    assert keeper.read("trial_1") == data == (tmp_path / "checkpoints" / "trial_1" / "checkpoint.pt").read_bytes()
    second = keeper.begin("trial_1", "cellhash")  # Tune restarted the trial
    assert second == first + 1
    with pytest.raises(StaleAttempt, match="attempt 0 is not the cell's current one"):
        keeper.write("trial_1", first, data)
    with pytest.raises(
        CheckpointProblem, match="a checkpoint of cell other sent as trial trial_1's \\(cell cellhash\\)"
    ):
        keeper.write("trial_1", second, encode_checkpoint({"hash": "other", "round": 2}, {"round": 2}))
    keeper.remove("trial_1", second)
    assert keeper.read("trial_1") is None


@pytest.mark.slow
def test_a_trial_whose_worker_is_killed_resumes_from_its_kept_checkpoint_bit_for_bit(
    tmp_path, local_ray, fresh_plugins
):
    from pflbench.tuning.sweep import run_sweep
    from pflbench.tuning.trial import SweepOptions

    base, resources, gate = dying_sweep_base(tmp_path)
    lines: list[str] = []
    result = run_sweep(
        "dying-fedavg",
        base,
        resources,
        SweepOptions(
            trials=1,
            results=tmp_path / "results",
            out=None,
            data_root=tmp_path / "data",
            workers=1,
            checkpoint_every=1,
            checkpoint_minutes=0,
            retries=2,
        ),
        log=lines.append,
    )
    [trial] = result.trials
    assert (gate / "stopped").exists(), "the worker was never killed"
    assert trial["status"] == "completed" and trial["error"] is None, trial
    assert trial["resumed_at_rounds"] == [KILL_ROUND - 1], trial
    assert f"trial 0 ({trial['trial_id']}): resumed at round {KILL_ROUND - 1} of {ROUNDS} from its checkpoint" in lines
    # Rounds 1..KILL_ROUND started in the first worker (killed at the start of KILL_ROUND); the retry, in
    # another process, started at KILL_ROUND: nothing before the checkpoint ran twice.
    trace = trace_of(gate)
    killed_pid = trace[0][1]
    assert trace[:KILL_ROUND] == [(r, killed_pid) for r in range(1, KILL_ROUND + 1)]
    assert [r for r, _ in trace[KILL_ROUND:]] == list(range(KILL_ROUND, ROUNDS + 1))
    assert len({pid for _, pid in trace[KILL_ROUND:]}) == 1 and trace[KILL_ROUND][1] != killed_pid
    # The finished trial removed its checkpoint from the driver's keeper; nothing else is left there.
    assert not list((result.folder / "checkpoints").rglob("*.pt"))
    assert_same_reports(result.folder, uninterrupted_reports(base, trial["values"], tmp_path / "data"))


@pytest.mark.slow
def test_a_sweep_rerun_with_resume_continues_an_errored_trial_from_its_checkpoint(tmp_path, local_ray, fresh_plugins):
    """No retries: the killed trial errors and the sweep ends without a result, keeping the trial's
    checkpoint; the same sweep with --resume restarts the trial under its id, from that checkpoint."""
    from pflbench.storage.checkpoint import read_header
    from pflbench.tuning.sweep import run_sweep
    from pflbench.tuning.trial import SweepError, SweepOptions

    base, resources, gate = dying_sweep_base(tmp_path)
    options = SweepOptions(
        trials=1,
        results=tmp_path / "results",
        out=tmp_path / "tuned",
        data_root=tmp_path / "data",
        workers=1,
        checkpoint_every=1,
        checkpoint_minutes=0,
        retries=0,
    )
    lines: list[str] = []
    with pytest.raises(SweepError, match="no trial of dying-fedavg ran every round.*--resume .* continues its trials"):
        run_sweep("dying-fedavg", base, resources, options, log=lines.append)
    [folder] = (tmp_path / "results" / "sweeps").iterdir()
    [checkpoint] = (folder / "checkpoints").glob("*/checkpoint.pt")
    assert read_header(checkpoint)["round"] == KILL_ROUND - 1
    assert any(f"the same command with --resume {folder} continues them" in line for line in lines), lines
    assert not (tmp_path / "tuned").exists()

    with pytest.raises(SweepError, match="not of fedavg on base cell"):  # another sweep's folder is refused
        run_sweep(
            "fedavg",
            base.model_copy(update={"algorithm": "fedavg"}),
            resources,
            replace(options, resume=folder),
            log=lines.append,
        )
    lines.clear()
    result = run_sweep("dying-fedavg", base, resources, replace(options, resume=folder), log=lines.append)
    assert result.folder == folder
    [trial] = result.trials
    assert trial["trial_id"] == checkpoint.parent.name  # the same trial, restarted by Tune's restore
    assert trial["status"] == "completed" and trial["resumed_at_rounds"] == [KILL_ROUND - 1], trial
    assert f"trial 0 ({trial['trial_id']}): resumed at round {KILL_ROUND - 1} of {ROUNDS} from its checkpoint" in lines
    assert [r for r, _ in trace_of(gate)] == list(range(1, KILL_ROUND + 1)) + list(range(KILL_ROUND, ROUNDS + 1))
    assert not checkpoint.exists() and (tmp_path / "tuned" / "dying-fedavg.yaml").is_file()
    assert_same_reports(folder, uninterrupted_reports(base, trial["values"], tmp_path / "data"))


@pytest.mark.slow
def test_a_sweep_whose_driver_is_killed_is_continued_by_resume_from_its_kept_checkpoint(
    tmp_path, local_ray, fresh_plugins
):
    """`pflbench sweep` (another process, on this file's Ray) is killed -9 with its trial waiting at the
    start of round KILL_ROUND (once Tune's saved state names the trial: a trial it never saved is sampled
    anew); Ray ends the trial with its driver. The same sweep with --resume restores Tune's saved state
    and the trial, under its id, resumes from the checkpoint the driver's keeper wrote; trials.parquet
    holds every round once, equal to an uninterrupted trial's."""
    from pflbench.storage.checkpoint import read_header
    from pflbench.tuning.sweep import run_sweep
    from pflbench.tuning.trial import SweepOptions

    base, resources, gate = dying_sweep_base(tmp_path, action=WAIT)
    results = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "pflbench.cli",
        "sweep",
        "--algo",
        "dying-fedavg",
        "--spec",
        str(tmp_path / "base.yaml"),
        "--trials",
        "1",
        "--workers",
        "1",
        "--grace-rounds",
        str(ROUNDS),
        "--results",
        str(results),
        "--out",
        str(tmp_path / "tuned"),
        "--root",
        str(tmp_path / "data"),
        "--checkpoint-every",
        "1",
        "--checkpoint-minutes",
        "0",
        "--ray-address",
        local_ray.get_runtime_context().gcs_address,
    ]
    deadline = time.monotonic() + BOUND

    def trial_saved_by_tune():
        """The trial waits at the gate, its checkpoint written, and Tune's saved state names it."""
        found = list(results.glob("sweeps/*/checkpoints/*/checkpoint.pt"))
        if not (gate / "stopped").exists() or not found:
            return None
        states = list(found[0].parents[2].glob("ray/experiment_state-*.json"))
        return found[0] if states and found[0].parent.name in states[0].read_text() else None

    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        checkpoint = None
        while checkpoint is None and driver.poll() is None and time.monotonic() < deadline:
            checkpoint = trial_saved_by_tune()
            time.sleep(0.2)
        assert checkpoint is not None, f"no trial at the gate: {(tmp_path / 'driver.log').read_text()[-3000:]}"
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and anything it started
        driver.wait(timeout=BOUND)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=BOUND)
    assert read_header(checkpoint)["round"] == KILL_ROUND - 1
    folder = checkpoint.parents[2]
    assert not (folder / "sweep.json").exists()

    lines: list[str] = []
    result = run_sweep(
        "dying-fedavg",
        base,
        resources,
        SweepOptions(
            trials=1,
            results=results,
            out=tmp_path / "tuned",
            data_root=tmp_path / "data",
            workers=1,
            checkpoint_every=1,
            checkpoint_minutes=0,
            resume=folder,
        ),
        log=lines.append,
    )
    [trial] = result.trials
    assert trial["trial_id"] == checkpoint.parent.name and trial["status"] == "completed", trial
    assert trial["resumed_at_rounds"] == [KILL_ROUND - 1], trial
    assert f"trial 0 ({trial['trial_id']}): resumed at round {KILL_ROUND - 1} of {ROUNDS} from its checkpoint" in lines
    resumed_pids = {pid for r, pid in trace_of(gate)[KILL_ROUND:]}
    assert [r for r, _ in trace_of(gate)] == list(range(1, KILL_ROUND + 1)) + list(range(KILL_ROUND, ROUNDS + 1))
    assert trace_of(gate)[0][1] not in resumed_pids
    assert_same_reports(folder, uninterrupted_reports(base, trial["values"], tmp_path / "data"))


@pytest.mark.slow
def test_a_sweep_whose_driver_gets_sigterm_checkpoints_its_trial_at_the_end_of_the_round_and_resume_continues_it(
    tmp_path, local_ray, fresh_plugins, capfd
):
    """`pflbench sweep` (here, in this process, on this file's Ray) gets SIGTERM from its trial at the start
    of round KILL_ROUND; the trial ends that round, writes its checkpoint through the driver's keeper and
    stops; the sweep exits with PREEMPTED_EXIT and one line naming the trial, the round and `--resume`.
    The same command with --resume continues the trial at that round, in another worker, and
    trials.parquet equals the uninterrupted trial's, round by round."""
    import json
    import re
    import signal as signals

    from pflbench.storage.checkpoint import read_header
    from pflbench.cli import main
    from pflbench.run.preemption import PREEMPTED_EXIT

    base, _, gate = dying_sweep_base(tmp_path, action=SIGTERM_DRIVER.format(driver=os.getpid()))
    results = tmp_path / "results"
    command = [
        "sweep",
        "--algo",
        "dying-fedavg",
        "--spec",
        str(tmp_path / "base.yaml"),
        "--trials",
        "1",
        "--workers",
        "1",
        "--grace-rounds",
        str(ROUNDS),
        "--results",
        str(results),
        "--out",
        str(tmp_path / "tuned"),
        "--root",
        str(tmp_path / "data"),
        "--checkpoint-minutes",
        "0",
        "--retries",
        "0",
    ]  # no checkpoint but the preempted round's; an error would end the sweep
    handlers = {sig: signals.getsignal(sig) for sig in (signals.SIGTERM, signals.SIGINT)}
    assert main(command) == PREEMPTED_EXIT, capfd.readouterr()
    out, err = capfd.readouterr()
    assert {sig: signals.getsignal(sig) for sig in handlers} == handlers  # the sweep's handlers are gone
    assert (
        "SIGTERM: stopping at the end of the round in progress (at most 25 s), with a checkpoint; "
        "Ctrl-C again to stop at once"
    ) in err
    [folder] = (results / "sweeps").iterdir()
    [checkpoint] = (folder / "checkpoints").glob("*/checkpoint.pt")
    trial_id = checkpoint.parent.name
    assert re.search(
        rf"^preempted \(SIGTERM\): sweep {folder.name}: trial {trial_id}: checkpoint written after "
        rf"round {KILL_ROUND} of {ROUNDS}; the next run resumes at round {KILL_ROUND} of {ROUNDS}; the "
        rf"same command with --resume {re.escape(str(folder))} continues it$",
        err,
        re.M,
    ), err
    assert read_header(checkpoint)["round"] == KILL_ROUND
    assert not (folder / "sweep.json").exists() and not (tmp_path / "tuned").exists()
    assert [r for r, _ in trace_of(gate)] == list(range(1, KILL_ROUND + 1))

    assert main([*command, "--resume", str(folder)]) == 0, capfd.readouterr()
    out, err = capfd.readouterr()
    [trial] = json.loads((folder / "sweep.json").read_text())["outcomes"]
    assert trial["trial_id"] == trial_id and trial["status"] == "completed", trial
    assert trial["resumed_at_rounds"] == [KILL_ROUND], trial
    assert f"trial 0 ({trial_id}): resumed at round {KILL_ROUND} of {ROUNDS} from its checkpoint" in out
    # Rounds 1..KILL_ROUND ran in the first worker; the resumed trial, in another, started after KILL_ROUND.
    trace = trace_of(gate)
    assert [r for r, _ in trace] == list(range(1, ROUNDS + 1))
    assert trace[KILL_ROUND][1] != trace[0][1]
    assert not checkpoint.exists() and (tmp_path / "tuned" / "dying-fedavg.yaml").is_file()
    assert_same_reports(folder, uninterrupted_reports(base, trial["values"], tmp_path / "data"))


def test_a_stopping_sweep_waits_for_the_trials_running_at_the_signal_at_most_the_grace_seconds(tmp_path, local_ray):
    """The driver's side of a sweep's stop (TrialStops, on a real board, the clock the test's): the stop
    reaches the board at the first step after the signal; the Tune run ends once every trial running then
    has stopped or ended (a trial started later is not waited for), or after the grace seconds, once;
    the line says where each trial stopped and that --resume continues the sweep."""
    import signal as signals

    from pflbench.storage.checkpoint import encode_checkpoint
    from pflbench.run.preemption import Preempted, Preemption
    from pflbench.run.on_ray import start_board
    from pflbench.tuning.sweep_stop import STOPPED, TrialStops

    def stopping(running_at_signal: list[str]):
        clock = [0.0]
        board = start_board()
        preemption = Preemption(grace_seconds=10)
        stops = TrialStops(preemption, board, tmp_path / "checkpoints", rounds=12, clock=lambda: clock[0])
        assert not stops.step(running_at_signal)  # no signal yet: nothing asked of the board
        assert local_ray.get(board.stop_requested.remote()) is None
        with preemption.installed():
            signals.raise_signal(signals.SIGTERM)
        assert not stops.step(running_at_signal)
        assert local_ray.get(board.stop_requested.remote()) == "SIGTERM"
        return stops, board, clock

    # Every trial running at the signal stops (or completes) within the grace seconds: the run ends then.
    stops, board, clock = stopping(["a", "b"])
    local_ray.get(board.post.remote("a", {STOPPED: Preempted("SIGTERM", rounds_done=4, resumes_at=4)}))
    clock[0] = 3.0
    assert not stops.step(["a", "b", "c"])  # b still in its round; c started after the signal
    assert stops.step(["a", "c"])  # b completed
    assert not stops.step(["a", "c"])  # once
    assert stops.line(tmp_path / "sweep-x") == (
        "preempted (SIGTERM): sweep sweep-x: trial a: checkpoint written after round 4 of 12; the next run resumes "
        "at round 4 of 12; trial c: started as the sweep stopped, ended; the next run starts it from round 1 (it "
        f"has no checkpoint); the same command with --resume {tmp_path / 'sweep-x'} continues it"
    )

    # A trial still in its round at the grace deadline is ended with the run, from its last checkpoint.
    (tmp_path / "checkpoints" / "b").mkdir(parents=True)
    (tmp_path / "checkpoints" / "b" / "checkpoint.pt").write_bytes(
        encode_checkpoint({"hash": "cell", "round": 2, "rounds": 12}, {"round": 2})
    )
    stops, board, clock = stopping(["b"])
    clock[0] = 10.0
    assert not stops.step(["b"])
    clock[0] = 10.5
    assert stops.step(["b"])
    assert stops.line(tmp_path / "sweep-y") == (
        "preempted (SIGTERM): sweep sweep-y: trial b: still in a round 10 s after the signal, stopped at once; the "
        f"next run resumes at round 2 of 12; the same command with --resume {tmp_path / 'sweep-y'} continues it"
    )


def test_a_stopping_sweep_waits_for_a_trial_that_started_before_tune_marked_it_running(tmp_path, local_ray):
    """Tune marks a trial RUNNING when it has processed its actor's start, which on a busy machine comes after
    the trial's training began (a sweep signalled then said "no trial was running" and its trials restarted
    from round 1 on --resume). A trial says on the board that it started, before its first round; the driver
    waits for it though Tune still calls it PENDING, and ends the Tune run (SIGUSR1) once it has stopped."""
    import signal as signals
    from types import SimpleNamespace

    from pflbench.run.preemption import Preempted, Preemption
    from pflbench.run.on_ray import start_board
    from pflbench.tuning.sweep_stop import STOPPED, EndTuneRun, TrialStops, active

    board = start_board()
    preemption = Preemption(grace_seconds=600)
    stops = TrialStops(preemption, board, tmp_path / "checkpoints", rounds=12)
    local_ray.get(board.post.remote("a", {"started": True}))  # what `started_trial` posts, before round 1
    trials = [SimpleNamespace(trial_id="a", status="PENDING"), SimpleNamespace(trial_id="b", status="PENDING")]
    ended: list[int] = []
    previous = signals.signal(signals.SIGUSR1, lambda signum, frame: ended.append(signum))  # Tune's, in a sweep
    try:
        with active(stops), preemption.installed():
            signals.raise_signal(signals.SIGTERM)
            EndTuneRun().on_step_end(iteration=0, trials=trials)
            assert not ended  # trial a started: the run waits for it
            local_ray.get(board.post.remote("a", {STOPPED: Preempted("SIGTERM", rounds_done=3, resumes_at=3)}))
            EndTuneRun().on_step_end(iteration=1, trials=trials)
            assert ended == [signals.SIGUSR1]
    finally:
        signals.signal(signals.SIGUSR1, previous)
    assert stops.line(tmp_path / "sweep-z") == (
        "preempted (SIGTERM): sweep sweep-z: trial a: checkpoint written after round 3 of 12; the next run resumes "
        f"at round 3 of 12; the same command with --resume {tmp_path / 'sweep-z'} continues it"
    )
