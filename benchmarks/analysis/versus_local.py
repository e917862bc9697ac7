"""Each stored cell against Local at the same seed and split: the table behind a column's write-up.

For every cell folder given (a results store's `<hash>/`, published or not), one Markdown row: its
algorithm, seed, the settings in which it departs from the algorithm's defaults (and from Local's
budget: batch size, learning rate, ...), its mean client accuracy at the last round as delivered and
after local adaptation, Local's at the same seed, the per-client difference to Local ± one standard
error (the reports' paired test: pflbench.reports.stats), its wall time, and for pFedLA-type cells the
share of aggregation weights that are exactly 0 or 1 at chosen rounds. Local's cell is looked up in
the `--local` stores: the same dataset, partition (and its parameters), clients and seed.

    python benchmarks/analysis/versus_local.py results/published/table1-pfedla-server/*/ \
        --local results/published/table1-full results/published/table1-full-seed1 [--alpha-rounds 100,600]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alpha import exact_share, load_alphas  # noqa: E402

from pflbench.reports.cells import printed_value, read_config, read_metrics  # noqa: E402
from pflbench.reports.rows import current_defaults  # noqa: E402
from pflbench.reports.stats import Paired, Sample, paired  # noqa: E402

BUDGET = ("rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay", "train_fraction",
          "val_fraction", "finetune_epochs", "model")


def read_cell(folder: Path) -> tuple[dict, dict]:
    return read_config(folder)["cell"], json.loads((folder / "summary.json").read_text())


def last_round_clients(folder: Path, column: str) -> dict[int, float]:
    """{client: accuracy in %} at the last evaluated round (the trained clients: read_metrics)."""
    metrics = read_metrics(folder)
    last = metrics[metrics["round"] == metrics["round"].max()]
    return {int(c): float(a) * 100 for c, a in zip(last["client"], last[column])}


def same_split(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("dataset", "partition", "partition_params", "clients", "seed"))


def find_local(cell: dict, stores: list[Path]) -> Path | None:
    for store in stores:
        for folder in sorted(p.parent for p in store.glob("*/config.json")):
            other, _ = read_cell(folder)
            if other["algorithm"] == "local" and (folder / "summary.json").exists() and same_split(cell, other):
                return folder
    return None


def _printed(value) -> str:
    """A hyperparameter's value as the row labels print it (a value of None: "null")."""
    text = printed_value(value)
    return "null" if text is None else text


def departures(cell: dict, local: dict | None) -> str:
    """The hyperparameters that differ from the algorithm's current defaults, and the budget fields
    that differ from Local's cell."""
    defaults = current_defaults(cell["algorithm"])   # as the report's row labels print them
    changed = [f"{k}={_printed(v)}" for k, v in sorted(cell.get("hp", {}).items())
               if f"hp.{k}" in defaults and defaults[f"hp.{k}"] != _printed(v)]
    if local is not None:
        changed += [f"{k}={cell.get(k)}" for k in BUDGET if cell.get(k) != local.get(k)]
    return ", ".join(changed) or "defaults"


def versus(folder: Path, local: Path | None, column: str) -> Paired | None:
    """The cell minus Local, client by client, at the last round (one seed: the clients are the units);
    None without a Local cell or where the cells have no such scores (no adaptation run)."""
    if local is None:
        return None
    seed = 0
    ours = last_round_clients(folder, column)
    theirs = last_round_clients(local, column)
    if any(np.isnan(v) for v in [*ours.values(), *theirs.values()]):
        return None
    return paired(Sample({seed: ours}, {seed: float(np.mean(list(ours.values())))}),
                  Sample({seed: theirs}, {seed: float(np.mean(list(theirs.values())))}))


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def text(p: Paired | None) -> str:
    if p is None:
        return "–"
    return f"{p.mean:+.2f} ± {p.se:.2f} ({p.up} up, {p.down} down)" if p.se is not None else f"{p.mean:+.2f}"


def exact_shares(folder: Path, rounds: list[int]) -> str:
    alphas, _ = load_alphas(folder)
    if not alphas:
        return "–"
    shares = [f"{100 * exact_share(alphas[r]):.1f}%" if r in alphas else "–" for r in rounds]
    return " / ".join(shares)


def table(cells: list[Path], stores: list[Path], alpha_rounds: list[int]) -> str:
    lines = ["| study | cell | row | seed | settings | delivered | adapted | Local (same seed) | − Local, delivered "
             "| − Local, adapted | wall (s) | α exactly 0 or 1 at rounds " + " / ".join(map(str, alpha_rounds)) + " |",
             "|---|---|---|---:|---|---:|---:|---:|---|---|---:|---|"]
    for folder in cells:
        cell, summary = read_cell(folder)
        local = find_local(cell, stores)
        local_cell, local_summary = read_cell(local) if local else (None, None)
        local_text = percent(local_summary.get("final_accuracy")) if local_summary else "–"
        if local == folder:  # Local's own row
            local = None
        settings = departures(cell, local_cell)
        if summary.get("status") != "finished":  # a diverged cell: its numbers are those of its last evaluation
            settings += f"; {summary.get('status')} at round {summary.get('diverged_round')}"
        lines.append(
            f"| {folder.parent.name} | {folder.name} | {cell['algorithm']} | {cell['seed']} | {settings} | "
            f"{percent(summary.get('final_accuracy'))} | {percent(summary.get('final_accuracy_adapted'))} | {local_text} | "
            f"{text(versus(folder, local, 'accuracy'))} | {text(versus(folder, local, 'accuracy_adapted'))} | "
            f"{summary.get('wall_time', float('nan')):.0f} | {exact_shares(folder, alpha_rounds)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", help="cell folders (a store's <hash>/)")
    parser.add_argument("--local", nargs="+", required=True, help="stores to find each cell's Local in")
    parser.add_argument("--alpha-rounds", default="100,600", help="rounds for the share of α exactly 0 or 1")
    args = parser.parse_args(argv)
    rounds = [int(r) for r in args.alpha_rounds.split(",")]
    cells = [Path(c) for c in args.cells if (Path(c) / "summary.json").exists()]
    print(table(cells, [Path(s) for s in args.local], rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
