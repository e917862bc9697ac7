"""One trial of a sweep: the sweep's options, the base cell and the search space it varies, and a trial run as a cell on its validation split, with its own checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pflbench.config import CellConfig, cell_hash
from pflbench.run.preemption import (
    DEFAULT_GRACE_SECONDS,
    Preempted,
    running_cell,
)
from pflbench.run.spec import Resources, load_spec, resolve_cell
from pflbench.simulator.execution import ExecutionOptions
from pflbench.storage.checkpoint import Checkpointer

if TYPE_CHECKING:
    from pflbench.algorithm import AnyAlgorithm
    from pflbench.simulator.federation import Federation
    from pflbench.storage.checkpoint import Resumed


DEFAULT_BASE = Path("benchmarks/sweeps/default.yaml")


METRIC = "val_accuracy"


SPACE_KINDS = ("loguniform", "uniform", "int", "choice")


class SweepError(ValueError):
    """A sweep that cannot start (bad base setting, nothing to tune) or where no trial finished."""


@dataclass(frozen=True)
class SweepOptions:
    trials: int = 20
    results: Path = Path("results")
    out: Path | None = Path("benchmarks/tuned")  # None: write no tuned configuration
    tune_lr: bool = True
    grace_rounds: int | None = None  # ASHA's grace period in rounds; None: a quarter of the rounds (>= eval_every)
    reduction_factor: float = 3.0
    seed: int = 0  # Optuna's sampler
    workers: int | None = None  # trials at once; None: as many as Ray's resources allow
    ray_address: str | None = None
    data_root: Path | None = None
    mirror: Path | None = None
    execution: ExecutionOptions = ExecutionOptions()  # how trials run (device None: cuda for cells given GPUs)
    # Round checkpoints of the trials (pflbench/storage/checkpoint.py), kept by the driver's keeper in <sweep
    # folder>/checkpoints/<trial id>/: a trial whose worker or node is lost is rerun by Tune up to
    # `retries` times and resumes from its checkpoint.
    checkpoint_every: int = 0
    checkpoint_minutes: float = 5.0
    keep_checkpoints: bool = False
    retries: int = 2
    resume: Path | None = None  # a sweep folder to continue (module doc) instead of starting a new sweep
    # After SIGTERM / a first Ctrl-C: how long the running trials' rounds in progress may take (module doc).
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def __post_init__(self) -> None:
        if not self.grace_seconds >= 0:
            raise ValueError(f"grace seconds must be >= 0, got {self.grace_seconds!r}")


@dataclass
class SweepResult:
    folder: Path
    best: dict  # {"trial", "config": {lr, hp...}, "val_accuracy", "rounds"}
    trials: list[dict]
    tuned_file: Path | None


def base_cell(
    algorithm: str, spec: Path = DEFAULT_BASE, sets: dict[str, Any] | None = None, scale: str | None = None
) -> tuple[CellConfig, Resources]:
    """The one cell a sweep varies: the spec's cells for `algorithm` (after `sets` and `scale`),
    which must be exactly one."""
    plan = load_spec(spec, {**(sets or {}), "algorithm": algorithm}, scale=scale)
    if len(plan.cells) != 1:
        varying = sorted(
            {
                field
                for field in CellConfig.model_fields
                if len({json.dumps(getattr(c, field), sort_keys=True) for c in plan.cells}) > 1
            }
        )
        raise SweepError(
            f"{spec}: gives {len(plan.cells)} cells for {algorithm}, a sweep needs one; they differ in "
            f"{', '.join(varying)}: fix them with --set (e.g. --set seed=0, --dataset, --clients)"
        )
    cell = plan.cells[0]
    if cell.val_fraction <= 0:
        raise SweepError(f"{spec}: val_fraction is 0: a sweep measures its objective on the validation split")
    return cell, plan.resources


def search_space(algorithm: str, cell: CellConfig, tune_lr: bool = True) -> dict[str, tuple]:
    """`{"lr": ("loguniform", lo, hi), "hp.mu": (...), ...}`: what the sweep samples."""
    from pflbench.algorithm import get_algorithm

    cls = get_algorithm(algorithm)
    declared = cls.Hyperparams.model_fields
    space: dict[str, tuple] = {}
    if tune_lr:
        space["lr"] = ("loguniform", cell.lr / 10, cell.lr * 10)
    for name, entry in cls.search_space.items():
        if name not in declared:
            raise SweepError(
                f"{algorithm}.search_space names {name!r}, which is not one of its hyperparameters "
                f"({', '.join(declared) or 'none'})"
            )
        space[f"hp.{name}"] = tuple(entry)
    for name, entry in space.items():
        kind = entry[0] if entry else None
        if kind not in SPACE_KINDS or len(entry) != (2 if kind == "choice" else 3):
            raise SweepError(
                f"{algorithm}: search space entry {name}={entry!r}; allowed: (loguniform|uniform, low, "
                f"high), (int, low, high) or (choice, [values])"
            )
    if not space:
        raise SweepError(f"{algorithm} declares no search space and --no-lr leaves nothing to tune")
    return space


def tune_space(space: dict[str, tuple]) -> dict:
    """The search space as Ray Tune domains, nested (`{"lr": ..., "hp": {"mu": ...}}`)."""
    from ray import tune

    nested: dict = {}
    for name, (kind, *args) in space.items():
        if kind == "loguniform":
            domain = tune.loguniform(*args)
        elif kind == "uniform":
            domain = tune.uniform(*args)
        elif kind == "int":
            domain = tune.randint(args[0], args[1] + 1)  # inclusive, as declared
        else:
            domain = tune.choice(list(args[0]))
        group, _, entry = name.partition(".")
        if entry:
            nested.setdefault(group, {})[entry] = domain
        else:
            nested[group] = domain
    return nested


def trial_values(config: dict) -> dict[str, Any]:
    """A trial's sampled values as cell assignments: {"lr": 0.01, "hp": {"mu": 0.1}}."""
    values = {k: v for k, v in config.items() if k != "hp"}
    if config.get("hp"):
        values["hp"] = dict(config["hp"])
    return values


