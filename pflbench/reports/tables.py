"""Tables as data, in pFedLA's layout; text.py and the HTML templates only format them.

`accuracy_tables`: for one evaluation protocol (protocols.py: the model scored, the round selected,
the averaging; it names the summary key read), per partition scheme (Table 1 = pathological, Table 2 =
dominant), a row per algorithm and a column per (dataset, number of clients); each entry is that
protocol's accuracy in %, mean ± sample std over the seeds of its finished cells, with the counts of
failed and diverged cells beside it (never averaged as zeros), and the paper's number for that entry
where a reference file has one. Which differences are real (`mark_best`, stats.py): the column's
highest mean is bold only where a paired test on the clients' test splits separates it from every
other row, and each row the test cannot tell from it is marked tied (≈); reference algorithms such as
`centralized` are listed last and never ranked. A paper number gets a Δ (ours − paper) only
when the table's protocol is the one the reference declares and the cells' settings equal every one
the reference declares (rounds, local epochs, clients, participation, lr, samples per client,
train/validation fractions, batch size, momentum, weight decay, the resolved model and the exact
dataset: reference.SETTINGS; local adaptation for an adapted number); otherwise the entry carries a
footnote saying what differs.

`communication_tables`: per (dataset, scheme, clients), a row per algorithm: accuracy (as delivered,
and after local adaptation where the cells have it), MB per round and in total (down + up), beside
pFedLA's Table 3 where it applies, and the wall-clock time of a cell (mean over seeds; the survey's Figures
6-7 report accuracy and wall-clock time per method); and, where cells held clients out of training
(`unseen_fraction`), the accuracy of the model each method serves those newcomers (`NEWCOMERS_KEY`), a
column of its own.

Rows (rows.py): an algorithm's cells whose hyperparameters (`hp.*`) or budget differ get one row per
setting (e.g. HeurpFedLA retain_layers=1, retain_layers=2); cells run with tuned hyperparameters
(`hp_source` "tuned") get their own row, marked †. Cells of one entry that differ in anything but the
seed are listed in the table's notes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pflbench.config import CellConfig
from pflbench.reports.cells import dataset_rank, printed_value
from pflbench.reports.budget import table_budget
from pflbench.reports.columns import Column
from pflbench.reports.identical import describe as describe_identical
from pflbench.reports.identical import identical_groups
from pflbench.reports.protocols import ADAPTED, DEFAULT, Protocol
from pflbench.reports.reference import Comparison, PaperValue, Reference, compare, find_paper_value
from pflbench.reports.rows import TUNED, Row, row_of_cells, row_order
from pflbench.reports.samples import entry_sample
from pflbench.reports.stats import LEVEL, SEED_UNITS, Paired, Sample, check_level, paired, test_text

CONFIG_COLUMNS = tuple(CellConfig.model_fields) + ("hp_source", "finetune_epochs")
DATA_DIFFER = "‡"
TIED = "≈"  # not told apart from the column's highest mean by the paired test (stats.py)


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
    comparison: Comparison | None = None  # the paper number against these cells (None: no paper)
    footnote: int | None = None  # the table's note saying why there is no Δ
    best: bool = False
    mbytes: list[float] = field(default_factory=list)  # total down + up of each finished cell
    mbytes_per_round: list[float] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the finished cells' folders
    wall_times: list[float] = field(default_factory=list)  # each finished cell's wall-clock time, s
    models: list[str] = field(default_factory=list)  # the model each finished cell resolved to
    client_down: list[float] = field(default_factory=list)  # bytes to one taking-part client per round
    client_up: list[float] = field(default_factory=list)  # bytes from one taking-part client per round
    same_as: Row | None = None  # another row whose cells this entry's equal bit for bit (identical.py)
    sample: Sample | None = None  # per-client accuracies by seed, for the paired tests (samples.py)
    top: bool = False  # the highest mean of its column (among the rows ranked with it)
    tied: bool = False  # the paired test cannot tell it from the top (the top too, when some row is)
    versus: Row | None = None  # the top row this entry was tested against
    test: Paired | None = None  # this entry against the top (None: the top itself, or untestable)

    @property
    def mean(self) -> float | None:
        return mean_or_none(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation over seeds (None with fewer than two finished cells)."""
        if len(self.values) < 2:
            return None
        mean = sum(self.values) / len(self.values)  # self.mean, of two or more values
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (len(self.values) - 1))

    @property
    def comparable(self) -> bool:
        """The paper's number was measured the way ours was (protocol and settings)."""
        return self.paper is not None and (self.comparison is None or self.comparison.comparable)

    @property
    def other_protocol(self) -> bool:
        return self.comparison is not None and not self.comparison.protocol_ok

    @property
    def delta(self) -> float | None:
        """Ours minus the paper's, in percentage points; None unless comparable."""
        if self.mean is None or self.paper is None or not self.comparable:
            return None
        return self.mean - self.paper.mean

    @property
    def status(self) -> str:
        """ "finished" when some cell finished, else the problems, e.g. "failed" or "diverged"."""
        if self.values:
            return "finished"
        return "/".join(sorted(self.problems)) or "missing"

    def value_text(self) -> str:
        if self.mean is None:
            return ""
        return (
            f"{self.mean:.2f}"
            + (f" ± {self.std:.2f}" if self.std is not None else "")
            + (f" {TIED}" if self.tied else "")
        )

    def test_title(self) -> str:
        """The test behind this entry's mark, for a tooltip: "p = 0.23 against FedAvg (10 clients)"."""
        if self.top and self.best:
            return "ahead of every other row of its column by more than chance"
        if self.top and self.tied:
            return "the highest mean of its column, but some row cannot be told from it"
        if self.versus is None:
            return ""
        if self.test is None or self.test.p is None:
            return f"not testable against {self.versus.label} (no shared clients or too few seeds): counted as tied"
        what = "tied with" if self.tied else "below"
        return f"{what} {self.versus.label}: p = {self.test.p:.3g} ({self.test.unit_text})"

    def problem_text(self) -> str:
        if not self.values:  # nothing finished: the statuses are the entry
            return ", ".join(f"{status}" if n == 1 else f"{status} ×{n}" for status, n in sorted(self.problems.items()))
        return ", ".join(f"{n} {status}" for status, n in sorted(self.problems.items()))

    def text(self) -> str:
        """ "71.20 ± 1.30", "71.20 ± 1.30 (1 diverged)", "failed", with † for tuned cells."""
        value, problems = self.value_text(), self.problem_text()
        text = (f"{value} ({problems})" if problems else value) if value else problems
        return text + (f" {TUNED}" if self.tuned else "") + (f" {self.same_text()}" if self.same_as is not None else "")

    def same_text(self) -> str:
        """ "(= FedAvg)": the entry repeats another row's results bit for bit."""
        return f"(= {self.same_as.label})" if self.same_as is not None else ""

    def paper_text(self) -> str:
        if self.paper is None:
            return ""
        return f"{self.paper.mean:.2f}" + (f" ± {self.paper.std:.2f}" if self.paper.std is not None else "")

    def delta_text(self) -> str:
        return "" if self.delta is None else f"{self.delta:+.2f}"

    def mark(self) -> str:
        """ " [1]": the footnote saying why this paper number has no Δ."""
        return f" [{self.footnote}]" if self.footnote else ""


