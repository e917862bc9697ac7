"""Numbers transcribed from papers: `benchmarks/reference/*.csv`.

Format (see benchmarks/reference/README.md): `#` header lines of `key: value` (source, table, metric,
partition, settings, note; a key may repeat), then a CSV with the key columns `algorithm, dataset,
partition, clients`; optional constraint columns `hp.*`, `partition_params.*`, `dataset_options.*`
(a cell matches only if its value equals the one given; empty = any); the paper's numbers `mean`,
`std` (accuracy in %) and optionally `comm_mbytes`; `protocol`, the evaluation protocol the number
was measured under (`pflbench.reports.protocols`, e.g. `adapted-final-clients`; absent: as delivered,
final round, mean over clients); the paper's settings (`SETTINGS`: `rounds, local_epochs, clients,
participation, lr, samples_per_client, train_fraction, val_fraction, batch_size, momentum,
weight_decay, model`; absent or empty: not constrained). Any other column is kept for reading.

A paper number is shown beside ours for the entry its key (and constraints) match; it is compared
with ours (a Δ) only when the table's protocol is the paper's and every setting the reference gives
equals the cell's (`compare`); otherwise the report says what differs. The dataset is always one of
those settings: a row's `dataset` is the data the paper used, so a cell on other data shown beside it
(our offline `cifar10-jpeg` beside the paper's `cifar10`: a lossy re-encoding, not CIFAR-10) never
gets a Δ. `model` is compared with the model the cell resolved to (`auto` becomes `cnn`, `cnn-bn`...;
the summary's `model`, the store's `resolved_model` column).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np
import pandas as pd

from pflbench.reports.protocols import DEFAULT, Protocol

KEYS = ("algorithm", "dataset", "partition", "clients")
CONSTRAINT_PREFIXES = ("hp.", "partition_params.", "dataset_options.")
# The paper's settings a cell must share for a Δ: reference column -> the store's cell columns, the
# first present and set in a cell is its value (`model`: what `auto` resolved to, else the configured name).
SETTINGS = {
    "rounds": ("rounds",),
    "local_epochs": ("local_epochs",),
    "clients": ("clients",),
    "participation": ("participation",),
    "lr": ("lr",),
    "samples_per_client": ("partition_params.samples_per_client",),
    "train_fraction": ("train_fraction",),
    "val_fraction": ("val_fraction",),
    "batch_size": ("batch_size",),
    "momentum": ("momentum",),
    "weight_decay": ("weight_decay",),
    "model": ("resolved_model", "model"),
    "dataset": ("dataset",),
}


@dataclass
class Reference:
    """One reference file."""

    name: str  # file stem, e.g. pfedla_table1
    meta: dict[str, list[str]] = field(default_factory=dict)
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def title(self) -> str:
        source = self.meta.get("source", [self.name])[0]
        table = self.meta.get("table", [""])[0]
        return f"{source}, {table}" if table else source

    @property
    def short(self) -> str:
        """ "pFedLA Table 1" style label for footnotes."""
        table = self.meta.get("table", [self.name])[0].split(" (")[0]
        source = self.meta.get("source", [""])[0]
        paper = source.split("(")[-1].split(")")[0] if "(" in source else ""
        return f"{paper} {table}".strip()

    @property
    def communication(self) -> bool:
        return "comm_mbytes" in self.rows

    @property
    def constraints(self) -> list[str]:
        return [c for c in self.rows.columns if c.startswith(CONSTRAINT_PREFIXES)]


@dataclass(frozen=True)
class PaperValue:
    mean: float
    std: float | None
    comm_mbytes: float | None
    source: str  # Reference.short
    protocol: Protocol = DEFAULT
    settings: tuple = ()  # ((reference column, value), ...): the settings this row gives


@dataclass(frozen=True)
class Comparison:
    """A paper number against the cells of one entry, in a table of `protocol`."""

    paper: PaperValue
    protocol: Protocol
    differences: tuple[str, ...] = ()  # "rounds 20 vs 600" (ours vs the paper's)

    @property
    def protocol_ok(self) -> bool:
        return self.paper.protocol == self.protocol

    @property
    def comparable(self) -> bool:
        return self.protocol_ok and not self.differences

    @property
    def reason(self) -> str:
        """ "" when comparable, else why there is no Δ."""
        parts = []
        if not self.protocol_ok:
            parts.append(f"protocol differs: the paper's number is {self.paper.protocol.label}")
        if self.differences:
            parts.append("settings differ (ours vs paper): " + ", ".join(self.differences))
        return "; ".join(parts)


def _text(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    return str(value)


def setting_differences(paper: PaperValue, cells: pd.DataFrame) -> tuple[str, ...]:
    """The settings the paper gives that the cells do not all share, as "rounds 20 vs 600"; and,
    for an adapted paper number, cells without local adaptation ("finetune_epochs 0 vs > 0")."""
    differences = []
    for name, wanted in paper.settings:
        values = [_setting_value(cell, SETTINGS.get(name, (name,))) for _, cell in cells.iterrows()]
        have = [v for v in values if v is not None]
        if len(have) == len(values) and have and all(_equal(wanted, v) for v in have):
            continue
        ours = "/".join(dict.fromkeys(_text(v) for v in have)) if have else "unset"
        if have and len(have) < len(values):
            ours += "/unset"
        differences.append(f"{name} {ours} vs {_text(wanted)}")
    if paper.protocol.adapted:
        epochs = (
            pd.to_numeric(cells["finetune_epochs"], errors="coerce").fillna(0)
            if "finetune_epochs" in cells
            else pd.Series([0] * len(cells))
        )
        if len(epochs) == 0 or (epochs <= 0).any():
            differences.append(f"finetune_epochs {'/'.join(dict.fromkeys(_text(v) for v in epochs)) or 0} vs > 0")
    return tuple(differences)


def _setting_value(cell: pd.Series, columns: tuple[str, ...]) -> Any:
    """A cell's value of a setting: its first column that is present and set (None: unset)."""
    for column in columns:
        value = cell.get(column)
        if value is not None and not (np.isscalar(value) and pd.isna(value)):
            return value
    return None


