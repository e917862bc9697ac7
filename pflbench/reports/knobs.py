"""A cell's heterogeneity knob setting in words ("concept_shift.clusters=4", or "off"), read from the
store's columns: shared by the accuracy tables (a knob-on cell is a row of its own) and the who-copes
report (pflbench/reports/heterogeneity.py)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from pflbench.config import HETEROGENEITY_FIELDS


def format_value(value: Any) -> str:
    """A setting's value as a report prints it: floats short (`0.3`, `1e-05`), strings as they are, the rest as JSON."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)


OFF = "off"


def knob_columns(cells: pd.DataFrame) -> list[str]:
    """The store's columns that belong to a heterogeneity knob (`system.dropout`, `unseen_fraction`)."""
    return [c for c in cells.columns if c in HETEROGENEITY_FIELDS or c.split(".")[0] in HETEROGENEITY_FIELDS]


def knob_setting(cell: pd.Series, columns: list[str]) -> str:
    """ "concept_shift.clusters=4", "system.dropout=0.3, system.straggler_fraction=0.5", or "off"."""
    items = []
    for column in sorted(columns):
        value = cell.get(column)
        if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
            continue
        if column == "unseen_fraction" and float(value) == 0.0:
            continue
        items.append(f"{column}={show_value(value)}")
    return ", ".join(items) or OFF


def show_value(value: Any) -> str:
    """A store value as text (numpy scalars from DataFrame columns as plain numbers)."""
    return format_value(value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) else value)
