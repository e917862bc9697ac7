"""A sweep stopped by SIGTERM (preemption) or a first Ctrl-C (`pflbench sweep`, pflbench/tuning/sweep.py), as
`pflbench run` on Ray stops its cells (pflbench/run/runner.py, pflbench/run/preemption.py), with the same pieces:

- the driver holds a `Preemption` (taken back from `ray.init`, whose SIGTERM handler exits, and from
  Ray Tune, which installs its own SIGINT handler when its run starts: `EndTuneRun.setup`) and passes
  the stop to the running trials through a `ProgressBoard` (pflbench/run/on_ray.py);
- each trial says on the board that it started, before its first round (`started_trial`: Tune may not
  have marked it running yet), and reads the stop there (`BoardStop`) at the end of its round, writes that round's checkpoint
  through the driver's checkpoint keeper (its `Checkpointer`, as a cell's), says so on the board and
  waits (`stopped_trial`);
- the driver ends the Tune run once every trial that was running at the signal has stopped or ended,
  or `grace_seconds` after the signal (`TrialStops`), the way Tune ends a run on a user's Ctrl-C:
  SIGUSR1, whose handler Tune installs for that. Tune then saves its state with those trials still
  running, that is unfinished, and ends their actors (its cleanup gives each 10 s to stop before it
  kills it: the checkpoints and Tune's state are written before that wait); a trial still in its round
  loses that round's work and resumes from its last checkpoint;
- the sweep exits with PREEMPTED_EXIT and one line naming each trial, the round it resumes at, and
  `--resume <sweep folder>`, which restarts the unfinished trials under their ids: each resumes from
  its checkpoint, bit for bit as if uninterrupted.

A trial neither returns nor raises after its stop: Tune would record it as completed, or as an error
(and spend one of its `--retries`); `--resume` continues neither.

`EndTuneRun` is the callback given to Tune's RunConfig, which Tune saves with its state and restores on
`--resume`: so it is a class of this module, holding nothing, and acts on the TrialStops of the
sweep running in this process (`active`). This module imports Ray Tune: pflbench.tuning.sweep imports it
only when a sweep runs.
"""

from __future__ import annotations

import logging
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from collections.abc import Callable, Iterator, Sequence

from ray import tune

from pflbench.run.preemption import Preempted, Preemption

STOPPED = "preempted"  # a trial's entry on the board once it stopped on the driver's request: its Preempted
STARTED = "started"  # a trial's entry on the board from before its first round (`started_trial`)


def started_trial(board: Any, trial: str) -> None:  # board: an actor
    """A trial's training starts (module doc): said on the board before its first round, so that the driver
    waits for it on a stop even where Tune has not yet marked it running (Tune marks a trial running when it
    has processed its actor's start, which can come after the trial's training began, on a busy machine)."""
    import ray

    ray.get(board.post.remote(trial, {STARTED: True}))


def stopped_trial(board: Any, trial: str, stopped: Preempted, wait: float) -> NoReturn:  # board: an actor
    """A trial stopped on the sweep driver's request, its checkpoint written (module doc): tell the driver
    (`board`), then wait for it to end the Tune run, which ends this trial's actor. A driver that has not
    ended it `wait` seconds later is gone or stuck: the trial then errors, and a retry or `--resume`
    continues it from its checkpoint."""
    board.post.remote(trial, {STOPPED: stopped})
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.5)
    raise RuntimeError(
        f"trial {trial} stopped on {stopped.signal} after round {stopped.rounds_done}, but the "
        f"sweep's driver did not end it within {wait:g} s"
    )


