"""Numbers transcribed from papers: `benchmarks/reference/*.csv`.

Format (see benchmarks/reference/README.md): `#` header lines of `key: value` (source, table, metric,
partition, settings, note; a key may repeat), then a CSV with the key columns `algorithm, dataset,
partition, clients`; optional constraint columns `hp.*`, `partition_params.*`, `dataset_options.*`
(a cell matches only if its value equals the one given; empty = any); the paper's numbers `mean`,
`std` (accuracy in %) and optionally `comm_mbytes`; any other column (participation, rounds, ...) is
the paper's setting, kept for reading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ("algorithm", "dataset", "partition", "clients")
CONSTRAINT_PREFIXES = ("hp.", "partition_params.", "dataset_options.")


@dataclass
class Reference:
    """One reference file."""
    name: str                                   # file stem, e.g. pfedla_table1
    meta: dict[str, list[str]] = field(default_factory=dict)
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def title(self) -> str:
        source = self.meta.get("source", [self.name])[0]
        table = self.meta.get("table", [""])[0]
        return f"{source}, {table}" if table else source

    @property
    def short(self) -> str:
        """"pFedLA Table 1" style label for footnotes."""
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
    source: str      # Reference.short


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
    return Reference(path.stem, meta, rows)


def default_reference_dir() -> Path | None:
    """benchmarks/reference of the working directory, else of the source checkout this package is in."""
    for candidate in (Path("benchmarks") / "reference", Path(__file__).resolve().parents[2] / "benchmarks" / "reference"):
        if candidate.is_dir():
            return candidate
    return None


def load_references(folder: str | Path | None) -> list[Reference]:
    if folder is None or not Path(folder).is_dir():
        return []
    return [read_reference(p) for p in sorted(Path(folder).glob("*.csv"))]


def _equal(wanted, have) -> bool:
    if have is None or (np.isscalar(have) and pd.isna(have)):
        return False
    try:
        return float(wanted) == float(have)
    except (TypeError, ValueError):
        return str(wanted) == str(have)


def find_paper_value(references: list[Reference], *, algorithm: str, dataset: str, partition: str, clients: int,
                     cells: pd.DataFrame, communication: bool = False) -> PaperValue | None:
    """The first reference row for this entry whose constraints every one of its `cells` meets."""
    for ref in references:
        if ref.communication != communication:
            continue
        rows = ref.rows
        rows = rows[(rows["algorithm"] == algorithm) & (rows["dataset"] == dataset)
                    & (rows["partition"] == partition) & (rows["clients"].astype(int) == int(clients))]
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
                return PaperValue(float(row["mean"]), None if std is None or pd.isna(std) else float(std),
                                  None if comm is None or pd.isna(comm) else float(comm), ref.short)
    return None