def add_footnote(footnotes: list[str], entry: Entry) -> None:
    """Number the reason an entry's paper value has no Δ (one number per distinct reason)."""
    if entry.comparison is None or entry.comparison.comparable or entry.mean is None:
        return  # nothing of ours to compare: no footnote
    reason = entry.comparison.reason
    if reason not in footnotes:
        footnotes.append(reason)
    entry.footnote = footnotes.index(reason) + 1


@dataclass
class Table:
    scheme: str
    protocol: Protocol
    columns: list[Column]
    rows: list[Row]
    entries: dict[tuple, Entry]  # (row.key, column.key) -> Entry
    params: str = ""  # the scheme's parameters when all its cells share them
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # references whose numbers appear
    footnotes: list[str] = field(default_factory=list)  # [n] -> why entries marked [n] have no Δ
    budget: str = ""  # the training budget of its cells (budget.py), for the caption
    identical: list[str] = field(default_factory=list)  # entries that repeat another row's results
    level: float = LEVEL  # the paired tests' level (stats.py)
    untested: list[str] = field(default_factory=list)  # columns where no pair could be tested, and why

    @property
    def marks(self) -> str:
        """What bold and ≈ mean and how they were decided, for the caption."""
        if self.protocol.worst10:
            how = (
                f"two-sided Wilcoxon signed-rank test on per-seed values (the worst 10% are different clients "
                f"for each method: no per-client pairing), from {SEED_UNITS} shared seeds on, level {self.level:g}"
            )
        else:
            how = test_text(self.level)
        return (
            f"Bold: the column's highest mean, ahead of every other row by more than chance; {TIED}: "
            f"cannot be told from the highest mean (the highest itself carries {TIED} when some row is tied "
            f"with it). Test: {how}."
        )

    @property
    def metric(self) -> str:
        """The summary key this table reads."""
        return self.protocol.key

    @property
    def caption(self) -> str:
        """The protocol, in a sentence (every table's caption says it)."""
        return self.protocol.caption

    @property
    def any_delta(self) -> bool:
        return any(e.delta is not None for e in self.entries.values())

    @property
    def id(self) -> str:
        return f"{self.protocol.name}-{self.scheme}"

    def entry(self, row: Row, column: Column) -> Entry | None:
        return self.entries.get((row.key, column.key))

    def has_paper(self, column: Column) -> bool:
        return any((e := self.entry(r, column)) is not None and e.paper is not None for r in self.rows)

    @property
    def title(self) -> str:
        what = "Worst-10% accuracy" if self.protocol.worst10 else "Accuracy"
        return (
            f"{what}, partition {self.scheme}"
            + (f" ({self.params})" if self.params else "")
            + f" — {self.protocol.label}"
        )

    @property
    def any_tuned(self) -> bool:
        return any(e.tuned for e in self.entries.values())

    @property
    def data_notes(self) -> dict[str, str]:
        return {c.dataset: c.data_note for c in self.columns if c.data_note and self.has_paper(c)}


