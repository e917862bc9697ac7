"""The results page's data (pflbench.reports.glance): a column's rows against the paper, the column, the
page, and the α views (pflbench.reports.alpha_views).

A row's two verdicts: against the paper, *within* the paper's ± (|Δ| ≤ its std), *above* or *below* it;
within our column, *best* (ahead of every other row by the paired test, tables.mark_best), *≈ best* (not
separated from the column's highest mean) or *below best* (separated). A column on another dataset than
the paper's shows the paper's number as another dataset's, with no Δ and no verdict; a paper row we have
no cells for is "not run" and makes the column *partial* ("not yet run" where the study's command plans
cells for it that have no result yet: a study published cell by cell as it runs).

Where the choice is ours (the paper is silent): "within the paper's ±" uses the paper's std alone (it
does not say over how many runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pflbench.reports.columns import Column
from pflbench.reports.orderings import Chain, Claim
from pflbench.reports.protocols import Protocol
from pflbench.reports.reference import PaperValue, Reference
from pflbench.reports.stats import LEVEL
from pflbench.reports.tables import Entry


@dataclass
class GlanceRow:
    algorithm: str
    label: str
    paper: PaperValue | None
    ours: Entry | None  # under the paper's protocol (the reference row's)
    delivered: Entry | None  # as delivered, final round, mean over clients
    other_dataset: bool = False  # the paper's number is for another dataset than ours
    reason: str = ""  # why there is no Δ (settings differ), "" when there is one
    variants: list[GlanceRow] = field(default_factory=list)
    variant: bool = False
    waiting: bool = False  # the column study's command plans cells for it that have no result yet

    @property
    def run(self) -> bool:
        return self.ours is not None and self.ours.mean is not None

    @property
    def missing(self) -> bool:
        """No cell of ours finished for this row under any protocol: not run."""
        return not self.run and not self.failed and (self.delivered is None or self.delivered.mean is None)

    @property
    def failed(self) -> bool:
        """Its cells ran but none finished with a number (diverged, failed)."""
        return self.ours is not None and self.ours.mean is None and bool(self.ours.problems)

    @property
    def delta(self) -> float | None:
        if self.other_dataset or self.ours is None:
            return None
        return self.ours.delta

    @property
    def seeds(self) -> int:
        return len(self.ours.values) if self.ours is not None else 0

    def verdict(self) -> str:
        """Against the paper: within its ±, above, below; or why there is none."""
        if not self.run:
            if self.failed and self.ours is not None:
                return self.ours.status  # "diverged", "failed"
            if self.missing:
                return "not yet run" if self.waiting else "not run"
            return "no number under the paper's protocol"
        if self.paper is None:
            return "no paper number"
        if self.other_dataset:
            return "another dataset: not compared"
        delta = self.delta
        if delta is None:
            return "settings differ: not compared"
        spread = self.paper.std or 0.0
        if abs(delta) <= spread:
            return "within the paper's ±"
        return "above the paper's ±" if delta > 0 else "below the paper's ±"

    def rank(self) -> str:
        """Within our column (the paired test against the column's highest mean, tables.mark_best; the
        column names that row: `GlanceColumn.best_text`)."""
        entry = self.ours
        if entry is None or entry.mean is None:
            return ""
        if entry.same_as is not None:
            return f"= {entry.same_as.label}"
        if entry.best:
            return "best (separated from every row)"
        if entry.top:
            return "highest mean"
        if entry.versus is None:
            return "not ranked"
        if entry.tied:
            return "≈ best (not separated)"
        p = entry.test.p if entry.test is not None else None
        return f"below best (p = {p:.2g})" if p is not None else "below best"


@dataclass
class AlphaView:
    label: str  # the row's label ("pFedLA", "pFedLA (head=softmax, ...)")
    study: str
    cell: str
    path: str
    round: int
    layer: str
    extreme: float  # fraction of α entries within ALPHA_EXTREME of 0 or 1 at `round`
    self_weight: float  # mean over clients and layers of α[i, l, i] at `round`
    heatmap: str = ""  # figure paths, relative to the page's folder
    evolution: str = ""

    @property
    def collapsed(self) -> bool:
        """Every entry of α is 0 or 1 (to ALPHA_EXTREME): each client's weights are one-hot."""
        return self.extreme == 1.0

    def collapse_text(self) -> str:
        share = f"{100 * self.extreme:.0f}% of entries at 0 or 1"
        return f"collapsed ({share})" if self.collapsed else f"not collapsed ({share})"


