"""The difference view: every row of an accuracy table against a reference row (Local by default: the
papers' claims are "above Local"), per column, on what the two share — the same clients' test splits,
and the seeds both have (stats.paired says how seeds are combined).

For each (row, column): the mean per-client difference in percentage points with one standard error
and its t-interval at the report's level, how many clients went up / down / stayed equal, and the
signed-rank test's p — what benchmarks/README.md's paragraphs used to compute by hand ("FedAvg − Local,
adapted: +1.8 ± 0.5, 9 of 10 clients up"). A row is compared with the reference row of its own
heterogeneity knob setting (a knob-on row with the knob-on reference), never across settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pflbench.reports.cells import display_name
from pflbench.reports.stats import Paired, PairedTexts, paired
from pflbench.reports.rows import Row
from pflbench.reports.tables import Column, Entry, Table

DEFAULT_BASELINE = "local"


class UnknownBaseline(ValueError):
    """The reference row named for the difference view is in none of the tables."""


@dataclass(frozen=True)
class Difference(PairedTexts):
    row: Row
    column: Column
    baseline: Row
    entry: Entry
    test: Paired | None  # None: the two share no seed (or no cell finished)

    def counts_text(self) -> str:
        """ "9 / 1 / 0": clients up / down / equal (seeds, for a number without clients)."""
        return "–" if self.test is None else f"{self.test.up} / {self.test.down} / {self.test.equal}"

    def units_text(self) -> str:
        return "–" if self.test is None else self.test.unit_text

    @property
    def separated(self) -> bool:
        return self.test is not None and self.test.separated


@dataclass
class DifferenceTable:
    table: Table  # the accuracy table it reads
    baseline: str  # the reference row's name, as asked
    lines: list[Difference] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # columns (and settings) without the reference row

    @property
    def baseline_label(self) -> str:
        labels = list(dict.fromkeys(d.baseline.label for d in self.lines))
        return labels[0] if len(labels) == 1 else display_name(self.baseline)

    @property
    def several_columns(self) -> bool:
        return len({d.column.key for d in self.lines}) > 1

    @property
    def title(self) -> str:
        return f"Paired differences against {self.baseline_label}"

    @property
    def caption(self) -> str:
        level = self.table.level
        return (
            f"Protocol {self.table.protocol.label}: each row minus {self.baseline_label} on the same clients' "
            f"test splits: the mean per-client difference in percentage points ± one standard "
            f"error, its {100 * (1 - level):g}% t-interval, the clients above / below / level with "
            f"{self.baseline_label} (level: the same accuracy), and the two-sided Wilcoxon signed-rank test's p. "
            f"Seeds: the shared ones, their (seed, client) pairs pooled; from 6 shared seeds on, per-seed means."
        )


def find_baseline(rows: list[Row], name: str, setting: str = "") -> Row | None:
    """The reference row called `name` (an algorithm's registered or displayed name, or a row's label,
    case-insensitive) among `rows` of one knob `setting`: with several (hyperparameter variants, tuned
    rows), the one with the paper's defaults and no variant; else the first."""
    wanted = name.strip().lower()

    def names(row: Row) -> set[str]:
        return {row.algorithm.lower(), display_name(row.algorithm).lower(), row.label.lower()}

    found = [r for r in rows if r.setting == setting and wanted in names(r)]
    if not found:
        return None
    return min(found, key=lambda r: (r.tuned, r.variant != r.setting, r.variant))


def difference_table(table: Table, baseline: str = DEFAULT_BASELINE) -> DifferenceTable | None:
    """`table`'s rows against `baseline`, column by column (None: the table has no such row)."""
    result = DifferenceTable(table, baseline)
    found_any = False
    for column in table.columns:
        for setting in dict.fromkeys(r.setting for r in table.rows):
            reference = find_baseline(table.rows, baseline, setting)
            base = table.entry(reference, column) if reference is not None else None
            if base is None or base.mean is None:
                if any(table.entry(r, column) is not None for r in table.rows if r.setting == setting):
                    result.missing.append(column.label + (f" ({setting})" if setting else ""))
                continue
            found_any = True
            for row in table.rows:
                entry = table.entry(row, column)
                if row.setting != setting or row == reference or entry is None or entry.mean is None:
                    continue
                test = paired(entry.sample, base.sample, table.level) if entry.sample and base.sample else None
                assert reference is not None  # (a base entry was found for it)
                result.lines.append(Difference(row, column, reference, entry, test))
    return result if found_any else None


def difference_tables(tables: list[Table], baseline: str = DEFAULT_BASELINE) -> list[DifferenceTable]:
    """The difference view of each table that has the reference row; UnknownBaseline when none has it
    (the message lists the rows there are)."""
    found = [d for t in tables if (d := difference_table(t, baseline)) is not None]
    if tables and not found:
        rows = sorted({r.algorithm for t in tables for r in t.rows})
        raise UnknownBaseline(
            f"reference row {baseline!r} for the difference view is in none of the accuracy tables; "
            f"allowed: an algorithm of the store ({', '.join(rows)}) or a row's label"
        )
    return found
