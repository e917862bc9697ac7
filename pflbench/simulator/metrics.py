"""A cell's numbers: the per-client rows of an evaluation round, and the summaries of a finished cell.

The rows are built here once, for trained clients and newcomers alike (`client_rows`); the
summaries of the evaluation protocols are defined here once (`protocol_summary`, keyed by
`accuracy_key`/`round_key`), and `pflbench.reports.protocols` reads the same keys through those two
functions rather than spelling them again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

METRIC_COLUMNS = [
    "round",
    "client",
    "accuracy",
    "loss",
    "val_accuracy",
    "val_loss",
    "accuracy_adapted",
    "loss_adapted",
    "val_accuracy_adapted",
    "val_loss_adapted",
    "test_samples",
    "val_samples",
    "bytes_down",
    "bytes_up",
    "wall_time",
]
ROUND_COLUMNS = [
    "round",
    "clients",
    "bytes_down",
    "bytes_up",
    "wall_time",
    "adapt_time",
    "train_time",
    "server_time",
    "eval_time",
]  # seconds per round: local training,
# the other hooks (configure/receive/send/aggregate), forming and scoring the personalized models

# The summary keys a cell run in a cell group adds (pflbench.simulator.groups.SUMMARY_KEYS): how it ran.
CELL_GROUP_KEYS = (
    "cell_group_cells",
    "cell_group_calls",
    "cell_group_merged_calls",
    "cell_group_mean_width",
    "cell_group_static_step",
)

# Summary keys that record how and where a run went, not what it computed: timings, the store's own
# records, peak memory and the machine (pflbench.run.cost), checkpoints (pflbench.storage.checkpoint). Two runs of one
# cell (in-process or on Ray, resumed or not) agree on every other key; tests and `pflbench verify` compare
# summaries without these (and without any `*_time_total`).
RUN_RECORD_KEYS = frozenset(
    {
        "wall_time",
        "completed_at",
        "files",
        "runner",
        "compile_seconds",
        "peak_host_bytes",
        "host_start_bytes",
        "peak_host_method",
        "peak_gpu_bytes",
        "cpu_model",
        "cpu_capability",
        "cpu_cores",
        "gpu_model",
        "code_commit",
        "code_dirty",
        "checkpoint_seconds",
        "checkpoints_written",
        "checkpoint_bytes",
        "resumed_from_round",
        "checkpoint_error",
        *CELL_GROUP_KEYS,  # a cell run in a cell group
    }
)


SELECTIONS = ("final", "bestval")  # the round selections a summary holds (besttest: `best_accuracy`)
NEWCOMERS = "_newcomers"  # suffix of the newcomers' own summaries (pflbench.newcomers)


def accuracy_key(selection: str, adapted: bool = False, averaging: str = "clients") -> str:
    """The summary key of one evaluation protocol's number (see pflbench.reports.protocols):
    `{final|bestval}_accuracy[_adapted][_pooled]`, `{final|bestval}_worst10_accuracy[_adapted]`, and
    `best_accuracy` for the round selected on test (as delivered, mean over clients)."""
    if selection == "besttest":
        return "best_accuracy"
    model = "_adapted" if adapted else ""
    if averaging == "worst10":
        return f"{selection}_worst10_accuracy{model}"
    return f"{selection}_accuracy{model}" + ("_pooled" if averaging == "pooled" else "")


def round_key(selection: str, adapted: bool = False) -> str | None:
    """The summary key of the round a selection chose (None for the final round)."""
    if selection == "besttest":
        return "best_round"
    if selection == "bestval":
        return "bestval_round" + ("_adapted" if adapted else "")
    return None


def client_rows(
    rnd: int,
    client_ids: Sequence[int] | np.ndarray,
    scores: dict,
    adapted: dict,
    test_samples: list[int],
    val_samples: list[int],
    bytes_down: dict | None = None,
    bytes_up: dict | None = None,
    **flags: Any,
) -> list[dict]:
    """One metrics row per client of an evaluation round. `scores`/`adapted`: split -> (accuracy,
    loss) per client position (a split not evaluated is NaN); `client_ids`: position -> partition id;
    bytes by position (absent: 0); `flags`: extra columns (e.g. `newcomer`). No `wall_time`: the
    round driver stamps it."""
    count = len(client_ids)
    missing = ([math.nan] * count,) * 2
    accuracy, loss = _lists(scores.get("test"), missing)
    val_accuracy, val_loss = _lists(scores.get("val"), missing)
    accuracy_a, loss_a = _lists(adapted.get("test"), missing)
    val_accuracy_a, val_loss_a = _lists(adapted.get("val"), missing)
    bytes_down, bytes_up = bytes_down or {}, bytes_up or {}
    return [
        {
            "round": rnd,
            "client": int(client_ids[k]),
            "accuracy": accuracy[k],
            "loss": loss[k],
            "val_accuracy": val_accuracy[k],
            "val_loss": val_loss[k],
            "accuracy_adapted": accuracy_a[k],
            "loss_adapted": loss_a[k],
            "val_accuracy_adapted": val_accuracy_a[k],
            "val_loss_adapted": val_loss_a[k],
            "test_samples": test_samples[k],
            "val_samples": val_samples[k],
            "bytes_down": bytes_down.get(k, 0),
            "bytes_up": bytes_up.get(k, 0),
            **flags,
        }
        for k in range(count)
    ]


def _lists(pair: Any, missing: tuple[list[float], list[float]]) -> tuple[list[float], list[float]]:
    if pair is None:
        return missing
    return [float(v) for v in pair[0].tolist()], [float(v) for v in pair[1].tolist()]


def trained_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """The trained clients' rows of a metrics table (all rows where the cell has no newcomers)."""
    if "newcomer" not in metrics:
        return metrics
    return metrics[~metrics["newcomer"].astype(bool)]


