"""Ranks across a study (Demšar 2006): for one protocol, every method's average rank over the study's
columns, the Friedman test that all rank equally, and the Nemenyi critical difference (stats.py).

A *block* is one column of one accuracy table — a (partition scheme, dataset, clients) — and, in a
study with heterogeneity knobs, one knob setting of it (FedAvg under concept shift and FedAvg without
are the same method on two problems). A *method* is a table row without its knob setting: an
algorithm, its hyperparameter variant, tuned or not. In each block the methods are ranked by their mean
(1 = the highest; ties share the mean of their ranks). A method whose cells in a block all diverged is
ranked last there (a divergence is the method's result, not a missing one); a method that has no result
in some block (never run, failed) is left out of the ranking, and the ranking says so. Reference rows
(Centralized) are not methods. Ranks need at least 2 blocks and 2 methods; the Friedman test, 3 methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pflbench.reports.cells import display_name
from pflbench.reports.protocols import Protocol
from pflbench.reports.stats import LEVEL, average_ranks, cliques, friedman, nemenyi_cd
from pflbench.reports.rows import TUNED, Row
from pflbench.reports.tables import Entry, Table

DIVERGED = -math.inf


@dataclass
class StudyRanks:
    protocol: Protocol
    methods: list[str]  # labels, in the order of `ranks`
    blocks: list[str]  # labels of the columns ranked over
    scores: np.ndarray  # [block, method], %; -inf: diverged
    ranks: np.ndarray  # average rank per method (1 = best)
    friedman_p: float | None  # None: fewer than 3 methods
    cd: float  # Nemenyi critical difference at `level`
    groups: list[tuple[int, ...]]  # methods not told apart (indices into `methods`), as the diagram's bars
    level: float = LEVEL
    left_out: list[str] = field(default_factory=list)  # methods not ranked, and why
    figure: str | None = None  # the critical-difference diagram, relative to the report folder

    @property
    def order(self) -> list[int]:
        return sorted(range(len(self.methods)), key=lambda i: self.ranks[i])

    @property
    def rejected(self) -> bool:
        """The Friedman test rejects equal ranks at `level`: the diagram's groups mean something."""
        return self.friedman_p is not None and self.friedman_p < self.level

    def friedman_text(self) -> str:
        if self.friedman_p is None:
            return "Friedman test: needs at least 3 methods"
        verdict = (
            "rejects equal ranks" if self.rejected else "does not reject equal ranks: no two methods are told apart"
        )
        return f"Friedman test over {len(self.blocks)} columns: p = {self.friedman_p:.3g}, {verdict}"

    def group_text(self) -> str:
        if not self.groups:
            return "every pair of methods is more than CD apart"
        return "; ".join(", ".join(self.methods[i] for i in group) for group in self.groups)

    def best_block_count(self, index: int) -> int:
        """In how many blocks method `index` has the highest mean (ties counted)."""
        return int(sum(row[index] == row.max() for row in self.scores))

    @property
    def caption(self) -> str:
        return (
            f"Protocol {self.protocol.label}: average rank of each method over {len(self.blocks)} columns (1 = the "
            f"highest mean of a column; ties share their mean rank; a column where a method diverged ranks it "
            f"last). {self.friedman_text()}. Nemenyi critical difference at level {self.level:g}: "
            f"CD = {self.cd:.2f} ({len(self.methods)} methods, {len(self.blocks)} columns; Demšar 2006): methods "
            f"whose average ranks differ by less than CD are not told apart."
        )


def method_of(row: Row) -> tuple[tuple, str]:
    """A row's method (key, label): the row without its knob setting."""
    variant = row.variant
    if row.setting:
        variant = variant[: -len(row.setting)].rstrip(", ") if variant.endswith(row.setting) else variant
    label = display_name(row.algorithm) + (f" ({variant})" if variant else "") + (f" {TUNED}" if row.tuned else "")
    return (row.algorithm, variant, row.tuned), label


def score(entry: Entry | None) -> float | None:
    """A block's score of a method: its mean in %, DIVERGED when every cell of it diverged, else None."""
    if entry is None:
        return None
    if entry.mean is not None:
        return entry.mean
    return DIVERGED if entry.problems and set(entry.problems) == {"diverged"} else None


def study_ranks(tables: list[Table], level: float = LEVEL) -> StudyRanks | None:
    """The ranks over every block of `tables` (one protocol's accuracy tables, one per scheme); None
    with fewer than 2 blocks or 2 rankable methods."""
    if not tables:
        return None
    protocols = {t.protocol for t in tables}
    if len(protocols) != 1:
        raise ValueError(f"ranks are per protocol; these tables mix {', '.join(sorted(p.name for p in protocols))}")
    blocks: list[str] = []
    values: list[dict] = []
    labels: dict[tuple, str] = {}
    several_schemes = len(tables) > 1
    for table in tables:
        for column in table.columns:
            for setting in dict.fromkeys(r.setting for r in table.rows):
                found = {}
                for row in table.rows:
                    if row.setting != setting or row.reference:
                        continue
                    key, label = method_of(row)
                    labels.setdefault(key, label)
                    value = score(table.entry(row, column))
                    if value is not None:
                        found[key] = value
                if not found:
                    continue
                blocks.append(
                    column.label
                    + (f", {table.scheme}" if several_schemes else "")
                    + (f", {setting}" if setting else "")
                )
                values.append(found)
    if len(blocks) < 2:
        return None
    kept = [k for k in labels if all(k in v for v in values)]
    left_out = [
        f"{labels[k]}: no result in {sum(k not in v for v in values)} of {len(blocks)} columns"
        for k in labels
        if k not in kept
    ]
    if len(kept) < 2:
        return None
    scores = np.array([[v[k] for k in kept] for v in values], dtype=float)
    ranks = average_ranks(np.where(np.isinf(scores), -1e12, scores))
    cd = nemenyi_cd(len(kept), len(blocks), level)
    p = friedman(np.where(np.isinf(scores), -1e12, scores))
    return StudyRanks(
        protocols.pop(),
        [labels[k] for k in kept],
        blocks,
        scores,
        ranks,
        p,
        cd,
        cliques(ranks.tolist(), cd),
        level,
        left_out,
    )