@dataclass
class CommTable:
    """Table-3 style: accuracy and communication of each algorithm on one (dataset, scheme, clients).
    `rows` hold the accuracy as delivered (final round, mean over clients) and the communication;
    `adapted` the accuracy after local adaptation by row key, when some cell has it. The paper's
    accuracy sits on the entry of its declared protocol."""

    column: Column
    scheme: str
    rows: list[tuple[Row, Entry]]
    notes: list[str] = field(default_factory=list)
    adapted: dict[tuple, Entry] = field(default_factory=dict)
    footnotes: list[str] = field(default_factory=list)
    budget: str = ""
    newcomers: dict[tuple, Entry] = field(default_factory=dict)  # unseen clients' accuracy by row key

    @property
    def title(self) -> str:
        return f"Communication, {self.column.label}, partition {self.scheme}"

    @property
    def caption(self) -> str:
        text = f"Accuracy: {DEFAULT.label}"
        if self.adapted:
            text += f"; and {ADAPTED.label}"
        if self.newcomers:
            text += (
                "; newcomers: clients held out of training (unseen_fraction), scored with the model the "
                "method serves them, as delivered, final round, mean over newcomers"
            )
        return text + "."

    def papered(self, row: Row) -> Entry | None:
        """The entry carrying the paper's number for this row (its protocol's), if any."""
        for entry in (dict(self.rows).get(row), self.adapted.get(row.key)):
            if entry is not None and entry.paper is not None:
                return entry
        return None

    @property
    def paper_protocol(self) -> Protocol | None:
        protocols = {
            e.paper.protocol for r, _ in self.rows if (e := self.papered(r)) is not None and e.paper is not None
        }
        return next(iter(protocols)) if len(protocols) == 1 else None

    @property
    def has_paper(self) -> bool:
        return any(self.papered(r) is not None for r, _ in self.rows)

    @property
    def any_tuned(self) -> bool:
        return any(e.tuned for _, e in self.rows)


