"""Stored cells' learning curves as a table: where a curve peaks and where it falls.

For every cell folder given (a results store's `<hash>/`, published or not), one Markdown row: its
algorithm and seed, the mean client test accuracy (%) at the chosen rounds, the best evaluated round
and its accuracy, and the largest fall between two consecutive evaluations (from, to, points). Written
for Per-FedAvg's break on Table 2 (docs/algorithms/perfedavg.md): does a seed fall as seed 0 does at
round ~490?

    python benchmarks/analysis/curve.py results/published/table2-full/f7af474989db \
        results/published/table2-full-seed1/3a5bad2a5d37 --rounds 300,400,480,490,500,600 [--adapted]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pflbench.reports.cells import read_config, read_metrics


def mean_curve(folder: Path, column: str) -> pd.Series:
    """Mean over the trained clients of `column` (in %), indexed by the evaluated rounds."""
    metrics = read_metrics(folder)
    return metrics.groupby("round")[column].mean() * 100


def largest_fall(curve: pd.Series) -> tuple[int, int, float]:
    """(round before, round after, points lost) of the largest fall between consecutive evaluations
    (a curve of one evaluation: that round twice, 0)."""
    if len(curve) < 2:
        return int(curve.index[0]), int(curve.index[0]), 0.0
    steps = curve.diff()
    after = int(steps.idxmin())
    before = int(curve.index[curve.index.get_loc(after) - 1])
    return before, after, float(-steps.min())


def row(folder: Path, rounds: list[int], column: str) -> str:
    cell = read_config(folder)["cell"]
    curve = mean_curve(folder, column).dropna()
    if curve.empty:
        return f"| {folder.parent.name}/{folder.name} | {cell['algorithm']} | {cell['seed']} | no {column} scores |"
    at = [f"{curve[r]:.2f}" if r in curve.index else "–" for r in rounds]
    best = int(curve.idxmax())
    before, after, fall = largest_fall(curve)
    return (f"| {folder.parent.name}/{folder.name} | {cell['algorithm']} | {cell['seed']} | " + " | ".join(at)
            + f" | {best}: {curve[best]:.2f} | {before} → {after}: −{fall:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", help="cell folders (a store's <hash>/)")
    parser.add_argument("--rounds", default="300,400,480,490,500,600", help="rounds to show")
    parser.add_argument("--adapted", action="store_true", help="after local adaptation (default: as delivered)")
    args = parser.parse_args(argv)
    rounds = [int(r) for r in args.rounds.split(",")]
    column = "accuracy_adapted" if args.adapted else "accuracy"
    print(f"| cell | row | seed | {' | '.join(f'round {r}' for r in rounds)} | best round | largest fall |")
    print("|---|---|---:|" + "---:|" * len(rounds) + "---|---|")
    for folder in map(Path, args.cells):
        print(row(folder, rounds, column))
    return 0


if __name__ == "__main__":
    sys.exit(main())