def newcomer_summary(metrics: pd.DataFrame) -> dict:
    """The protocol summaries of the newcomers' rows, each key with the suffix `_newcomers`."""
    if "newcomer" not in metrics:
        return {}
    rows = metrics[metrics["newcomer"].astype(bool)]
    if not len(rows):
        return {}
    out = {}
    for model in ("", "_adapted"):
        out.update({f"{key}{NEWCOMERS}": value for key, value in protocol_summary(rows, model).items()})
    return out


def summarize(
    metrics: pd.DataFrame, rounds: pd.DataFrame, status: str, diverged_round: int | None, wall_time: float, facts: dict
) -> dict:
    """A finished (or diverged) cell's summary: status, totals, `facts` (how and where it ran), and the
    protocol summaries of its trained clients and of its newcomers."""
    summary = {
        "status": status,
        "rounds_completed": int(len(rounds)),
        "diverged_round": diverged_round,
        "bytes_down_total": int(rounds["bytes_down"].sum()),
        "bytes_up_total": int(rounds["bytes_up"].sum()),
        "wall_time": wall_time,
        **facts,
    }
    everyone, metrics = metrics, trained_rows(metrics)  # newcomers' rows have their own summaries
    summary.update(newcomer_summary(everyone))
    if len(metrics):
        summary.update(protocol_summary(metrics, ""))
        summary.update(protocol_summary(metrics, "_adapted"))
        per_round = metrics.groupby("round")["accuracy"].mean()
        if per_round.notna().all():  # selection on the test split: kept, and only ever shown labeled so
            summary.update(
                {accuracy_key("besttest"): float(per_round.max()), round_key("besttest"): int(per_round.idxmax())}
            )
    return summary


def protocol_summary(metrics: pd.DataFrame, model: str = "") -> dict:
    """The summaries of one scored model (`model`: "" as delivered, "_adapted" after local adaptation):

    - `final_accuracy{model}`: mean over clients at the last evaluation round, with
      `final_worst10_accuracy{model}`, `final_loss{model}` and `final_accuracy{model}_pooled` (pooled
      over all clients' test samples: sample-weighted, as pFedHN's code reports);
    - `bestval_accuracy{model}`: the mean test accuracy at `bestval_round{model}`, the round whose
      mean *validation* accuracy is highest (the first such round), with the same variants; no
      summary here selects a round on the test split;
    - `final_val_accuracy{model}`, `best_val_accuracy{model}`.
    A round whose clients are not all scored (split withheld, adaptation diverged) is never selected."""
    out: dict = {}
    adapted = model == "_adapted"
    test, val = f"accuracy{model}", f"val_accuracy{model}"
    if test not in metrics or val not in metrics:  # stores written before the column existed
        return out
    last_round = metrics["round"].max()

    def at(rnd: int, selection: str) -> None:
        rows = metrics[metrics["round"] == rnd]
        values = rows[test].to_numpy(dtype=float)
        out[accuracy_key(selection, adapted)] = float(values.mean())
        out[accuracy_key(selection, adapted, "worst10")] = worst_fraction_mean(values)
        if selection == "final":
            out[f"final_loss{model}"] = float(rows[f"loss{model}"].mean())
        if "test_samples" in rows and rows["test_samples"].sum() > 0:
            weights = rows["test_samples"].to_numpy(dtype=float)
            out[accuracy_key(selection, adapted, "pooled")] = float((values * weights).sum() / weights.sum())

    grouped = metrics.groupby("round")
    scored = grouped[test].apply(lambda v: v.notna().all())
    if scored.get(last_round, False):
        at(last_round, "final")
    val_scored = grouped[val].apply(lambda v: v.notna().all())
    if val_scored.get(last_round, False):
        out[f"final_val_accuracy{model}"] = float(metrics.loc[metrics["round"] == last_round, val].mean())
    val_mean = grouped[val].mean()[val_scored]
    if len(val_mean):
        out[f"best_val_accuracy{model}"] = float(val_mean.max())
        chosen = val_mean[scored.reindex(val_mean.index, fill_value=False)]
        if len(chosen):
            rnd = int(chosen.idxmax())
            out[round_key("bestval", adapted)] = rnd
            at(rnd, "bestval")
    return out


def worst_fraction_mean(values: np.ndarray, fraction: float = 0.1) -> float:
    """Mean of the worst `fraction` of clients (at least one)."""
    count = max(1, math.ceil(fraction * len(values)))
    return float(np.sort(values)[:count].mean())