@dataclass
class CarryOver:
    """Whether one conclusion of a column on the paper's dataset (`there`) holds on a column of the same
    table on another dataset (`here`): pflbench.reports.carry_over."""

    conclusion: str  # "pFedLA vs FedAvg", "pFedLA's α exactly 0 or 1"
    protocol: str  # delivered, adapted, mixed; "" for α
    there: str  # the outcome on the paper's dataset ("FedAvg above pFedLA (-1.60)")
    here: str  # the outcome here, or why there is none ("not yet run")
    verdict: str  # "carries over", "does not carry over", "not yet decidable", "not decidable"

    @property
    def label(self) -> str:
        return f"{self.conclusion} ({self.protocol})" if self.protocol else self.conclusion


@dataclass
class GlanceColumn:
    study: str  # the study whose cells are the column (its page is the evidence)
    table: str  # "Table 1"
    reference: Reference | None
    column: Column
    scheme: str
    stores: list[str]  # the studies read (the column's and those beside it)
    rows: list[GlanceRow]
    claims: list[Claim]
    chain: Chain | None
    protocol: Protocol  # the paper's protocol (of its rows; the default where none)
    seeds: list = field(default_factory=list)
    variant_of: str = ""  # a variant column: the column it varies
    differences: tuple[str, ...] = ()  # a variant column's settings against the paper's
    alpha: list[AlphaView] = field(default_factory=list)
    home: str = ""  # another-dataset column: the study of the column whose conclusions `carry` checks
    carry: list[CarryOver] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9-]+", "-", self.study.lower())

    @property
    def other_dataset(self) -> bool:
        return self.column.paper_dataset != self.column.dataset

    @property
    def partial(self) -> bool:
        return any(r.missing for r in self.rows)

    @property
    def title(self) -> str:
        source = self.reference.short if self.reference is not None else self.table
        text = f"{source}, {self.column.dataset}, {self.column.clients} clients ({self.scheme})"
        if self.variant_of:
            text += " at " + ", ".join(self.differences) if self.differences else " (variant)"
        return text

    @property
    def short(self) -> str:
        """ "Table 1 (fmnist, 10 clients)", with a variant column's changed settings."""
        text = f"{self.table} ({self.column.dataset}, {self.column.clients} clients"
        return text + (f", {', '.join(self.differences)})" if self.variant_of and self.differences else ")")

    @property
    def state(self) -> str:
        if self.variant_of:
            return "variant: orderings only"
        waiting = sum(r.missing and r.waiting for r in self.rows)
        if self.other_dataset:
            text = f"another dataset than the paper's ({self.column.paper_dataset}): not compared"
            return text + (f"; {waiting} of {len(self.rows)} rows not yet run" if waiting else "")
        if waiting:
            return f"partial: {waiting} of {len(self.rows)} rows not yet run"
        return "partial: rows not run" if self.partial else "complete"

    def best_text(self) -> str:
        """Which row is the highest mean of our column, and whether the paired test separates it."""
        for row in self.rows:
            for item in (row, *row.variants):
                if item.ours is not None and item.ours.top:
                    how = "separated from every other row" if item.ours.best else "not separated from the rows marked ≈"
                    return f"highest mean of our column: {item.label} ({how}; paired test, level {LEVEL:g})"
        return ""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.verdict()] = out.get(row.verdict(), 0) + 1
        return out


@dataclass
class Glance:
    columns: list[GlanceColumn]
    published: str
    level: float = LEVEL

    @property
    def reproduced(self) -> list[GlanceColumn]:
        return [c for c in self.columns if not c.variant_of]

    @property
    def variants(self) -> list[GlanceColumn]:
        return [c for c in self.columns if c.variant_of]

    def studies(self) -> set[str]:
        """Every study the page reads."""
        return {s for c in self.columns for s in c.stores} | {a.study for c in self.columns for a in c.alpha}