def make_entry(group: pd.DataFrame, metric: str) -> Entry:
    entry = Entry(tuned=bool((group["hp_source"] == "tuned").any()))
    for _, cell in group.iterrows():
        entry.hashes.append(str(cell["hash"]))
        entry.seeds.append(cell["seed"])
        entry.statuses.append(str(cell["status"]))
        value = cell.get(metric)
        if cell["status"] == "finished" and value is not None and not pd.isna(value):
            entry.values.append(float(value) * 100)
            entry.paths.append(str(cell.get("path", "")))
            wall = cell.get("wall_time")
            if wall is not None and not pd.isna(wall):
                entry.wall_times.append(float(wall))
            model = cell.get("resolved_model", cell.get("model"))
            if model is not None and not pd.isna(model):
                entry.models.append(str(model))
            per_client = client_payload(cell)
            if per_client is not None:
                entry.client_down.append(per_client[0])
                entry.client_up.append(per_client[1])
            if not pd.isna(cell["mbytes"]):
                entry.mbytes.append(float(cell["mbytes"]))
                if cell["rounds_completed"] and not pd.isna(cell["rounds_completed"]):
                    entry.mbytes_per_round.append(float(cell["mbytes"]) / float(cell["rounds_completed"]))
        else:
            status = str(cell["status"]) if cell["status"] != "finished" else "no result"
            entry.problems[status] = entry.problems.get(status, 0) + 1
    return entry


def client_payload(cell: pd.Series) -> tuple[float, float] | None:
    """(bytes down, bytes up) per taking-part client per round: the size of what one client receives
    and sends, i.e. the model budget of the method (FedMN's routed modules, a hypernetwork's output...)."""
    try:
        rounds = float(cell["rounds_completed"])
        clients = float(cell["clients"]) * float(cell.get("participation", 1.0) or 1.0)
        down, up = float(cell["bytes_down_total"]), float(cell["bytes_up_total"])
    except (KeyError, TypeError, ValueError):
        return None
    if not rounds or not clients or any(math.isnan(v) for v in (rounds, clients, down, up)):
        return None
    taking_part = max(1.0, round(clients))
    return down / rounds / taking_part, up / rounds / taking_part


def payload_text(entry: Entry) -> tuple[str, str, str]:
    """(model, "≈ parameters" received per client per round, "KB down / up per client per round")."""
    model = "/".join(dict.fromkeys(entry.models)) or "–"
    if not entry.client_down:
        return model, "–", "–"
    down, up = mean_or_none(entry.client_down), mean_or_none(entry.client_up)
    assert down is not None and up is not None  # (client_down and client_up: one value per seed)
    params = down / 4  # float32
    count = f"{params / 1e6:.2f}M" if params >= 1e6 else f"{params / 1e3:.1f}k" if params >= 1e3 else f"{params:.0f}"
    return model, f"≈ {count}" if params else "0", f"{down / 1e3:.1f} / {up / 1e3:.1f}"


def mixed_columns(group: pd.DataFrame) -> list[str]:
    """Configuration columns (other than the seed and hyperparameters) in which an entry's cells differ,
    values compared as printed (100 and 100.0, an int column read beside a float one, are one value);
    a value missing from some cells is a difference."""
    return [
        c
        for c in group.columns
        if c.split(".")[0] in CONFIG_COLUMNS
        and c not in ("seed", "hp_source")
        and not c.startswith("hp.")
        and group[c].astype(object).map(printed_value).nunique(dropna=False) > 1
    ]


