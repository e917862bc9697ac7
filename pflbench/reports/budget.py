"""The training budget behind a table, in words, for its caption: rounds, local epochs, learning rate,
batch size, samples per client, clients and participation, local adaptation (from the cells'
configurations). Numbers are only comparable at equal budgets, so every accuracy table says which one
it shows; where the cells of a column differ (e.g. pFedHN run at another learning rate by a spec's
override), the caption gives the common value and the exceptions by algorithm, or "varies: ..."."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from pflbench.reports.cells import display_name
from pflbench.reports.knobs import format_value
from pflbench.reports.columns import Column

SAMPLE_KEYS = (
    ("partition_params.samples_per_client", "{} samples per client"),
    ("partition_params.mean_samples_per_client", "{} samples per client on average"),
)


def _plain(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _text(value: Any) -> str:
    return format_value(float(value)) if isinstance(value, float) else str(value)


def _plural(n: Any, word: str) -> str:
    return f"{_text(n)} {word}" + ("" if n == 1 else "s")


def _participation(clients: Any, participation: Any) -> str:
    if participation is None or participation >= 1:
        return f"{_text(clients)} clients, all in every round"
    return f"{_text(clients)} clients, {participation * 100:g}% per round"


# (what, how one value reads); each reads a value per cell (None: not stated)
def _fields(cell: pd.Series) -> dict[str, str | None]:
    def get(key: str) -> Any:
        return _plain(cell.get(key)) if key in cell.index else None

    samples = None
    for key, template in SAMPLE_KEYS:
        if get(key) is not None:
            samples = template.format(_text(get(key)))
            break
    rounds, epochs, lr, batch = get("rounds"), get("local_epochs"), get("lr"), get("batch_size")
    finetune = get("finetune_epochs") or 0
    return {
        "rounds": None if rounds is None else _plural(rounds, "round"),
        "epochs": None if epochs is None else _plural(epochs, "local epoch"),
        "lr": None if lr is None else f"lr {_text(lr)}",
        "batch": None if batch is None else f"batch {_text(batch)}",
        "samples": samples,
        "clients": None if get("clients") is None else _participation(get("clients"), get("participation")),
        "adaptation": f"local adaptation {_plural(finetune, 'epoch')}" if finetune else None,
    }


def describe(values: dict[str, str | None]) -> str | None:
    """One field over a column's algorithms ({algorithm: text}): the common text; the majority with
    the exceptions, "lr 0.05 (pFedHN: lr 0.01)"; or "varies: ..." when no text covers most of them."""
    stated = {a: v for a, v in values.items() if v is not None}
    if not stated:
        return None
    counts = Counter(stated.values())
    if len(counts) == 1:
        return next(iter(counts))
    common, n = counts.most_common(1)[0]
    others: dict[str, list[str]] = {}
    for algorithm, value in stated.items():
        if value != common:
            others.setdefault(value, []).append(display_name(algorithm))
    if n * 2 > len(stated):
        listed = "; ".join(", ".join(names) + ": " + v for v, names in others.items())
        return f"{common} ({listed})"
    groups: dict[str, list[str]] = {}
    for algorithm, value in stated.items():
        groups.setdefault(value, []).append(display_name(algorithm))
    return "varies: " + "; ".join(v + " (" + ", ".join(names) + ")" for v, names in groups.items())


def budget_text(cells: pd.DataFrame) -> str:
    """The budget of a set of cells (one column of a table, or a whole table), in one line."""
    if cells.empty:
        return ""
    per_field: dict[str, dict[str, str | None]] = {}
    for _, cell in cells.iterrows():
        algorithm = str(cell.get("algorithm"))
        for name, value in _fields(cell).items():
            slot = per_field.setdefault(name, {})
            if algorithm in slot and slot[algorithm] != value:  # one algorithm's cells differ among themselves
                slot[algorithm] = (
                    f"{slot[algorithm]} / {value}"
                    if value not in str(slot[algorithm]).split(" / ")
                    else slot[algorithm]
                )
            else:
                slot[algorithm] = value
    parts = [
        text
        for name in ("rounds", "epochs", "lr", "batch", "samples", "clients", "adaptation")
        if (text := describe(per_field.get(name, {}))) is not None
    ]
    return ", ".join(parts)


def table_budget(columns: Sequence[Column], cells_of_column: Callable[[Column], pd.DataFrame]) -> str:
    """A table's budget caption: one line when every column shares it, else one per column.
    `cells_of_column(column)` returns that column's cells."""
    texts = [(column, budget_text(cells_of_column(column))) for column in columns]
    distinct = list(dict.fromkeys(text for _, text in texts if text))
    if not distinct:
        return ""
    if len(distinct) == 1:
        return f"Budget: {distinct[0]}."
    return "Budget per column: " + "; ".join(f"{column.label}: {text}" for column, text in texts if text) + "."
