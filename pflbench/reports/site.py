"""The static HTML leaderboard: `index.html` (tables, figures, every cell), a page per cell and per
algorithm. Jinja2 templates (package data, templates/) with autoescaping on, so every value read
from a results store is rendered as text; CSS and the small sorting/filtering script are inlined and
figures are local files, so the folder opens from disk with no server and no network.

The leaderboard's tables exist once per evaluation protocol the store has numbers for (protocols.py);
a "protocol" select (part of the filters, kept in the address's hash as #protocol=NAME) shows one
protocol's tables at a time, each captioned with its protocol. A cell's page lists its numbers under
every protocol it has (as delivered and after local adaptation; final, best-validation and best-test
rounds)."""

from __future__ import annotations

import datetime
import re
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined

from pflbench.reports.document import Report, safe_name
from pflbench.reports.cells import (
    algorithm_class,
    display_name,
    execution_text,
    read_artifacts,
    read_config,
    read_error,
    read_metrics,
    read_rounds,
    timing_breakdown,
)
from pflbench.reports.heterogeneity import site_tables
from pflbench.reports.protocols import AVERAGINGS, DEFAULT, MODELS, SELECTIONS, Protocol
from pflbench.reports.provenance import cell_provenance, study_facts
from pflbench.reports.dotplot import dot_plot
from pflbench.reports.rows import TUNED, Row
from pflbench.reports.reference import Reference
from pflbench.reports.tables import DATA_DIFFER, CommTable, Table, mean_or_none, payload_text
from pflbench.storage.store import flatten

CELL_COLUMNS = [  # (title, key, numeric)
    ("cell", "hash", False),
    ("algorithm", "algorithm", False),
    ("dataset", "dataset", False),
    ("scheme", "partition", False),
    ("params", "params", False),
    ("clients", "clients", True),
    ("seed", "seed", True),
    ("status", "status", False),
    ("accuracy %", "final_accuracy", True),
    ("worst 10% %", "final_worst10_accuracy", True),
    ("adapted %", "final_accuracy_adapted", True),
    ("best-val %", "bestval_accuracy", True),
    ("best-val round", "bestval_round", True),
    ("best test % (selected on test)", "best_accuracy", True),
    ("MB total", "mbytes", True),
    ("hp", "hp_source", False),
    ("wall s", "wall_time", True),
    ("peak host MB", "peak_host_mb", True),
    ("peak GPU MB", "peak_gpu_mb", True),
]  # pflbench/run/cost.py
PERCENT_KEYS = (
    "final_accuracy",
    "final_worst10_accuracy",
    "final_accuracy_adapted",
    "bestval_accuracy",
    "best_accuracy",
)


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("pflbench.reports", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # The templates call each helper by its own name.
    env.globals.update({f.__name__: f for f in (display_name, algorithm_class, mean_or_none, payload_text)})
    env.globals.update(
        cell_url=lambda h: f"cells/{safe_name(h)}.html",
        algorithm_url=lambda a: f"algorithms/{safe_name(a)}.html",
        TUNED=TUNED,
        DATA_DIFFER=DATA_DIFFER,
    )
    env.filters.update(num=_num, sortval=_sortval)
    return env


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, (float, np.floating)) else str(value)


def _sortval(value: Any) -> str:
    if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)):
        return ""
    return str(value)