def columns_of(cells: pd.DataFrame) -> list[Column]:
    several = (cells.groupby(["dataset", "clients"])["params"].nunique() > 1).any()
    keys = sorted(
        {(d, int(c), p if several else "") for d, c, p in zip(cells["dataset"], cells["clients"], cells["params"])},
        key=lambda k: (dataset_rank(k[0]), k[1], k[2]),
    )
    return [Column(d, c, p, bool(several)) for d, c, p in keys]


def attach_paper(
    entry: Entry,
    references: Sequence[Reference],
    protocol: Protocol,
    *,
    algorithm: str,
    column: Column,
    scheme: str,
    group: pd.DataFrame,
    show_other: bool = True,
    communication: bool = False,
) -> None:
    """The paper's number for this entry and how it compares; one declared under another protocol is
    attached (shown apart, no Δ) only where `show_other`."""
    paper = find_paper_value(
        references,
        algorithm=algorithm,
        dataset=column.paper_dataset,
        partition=scheme,
        clients=column.clients,
        cells=group,
        communication=communication,
    )
    if paper is None or (paper.protocol != protocol and not show_other):
        return
    entry.paper, entry.comparison = paper, compare(paper, group, protocol)


def accuracy_tables(
    cells: pd.DataFrame, references: Sequence[Reference] = (), protocol: Protocol | str = DEFAULT, level: float = LEVEL
) -> list[Table]:
    """One Table per partition scheme (schemes alphabetically: dominant, ..., pathological) of
    `protocol`'s numbers. Paper numbers: in tables of their own protocol (with a Δ where the settings
    match), and in the default table (as delivered, final round) greyed, without Δ; never in
    worst-10% tables (the papers' numbers are means). Best and ties: paired tests at `level`
    (`mark_best`)."""
    protocol = Protocol.parse(protocol)
    level = check_level(level)
    tables: list[Table] = []
    if cells.empty:
        return tables
    metric = protocol.key
    if protocol.adapted:  # only cells that ran local adaptation have adapted numbers
        cells = cells[cells["finetune_epochs"] > 0] if "finetune_epochs" in cells else cells.iloc[:0]
        if cells.empty:
            return tables
    if metric not in cells:
        cells = cells.assign(**{metric: float("nan")})
    if protocol.selection == "bestval" and "val_fraction" in cells:  # no validation split: never an entry,
        cells = cells[cells["val_fraction"].fillna(0) > 0]  # failed or diverged neither
    if protocol != DEFAULT:  # finished cells without this protocol's number (older stores) are not entries
        cells = cells[~((cells["status"] == "finished") & cells[metric].isna())]
        if cells.empty:
            return tables
    for scheme, scheme_cells in cells.groupby("partition", sort=True):
        scheme_cells = scheme_cells.assign(row=row_of_cells(scheme_cells))
        columns = columns_of(scheme_cells)
        several = columns[0].show_params if columns else False
        rows = sorted(set(scheme_cells["row"]), key=row_order)
        params = scheme_cells["params"].unique()
        table = Table(
            str(scheme), protocol, columns, rows, {}, params=params[0] if len(params) == 1 else "", level=level
        )
        for column in columns:
            selected = scheme_cells[
                (scheme_cells["dataset"] == column.dataset) & (scheme_cells["clients"] == column.clients)
            ]
            if several:
                selected = selected[selected["params"] == column.params]
            for row in rows:
                group = selected[selected["row"] == row]
                if group.empty:
                    continue
                entry = make_entry(group, metric)
                entry.sample = entry_sample(group, protocol)
                if not protocol.worst10:
                    attach_paper(
                        entry,
                        references,
                        protocol,
                        algorithm=row.algorithm,
                        column=column,
                        scheme=str(scheme),
                        group=group,
                        show_other=protocol == DEFAULT,
                    )
                    if entry.paper is not None and entry.paper.source not in table.sources:
                        table.sources.append(entry.paper.source)
                table.entries[(row.key, column.key)] = entry
                mixed = mixed_columns(group)
                if mixed:
                    table.notes.append(f"{row.label} on {column.label}: its cells also differ in {', '.join(mixed)}")
            mark_identical(table, column, rows, selected)
            mark_best(table, column, rows, level)
        table.budget = table_budget(columns, lambda c: column_cells(scheme_cells, c))  # noqa: B023 (called in this iteration)
        for row in rows:  # footnotes numbered in reading order
            for column in columns:
                if (e := table.entry(row, column)) is not None:
                    add_footnote(table.footnotes, e)
        table.notes += execution_notes(scheme_cells, columns)
        tables.append(table)
    return tables


