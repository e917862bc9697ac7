"""Ours against the paper at a glance, for a study page: per column of an accuracy table whose protocol is
the paper's, a small dot plot — one line per row with a paper number, the paper's mean with its ± as a
grey bar, ours (mean over seeds, ± their std where there are several) as a dot — as plain numbers in an
SVG box for the template to draw (the template writes every label, escaped)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pflbench.reports.columns import Column
from pflbench.reports.rows import Row
from pflbench.reports.tables import Table

WIDTH, ROW, LEFT, RIGHT, TOP, BOTTOM = 380, 18, 130, 12, 8, 26


@dataclass(frozen=True)
class Dot:
    label: str
    y: float
    paper: float  # x of the paper's mean
    paper_low: float  # x of its mean − std (= paper when no std)
    paper_high: float
    ours: float
    ours_low: float
    ours_high: float
    title: str  # "pFedLA: ours 91.48 ± 1.08, paper 94.34 ± 0.29 (Δ −2.86)"


def dot_plot(table: Table, column: Column, shown: Sequence[tuple[Row, str]] | None = None) -> dict | None:
    """{width, height, dots, ticks, left, right, bottom, top} for one column; None when no row of it has
    both our number and a comparable paper number (a Δ). `shown`: the rows to draw with their labels (the
    page's base rows; default every row by its own label)."""
    rows = []  # (row, label, entry, paper mean, paper std, our mean, our std)
    for row, label in shown if shown is not None else [(r, r.label) for r in table.rows]:
        entry = table.entry(row, column)
        if entry is None or entry.delta is None or entry.paper is None or entry.mean is None:
            continue
        rows.append((row, label, entry, entry.paper.mean, entry.paper.std or 0.0, entry.mean, entry.std or 0.0))
    if not rows:
        return None
    values = [
        v
        for _, _, _, paper, std, ours, spread in rows
        for v in (paper - std, paper + std, ours - spread, ours + spread)
    ]
    low, high = min(values), max(values)
    pad = max(1.0, 0.05 * (high - low))
    low, high = low - pad, high + pad
    height = TOP + ROW * len(rows) + BOTTOM

    def x(value: float) -> float:
        return round(LEFT + (value - low) / (high - low) * (WIDTH - LEFT - RIGHT), 1)

    dots = []
    for k, (_row, label, entry, paper, std, ours, spread) in enumerate(rows):
        title = f"{label}: ours {entry.value_text()}, paper {entry.paper_text()} (Δ {entry.delta_text()})"
        dots.append(
            Dot(
                label,
                TOP + ROW * k + ROW / 2,
                x(paper),
                x(paper - std),
                x(paper + std),
                x(ours),
                x(ours - spread),
                x(ours + spread),
                title,
            )
        )
    step = _step(high - low)
    first = int(low // step + 1) * step
    ticks = []
    value = first
    while value <= high:
        ticks.append((x(value), f"{value:g}"))
        value += step
    return {
        "width": WIDTH,
        "height": height,
        "dots": dots,
        "ticks": ticks,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "bottom": height - BOTTOM + 4,
        "top": TOP,
    }


def _step(span: float) -> float:
    for step in (1, 2, 5, 10, 20, 25, 50):
        if span / step <= 6:
            return float(step)
    return 100.0
