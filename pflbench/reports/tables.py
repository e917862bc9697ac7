"""Tables as data, in pFedLA's layout; text.py and the HTML templates only format them.

`accuracy_tables`: per partition scheme (Table 1 = pathological, Table 2 = dominant), a row per
algorithm and a column per (dataset, number of clients); each entry is the metric (final accuracy or
the worst 10% of clients') in %, mean ± sample std over the seeds of its finished cells, with the
counts of failed and diverged cells beside it (never averaged as zeros), the best of a column marked,
and the paper's number for that entry where a reference file has one.

`communication_tables`: per (dataset, scheme, clients), a row per algorithm: accuracy, MB per round
and in total (down + up), beside pFedLA's Table 3 where it applies.

Rows: an algorithm's cells whose hyperparameters (`hp.*`) differ get one row per setting (e.g.
HeurpFedLA retain_layers=1, retain_layers=2); cells run with tuned hyperparameters (`hp_source` "tuned") get their own row,
marked †. Cells of one entry that differ in anything but the seed are listed in the table's notes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pflbench.config import CellConfig
from pflbench.reports.cells import (DATASET_ALIASES, algorithm_rank, dataset_rank, display_name, format_value)
from pflbench.reports.reference import PaperValue, Reference, find_paper_value

METRICS = {"final_accuracy": "final accuracy", "final_worst10_accuracy": "final accuracy of the worst 10% of clients"}
CONFIG_COLUMNS = tuple(CellConfig.model_fields) + ("hp_source",)
TUNED = "†"
DATA_DIFFER = "‡"
PROBLEM_STATUSES = ("failed", "diverged")


@dataclass(frozen=True)
class Column:
    dataset: str
    clients: int
    params: str = ""
    show_params: bool = False

    @property
    def key(self) -> tuple:
        return (self.dataset, self.clients, self.params)

    @property
    def paper_dataset(self) -> str:
        return DATASET_ALIASES.get(self.dataset, (self.dataset, ""))[0]

    @property
    def data_note(self) -> str:
        return DATASET_ALIASES.get(self.dataset, ("", ""))[1]

    @property
    def label(self) -> str:
        text = f"{self.dataset}, {self.clients} clients"
        return text + (f" ({self.params})" if self.show_params and self.params else "")


@dataclass(frozen=True)
class Row:
    algorithm: str
    variant: str = ""    # "retain_layers=1" when the algorithm's cells differ in hyperparameters
    tuned: bool = False

    @property
    def key(self) -> tuple:
        return (self.algorithm, self.variant, self.tuned)

    @property
    def label(self) -> str:
        text = display_name(self.algorithm) + (f" ({self.variant})" if self.variant else "")
        return text + (f" {TUNED}" if self.tuned else "")


@dataclass
class Entry:
    """The cells of one (row, column): values of the finished ones in %, the others by status."""
    values: list[float] = field(default_factory=list)
    problems: dict[str, int] = field(default_factory=dict)
    hashes: list[str] = field(default_factory=list)
    seeds: list = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    tuned: bool = False
    paper: PaperValue | None = None
    best: bool = False
    mbytes: list[float] = field(default_factory=list)          # total down + up of each finished cell
    mbytes_per_round: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation over seeds (None with fewer than two finished cells)."""
        if len(self.values) < 2:
            return None
        mean = self.mean
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (len(self.values) - 1))

    @property
    def delta(self) -> float | None:
        """Ours minus the paper's, in percentage points."""
        return None if self.mean is None or self.paper is None else self.mean - self.paper.mean

    @property
    def status(self) -> str:
        """"finished" when some cell finished, else the problems, e.g. "failed" or "diverged"."""
        if self.values:
            return "finished"
        return "/".join(sorted(self.problems)) or "missing"

    def value_text(self) -> str:
        if self.mean is None:
            return ""
        return f"{self.mean:.2f}" + (f" ± {self.std:.2f}" if self.std is not None else "")

    def problem_text(self) -> str:
        if not self.values:  # nothing finished: the statuses are the entry
            return ", ".join(f"{status}" if n == 1 else f"{status} ×{n}" for status, n in sorted(self.problems.items()))
        return ", ".join(f"{n} {status}" for status, n in sorted(self.problems.items()))

    def text(self) -> str:
        """"71.20 ± 1.30", "71.20 ± 1.30 (1 diverged)", "failed", with † for tuned cells."""
        value, problems = self.value_text(), self.problem_text()
        text = (f"{value} ({problems})" if problems else value) if value else problems
        return text + (f" {TUNED}" if self.tuned else "")

    def paper_text(self) -> str:
        if self.paper is None:
            return ""
        return f"{self.paper.mean:.2f}" + (f" ± {self.paper.std:.2f}" if self.paper.std is not None else "")

    def delta_text(self) -> str:
        return "" if self.delta is None else f"{self.delta:+.2f}"


