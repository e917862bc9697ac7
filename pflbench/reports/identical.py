"""Entries that are another algorithm's results bit for bit.

Some algorithms reduce to another on some cells: FedBN is FedAvg on a model without BatchNorm,
FedFomo is Local where no other client's model lowers a client's validation loss (pathological
splits), FedProx can coincide with FedAvg. Such an entry is a real run, but not a separate result:
the tables flag it ("= FedAvg") with the reason where it is known, and do not count it as a best of
its own.

Two cells coincide when their per-round, per-client metrics (test and validation accuracy and loss,
and the adapted ones) are identical; two entries (rows of one table column) coincide when every
seed's cells do, on the same dataset, partition, clients and seed.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from pflbench.reports.rows import Row

from pflbench.reports.cells import algorithm_rank, display_name, read_metrics, reduces_to

SIGNATURE_COLUMNS = ("accuracy", "loss", "val_accuracy", "val_loss", "accuracy_adapted", "loss_adapted")


@lru_cache(maxsize=4096)
def _signature(path: str, stamp: float) -> str | None:
    metrics = read_metrics(path)
    columns = [c for c in SIGNATURE_COLUMNS if c in metrics]
    if metrics.empty or "accuracy" not in columns:
        return None
    frame = metrics.sort_values(["round", "client"])[["round", "client", *columns]]
    return hashlib.sha1(pd.util.hash_pandas_object(frame, index=False).values.tobytes()).hexdigest()


def cell_signature(path: str | Path) -> str | None:
    """A digest of a cell's per-round, per-client metrics (None: none stored)."""
    from pflbench.storage.store import METRICS

    file = Path(path) / METRICS
    try:
        stamp = file.stat().st_mtime
    except OSError:
        return None
    return _signature(str(path), stamp)


def reason(algorithm: str, same_as: str) -> str:
    """Why `algorithm` gives `same_as`'s results, where its class says (`Algorithm.reduces_to`)."""
    return reduces_to(algorithm).get(same_as, "")


def identical_groups(entries: dict) -> dict:
    """`entries`: {row: [(seed, cell path), ...]} of one table column (finished cells). Returns
    {row: the earlier row (in the tables' order) whose cells it equals on every seed}."""
    signatures = {}
    for row, cells in entries.items():
        if not cells:
            continue
        sig = tuple(sorted((str(seed), cell_signature(path)) for seed, path in cells))
        if any(s is None for _, s in sig):
            continue
        signatures[row] = sig
    first: dict[tuple, object] = {}
    same = {}
    for row in sorted(signatures, key=lambda r: (algorithm_rank(r.algorithm), r.tuned, r.variant)):
        sig = signatures[row]
        if sig in first:
            same[row] = first[sig]
        else:
            first[sig] = row
    return same


def describe(row: Row, same_as: Row) -> str:
    why = reason(row.algorithm, same_as.algorithm)
    return f"{row.label} is bit-identical to {same_as.label} (per-client metrics equal at every round and seed)" + (
        f": {why}" if why else ""
    )


__all__ = ["cell_signature", "identical_groups", "describe", "reason", "display_name"]
