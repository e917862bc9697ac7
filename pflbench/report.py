"""`pflbench report`: the first table of a results store, in Markdown.

One table per partition scheme: a row per algorithm, a column per (dataset, number of clients), each
entry the final mean client test accuracy in %, mean ± sample std over seeds, the best of a column in
bold. Cells that failed or diverged are counted in their entry, not averaged. Entries that mix cells
differing in more than their seed are flagged under the table.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pflbench.config import CellConfig
from pflbench.store import load_store

CONFIG_COLUMNS = tuple(CellConfig.model_fields)


def params_label(row: pd.Series) -> str:
    params = {k.removeprefix("partition_params."): v for k, v in row.items()
              if k.startswith("partition_params.") and not pd.isna(v)}
    # Integer parameters come back as floats from columns that other schemes leave empty (NaN).
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={json.dumps(v)}"
                     for k, v in sorted(params.items()))


def entry_text(group: pd.DataFrame) -> tuple[str, float | None]:
    """`71.2 ± 1.3` (and failures), plus the mean for ranking."""
    finished = group.loc[group["status"] == "finished", "final_accuracy"].astype(float) * 100
    others = group.loc[group["status"] != "finished", "status"].value_counts()
    problems = ", ".join(f"{n} {status}" for status, n in sorted(others.items()))
    if finished.empty:
        return problems, None
    text = f"{finished.mean():.1f}" + (f" ± {finished.std():.1f}" if len(finished) > 1 else "")
    return text + (f" ({problems})" if problems else ""), float(finished.mean())


def scheme_table(cells: pd.DataFrame) -> tuple[str, list[str]]:
    """The Markdown table of one scheme's cells, and notes on entries that mix configurations."""
    cells = cells.assign(params=cells.apply(params_label, axis=1))
    several_params = cells.groupby(["dataset", "clients"])["params"].nunique().max() > 1
    column_keys = ["dataset", "clients", "params"] if several_params else ["dataset", "clients"]
    columns = sorted(cells.groupby(column_keys).groups)
    algorithms = sorted(cells["algorithm"].unique())
    # Configuration columns other than the seed: cells of one entry should agree on all of them.
    config_columns = [c for c in cells.columns if c.split(".")[0] in CONFIG_COLUMNS and c != "seed"]

    def header(key) -> str:
        text = f"{key[0]}, {key[1]} clients"
        return text + (f" ({key[2]})" if several_params and key[2] else "")

    entries: dict[tuple, dict[str, tuple[str, float | None]]] = {}
    notes = []
    for key, group in cells.groupby([*column_keys, "algorithm"]):
        entries.setdefault(key[:-1], {})[key[-1]] = entry_text(group)
        mixed = [c for c in config_columns if group[c].astype(str).nunique() > 1]
        if mixed:
            notes.append(f"{key[-1]} on {header(key[:-1])}: its cells also differ in {', '.join(mixed)}")

    lines = ["| algorithm | " + " | ".join(header(k) for k in columns) + " |",
             "|---|" + "---|" * len(columns)]
    best = {k: max((m for _, m in entries[k].values() if m is not None), default=None) for k in columns}
    for algorithm in algorithms:
        row = []
        for key in columns:
            text, mean = entries[key].get(algorithm, ("–", None))
            row.append(f"**{text}**" if mean is not None and mean == best[key] and len(entries[key]) > 1 else text)
        lines.append(f"| {algorithm} | " + " | ".join(row) + " |")
    return "\n".join(lines), notes


def render(store: pd.DataFrame) -> str:
    if store.empty:
        return "# pflbench results\n\nThe store has no results yet: run `pflbench run SPEC` first.\n"
    if "final_accuracy" not in store:  # only failed cells so far
        store = store.assign(final_accuracy=float("nan"))
    seeds = store.groupby(["algorithm", "dataset", "partition", "clients"])["seed"].nunique().max()
    parts = ["# pflbench results", "",
             f"Final accuracy of each client's personalized model on its own test split, mean over clients, "
             f"in %: mean ± std over seeds (up to {seeds} per entry). Best of each column in bold; "
             f"failed or diverged cells are counted, not averaged."]
    for scheme, cells in store.groupby("partition"):
        table, notes = scheme_table(cells)
        params = cells.apply(params_label, axis=1).unique()
        title = f"## Partition: {scheme}" + (f" ({params[0]})" if len(params) == 1 and params[0] else "")
        parts += ["", title, "", table]
        if notes:
            parts += ["", "Note: " + "; ".join(notes) + "."]
    return "\n".join(parts) + "\n"


def write_report(results: str | Path, out: str | Path) -> tuple[Path, str]:
    text = render(load_store(results))
    path = Path(out) / "report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, text


def add_parser(subparsers) -> None:
    report = subparsers.add_parser("report", help="write the results store's accuracy table (Markdown)")
    report.add_argument("--results", type=Path, default=Path("results"), help="results store (default: results)")
    report.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    report.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    path, text = write_report(args.results, args.out)
    print(text)
    print(f"written to {path}")
    return 0