@dataclass
class Table:
    scheme: str
    metric: str
    columns: list[Column]
    rows: list[Row]
    entries: dict[tuple, Entry]      # (row.key, column.key) -> Entry
    params: str = ""                 # the scheme's parameters when all its cells share them
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)   # references whose numbers appear

    def entry(self, row: Row, column: Column) -> Entry | None:
        return self.entries.get((row.key, column.key))

    def has_paper(self, column: Column) -> bool:
        return any(self.entry(r, column) is not None and self.entry(r, column).paper is not None for r in self.rows)

    @property
    def title(self) -> str:
        what = "Accuracy" if self.metric == "final_accuracy" else "Worst-10% accuracy"
        return f"{what}, partition {self.scheme}" + (f" ({self.params})" if self.params else "")

    @property
    def any_tuned(self) -> bool:
        return any(e.tuned for e in self.entries.values())

    @property
    def data_notes(self) -> dict[str, str]:
        return {c.dataset: c.data_note for c in self.columns if c.data_note and self.has_paper(c)}


@dataclass
class CommTable:
    """Table-3 style: accuracy and communication of each algorithm on one (dataset, scheme, clients)."""
    column: Column
    scheme: str
    rows: list[tuple[Row, Entry]]
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"Communication, {self.column.label}, partition {self.scheme}"

    @property
    def has_paper(self) -> bool:
        return any(e.paper is not None for _, e in self.rows)

    @property
    def any_tuned(self) -> bool:
        return any(e.tuned for _, e in self.rows)


def row_of_cells(cells: pd.DataFrame) -> pd.Series:
    """The Row of each cell: algorithm, its varying hyperparameters (default-hp cells only), tuned."""
    rows = pd.Series(index=cells.index, dtype=object)
    hp_columns = [c for c in cells.columns if c.startswith("hp.")]
    for (algorithm, source), group in cells.groupby(["algorithm", "hp_source"], dropna=False):
        tuned = source == "tuned"
        # Only hyperparameters that differ within one (dataset, clients) make rows: a value chosen per
        # dataset (e.g. by a spec's override) is one setting, not several.
        varying = [] if tuned else [c for c in hp_columns if group.groupby(["dataset", "clients", "params"])[c]
                                    .agg(lambda s: s.dropna().astype(str).nunique()).max() > 1]
        for index, cell in group.iterrows():
            variant = ", ".join(f"{c.removeprefix('hp.')}={format_value(cell[c])}" for c in varying
                                if not pd.isna(cell[c]))
            rows[index] = Row(str(algorithm), variant, tuned)
    return rows


def make_entry(group: pd.DataFrame, metric: str) -> Entry:
    entry = Entry(tuned=bool((group["hp_source"] == "tuned").any()))
    for _, cell in group.iterrows():
        entry.hashes.append(str(cell["hash"]))
        entry.seeds.append(cell["seed"])
        entry.statuses.append(str(cell["status"]))
        value = cell.get(metric)
        if cell["status"] == "finished" and value is not None and not pd.isna(value):
            entry.values.append(float(value) * 100)
            if not pd.isna(cell["mbytes"]):
                entry.mbytes.append(float(cell["mbytes"]))
                if cell["rounds_completed"] and not pd.isna(cell["rounds_completed"]):
                    entry.mbytes_per_round.append(float(cell["mbytes"]) / float(cell["rounds_completed"]))
        else:
            status = str(cell["status"]) if cell["status"] != "finished" else "no result"
            entry.problems[status] = entry.problems.get(status, 0) + 1
    return entry