def trial_cell(base: CellConfig, config: dict) -> CellConfig:
    values = trial_values(config)
    data = base.model_dump(mode="json")
    data.update({k: v for k, v in values.items() if k != "hp"})
    data["hp"] = {**base.hp, **values.get("hp", {})}
    return resolve_cell(data, source="trial")


CHECKPOINTS = "checkpoints"  # <sweep folder>/checkpoints/<trial id>/checkpoint.pt, kept by the driver's keeper


SETTINGS = "settings.json"


def run_trial(
    config: dict,
    *,
    base: dict,
    cpus: float,
    data_root: str | None,
    mirror: str | None,
    execution: ExecutionOptions,
    checkpoints: dict | None = None,
    keeper: Any = None,
    plugins: tuple = (),
    board: Any = None,
    stop_wait: float = 600.0,
) -> None:
    """Run the base cell with the trial's values, validation split only, reporting
    {round, val_accuracy, val_loss} to Tune at every evaluated round (ASHA may stop it there).
    `checkpoints`: {folder, every, minutes, keep}: the trial's round checkpoints, resumed from when Tune
    restarts it; kept through `keeper` (the driver's CheckpointKeeper actor, pflbench/run/checkpoint_relay.py)
    under the trial's id, or, without one, in `folder/<trial id>/` on this machine (a trial run outside
    a sweep). A resumed trial first reports again what it reported up to its checkpoint (`TrialCheckpointer`).
    `board`: the sweep driver's ProgressBoard (pflbench/run/on_ray.py), where a stop on SIGTERM / Ctrl-C is
    asked for: the trial then writes its checkpoint at the end of its round and waits, at most
    `stop_wait` seconds, for the driver to end it (with checkpoints only; pflbench/tuning/sweep_stop.py)."""
    import torch
    from ray import tune

    from pflbench.loader.plugins import activate
    from pflbench.run.preemption import BoardStop
    from pflbench.simulator.rounds import run_cell

    activate(plugins)  # the user's plugins, in this Ray worker, before the trial's cell is resolved
    cell = trial_cell(CellConfig(**base), config)
    torch.set_num_threads(execution.threads or max(1, int(cpus)))
    reports: list[dict] = []  # what this trial reported, round by round (a resumed one: from round 1)
    notes: list[str] = []
    checkpointer = None
    stop = BoardStop(board) if board is not None and checkpoints is not None else None

    def report(info: dict) -> None:
        rnd = info["round"]
        if (rnd % cell.eval_every == 0 or rnd == cell.rounds) and info.get("mean_val_accuracy") is not None:
            losses = [row["val_loss"] for row in info.get("client_rows", ()) if row.get("val_loss") is not None]
            reports.append(
                {
                    "round": rnd,
                    METRIC: info["mean_val_accuracy"],
                    "val_loss": sum(losses) / len(losses) if losses else None,
                }
            )
            tune.report({**reports[-1], "status": "running", **progress()})

    def replay(earlier: list[dict]) -> None:
        reports.extend(earlier)
        for metrics in earlier:
            tune.report({**metrics, "status": "running", **progress()})

    def progress() -> dict:
        resumed = checkpointer.resumed_from if checkpointer is not None else None
        return {"resumed_from_round": -1 if resumed is None else resumed, "notes": "; ".join(notes)}

    if checkpoints is not None:
        from pflbench.storage.checkpoint import CheckpointPolicy
        from pflbench.storage.store import SET_ASIDE

        trial = tune.get_context().get_trial_id()
        folder = Path(checkpoints["folder"])
        files = None
        if keeper is not None:  # this start of the trial owns its checkpoint from now on
            import ray

            from pflbench.run.checkpoint_relay import RelayedCheckpointFile

            files = RelayedCheckpointFile(keeper, trial, ray.get(keeper.begin.remote(trial, cell_hash(cell))))
        checkpointer = TrialCheckpointer(
            folder / trial,
            cell,
            CheckpointPolicy(checkpoints["every"], checkpoints["minutes"]),
            set_aside_dir=folder / SET_ASIDE,
            note=notes.append,
            files=files,
            reports=reports,
            replay=replay,
            preemption=stop,
        )
    if stop is not None:
        from pflbench.tuning.sweep_stop import started_trial

        started_trial(board, tune.get_context().get_trial_id())
    try:
        with running_cell(stop):
            result = run_cell(
                cell,
                data_root=data_root,
                mirror=mirror,
                execution=execution,
                on_round=report,
                evaluate=("val",),
                checkpointer=checkpointer,
            )
    except Preempted as stopped:
        from pflbench.tuning.sweep_stop import stopped_trial

        stopped_trial(board, tune.get_context().get_trial_id(), stopped, stop_wait)
    if checkpointer is not None and checkpoints is not None and not checkpoints["keep"]:  # (a checkpointer: given)
        checkpointer.remove()
    if result.status != "finished":  # diverged: the worst objective, at the round it happened
        rnd = result.summary.get("diverged_round") or (reports[-1]["round"] if reports else 1)
        tune.report({"round": rnd, METRIC: 0.0, "status": result.status, "error": result.error or "", **progress()})


class TrialCheckpointer(Checkpointer):
    """A trial's Checkpointer: each checkpoint also carries what the trial reported to Tune so far
    (`reports`, beside the round loop's records), and a trial resumed from one hands those to `replay`
    first, so Tune holds every round of it, exactly as reported: Tune's own records of them may be lost
    (a sweep continued with --resume after its driver was killed restores Tune's last saved state).
    Tune's scheduler takes a round it has seen again as seen (ASHA records a trial once per rung);
    `finish_sweep` keeps one row per round."""

    REPORTS = "sweep_reports"

    def __init__(self, *args: Any, reports: list, replay: Callable[[list], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports, self.replay = reports, replay

    def after_round(self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float) -> None:
        super().after_round(rnd, fed, algorithm, {**loop, self.REPORTS: list(self.reports)}, elapsed)

    def resume(self, fed: Federation, algorithm: AnyAlgorithm, provenance: dict | None = None) -> Resumed | None:
        resumed = super().resume(fed, algorithm, provenance)
        if resumed is not None:
            self.replay(resumed.loop.get(self.REPORTS, []))
        return resumed