def compare(paper: PaperValue, cells: pd.DataFrame, protocol: Protocol) -> Comparison:
    return Comparison(paper, protocol, setting_differences(paper, cells))


def read_reference(path: str | Path) -> Reference:
    path = Path(path)
    meta: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line.lstrip("#").strip().partition(":")
        if sep:
            meta.setdefault(key.strip(), []).append(value.strip())
    rows = pd.read_csv(path, comment="#", dtype={"algorithm": str, "dataset": str, "partition": str})
    missing = [k for k in (*KEYS, "mean") if k not in rows]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; see benchmarks/reference/README.md")
    if "protocol" in rows:
        for value in rows["protocol"].dropna().unique():
            try:
                Protocol.parse(value)
            except ValueError as err:
                raise ValueError(f"{path}: column protocol: {err}") from None
    return Reference(path.stem, meta, rows)


def default_reference_dir() -> Path | None:
    """benchmarks/reference of the working directory, else the one shipped with pflbench (the checkout's)."""
    from pflbench.run.resources import benchmarks_dir

    for candidate in (Path("benchmarks") / "reference", benchmarks_dir() / "reference"):
        if candidate.is_dir():
            return candidate
    return None


def load_references(folder: str | Path | None) -> list[Reference]:
    if folder is None or not Path(folder).is_dir():
        return []
    return [read_reference(p) for p in sorted(Path(folder).glob("*.csv"))]


def _equal(wanted: Any, have: Any) -> bool:
    if have is None or (np.isscalar(have) and pd.isna(have)):
        return False
    try:
        return float(wanted) == float(have)
    except (TypeError, ValueError):
        return str(wanted) == str(have)


def find_paper_value(
    references: Sequence[Reference],
    *,
    algorithm: str,
    dataset: str,
    partition: str,
    clients: int,
    cells: pd.DataFrame,
    communication: bool = False,
) -> PaperValue | None:
    """The first reference row for this entry whose constraints every one of its `cells` meets."""
    for ref in references:
        if ref.communication != communication:
            continue
        rows = ref.rows
        rows = rows[
            (rows["algorithm"] == algorithm)
            & (rows["dataset"] == dataset)
            & (rows["partition"] == partition)
            & (rows["clients"].astype(int) == int(clients))
        ]
        for _, row in rows.iterrows():
            ok = True
            for column in ref.constraints:
                wanted = row[column]
                if pd.isna(wanted):
                    continue
                if column not in cells or not all(_equal(wanted, v) for v in cells[column]):
                    ok = False
                    break
            if ok:
                std = row.get("std")
                comm = row.get("comm_mbytes")
                protocol = row.get("protocol")
                settings = tuple((name, row[name]) for name in SETTINGS if name in row and not pd.isna(row[name]))
                return PaperValue(
                    float(row["mean"]),
                    None if std is None or pd.isna(std) else float(std),
                    None if comm is None or pd.isna(comm) else float(comm),
                    ref.short,
                    DEFAULT if protocol is None or pd.isna(protocol) else Protocol.parse(protocol),
                    settings,
                )
    return None