def mixed_columns(group: pd.DataFrame) -> list[str]:
    """Configuration columns (other than the seed and hyperparameters) in which an entry's cells differ."""
    return [c for c in group.columns
            if c.split(".")[0] in CONFIG_COLUMNS and c not in ("seed", "hp_source") and not c.startswith("hp.")
            and group[c].astype(str).nunique() > 1]


def columns_of(cells: pd.DataFrame) -> list[Column]:
    several = (cells.groupby(["dataset", "clients"])["params"].nunique() > 1).any()
    keys = sorted({(d, int(c), p if several else "") for d, c, p in zip(cells["dataset"], cells["clients"], cells["params"])},
                  key=lambda k: (dataset_rank(k[0]), k[1], k[2]))
    return [Column(d, c, p, bool(several)) for d, c, p in keys]


def accuracy_tables(cells: pd.DataFrame, references: list[Reference] = (),
                    metric: str = "final_accuracy") -> list[Table]:
    """One Table per partition scheme (schemes alphabetically: dominant, ..., pathological)."""
    tables = []
    if cells.empty:
        return tables
    for scheme, scheme_cells in cells.groupby("partition", sort=True):
        scheme_cells = scheme_cells.assign(row=row_of_cells(scheme_cells))
        columns = columns_of(scheme_cells)
        several = columns[0].show_params if columns else False
        rows = sorted(set(scheme_cells["row"]), key=lambda r: (algorithm_rank(r.algorithm), r.tuned, r.variant))
        params = scheme_cells["params"].unique()
        table = Table(str(scheme), metric, columns, rows, {}, params=params[0] if len(params) == 1 else "")
        for column in columns:
            selected = scheme_cells[(scheme_cells["dataset"] == column.dataset) & (scheme_cells["clients"] == column.clients)]
            if several:
                selected = selected[selected["params"] == column.params]
            for row in rows:
                group = selected[selected["row"] == row]
                if group.empty:
                    continue
                entry = make_entry(group, metric)
                if metric == "final_accuracy":
                    entry.paper = find_paper_value(references, algorithm=row.algorithm, dataset=column.paper_dataset,
                                                   partition=str(scheme), clients=column.clients, cells=group)
                    if entry.paper is not None and entry.paper.source not in table.sources:
                        table.sources.append(entry.paper.source)
                table.entries[(row.key, column.key)] = entry
                mixed = mixed_columns(group)
                if mixed:
                    table.notes.append(f"{row.label} on {column.label}: its cells also differ in {', '.join(mixed)}")
            means = [e.mean for r in rows if (e := table.entry(r, column)) is not None and e.mean is not None]
            if len(means) > 1:
                for r in rows:
                    e = table.entry(r, column)
                    if e is not None and e.mean is not None and e.mean >= max(means) - 1e-9:
                        e.best = True
        tables.append(table)
    return tables


def communication_tables(cells: pd.DataFrame, references: list[Reference] = ()) -> list[CommTable]:
    tables = []
    if cells.empty:
        return tables
    for scheme, scheme_cells in cells.groupby("partition", sort=True):
        scheme_cells = scheme_cells.assign(row=row_of_cells(scheme_cells))
        for column in columns_of(scheme_cells):
            selected = scheme_cells[(scheme_cells["dataset"] == column.dataset) & (scheme_cells["clients"] == column.clients)]
            if column.show_params:
                selected = selected[selected["params"] == column.params]
            table = CommTable(column, str(scheme), [])
            for row in sorted(set(selected["row"]), key=lambda r: (algorithm_rank(r.algorithm), r.tuned, r.variant)):
                group = selected[selected["row"] == row]
                entry = make_entry(group, "final_accuracy")
                entry.paper = find_paper_value(references, algorithm=row.algorithm, dataset=column.paper_dataset,
                                               partition=str(scheme), clients=column.clients, cells=group,
                                               communication=True)
                table.rows.append((row, entry))
                mixed = mixed_columns(group)
                if mixed:
                    table.notes.append(f"{row.label}: its cells also differ in {', '.join(mixed)}")
            tables.append(table)
    return tables


def mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
