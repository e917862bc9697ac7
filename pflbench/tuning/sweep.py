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
import os
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pflbench.config import CellConfig, cell_hash
from pflbench.run.preemption import (
    PREEMPTED_EXIT,
    Preemption,
    keeping_signals,
)
from pflbench.run.spec import Resources
from pflbench.simulator.execution import ExecutionOptions
from pflbench.storage.store import write_json
from pflbench.tuning.trial import (
    CHECKPOINTS,
    METRIC,
    SETTINGS,
    SweepError,
    SweepOptions,
    SweepResult,
    run_trial,
    search_space,
    tune_space,
)
from pflbench.tuning.tuned import finish_sweep

if TYPE_CHECKING:
    pass


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
    from pflbench.run.options import RunStopped
    from pflbench.run.stops import acknowledge
    from pflbench.simulator.rounds import prepare_cell

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

    from pflbench.loader.plugins import sources_for
    from pflbench.run.checkpoint_relay import start_keeper
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