def summary_value(key: str, value: Any) -> str:
    """A summary value as a reader wants it: accuracies in %, bytes in MB, times in s, floats short."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    value = float(value)
    if "accuracy" in key and 0.0 <= value <= 1.0:
        return f"{value * 100:.2f}%"
    if key.startswith("bytes") or key.endswith("bytes"):
        return f"{value / 1e6:.3f} MB"
    if key.endswith("time") or key.endswith("_time_total") or key == "wall_time":
        return f"{value:.1f} s"
    if "loss" in key:
        return f"{value:.4f}"
    return f"{value:g}" if not value.is_integer() else str(int(value))


def cell_rows(cells: pd.DataFrame) -> list[dict]:
    rows = []
    for _, cell in cells.iterrows():
        row = {
            "hash": str(cell["hash"]),
            "algorithm": str(cell["algorithm"]),
            "dataset": str(cell["dataset"]),
            "partition": str(cell["partition"]),
            "params": str(cell["params"]),
            "clients": cell["clients"],
            "seed": cell["seed"],
            "status": str(cell["status"]),
            "hp_source": str(cell["hp_source"]),
            "error": str(cell.get("error") or ""),
        }
        for key in PERCENT_KEYS:
            value = cell.get(key)
            row[key] = None if value is None or pd.isna(value) or cell["status"] != "finished" else float(value) * 100
        rnd = cell.get("bestval_round")
        row["bestval_round"] = None if rnd is None or pd.isna(rnd) or cell["status"] != "finished" else int(rnd)
        row["mbytes"] = None if pd.isna(cell["mbytes"]) else float(cell["mbytes"])
        row["wall_time"] = None if pd.isna(cell["wall_time"]) else float(cell["wall_time"])
        for key in ("peak_host", "peak_gpu"):  # what the cell cost in memory (pflbench/run/cost.py)
            value = cell.get(f"{key}_bytes")
            row[f"{key}_mb"] = None if value is None or pd.isna(value) else float(value) / 1e6
        rows.append(row)
    return rows


def options_of(cells: pd.DataFrame, column: str) -> list[str]:
    if cells.empty:
        return []
    values = cells[column].dropna().unique().tolist()
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))]


def artifact_list(path: str | Path) -> list[dict]:
    out = []
    for name, rounds in read_artifacts(path).items():
        last = rounds[max(rounds)]
        out.append(
            {
                "name": name,
                "rounds": len(rounds),
                "first": min(rounds),
                "last": max(rounds),
                "shape": " × ".join(map(str, last.shape)) or "scalar",
                "dtype": str(last.dtype),
            }
        )
    return out


def protocol_scores(cell: pd.Series) -> list[dict]:
    """A cell's numbers under every protocol it has: a row per (model, selection) with the mean over
    clients, pooled and worst-10% accuracy (%) and the round the selection chose."""

    def value(key: str) -> float | None:
        v = cell.get(key)
        return None if v is None or pd.isna(v) else float(v)

    rows: list[dict[str, Any]] = []
    if cell["status"] != "finished":
        return rows
    for model in MODELS:
        for selection in SELECTIONS:
            if selection == "besttest" and model != "delivered":
                continue
            scores = dict.fromkeys(AVERAGINGS)
            for averaging in AVERAGINGS:
                try:
                    protocol = Protocol(model, selection, averaging)
                except ValueError:
                    continue
                v = value(protocol.key)
                scores[averaging] = None if v is None else v * 100
            if not any(v is not None for v in scores.values()):
                continue
            base = Protocol(model, selection, "clients")
            rnd = value(base.round_key) if base.round_key else value("rounds_completed")
            rows.append(
                {
                    "label": f"{MODELS[model]} · {SELECTIONS[selection]}",
                    "name": base.name,
                    **scores,
                    "round": None if rnd is None else int(rnd),
                }
            )
    return rows


def write_site(
    cells: pd.DataFrame,
    boards: list[tuple[Protocol, list[Table]]],
    comm: list[CommTable],
    references: Sequence[Reference],
    report: Report,
    results: Path,
    docs_url: str | None = None,
) -> Path:
    """`boards`: [(protocol, [Table per scheme])], the leaderboard's protocols in the select's order; the
    page opens on the paper's protocol where some entry has a Δ against the paper (`opening_protocol`),
    else on the first."""
    env = environment()
    out = report.out
    rows = cell_rows(cells)
    opening = opening_protocol(boards)  # first in the select: the page opens on it
    boards = sorted(boards, key=lambda board: board[0] != opening)
    study = study_facts(results)  # a published study's provenance, and which seeds its tables pool
    if study is not None:
        study = {**study, "shown_seeds": shown_seeds(cells, Path(results))}
    common = {
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "results": str(results),
        "cell_columns": CELL_COLUMNS,
        "study": study,
        "docs_url": docs_url,
        "docs_relative": docs_url is not None and bool(docs_url) and not re.match(r"^[a-z]+:|/", docs_url),
    }
    statuses = cells["status"].value_counts().to_dict() if len(cells) else {}
    figures = [{"title": t, "path": p} for t, p in report.figures]
    tables = [t for _, board in boards for t in board]
    layouts = {t.id: row_layout(t, Path(results)) for t in tables}
    alpha_cells = [(r, f) for r in rows for f in report.cell_figures.get(r["hash"], []) if f["kind"] == "alpha"]
    index = out / "index.html"
    index.write_text(
        env.get_template("index.html").render(
            root="",
            boards=boards,
            default_protocol=opening.name,
            comm=comm,
            cells=rows,
            statuses=statuses,
            figures=figures,
            layouts=layouts,
            best_groups={t.id: best_groups(t, {r.key: label for r, label, _ in layouts[t.id]}) for t in tables},
            dot_plots={
                t.id: [
                    (c, d)
                    for c in t.columns
                    if (d := dot_plot(t, c, [(r, label) for r, label, variant in layouts[t.id] if not variant]))
                    is not None
                ]
                for t in tables
            },
            alpha_figures=alpha_cells,
            references=references,
            notes=report.notes,
            copes=site_tables(report.heterogeneity),
            differences=report.differences,
            ranks=report.ranks,
            skipped=report.skipped,
            progress=report.progress,
            datasets=options_of(cells, "dataset"),
            schemes=options_of(cells, "partition"),
            clients=options_of(cells, "clients"),
            algorithms=options_of(cells, "algorithm"),
            **common,
        )
    )

    (out / "cells").mkdir(exist_ok=True)
    template = env.get_template("cell.html")
    for row, (_, cell) in zip(rows, cells.iterrows()):
        config = read_config(cell["path"])
        flat_config = flatten(config.get("cell", {}))
        summary = {
            k: v
            for k, v in cell.items()
            if k not in flat_config and k not in ("path", "params", "mbytes") and not (np.isscalar(v) and pd.isna(v))
        }
        rounds = read_rounds(cell["path"])
        bytes_per_round = None
        if len(rounds) and "bytes_down" in rounds:
            bytes_per_round = {
                "down": float(rounds["bytes_down"].mean()) / 1e6,
                "up": float(rounds["bytes_up"].mean()) / 1e6,
            }
        (out / "cells" / f"{safe_name(cell['hash'])}.html").write_text(
            template.render(
                root="../",
                cell=row,
                config=sorted((k, json.dumps(v) if not isinstance(v, str) else v) for k, v in flat_config.items()),
                versions=sorted(flatten(config.get("versions", {})).items()),
                summary=sorted((k, summary_value(k, v)) for k, v in summary.items()),
                error_text=read_error(cell["path"]),
                figures=report.cell_figures.get(cell["hash"], []),
                partition_figure=report.partition_figures.get(cell["hash"]),
                artifacts=artifact_list(cell["path"]),
                bytes_per_round=bytes_per_round,
                charts=cell_charts(read_metrics(cell["path"])),
                scores=protocol_scores(cell),
                finetune_epochs=int(cell.get("finetune_epochs") or 0),
                adapt_time=None if pd.isna(cell.get("adapt_time_total", np.nan)) else float(cell["adapt_time_total"]),
                timing=timing_breakdown(rounds, cell.get("compile_seconds")),
                execution=execution_text(summary),
                provenance=cell_provenance(Path(cell["path"]).parent, cell["hash"]),
                **common,
            )
        )

    (out / "algorithms").mkdir(exist_ok=True)
    template = env.get_template("algorithm.html")
    for algorithm in options_of(cells, "algorithm"):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        (out / "algorithms" / f"{safe_name(algorithm)}.html").write_text(
            template.render(root="../", algorithm=algorithm, cells=mine, **common)
        )
    return index


def opening_protocol(boards: list[tuple[Protocol, list[Table]]]) -> Protocol:
    """The protocol a page opens on: the first whose tables compare some entry with the paper (a Δ: the
    paper's protocol, on a reproduction study), else the first (as delivered, final round)."""
    for protocol, tables in boards:
        if any(t.any_delta for t in tables):
            return protocol
    return boards[0][0] if boards else DEFAULT


def row_layout(table: Table, results: Path) -> list[tuple[Row, str, bool]]:
    """The table's rows in display order, each with the label it is shown by and whether it is a variant
    folded under its base row: among an algorithm's rows of one knob setting (tuned or not), the base
    holds the most cells of this store (`results`: the study's own, not those beside it), then the
    shortest label, and is shown by the algorithm's name; the others (another hyperparameter, batch,
    optimizer) follow it, labelled by what they change against it."""
    from pflbench.reports.glance_columns import variant_label

    def own(row: Row) -> int:
        return sum(
            1
            for c in table.columns
            if (e := table.entry(row, c)) is not None
            for path in e.paths
            if Path(path).parent.resolve() == results.resolve()
        )

    groups: dict[tuple, list[Row]] = {}
    for row in table.rows:
        groups.setdefault((row.algorithm, row.setting, row.tuned), []).append(row)
    out: list[tuple[Row, str, bool]] = []
    for row in table.rows:
        group = groups[(row.algorithm, row.setting, row.tuned)]
        if len(group) == 1:
            out.append((row, row.label, False))
            continue
        base = max(group, key=lambda r: (own(r), -len(r.variant)))
        if row is not base:
            continue  # placed after its base
        setting = f" ({row.setting})" if row.setting else ""
        out.append((row, display_name(row.algorithm) + setting + (f" {TUNED}" if row.tuned else ""), False))
        out += [(other, variant_label(other, base), True) for other in group if other is not base]
    return out


def best_groups(table: Table, labels: dict[tuple, str] | None = None) -> list[dict]:
    """Per column: the highest mean's row and the rows the paired test cannot tell from it (tables.mark_best),
    by the labels the table shows them with (`labels`: row key -> label; else each row's own)."""

    def name(row: Row) -> str:
        return (labels or {}).get(row.key, row.label)

    out = []
    for column in table.columns:
        ranked = [(r, e) for r in table.rows if (e := table.entry(r, column)) is not None and e.mean is not None]
        top = next(((r, e) for r, e in ranked if e.top), None)
        if top is None:
            continue
        out.append(
            {
                "column": column.label,
                "top": name(top[0]),
                "separated": top[1].best,
                "tied": [name(r) for r, e in ranked if e.tied and not e.top],
            }
        )
    return out


def shown_seeds(cells: pd.DataFrame, results: Path) -> str:
    """ "" when the tables hold this study's cells only; else what they pool: "seeds 0, 1, 2 (seed 0 from
    this study; the others from the studies beside it: ...)", so the banner and the tables agree."""
    if cells.empty or "path" not in cells:
        return ""
    stores = cells["path"].map(lambda p: Path(p).parent.name)
    own = stores == results.name
    if own.all():
        return ""
    seeds = sorted(cells["seed"].dropna().unique().tolist(), key=str)
    mine = sorted(cells.loc[own, "seed"].dropna().unique().tolist(), key=str)
    others = sorted(set(stores[~own]))
    return (
        f"Its tables pool seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: "
        f"seed{'s' if len(mine) > 1 else ''} {', '.join(map(str, mine)) or '–'} from this study, the rest and "
        f"the variant rows from {len(others)} studies shown beside it ({', '.join(others)})."
    )


def chart(
    series: dict[str, tuple[list, list]], *, width: int = 520, height: int = 220, ymax: float | None = None
) -> dict:
    """A line chart as plain numbers for the template to draw as inline SVG: {label: (xs, ys)} ->
    polyline points in a width x height box, with a few axis ticks. No text is made here: the
    template writes the labels, escaped."""
    pad_l, pad_r, pad_t, pad_b = 40, 10, 10, 28
    xs = [x for x_list, _ in series.values() for x in x_list]
    ys = [y for _, y_list in series.values() for y in y_list if y == y]
    if not xs or not ys:
        return {}
    x0, x1 = min(xs), max(xs)
    y0, y1 = 0.0, ymax if ymax is not None else max(ys) * 1.05 or 1.0
    sx = lambda x: pad_l + (x - x0) / ((x1 - x0) or 1) * (width - pad_l - pad_r)
    sy = lambda y: height - pad_b - (y - y0) / ((y1 - y0) or 1) * (height - pad_t - pad_b)
    colors = ["#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd"]
    lines = []
    for k, (label, (x_list, y_list)) in enumerate(series.items()):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(x_list, y_list) if y == y)
        lines.append(
            {
                "label": label,
                "color": colors[k % len(colors)],
                "points": points,
                "dots": [(round(sx(x), 1), round(sy(y), 1)) for x, y in zip(x_list, y_list) if y == y][:200],
            }
        )
    yticks = [(round(sy(v), 1), f"{v:g}") for v in np.linspace(y0, y1, 5).round(1)]
    xticks = [
        (round(sx(v), 1), f"{v:g}") for v in sorted(set(np.linspace(x0, x1, min(6, len(set(xs)))).round().tolist()))
    ]
    return {
        "width": width,
        "height": height,
        "lines": lines,
        "yticks": yticks,
        "xticks": xticks,
        "left": pad_l,
        "bottom": height - pad_b,
        "right": width - pad_r,
        "top": pad_t,
    }


