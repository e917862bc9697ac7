"""Preemption: SIGTERM (SLURM, Kubernetes, spot instances) or a first Ctrl-C stops a run cleanly.

A scheduler that preempts a job sends SIGTERM and kills it a grace period later (often 30 s). While a
`Preemption` is installed (`Preemption.installed()`, the main thread of `pflbench run`):

- the first SIGTERM or SIGINT asks the running cell to stop at the end of the round in progress: its
  Checkpointer (pflbench/storage/checkpoint.py) writes a round checkpoint there and raises `Preempted`; the
  runner starts no new cell, and `pflbench run` exits with `PREEMPTED_EXIT` (75, "temporary failure,
  run again") and one line naming the cell and the round. The next run resumes there ("resumed at
  round N of M"), bit-identical to an uninterrupted run (a round checkpoint is taken between rounds only);
- if the round in progress has not ended `grace_seconds` after the signal, the cell stops at once
  (SIGALRM raises `Preempted` in the main thread, between two Python bytecodes: one long torch
  operation delays it): that round's work is lost, and the next run resumes from the cell's last
  checkpoint (a checkpoint taken in the middle of a round could not continue bit for bit);
- a second SIGINT (Ctrl-C again) stops at once (KeyboardInterrupt, as before: exit 130), as does a
  SIGTERM while a stop is already asked for; except once the round in progress has ended on the stop
  (`round_ended`): its checkpoint is then being written and the run ends with it (exit 75), so the
  signal is only acknowledged.

On Ray the driver holds the `Preemption` (Ray's own SIGTERM handler, which exits, is replaced again
after `ray.init`: `take_signals`) and passes the stop on to the running cells through its progress
board; a worker's Checkpointer reads it there (pflbench/run/on_ray.py's `BoardStop`). The cells that have
not ended their round `grace_seconds` after the signal are cancelled (their round's work is lost).
A SIGTERM that reaches the Ray workers themselves (a scheduler signalling every process of the job:
`scancel`, a Kubernetes pod's termination) ends them at once, as Ray's workers do, and Ray's own
processes with them: the driver takes the Ray errors that follow for the job ending, and its one
"preempted" line says where each cell resumes: from its last checkpoint.

Start-up (`startup_signals`, the first thing `pflbench run` and `pflbench sweep` do, before their heavy
imports, the spec, the partitions and Ray's start): a SIGTERM or Ctrl-C before the run's `Preemption` is
installed stops the command at once with `StartupStop`, which it turns into one line saying nothing was
started and `PREEMPTED_EXIT`; never a silent exit 143. While Ray starts (`ray.init`), its own SIGTERM
handlers (one exits, the other arms an alarm that aborts) are kept out of the driver (`keeping_signals`), so
that the run's `Preemption` hears the signal.

Nothing here knows about cells or the store: the checkpointer asks a `StopRequest` (`requested`,
`signal`) at the end of each round and calls `round_ended`; the runner wraps a running cell in
`cell_running()` and makes its stop request `current()` for the cell's run (`running_cell`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

PREEMPTED_EXIT = 75  # sysexits' EX_TEMPFAIL: the run stopped on request; running it again continues it
DEFAULT_GRACE_SECONDS = 25.0


class Preempted(Exception):
    """A cell stopped on a preemption signal (module doc). `signal`: its name ("SIGTERM");
    `rounds_done`: rounds the cell had finished; `resumes_at`: the round of the checkpoint the next run
    continues from (None: from round 1); `in_round`: stopped at the grace deadline inside a round."""

    def __init__(
        self,
        signal_name: str,
        rounds_done: int | None = None,
        resumes_at: int | None = None,
        in_round: bool = False,
        checkpoint_error: str | None = None,
    ) -> None:
        super().__init__(f"preempted by {signal_name}")
        self.signal, self.rounds_done, self.resumes_at = signal_name, rounds_done, resumes_at
        self.in_round, self.checkpoint_error = in_round, checkpoint_error

    def __reduce__(
        self,
    ) -> tuple[type[Preempted], tuple[Any, ...]]:  # a Ray worker hands it back to the driver as a value
        return Preempted, (self.signal, self.rounds_done, self.resumes_at, self.in_round, self.checkpoint_error)


class StartupStop(BaseException):
    """A SIGTERM or SIGINT during a command's start-up (module doc). A BaseException, as KeyboardInterrupt:
    start-up code's `except Exception` does not take it for an error of its own. `started`: the signal
    came after the command's run had begun and ended (a Preemption was installed and removed again)."""

    def __init__(self, signal_name: str, started: bool = False) -> None:
        super().__init__(f"{signal_name} during start-up")
        self.signal, self.started = signal_name, started


_run_began: list[bool] = []  # a Preemption was installed in this process since `startup_signals`


def _on_startup_signal(signum: int, frame: FrameType | None) -> None:
    raise StartupStop(signal.Signals(signum).name, started=bool(_run_began))


