"""`pflbench sweep --algo NAME`: tune one algorithm's hyperparameters with Ray Tune, Optuna's sampler
and ASHA early stopping on rounds, on the clients' validation splits only.

- The base setting is one cell of a spec (default `benchmarks/sweeps/default.yaml`; `--spec`,
  `--scale`, `--set` and the shortcuts `--dataset/--partition/--clients/--rounds` narrow it), run
  with the algorithm forced to NAME. Every trial is that cell with sampled values, resolved by the
  same code as a spec's cells (`pflbench.spec.resolve_cell`), so a trial's settings written into a
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

Written: `<results>/sweeps/<algo>-<base hash>-<time>/` (sweep.json: settings, space, every trial's
outcome and the best; trials.parquet: every reported (trial, round, val_accuracy); ray/: Tune's own
files) and the best configuration `<out>/<algo>.yaml` (default benchmarks/tuned/), which a spec uses
with `tuned: true` (benchmarks/README.md). Tuning runs are kept apart from benchmark results: they
never evaluated the test split, so they must not be taken for (or resume) a benchmark cell.
"""
from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from pflbench.config import CellConfig, cell_hash
from pflbench.execution import ExecutionOptions
from pflbench.spec import Resources, load_spec, resolve_cell, tuned_path
from pflbench.store import atomic_write, write_json

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
    # Round checkpoints of the trials (pflbench/checkpoint.py) in <sweep folder>/checkpoints/<trial>/:
    # a trial whose worker is lost is rerun by Tune up to `retries` times and resumes from its checkpoint.
    checkpoint_every: int = 0
    checkpoint_minutes: float = 5.0
    keep_checkpoints: bool = False
    retries: int = 2


@dataclass
class SweepResult:
    folder: Path
    best: dict  # {"trial", "config": {lr, hp...}, "val_accuracy", "rounds"}
    trials: list[dict]
    tuned_file: Path | None


# ---- the base cell and the search space --------------------------------------------------------

def base_cell(algorithm: str, spec: Path = DEFAULT_BASE, sets: dict[str, Any] | None = None,
              scale: str | None = None) -> tuple[CellConfig, Resources]:
    """The one cell a sweep varies: the spec's cells for `algorithm` (after `sets` and `scale`),
    which must be exactly one."""
    plan = load_spec(spec, {**(sets or {}), "algorithm": algorithm}, scale=scale)
    if len(plan.cells) != 1:
        varying = sorted({field for field in CellConfig.model_fields
                          if len({json.dumps(getattr(c, field), sort_keys=True) for c in plan.cells}) > 1})
        raise SweepError(f"{spec}: gives {len(plan.cells)} cells for {algorithm}, a sweep needs one; they differ in "
                         f"{', '.join(varying)}: fix them with --set (e.g. --set seed=0, --dataset, --clients)")
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
            raise SweepError(f"{algorithm}.search_space names {name!r}, which is not one of its hyperparameters "
                             f"({', '.join(declared) or 'none'})")
        space[f"hp.{name}"] = tuple(entry)
    for name, entry in space.items():
        kind = entry[0] if entry else None
        if kind not in SPACE_KINDS or len(entry) != (2 if kind == "choice" else 3):
            raise SweepError(f"{algorithm}: search space entry {name}={entry!r}; allowed: (loguniform|uniform, low, "
                             f"high), (int, low, high) or (choice, [values])")
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