def cell_charts(metrics: pd.DataFrame) -> dict:
    """The cell page's two inline charts: accuracy per round (mean, worst 10%, validation) and the
    final accuracy of each client (sorted; the worst 10% marked)."""
    if metrics.empty or "accuracy" not in metrics:
        return {}
    from pflbench.reports.figures import worst_fraction_threshold

    per_round = metrics.groupby("round")
    rounds = [float(r) for r in per_round.groups]
    series = {
        "mean (test)": (rounds, (per_round["accuracy"].mean() * 100).tolist()),
        "worst 10% (test)": (
            rounds,
            [worst_fraction_threshold(g["accuracy"].to_numpy())[1] * 100 for _, g in per_round],
        ),
    }
    if "val_accuracy" in metrics:
        series["mean (validation)"] = (rounds, (per_round["val_accuracy"].mean() * 100).tolist())
    if "accuracy_adapted" in metrics and metrics["accuracy_adapted"].notna().any():
        series["mean after adaptation (test)"] = (rounds, (per_round["accuracy_adapted"].mean() * 100).tolist())
    last = metrics[metrics["round"] == metrics["round"].max()].sort_values("accuracy")
    values = (last["accuracy"] * 100).tolist()
    threshold, worst_mean = worst_fraction_threshold(np.asarray(values))
    bars = [{"client": int(c), "value": v, "worst": v <= threshold} for c, v in zip(last["client"], values)]
    return {"curve": chart(series, ymax=100.0), "bars": bars, "worst_mean": worst_mean}