class TrialStops:
    """The sweep driver's side of a stop (module doc), asked by Tune's loop after each of its steps
    (`step`, with the ids of the running trials): the stop goes to the trials through `board`; the Tune
    run is to end once every trial that was running at the stop has stopped (its checkpoint written) or
    ended, or `grace_seconds` after the signal. `line` then says, in one line, where each trial stopped
    and how to continue the sweep. `checkpoints`: the keeper's folder (<sweep folder>/checkpoints)."""

    def __init__(
        self,
        preemption: Preemption,
        board: Any,
        checkpoints: Path,
        rounds: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.preemption, self.board, self.checkpoints, self.rounds = preemption, board, checkpoints, rounds
        self.clock = clock
        self.since: float | None = None  # when the driver passed the stop on
        self.waited: set[str] = set()  # the trials running then
        self.stopped: dict[str, Preempted] = {}  # by trial id: where each running trial stopped
        self.late: dict[
            str, int | None
        ] = {}  # trials started after the stop, ended with the run: their checkpoint's round
        self.ended = False

    def step(self, running: list[str], pending: Sequence[str] = ()) -> bool:
        """True once: when the Tune run is to end now (its trials are ended with it). `running`: the trials
        Tune marks running; `pending`: those it has not started or marked yet (PENDING, PAUSED), of which the
        ones that said on the board they started (`started_trial`) are running too."""
        import ray

        from pflbench.run.stops import round_of_checkpoint

        if self.ended or not self.preemption.requested:
            return False
        if self.since is None:
            ray.get(self.board.request_stop.remote(self.preemption.signal))
        latest, _ = ray.get(self.board.snapshot.remote())
        running = [*running, *(trial for trial in pending if trial in latest)]  # started or stopped: on the board
        if self.since is None:
            self.since, self.waited = self.clock(), set(running)
        self.stopped.update({trial: info[STOPPED] for trial, info in latest.items() if STOPPED in info})
        if any(trial not in self.stopped for trial in running if trial in self.waited) and (
            self.clock() - self.since <= self.preemption.grace_seconds
        ):
            return False
        for trial in running:
            if trial not in self.stopped:
                at = round_of_checkpoint(self.checkpoints / trial / "checkpoint.pt")
                if trial in self.waited:  # still in its round: the round's work is lost
                    self.stopped[trial] = Preempted(self.preemption.signal or "signal", resumes_at=at, in_round=True)
                else:
                    self.late[trial] = at
        self.ended = True
        return True

    def line(self, folder: Path) -> str:
        from pflbench.run.stops import next_run, stopped_at

        grace = self.preemption.grace_seconds
        trials = [f"trial {trial}: {stopped_at(stop, self.rounds, grace)}" for trial, stop in self.stopped.items()]
        trials += [
            f"trial {trial}: started as the sweep stopped, ended; {next_run(at, self.rounds)}"
            for trial, at in self.late.items()
        ]
        return (
            f"preempted ({self.preemption.signal}): sweep {folder.name}: "
            + ("; ".join(trials) if trials else "no trial was running")
            + f"; the same command with --resume {folder} continues it"
        )


_active: list[TrialStops] = []


TUNE_LOG = logging.getLogger("ray.tune.tune")  # says how to continue with Tune's API: the line says --resume


@contextmanager
def active(stops: TrialStops) -> Iterator[TrialStops]:
    """`stops` is what `EndTuneRun` acts on while the sweep's Tune run runs in this process."""
    _active.append(stops)
    level = TUNE_LOG.level
    try:
        yield stops
    finally:
        _active.remove(stops)
        TUNE_LOG.setLevel(level)


class EndTuneRun(tune.Callback):
    """Given to Tune's RunConfig (module doc): takes SIGTERM and SIGINT back from Tune when its run starts
    and ends the run when the active TrialStops says so. Outside a sweep's run it does nothing."""

    def setup(
        self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any
    ) -> None:
        if _active:
            _active[-1].preemption.take_signals()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if _active and _active[-1].step(
            [trial.trial_id for trial in trials if trial.status == "RUNNING"],
            [trial.trial_id for trial in trials if trial.status in ("PENDING", "PAUSED")],
        ):
            if not callable(signal.getsignal(signal.SIGUSR1)):  # not Tune's: SIGUSR1 would end the driver
                raise RuntimeError("Ray Tune's SIGUSR1 handler is missing: the sweep cannot end its run")
            TUNE_LOG.setLevel(logging.ERROR)  # not Tune's words for a Ctrl-C ("Tuner.restore(...)"): ours follow
            signal.raise_signal(signal.SIGUSR1)
