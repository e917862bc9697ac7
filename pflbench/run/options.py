"""What a run is asked to do (`RunOptions`) and what it reports (`RunReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pflbench.run.display import PROBLEMS
from pflbench.run.preemption import (
    DEFAULT_GRACE_SECONDS,
)
from pflbench.run.trackers import TrackerOptions
from pflbench.simulator.execution import ExecutionOptions
from pflbench.storage.checkpoint import DEFAULT_MINUTES, CheckpointPolicy


class RunStopped(Exception):
    """The run stopped before its last cell; `line` says why, where and how it continues (one line);
    `exit_code`: PREEMPTED_EXIT or DISK_FULL_EXIT."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line)
        self.line, self.exit_code = line, exit_code


@dataclass(frozen=True)
class RunOptions:
    results: Path = Path("results")
    data_root: Path | None = None  # None: $PFLBENCH_DATA or ./data
    mirror: Path | None = None  # None: $PFLBENCH_DATA_MIRROR
    use_ray: bool = True
    workers: int | None = None  # cells at once; None: as many as Ray's resources allow
    ray_address: str | None = None
    force: bool = False  # rerun cells that already have a result
    execution: ExecutionOptions = ExecutionOptions()  # how cells run (device None: cuda for cells given GPUs)
    checkpoint_every: int = 0  # rounds between round checkpoints (0: by time only)
    checkpoint_minutes: float = DEFAULT_MINUTES  # at most this much wall time between checkpoints (0: not by time)
    keep_checkpoints: bool = False  # leave a finished cell's last checkpoint in the store
    keep_checkpoints_from: int = 0  # also keep a copy of every checkpoint from this round on (<store>/_kept/; 0: none)
    retries: int = 2  # Ray: reruns of a cell whose worker was lost (it resumes from its checkpoint)
    trackers: TrackerOptions = TrackerOptions()  # stream each cell's rounds to TensorBoard/W&B/MLflow (trackers.py)
    grace_seconds: float = (
        DEFAULT_GRACE_SECONDS  # after SIGTERM: how long the round in progress may take (preemption.py)
    )

    def __post_init__(self) -> None:
        _ = self.checkpoint_policy  # ValueError before any work
        if not self.grace_seconds >= 0:
            raise ValueError(f"grace seconds must be >= 0, got {self.grace_seconds!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {self.retries!r}")

    @property
    def checkpoint_policy(self) -> CheckpointPolicy:
        return CheckpointPolicy(
            self.checkpoint_every, self.checkpoint_minutes, self.keep_checkpoints, self.keep_checkpoints_from
        )

    plugins: tuple = ()  # the plugins the cells use, shipped to Ray workers (pflbench.loader.plugins)


@dataclass
class RunReport:
    outcomes: dict[str, str | None]  # every planned cell's hash -> its status after the run
    ran: int = 0
    elsewhere: int = 0  # cells another runner sharing the store had finished or was running
    skipped_datasets: dict[str, int] = field(default_factory=dict)  # optional dataset -> cells left out
    interrupted: bool = False
    stopped: RunStopped | None = None  # why the run stopped before its last cell (preempted, disk full)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.stopped is not None:
            return self.stopped.exit_code
        return 1 if any(status in PROBLEMS for status in self.outcomes.values()) else 0


class PrepareError(RuntimeError):
    """A cell's dataset or partition cannot be made; nothing has run."""
