"""The numbers a paired test compares (stats.py): an entry's per-client accuracies under a protocol,
read from its finished cells' metrics.parquet.

A protocol (protocols.py) names a model (as delivered: column `accuracy`; after local adaptation:
`accuracy_adapted`), a round (final: the last evaluation round; best validation / best test: the round
the cell's summary recorded for that selection) and an averaging. The per-client accuracies of that
round are what the mean over clients and the pooled number average, so one test serves both; the worst
10% of clients has no per-client pairing (they are other clients for each method) and is compared on
seeds only. Newcomers' rows (unseen clients) are not the table's clients and are left out, as
`read_metrics` does. A cell whose per-client mean does not give back its summary's number (a store
older than its metrics, a round not recorded) contributes its number but no clients, and is then
compared on seeds only.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

import pandas as pd

from pflbench.reports.cells import read_metrics
from pflbench.reports.protocols import Protocol
from pflbench.reports.stats import Sample
from pflbench.storage.store import METRICS

AGREE = 1e-6  # a cell's per-client mean and its summary's number agree to this (both in [0, 1])


@lru_cache(maxsize=512)
def _metrics(path: str, stamp: tuple) -> pd.DataFrame:
    """A cell's trained clients' metrics, read once per version of its file (`stamp`: size, mtime)."""
    return read_metrics(path)


def cell_metrics(path: str | Path) -> pd.DataFrame:
    file = Path(path) / METRICS
    try:
        info = os.stat(file)
    except OSError:
        return pd.DataFrame(columns=["round", "client", "accuracy"])
    return _metrics(str(path), (info.st_size, info.st_mtime_ns))


def cell_clients(cell: pd.Series, protocol: Protocol) -> dict[int, float] | None:
    """{client: accuracy in %} of one finished cell under `protocol` (None: not available, see module doc)."""
    if protocol.worst10 or not cell.get("path"):
        return None
    metrics = cell_metrics(cell["path"])
    column = "accuracy_adapted" if protocol.adapted else "accuracy"
    if metrics.empty or column not in metrics:
        return None
    if protocol.round_key is None:
        rnd = metrics["round"].max()
    else:
        rnd = cell.get(protocol.round_key)
        if rnd is None or pd.isna(rnd):
            return None
    rows = metrics[metrics["round"] == int(rnd)]
    if rows.empty or rows[column].isna().any() or rows["client"].duplicated().any():
        return None
    values = {int(c): float(v) for c, v in zip(rows["client"], rows[column])}
    expected = cell.get(protocol.with_averaging("clients").key)
    if expected is None or pd.isna(expected) or abs(sum(values.values()) / len(values) - float(expected)) > AGREE:
        return None
    return {c: v * 100 for c, v in values.items()}


def entry_sample(group: pd.DataFrame, protocol: Protocol) -> Sample:
    """The Sample of one table entry: its finished cells with a number under `protocol`, by seed (an
    entry has one cell per seed; should it have several, the first is kept)."""
    clients: dict = {}
    values: dict = {}
    key = protocol.key
    for _, cell in group.iterrows():
        value = cell.get(key)
        if cell.get("status") != "finished" or value is None or pd.isna(value) or not math.isfinite(float(value)):
            continue
        seed = cell["seed"]
        if seed in values:
            continue
        values[seed] = float(value) * 100
        found = cell_clients(cell, protocol)
        if found:
            clients[seed] = found
    return Sample(clients, values)
