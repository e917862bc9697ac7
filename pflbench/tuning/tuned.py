"""A finished sweep: each trial's state, the best configuration chosen on the validation metric, and the tuned configuration written for `pflbench run` to pick up (benchmarks/tuned)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pflbench.config import CellConfig, cell_hash
from pflbench.run.spec import tuned_path
from pflbench.storage.store import atomic_write, write_json
from pflbench.tuning.trial import CHECKPOINTS, METRIC, SweepError, SweepOptions, SweepResult, trial_values

if TYPE_CHECKING:
    pass


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