# How a cell was executed: not part of its hash (the results agree up to float rounding), but a column
# whose cells mix them should say so. Older stores lack `device`.
# Unseen clients (pflbench.newcomers): the newcomers' served model, as delivered, final round, mean over newcomers.
NEWCOMERS_KEY = "final_accuracy_newcomers"

EXECUTION = {
    "client_batching": "training paths",
    "device": "devices",
    "channels_last": "memory layouts (channels-last or not)",
    "client_threads": "client-thread counts",
    "compiled_training": "training steps (compiled or not)",
}


def _setting_text(value: Any) -> str:
    """A setting as written: a count kept as a float by pandas (a column with gaps) shown as an integer."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def execution_notes(cells: pd.DataFrame, columns: list[Column]) -> list[str]:
    """A note per column and execution setting on which the column's finished cells differ (e.g. some
    trained batched and others in a client loop, or on different devices). The cells of a column are
    compared with each other (ranks, paired tests); columns apart are not, so cells of other datasets
    run another way (a CNN channels-last beside an MLP) need no note."""
    notes = []
    finished = cells[cells["status"] == "finished"] if "status" in cells else cells
    for column in columns:
        selected = column_cells(finished, column)
        where = "this table mixes cells" if len(columns) == 1 else f"{column.label}: its cells were"
        for key, what in EXECUTION.items():
            if key not in selected:
                continue
            counts = selected[key].dropna().map(_setting_text).value_counts()
            if len(counts) > 1:
                listing = ", ".join(f"{n} {value}" for value, n in sorted(counts.items()))
                notes.append(
                    f"{where} run on different {what} ({listing}): their numbers agree up to "
                    f"float rounding, not bit for bit"
                )
    return notes


def communication_tables(cells: pd.DataFrame, references: Sequence[Reference] = ()) -> list[CommTable]:
    tables: list[CommTable] = []
    if cells.empty:
        return tables
    for scheme, scheme_cells in cells.groupby("partition", sort=True):
        scheme_cells = scheme_cells.assign(row=row_of_cells(scheme_cells))
        for column in columns_of(scheme_cells):
            selected = scheme_cells[
                (scheme_cells["dataset"] == column.dataset) & (scheme_cells["clients"] == column.clients)
            ]
            if column.show_params:
                selected = selected[selected["params"] == column.params]
            table = CommTable(column, str(scheme), [])
            table.budget = table_budget([column], lambda c: selected)  # noqa: B023 (called in this iteration)
            with_adapted = ADAPTED.key in selected and selected[ADAPTED.key].notna().any()
            for row in sorted(set(selected["row"]), key=row_order):
                group = selected[selected["row"] == row]
                entry = make_entry(group, DEFAULT.key)
                table.rows.append((row, entry))
                adapted = make_entry(group, ADAPTED.key) if with_adapted else None
                if adapted is not None:
                    table.adapted[row.key] = adapted
                if NEWCOMERS_KEY in group and group[NEWCOMERS_KEY].notna().any():
                    table.newcomers[row.key] = make_entry(group, NEWCOMERS_KEY)
                paper = find_paper_value(
                    references,
                    algorithm=row.algorithm,
                    dataset=column.paper_dataset,
                    partition=str(scheme),
                    clients=column.clients,
                    cells=group,
                    communication=True,
                )
                if paper is not None:
                    # The paper's accuracy goes beside our number of its protocol (delivered otherwise).
                    target = adapted if paper.protocol == ADAPTED and adapted is not None else entry
                    target.paper = paper
                    target.comparison = compare(paper, group, paper.protocol if target is adapted else DEFAULT)
                    add_footnote(table.footnotes, target)
                mixed = mixed_columns(group)
                if mixed:
                    table.notes.append(f"{row.label}: its cells also differ in {', '.join(mixed)}")
            finished = selected[selected["status"] == "finished"] if "path" in selected else selected.iloc[:0]
            same = identical_groups(
                {
                    row: list(zip(g["seed"], g["path"]))
                    for row, _ in table.rows
                    if not (g := finished[finished["row"] == row]).empty
                }
            )
            for row, entry in table.rows:  # "(= FedAvg)": the same results as another row
                entry.same_as = same.get(row)
                if row.key in table.adapted:
                    table.adapted[row.key].same_as = same.get(row)
            tables.append(table)
    return tables


def column_cells(cells: pd.DataFrame, column: Column) -> pd.DataFrame:
    selected = cells[(cells["dataset"] == column.dataset) & (cells["clients"] == column.clients)]
    return selected[selected["params"] == column.params] if column.show_params else selected


def mark_identical(table: Table, column: Column, rows: list[Row], selected: pd.DataFrame) -> None:
    """Flag the entries of a column whose cells repeat an earlier row's bit for bit (identical.py)."""
    finished = selected[selected["status"] == "finished"] if "path" in selected else selected.iloc[:0]
    cells = {
        row: [(seed, path) for seed, path in zip(group["seed"], group["path"])]
        for row in rows
        if not (group := finished[finished["row"] == row]).empty
    }
    for row, same_as in identical_groups(cells).items():
        entry = table.entry(row, column)
        if entry is None:
            continue
        entry.same_as = same_as
        note = f"{column.label}: {describe_identical(row, same_as)}"
        table.identical.append(note)


