"""The results page's tables as CSV (pflbench.reports.glance): every number of its rows and orderings."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from pflbench.reports.glance_data import Glance

ROW_FIELDS = (
    "column",
    "study",
    "dataset",
    "paper_dataset",
    "scheme",
    "clients",
    "row",
    "variant_of",
    "protocol",
    "paper_mean",
    "paper_std",
    "ours_mean",
    "ours_std",
    "seeds",
    "delivered_mean",
    "delta",
    "verdict",
    "in_our_column",
    "why_no_delta",
)
CLAIM_FIELDS = (
    "column",
    "study",
    "claim",
    "paper_difference",
    "protocol",
    "difference",
    "se",
    "ci_low",
    "ci_high",
    "clients_up",
    "clients_down",
    "clients_equal",
    "p",
    "paired_on",
    "verdict",
)


CARRY_FIELDS = ("column", "study", "home", "conclusion", "protocol", "there", "here", "verdict")


def _round(value: float | None, digits: int = 4) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def row_records(glance: Glance) -> list[dict]:
    out = []
    for column in glance.columns:
        for row in column.rows:
            for item in (row, *row.variants):
                ours = item.ours
                out.append(
                    {
                        "column": column.title,
                        "study": column.study,
                        "dataset": column.column.dataset,
                        "paper_dataset": column.column.paper_dataset,
                        "scheme": column.scheme,
                        "clients": column.column.clients,
                        "row": item.label,
                        "variant_of": row.label if item.variant else "",
                        "protocol": (item.paper.protocol.name if item.paper is not None else column.protocol.name),
                        "paper_mean": _round(item.paper.mean if item.paper else None, 2),
                        "paper_std": _round(item.paper.std if item.paper else None, 2),
                        "ours_mean": _round(ours.mean if ours else None),
                        "ours_std": _round(ours.std if ours else None),
                        "seeds": item.seeds,
                        "delivered_mean": _round(item.delivered.mean if item.delivered else None),
                        "delta": _round(item.delta),
                        "verdict": item.verdict(),
                        "in_our_column": item.rank(),
                        "why_no_delta": item.reason,
                    }
                )
    return out


def claim_records(glance: Glance) -> list[dict]:
    out = []
    for column in glance.columns:
        for claim in column.claims:
            for j in claim.judgements:
                t = j.test
                interval = t.interval if t is not None else None
                out.append(
                    {
                        "column": column.title,
                        "study": column.study,
                        "claim": claim.text,
                        "paper_difference": _round(claim.paper_difference, 2),
                        "protocol": j.protocol,
                        "difference": _round(t.mean if t else None),
                        "se": _round(t.se if t else None),
                        "ci_low": _round(interval[0] if interval else None),
                        "ci_high": _round(interval[1] if interval else None),
                        "clients_up": t.up if t else "",
                        "clients_down": t.down if t else "",
                        "clients_equal": t.equal if t else "",
                        "p": _round(t.p if t else None),
                        "paired_on": t.unit_text if t else "",
                        "verdict": j.verdict,
                    }
                )
    return out


def carry_records(glance: Glance) -> list[dict]:
    return [
        {
            "column": column.title,
            "study": column.study,
            "home": column.home,
            "conclusion": item.conclusion,
            "protocol": item.protocol,
            "there": item.there,
            "here": item.here,
            "verdict": item.verdict,
        }
        for column in glance.columns
        for item in column.carry
    ]


def write_csv(glance: Glance, folder: str | Path) -> list[Path]:
    """results_rows.csv, results_orderings.csv and (where a column checks another's conclusions)
    results_carry_over.csv: every number of the page's tables."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    tables = [
        ("results_rows.csv", ROW_FIELDS, row_records(glance)),
        ("results_orderings.csv", CLAIM_FIELDS, claim_records(glance)),
    ]
    carried = carry_records(glance)
    if carried:
        tables.append(("results_carry_over.csv", CARRY_FIELDS, carried))
    for name, fields, records in tables:
        path = folder / name
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(records)
        written.append(path)
    return written