def run_trial(config: dict, *, base: dict, cpus: float, data_root: str | None, mirror: str | None,
              execution: ExecutionOptions, checkpoints: dict | None = None, plugins: tuple = ()) -> None:
    """Run the base cell with the trial's values, validation split only, reporting
    {round, val_accuracy} to Tune at every evaluated round (ASHA may stop it there). `checkpoints`:
    {folder, every, minutes, keep}: the trial's round checkpoints, resumed from when Tune retries it."""
    import torch
    from ray import tune

    from pflbench.rounds import run_cell
    from pflbench.plugins import activate

    activate(plugins)  # the user's plugins, in this Ray worker, before the trial's cell is resolved
    cell = trial_cell(CellConfig(**base), config)
    torch.set_num_threads(execution.threads or max(1, int(cpus)))
    reported = []

    def report(info: dict) -> None:
        rnd = info["round"]
        if (rnd % cell.eval_every == 0 or rnd == cell.rounds) and info.get("mean_val_accuracy") is not None:
            reported.append(rnd)
            tune.report({"round": rnd, METRIC: info["mean_val_accuracy"], "status": "running"})

    checkpointer = None
    if checkpoints is not None:
        from pflbench.checkpoint import CheckpointPolicy, Checkpointer

        trial = Path(checkpoints["folder"]) / tune.get_context().get_trial_id()
        checkpointer = Checkpointer(trial, cell, CheckpointPolicy(checkpoints["every"], checkpoints["minutes"]),
                                    set_aside_dir=Path(checkpoints["folder"]) / "_set_aside")
    result = run_cell(cell, data_root=data_root, mirror=mirror, execution=execution, on_round=report,
                      evaluate=("val",), checkpointer=checkpointer)
    if checkpointer is not None and not checkpoints["keep"]:
        checkpointer.remove()
    if result.status != "finished":  # diverged: the worst objective, at the round it happened
        rnd = result.summary.get("diverged_round") or (reported[-1] if reported else 1)
        tune.report({"round": rnd, METRIC: 0.0, "status": result.status, "error": result.error or ""})


# ---- the sweep ----------------------------------------------------------------------------------

def run_sweep(algorithm: str, base: CellConfig, resources: Resources, options: SweepOptions = SweepOptions(),
              log=print) -> SweepResult:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from pflbench.data import data_mirror, data_root
    from pflbench.ray_cluster import ClusterError, connect_ray
    from pflbench.rounds import prepare_cell
    from pflbench.plugins import sources_for

    if options.trials < 1:
        raise SweepError("--trials must be at least 1")
    space = search_space(algorithm, base, options.tune_lr)
    options = replace(options, data_root=data_root(options.data_root), mirror=data_mirror(options.mirror))
    prepare_cell(base, options.data_root, options.mirror)  # the dataset and partition, once, before any trial
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = (Path(options.results) / "sweeps" / f"{algorithm}-{cell_hash(base)}-{stamp}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    execution = options.execution.on("cuda" if resources.gpus > 0 else "cpu")
    grace = options.grace_rounds or max(base.eval_every, base.rounds // 4)  # at least one evaluation first
    log(f"sweep {algorithm}: {options.trials} trials of {base.rounds} rounds on {base.dataset} "
        f"{base.partition} {base.clients} clients (base cell {cell_hash(base)}); objective: mean client "
        f"validation accuracy; ASHA grace {grace} rounds; space: "
        + ", ".join(f"{k}={v[0]}{list(v[1:])}" for k, v in space.items()))

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    try:  # a wrong address fails within seconds, with the run command's message
        owned = connect_ray(options.ray_address, options.workers, resources.cpus)
    except ClusterError as error:
        raise SweepError(str(error)) from None
    try:
        if resources.gpus > 0 and not ray.cluster_resources().get("GPU", 0):
            raise SweepError(f"the base spec asks for {resources.gpus:g} GPU per cell but Ray has none; "
                             f"use --set resources.gpus=0")
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, base=base.model_dump(mode="json"), cpus=resources.cpus,
                                 data_root=str(options.data_root), mirror=str(options.mirror) if options.mirror else None,
                                 execution=execution,
                                 checkpoints={"folder": str(folder / "checkpoints"), "every": options.checkpoint_every,
                                              "minutes": options.checkpoint_minutes, "keep": options.keep_checkpoints},
                                 plugins=sources_for([base])),
            {"cpu": resources.cpus, "gpu": resources.gpus})
        tuner = tune.Tuner(
            trainable,
            param_space=tune_space(space),
            tune_config=tune.TuneConfig(
                metric=METRIC, mode="max", num_samples=options.trials, max_concurrent_trials=options.workers,
                search_alg=OptunaSearch(seed=options.seed),
                scheduler=ASHAScheduler(time_attr="round", max_t=base.rounds, grace_period=min(grace, base.rounds),
                                        reduction_factor=options.reduction_factor)),
            run_config=tune.RunConfig(name="ray", storage_path=str(folder), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=options.retries)))
        grid = tuner.fit()
    finally:
        if owned:
            ray.shutdown()
    return finish_sweep(algorithm, base, space, options, folder, grid, grace, log)


