"""`pflbench sweep --algo NAME`: tune one algorithm's hyperparameters with Ray Tune, Optuna's sampler
and ASHA early stopping on rounds, on the clients' validation splits only.

- The base setting is one cell of a spec (default `benchmarks/sweeps/default.yaml`; `--spec`,
  `--scale`, `--set` and the shortcuts `--dataset/--partition/--clients/--rounds` narrow it), run
  with the algorithm forced to NAME. Every trial is that cell with sampled values, resolved by the
  same code as a spec's cells (`pflbench.run.spec.resolve_cell`), so a trial's settings written into a
  spec give the same cell.
- The search space: the algorithm's declared `search_space` (its own hyperparameters, `hp.NAME`) and,
  unless `--no-lr`, the local learning rate `lr`, log-uniform from a tenth to ten times the base cell's
  (the paper fixes one rate per dataset for every method; tuning it per method is the fairer default,
  and every method gets it). The same number of trials for every algorithm (`--trials`, default 20).
- The objective: mean client accuracy on the validation split (carved from each client's train data)
  at the last evaluated round, reported every `eval_every` rounds, maximised. Trials run with
  `evaluate=("val",)`: the engine withholds the test indices from the run altogether (no test
  evaluation, no test indices on the device), so tuning cannot see the test split.
- ASHA (`time_attr="round"`) stops poor trials early; the best trial is the one with the highest
  final validation accuracy among those that ran every round.

Checkpoints: a trial writes round checkpoints by the `--checkpoint-every/-minutes` policy
through the driver's checkpoint keeper (pflbench/run/checkpoint_relay.py: the actor `pflbench run` uses for
its cells, started by the sweep on its driver's node), into `<sweep folder>/checkpoints/<trial id>/`
on the driver's disk, never on the worker's. A trial Tune restarts after its worker or node was lost
(`--retries` times) resumes from its last checkpoint wherever it lands, bit for bit (the same
validation accuracy at every round as an uninterrupted trial), and its outcome says "resumed at round
R"; a resumed trial reports again, from its checkpoint, the rounds up to it (`TrialCheckpointer`).
SIGTERM (preemption) or a first Ctrl-C stops a sweep as it stops `pflbench run` on Ray
(pflbench/tuning/sweep_stop.py): each running trial writes its checkpoint at the end of the round in
progress (or is ended `--grace-seconds` after the signal, from its last checkpoint), Tune saves its
state, and the sweep exits with status 75 and one line naming each trial and `--resume <folder>`.
A sweep whose driver stopped (killed, preempted, or every retry of a trial spent) is continued by
the same command with `--resume <sweep folder>` (Tune restores its trials, sampler and scheduler;
unfinished and errored trials restart under their ids and resume from their checkpoints). A trial's
checkpoint is removed when it completes, diverges or ASHA stops it (`--keep-checkpoints` keeps them),
and kept while it can still be resumed.

Written: `<results>/sweeps/<algo>-<base hash>-<time>/` (settings.json: what `--resume` checks;
sweep.json: settings, space, every trial's outcome and the best; trials.parquet: every reported
(trial, round, val_accuracy, val_loss: the clients' mean), once per round; checkpoints/: the trials'
checkpoints while they can be resumed; ray/: Tune's own files) and the best configuration
`<out>/<algo>.yaml` (default benchmarks/tuned/), which a spec uses with `tuned: true`
(benchmarks/README.md). Tuning runs are kept apart from benchmark results: they never evaluated the
test split, so they must not be taken for (or resume) a benchmark cell.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import yaml

from pflbench.storage.checkpoint import Checkpointer
from pflbench.config import CellConfig, cell_hash
from pflbench.simulator.execution import ExecutionOptions
from pflbench.run.preemption import (
    DEFAULT_GRACE_SECONDS,
    PREEMPTED_EXIT,
    Preempted,
    Preemption,
    keeping_signals,
    running_cell,
)
from pflbench.run.spec import Resources, load_spec, resolve_cell, tuned_path
from pflbench.storage.store import atomic_write, write_json

if TYPE_CHECKING:
    from pflbench.algorithm import Algorithm
    from pflbench.storage.checkpoint import Resumed
    from pflbench.simulator.federation import Federation

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


# ---- the base cell and the search space --------------------------------------------------------


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


# ---- one trial (a Ray Tune function trainable) ---------------------------------------------------

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

    from pflbench.simulator.rounds import run_cell
    from pflbench.loader.plugins import activate
    from pflbench.run.on_ray import BoardStop

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

    def after_round(self, rnd: int, fed: Federation, algorithm: Algorithm[Any], loop: dict, elapsed: float) -> None:
        super().after_round(rnd, fed, algorithm, {**loop, self.REPORTS: list(self.reports)}, elapsed)

    def resume(self, fed: Federation, algorithm: Algorithm[Any], provenance: dict | None = None) -> Resumed | None:
        resumed = super().resume(fed, algorithm, provenance)
        if resumed is not None:
            self.replay(resumed.loop.get(self.REPORTS, []))
        return resumed


# ---- the sweep ----------------------------------------------------------------------------------


def sweep_folder(algorithm: str, base: CellConfig, options: SweepOptions) -> Path:
    """A new sweep's folder, or the one `options.resume` names (checked: a sweep of this algorithm and
    base cell that Tune can restore)."""
    if options.resume is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return (Path(options.results) / "sweeps" / f"{algorithm}-{cell_hash(base)}-{stamp}").resolve()
    from ray import tune

    folder = Path(options.resume).resolve()
    settings_file = folder / SETTINGS
    if not settings_file.is_file():
        raise SweepError(
            f"--resume {options.resume}: not a sweep folder (no {SETTINGS}; a sweep's folder is "
            f"<results>/sweeps/<algo>-<base hash>-<time>/)"
        )
    settings = json.loads(settings_file.read_text())
    if settings.get("algorithm") != algorithm or settings.get("base_hash") != cell_hash(base):
        raise SweepError(
            f"--resume {options.resume}: a sweep of {settings.get('algorithm')} on base cell "
            f"{settings.get('base_hash')}, not of {algorithm} on base cell {cell_hash(base)}: "
            f"give the command that started it (the same --algo, --spec, --set, --scale and shortcuts)"
        )
    if not tune.Tuner.can_restore(str(folder / "ray")):
        raise SweepError(
            f"--resume {options.resume}: Ray Tune saved no state there to continue from "
            f"(the sweep stopped before its first trial started); start it again without --resume"
        )
    return folder


def run_sweep(
    algorithm: str,
    base: CellConfig,
    resources: Resources,
    options: SweepOptions = SweepOptions(),
    log: Callable[[str], None] = print,
) -> SweepResult:
    """Run the sweep (module doc). SIGTERM or a first Ctrl-C stops it as `pflbench run` on Ray stops
    its cells: each running trial writes its checkpoint at the end of its round (or is ended
    `grace_seconds` after the signal), Tune saves its state, and `RunStopped` (PREEMPTED_EXIT) says in
    one line where each trial stopped and that `--resume <folder>` continues the sweep."""
    from pflbench.data import data_mirror, data_root
    from pflbench.run.ray_cluster import ClusterError, connect_ray
    from pflbench.simulator.rounds import prepare_cell
    from pflbench.run.stops import RunStopped, acknowledge

    if options.trials < 1:
        raise SweepError("--trials must be at least 1")
    space = search_space(algorithm, base, options.tune_lr)
    options = replace(options, data_root=data_root(options.data_root), mirror=data_mirror(options.mirror))
    folder = sweep_folder(algorithm, base, options)
    prepare_cell(base, options.data_root, options.mirror)  # the dataset and partition, once, before any trial
    if options.resume is not None:  # the sweep's own budget, sampler and scheduler, as Tune restores them
        settings = json.loads((folder / SETTINGS).read_text())
        options = replace(
            options, trials=settings["trials"], seed=settings["seed"], reduction_factor=settings["reduction_factor"]
        )
        grace = settings["grace_rounds"]
        space = {name: tuple(entry) for name, entry in settings["search_space"].items()}
        log(
            f"sweep {algorithm}: resuming {folder} ({options.trials} trials; its unfinished and errored trials "
            f"continue from their checkpoints)"
        )
    else:
        folder.mkdir(parents=True, exist_ok=True)
        grace = options.grace_rounds or max(base.eval_every, base.rounds // 4)  # at least one evaluation first
        write_json(
            folder / SETTINGS,
            {
                "algorithm": algorithm,
                "base_hash": cell_hash(base),
                "trials": options.trials,
                "seed": options.seed,
                "grace_rounds": grace,
                "reduction_factor": options.reduction_factor,
                "search_space": {k: list(v) for k, v in space.items()},
            },
        )
        log(
            f"sweep {algorithm}: {options.trials} trials of {base.rounds} rounds on {base.dataset} "
            f"{base.partition} {base.clients} clients (base cell {cell_hash(base)}); objective: mean client "
            f"validation accuracy; ASHA grace {grace} rounds; space: "
            + ", ".join(f"{k}={v[0]}{list(v[1:])}" for k, v in space.items())
        )
    execution = options.execution.on("cuda" if resources.gpus > 0 else "cpu")

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    preemption = Preemption(options.grace_seconds, on_request=lambda name: acknowledge(name, options.grace_seconds))
    with preemption.installed():
        try:  # a wrong address fails within seconds, with the run command's message
            with keeping_signals():  # a SIGTERM while Ray starts reaches `preemption`
                owned = connect_ray(options.ray_address, options.workers, resources.cpus)
        except ClusterError as error:
            raise SweepError(str(error)) from None
        preemption.take_signals()  # where ray.init replaced SIGTERM's handler with one that exits
        if preemption.requested:  # while Ray started: no trial has started
            if owned:
                import ray

                ray.shutdown()
            raise RunStopped(
                f"preempted ({preemption.signal}) as the sweep started: no trial was started; run the "
                f"same command again" + (f" (with --resume {folder})" if options.resume else ""),
                PREEMPTED_EXIT,
            )
        stops, grid = run_tune(algorithm, base, resources, options, folder, space, grace, execution, owned, preemption)
    if stops.ended:  # its trials' checkpoints are written, Tune's state saved: --resume continues it
        raise RunStopped(stops.line(folder), PREEMPTED_EXIT)
    return finish_sweep(algorithm, base, space, options, folder, grid, grace, log)


def run_tune(
    algorithm: str,
    base: CellConfig,
    resources: Resources,
    options: SweepOptions,
    folder: Path,
    space: dict[str, Any],
    grace: int,
    execution: ExecutionOptions,
    owned: bool,
    preemption: Preemption,
) -> tuple[Any, Any]:
    """The Tune run of `run_sweep` on the Ray it connected to (`owned`: stopped here after), with the
    trials' keeper and the board that passes a stop on `preemption` to them: (the TrialStops, the grid)."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from pflbench.run.checkpoint_relay import start_keeper
    from pflbench.loader.plugins import sources_for
    from pflbench.run.on_ray import start_board
    from pflbench.tuning.sweep_stop import EndTuneRun, TrialStops, active

    keeper = board = None
    try:
        if resources.gpus > 0 and not ray.cluster_resources().get("GPU", 0):
            raise SweepError(
                f"the base spec asks for {resources.gpus:g} GPU per cell but Ray has none; use --set resources.gpus=0"
            )
        keeper = start_keeper(folder / CHECKPOINTS)  # on this (the driver's) node: a lost node loses no checkpoint
        board = start_board()  # where the trials read a stop (SIGTERM, Ctrl-C) and say they stopped
        stops = TrialStops(preemption, board, folder / CHECKPOINTS, base.rounds)
        trainable = tune.with_resources(
            tune.with_parameters(
                run_trial,
                base=base.model_dump(mode="json"),
                cpus=resources.cpus,
                data_root=str(options.data_root),
                mirror=str(options.mirror) if options.mirror else None,
                execution=execution,
                checkpoints={
                    "folder": str(folder / CHECKPOINTS),
                    "every": options.checkpoint_every,
                    "minutes": options.checkpoint_minutes,
                    "keep": options.keep_checkpoints,
                },
                keeper=keeper,
                plugins=sources_for([base]),
                board=board,
            ),
            {"cpu": resources.cpus, "gpu": resources.gpus},
        )
        if options.resume is not None:
            tuner = tune.Tuner.restore(str(folder / "ray"), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=tune_space(space),
                tune_config=tune.TuneConfig(
                    metric=METRIC,
                    mode="max",
                    num_samples=options.trials,
                    max_concurrent_trials=options.workers,
                    search_alg=OptunaSearch(seed=options.seed),
                    scheduler=ASHAScheduler(
                        time_attr="round",
                        max_t=base.rounds,
                        grace_period=min(grace, base.rounds),
                        reduction_factor=options.reduction_factor,
                    ),
                ),
                run_config=tune.RunConfig(
                    name="ray",
                    storage_path=str(folder),
                    verbose=0,
                    failure_config=tune.FailureConfig(max_failures=options.retries),
                    callbacks=[EndTuneRun()],
                ),
            )  # saved with Tune's state: restored by --resume
        with warnings.catch_warnings(), active(stops):  # `stops`: what EndTuneRun acts on
            # A restarted trial's iterations count from 1 again: Optuna says so per step.
            warnings.filterwarnings("ignore", message="The reported value is ignored because this `step=")
            grid = tuner.fit()
    finally:
        for actor in (keeper, board):  # a Ray instance that outlives the sweep (a test's) keeps neither
            if actor is not None and not owned:
                ray.kill(actor)
        if owned:
            ray.shutdown()
    return stops, grid