def shown(value: float, digits: int = 2) -> float:
    """A mean as the tables display it."""
    return round(value + 0.0, digits)


def mark_best(table: Table, column: Column, rows: list[Row], level: float = LEVEL) -> None:
    """Among the rows of one heterogeneity knob setting (a knob-on row, e.g. pFedLA with a fifth of its
    clients unseen and its accuracy over the rest, is another experiment than the knob-off rows: it is
    ranked with its own setting's rows only), find the highest mean and test it against every other
    row (stats.paired: the same clients' test splits, shared seeds): bold where every test separates
    it, ≈ on each row that its test cannot (an untestable pair counts as tied) and on the top when
    some row is. Reference rows (Centralized) and entries repeating another row's results are not
    ranked. Where no pair of a column can be tested (no per-client metrics, a worst-10% column with
    too few seeds), nothing is marked and the table says so."""
    level = check_level(level)
    for setting in dict.fromkeys(r.setting for r in rows):
        ranked = [
            (r, e)
            for r in rows
            if r.setting == setting
            and not r.reference
            and (e := table.entry(r, column)) is not None
            and e.mean is not None
            and e.same_as is None
        ]
        if len(ranked) < 2:
            continue
        top_row, top = max(ranked, key=lambda pair: (shown(pair[1].mean or 0.0), pair[1].mean or 0.0))  # (not None)
        tests: dict[Row, Paired | None] = {}
        for row, entry in ranked:
            if entry is not top:
                found = paired(top.sample, entry.sample, level) if top.sample and entry.sample else None
                tests[row] = found if found is not None and found.p is not None else None
        if all(t is None for t in tests.values()):
            where = column.label + (f" ({setting})" if setting else "")
            table.untested.append(
                f"{where} (no pair of rows could be tested: no per-client metrics shared, or "
                f"fewer than {SEED_UNITS} shared seeds for a number without clients)"
            )
            continue
        top.top = True
        for row, entry in ranked:
            if entry is top:
                continue
            entry.versus, entry.test = top_row, tests[row]
            test = tests[row]
            entry.tied = test is None or not test.separated
        top.tied = any(e.tied for r, e in ranked if e is not top)
        top.best = not top.tied


def mean_or_none(values: list[float]) -> float | None:
    """The mean of `values` (None when there are none)."""
    return sum(values) / len(values) if values else None