def finish_sweep(algorithm, base, space, options, folder, grid, grace, log) -> SweepResult:
    import pandas as pd

    if not options.keep_checkpoints:  # trials stopped early by ASHA leave theirs (set-aside ones are kept)
        for path in (folder / "checkpoints").glob("*/checkpoint.pt"):
            path.unlink(missing_ok=True)
    trials, rows = [], []
    for i, result in enumerate(grid):
        history = result.metrics_dataframe if result.metrics_dataframe is not None else pd.DataFrame()
        last = result.metrics or {}
        status = last.get("status", "running")
        if result.error is not None:
            status = "error"
        values = trial_values({k: v for k, v in (result.config or {}).items()})
        rounds = int(last.get("round", 0) or 0)
        if status == "running":
            status = "completed" if rounds >= base.rounds else "stopped early"
        trials.append({"trial": i, "values": values, "status": status, "rounds": rounds,
                       METRIC: last.get(METRIC), "error": str(result.error).strip().splitlines()[-1]
                       if result.error is not None else last.get("error") or None})
        for _, row in history.iterrows() if len(history) else []:
            rows.append({"trial": i, "round": int(row["round"]), METRIC: float(row[METRIC]),
                         **{f"param.{k}": v for k, v in _flat(values).items()}})
    atomic_write(folder / "trials.parquet", lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))
    completed = [t for t in trials if t["status"] == "completed" and t[METRIC] is not None]
    best = max(completed, key=lambda t: (t[METRIC], -t["trial"]), default=None)
    summary = {
        "algorithm": algorithm, "base_cell": base.model_dump(mode="json"), "base_hash": cell_hash(base),
        "objective": "mean client accuracy on the validation split at the last round (maximised); "
                     "the test split is withheld from every trial",
        "search_space": {k: list(v) for k, v in space.items()}, "trials": options.trials,
        "sampler": f"optuna TPE (seed {options.seed})",
        "scheduler": f"ASHA on rounds (grace {grace}, reduction factor {options.reduction_factor:g}, max {base.rounds})",
        "outcomes": trials, "best": best,
    }
    write_json(folder / "sweep.json", summary)
    counts = {s: sum(t["status"] == s for t in trials) for s in ("completed", "stopped early", "diverged", "error")}
    log(f"{len(trials)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f"; results in {folder}")
    if best is None:
        errors = sorted({t["error"] for t in trials if t["error"]})
        raise SweepError(f"no trial of {algorithm} ran every round"
                         + (f"; errors: {'; '.join(errors)[:2000]}" if errors else "") + f" (see {folder})")
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


def _plain(value):
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
            "cell": base.model_dump(mode="json"), "hash": cell_hash(base),
            "objective": summary["objective"], "search_space": summary["search_space"],
            "sampler": summary["sampler"], "scheduler": summary["scheduler"],
            "val_accuracy": float(best[METRIC]), "sweep": str(folder),
            "date": datetime.date.today().isoformat(),
        },
    }
    header = (f"# Written by `pflbench sweep --algo {algorithm}`: the best configuration found, applied to "
              f"{algorithm}'s cells by a spec with\n# `tuned: true` (benchmarks/README.md). Only `set` is used.\n")
    path = tuned_path(out, algorithm)
    atomic_write(path, lambda tmp: tmp.write_text(header + yaml.safe_dump(data, sort_keys=False)))
    return path