def trial_states(grid: Any) -> dict[str, str]:  # a ray.tune ResultGrid
    """Tune's last status of each trial, by trial id (TERMINATED; ERROR; PENDING or RUNNING where the
    sweep was interrupted); empty where this Ray version does not say."""
    try:
        return {trial.trial_id: str(trial.status) for trial in grid._experiment_analysis.trials}
    except AttributeError:
        return {}


def finish_sweep(
    algorithm: str,
    base: CellConfig,
    space: dict[str, Any],
    options: SweepOptions,
    folder: Path,
    grid: Any,
    grace: int,
    log: Callable[[str], None],
) -> SweepResult:
    import pandas as pd

    states = trial_states(grid)
    trials: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    resumable: list[str] = []
    for i, result in enumerate(grid):
        history = result.metrics_dataframe if result.metrics_dataframe is not None else pd.DataFrame()
        last = result.metrics or {}
        trial_id = last.get("trial_id") or (result.config or {}).get("trial_id")
        status = last.get("status", "running")
        if result.error is not None:
            status = "error"
        elif states.get(str(trial_id), "TERMINATED") not in ("TERMINATED", "ERROR"):
            status = "interrupted"
        values = trial_values({k: v for k, v in (result.config or {}).items()})
        rounds = int(last.get("round", 0) or 0)
        if status == "running":
            status = "completed" if rounds >= base.rounds else "stopped early"
        resumed = (
            sorted({int(r) for r in history["resumed_from_round"].dropna() if r >= 0})
            if "resumed_from_round" in history
            else []
        )
        trials.append(
            {
                "trial": i,
                "trial_id": trial_id,
                "values": values,
                "status": status,
                "rounds": rounds,
                METRIC: last.get(METRIC),
                "resumed_at_rounds": resumed,
                "error": str(result.error).strip().splitlines()[-1]
                if result.error is not None
                else last.get("error") or None,
            }
        )
        for rnd in resumed:
            log(f"trial {i} ({trial_id}): resumed at round {rnd} of {base.rounds} from its checkpoint")
        checkpoint = folder / CHECKPOINTS / str(trial_id) / "checkpoint.pt"
        if status in ("error", "interrupted"):  # `--resume` continues it from there
            if checkpoint.exists():
                resumable.append(str(trial_id))
        elif not options.keep_checkpoints:  # ASHA stopped it (a finished trial removed its own)
            checkpoint.unlink(missing_ok=True)
            if checkpoint.parent.is_dir() and not any(checkpoint.parent.iterdir()):
                checkpoint.parent.rmdir()
        # A round reported again after a resume (evaluated after the checkpoint it resumed from) is the same row.
        seen: dict[int, dict[str, Any]] = {}
        for _, row in history.iterrows() if len(history) else []:
            seen[int(row["round"])] = {
                "trial": i,
                "round": int(row["round"]),
                METRIC: float(row[METRIC]),
                "val_loss": float(row["val_loss"]) if "val_loss" in row else math.nan,
                **{f"param.{k}": v for k, v in _flat(values).items()},
            }
        rows.extend(seen[rnd] for rnd in sorted(seen))
    atomic_write(folder / "trials.parquet", lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))
    completed = [t for t in trials if t["status"] == "completed" and t[METRIC] is not None]
    best = max(completed, key=lambda t: (t[METRIC], -t["trial"]), default=None)
    summary = {
        "algorithm": algorithm,
        "base_cell": base.model_dump(mode="json"),
        "base_hash": cell_hash(base),
        "objective": "mean client accuracy on the validation split at the last round (maximised); "
        "the test split is withheld from every trial",
        "search_space": {k: list(v) for k, v in space.items()},
        "trials": options.trials,
        "sampler": f"optuna TPE (seed {options.seed})",
        "scheduler": f"ASHA on rounds (grace {grace}, reduction factor {options.reduction_factor:g}, max {base.rounds})",
        "outcomes": trials,
        "best": best,
    }
    write_json(folder / "sweep.json", summary)
    counts = {
        s: sum(t["status"] == s for t in trials)
        for s in ("completed", "stopped early", "diverged", "error", "interrupted")
    }
    log(f"{len(trials)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f"; results in {folder}")
    if resumable:
        log(
            f"{len(resumable)} trials did not end and keep their checkpoints ({', '.join(resumable)}): "
            f"the same command with --resume {folder} continues them"
        )
    if best is None:
        errors = sorted({t["error"] for t in trials if t["error"]})
        raise SweepError(
            f"no trial of {algorithm} ran every round"
            + (f"; errors: {'; '.join(errors)[:2000]}" if errors else "")
            + f" (see {folder}"
            + (f"; --resume {folder} continues its trials from their checkpoints" if resumable else "")
            + ")"
        )
    log(f"best: trial {best['trial']}, validation accuracy {best[METRIC]:.2%}, {_describe(best['values'])}")
    tuned_file = None
    if options.out is not None:
        tuned_file = write_tuned(options.out, algorithm, best, summary, folder, base)
        log(f"written to {tuned_file} (a spec uses it with `tuned: true`)")
    return SweepResult(folder, best, trials, tuned_file)


def _flat(values: dict) -> dict:
    flat = {k: v for k, v in values.items() if k != "hp"}
    flat.update({f"hp.{k}": v for k, v in values.get("hp", {}).items()})
    return flat


def _describe(values: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v!r}" for k, v in _flat(values).items())


def _plain(value: Any) -> Any:
    """numpy scalars -> Python values, for YAML."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    return value


def write_tuned(out: Path, algorithm: str, best: dict, summary: dict, folder: Path, base: CellConfig) -> Path:
    values = best["values"]
    assign = {k: _plain(v) for k, v in values.items() if k != "hp"}
    if values.get("hp"):
        assign["hp"] = {k: _plain(v) for k, v in values["hp"].items()}
    data = {
        "algorithm": algorithm,
        "set": assign,
        "description": f"best of {summary['trials']} trials by mean client validation accuracy "
        f"({best[METRIC]:.4f} after {best['rounds']} rounds)",
        "tuned_on": {
            "cell": base.model_dump(mode="json"),
            "hash": cell_hash(base),
            "objective": summary["objective"],
            "search_space": summary["search_space"],
            "sampler": summary["sampler"],
            "scheduler": summary["scheduler"],
            "val_accuracy": float(best[METRIC]),
            "sweep": str(folder),
            "date": datetime.date.today().isoformat(),
        },
    }
    header = (
        f"# Written by `pflbench sweep --algo {algorithm}`: the best configuration found, applied to "
        f"{algorithm}'s cells by a spec with\n# `tuned: true` (benchmarks/README.md). Only `set` is used.\n"
    )
    path = tuned_path(out, algorithm)

    def write(tmp: Path) -> None:
        tmp.write_text(header + yaml.safe_dump(data, sort_keys=False))

    atomic_write(path, write)
    return path