def startup_signals() -> dict[int, Any]:
    """Install the start-up handlers (module doc) for SIGTERM and SIGINT; returns the previous handlers,
    for `restore_signals`. Outside the main thread nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    _run_began.clear()
    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, _on_startup_signal)
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """The handlers from before `startup_signals`."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextmanager
def keeping_signals() -> Iterator[None]:
    """Around `ray.init`: neither of Ray's own SIGTERM handlers is installed in this process, so that a
    SIGTERM while Ray starts reaches the handler in place (a Preemption's, or the start-up one):
    - Ray's Python one, which exits at once with no line (`ray._private.utils.set_sigterm_handler`);
    - the C++ failure handler of the driver's core worker (Abseil's), which prints a stack and passes the
      signal on, but first sets SIGALRM to abort the process and arms a 3-second alarm (against a hang
      in its own printing): that alarm then killed a run stopping cleanly on the signal, with SIGALRM or
      SIGABRT (`ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER`, read when the core worker
      starts; the workers Ray starts keep theirs).
    Where a Ray version has neither name, that part is left as it is (`Preemption.take_signals` after
    `ray.init` takes the signals back; `Preemption.installed` cancels an alarm left pending at its end)."""
    try:
        import ray._private.ray_constants as ray_constants
        import ray._private.utils as ray_utils
    except ImportError:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    real = getattr(ray_utils, "set_sigterm_handler", None)
    failure_handler_off = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    if real is not None:
        ray_utils.set_sigterm_handler = lambda handler: None
    if failure_handler_off is not None:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        yield
    finally:
        if real is not None:
            ray_utils.set_sigterm_handler = real
        if failure_handler_off is not None:
            ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = failure_handler_off


class StopRequest(Protocol):
    """What a Checkpointer asks at the end of every round: whether a stop was asked for, by which
    signal, and that the round ended (`Preemption` in the driver's process; `BoardStop` on a Ray worker)."""

    signal: str | None

    @property
    def requested(self) -> bool: ...

    def round_ended(self) -> None: ...


class BoardStop:
    """A Ray worker's `StopRequest`: the driver's stop, read from the progress board (at most every
    `every` seconds, so a cell of short rounds does not wait on the board each round)."""

    def __init__(self, board: Any, every: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.board, self.every, self.clock = board, every, clock
        self.signal: str | None = None
        self._asked = float("-inf")

    @property
    def requested(self) -> bool:
        import ray

        if self.signal is None and self.clock() - self._asked >= self.every:
            self._asked = self.clock()
            self.signal = ray.get(self.board.stop_requested.remote())
        return self.signal is not None

    def round_ended(self) -> None:
        pass


_current: list[StopRequest] = []


def current() -> StopRequest | None:
    """The stop request of the cell running in this process (None outside a cell): for a plugin or a
    test that must wait until a stop reached its cell."""
    return _current[-1] if _current else None


@contextmanager
def running_cell(stop: StopRequest | None) -> Iterator[None]:
    """`stop` is `current()` during a cell's run."""
    if stop is None:
        yield
        return
    _current.append(stop)
    try:
        yield
    finally:
        _current.remove(stop)


class Preemption:
    """The stop requested by a signal (module doc). `grace_seconds`: how long the round in progress
    may take after the first signal before the cell stops at once (0: at once). `on_request`: told the
    signal's name when the first one arrives (to print a line)."""

    def __init__(
        self, grace_seconds: float = DEFAULT_GRACE_SECONDS, on_request: Callable[[str], None] | None = None
    ) -> None:
        if not grace_seconds >= 0:
            raise ValueError(f"grace seconds must be >= 0, got {grace_seconds!r}")
        self.grace_seconds = grace_seconds
        self.on_request = on_request or (lambda name: None)
        self.signal: str | None = None  # the first signal's name, once one arrived
        self.requested_at: float | None = None
        self._running = False  # a cell's rounds are under way (the deadline may stop them)
        self._armed = False
        self._honoured = False  # a round ended after the stop was asked for: the cell stops there

    @property
    def requested(self) -> bool:
        return self.signal is not None

    # -- the signals --
    @contextmanager
    def installed(self) -> Iterator[Preemption]:
        """SIGTERM, SIGINT and SIGALRM handled as the module doc says, the previous handlers restored
        after. Outside the main thread (where Python cannot handle signals) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
        _run_began.append(True)
        self.take_signals()
        try:
            yield self
        finally:
            self._disarm()
            if previous[signal.SIGALRM] == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] > 0:
                signal.setitimer(signal.ITIMER_REAL, 0)  # not this run's (disarmed): it would kill the process now
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def take_signals(self) -> None:
        """(Re)install this object's handlers, e.g. after `ray.init` installed its own SIGTERM handler
        (main thread only; `installed` restores the handlers from before it)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGALRM, self._on_deadline)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and self._honoured:  # the round ended on the stop: its checkpoint is written or being
            try:  # written, and the run ends with it (stopping now would lose it)
                os.write(
                    2,
                    f"{signal.Signals(signum).name}: already stopping, the checkpoint of the round "
                    f"just ended is being kept\n".encode(),
                )
            except OSError:
                pass
            return
        if self.requested:  # the second one: stop now
            raise KeyboardInterrupt
        self.signal, self.requested_at = signal.Signals(signum).name, time.monotonic()
        if self._running:
            self._arm()
        self.on_request(self.signal)

    def _on_deadline(self, signum: int, frame: FrameType | None) -> None:
        self._armed = False
        if self._running and self.requested:
            self._running = False  # once: nothing after this raise is stopped again
            raise Preempted(self.signal or "signal", in_round=True)

    def _arm(self) -> None:
        if self.grace_seconds <= 0:
            self._on_deadline(signal.SIGALRM, None)
            return
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.grace_seconds)

    def _disarm(self) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._armed = False

    # -- what the runner and the checkpointer call --
    @contextmanager
    def cell_running(self) -> Iterator[None]:
        """Around a cell's run: the deadline stops the cell only inside it."""
        self._running = True
        try:
            if self.requested:
                self._arm()
            yield
        finally:
            self._running = False
            self._disarm()

    def round_ended(self) -> None:
        """The round in progress ended (the checkpointer writes the checkpoint next): the deadline no
        longer applies."""
        self._running = False
        self._honoured = self._honoured or self.requested
        self._disarm()
