"""Results at a glance: what reproduces and what does not, generated from the published studies.

A *reproduced column* is a published study named `table<N>-full` (or `table<N>-full-<dataset>`, a
column on another dataset than the paper's, e.g. `table1-full-cifar10-jpeg`) together with the studies
`leaderboard.yaml` puts beside it (its other seeds, its variants). Its paper is the reference file
(benchmarks/reference/*.csv) whose `table:` header is "Table <N>". A *variant column* is another
study with studies beside it whose name extends a column's (`table1-full-175`): the same table at
changed settings, judged on the paper's orderings only (no Δ: the settings differ).

For each column, one row per paper row: the paper's number, ours under the protocol the reference
declares for that row (and as delivered, for context), Δ = ours − paper, and two verdicts:

- against the paper: *within* the paper's ± (|Δ| ≤ its std), *above* or *below* it;
- within our column: *best* (ahead of every other row by the paired test, tables.mark_best), *≈ best*
  (not separated from the column's highest mean) or *below best* (separated).

The row is the algorithm's row holding the column study's own cells (the paper's settings); its other
rows (a hyperparameter variant from a study beside it) are listed folded under it. A column on another
dataset than the paper's shows the paper's number as another dataset's, with no Δ and no verdict; a
paper row we have no cells for is "not run" and makes the column *partial*.

*Orderings the paper claims*: for the pairs in `CLAIMS`, the paper's direction is read from its own
numbers (a > b where the paper's a is higher), and judged under each protocol in `JUDGED`: as delivered,
after local adaptation, and *mixed* — where the paper compares a method that delivers one global model
(its card says it personalizes "nothing": FedAvg) with personalized ones, its global-model number can
only be after local adaptation (the reference files' protocol note), while a personalized method may be
scored as delivered; mixed reads the global-model method adapted and the other as delivered. Each is
the paired difference (stats.paired: the same clients' test splits, every published seed pooled as
(seed, client) pairs) with its 95% t-interval and clients up/down; *holds* / *reversed* when the
signed-rank test separates the two, *not separated* otherwise. A chain (Local < FedAvg < pFedLA)
holds when each link holds and fails when one is reversed.

Where the choice is ours (the paper is silent): "within the paper's ±" uses the paper's std alone (it
does not say over how many runs); the claims judged are the ones pFedLA's text and tables make about
its baselines (`CLAIMS`), not every pair of rows.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pflbench.loader.plugins import loaded_versions
from pflbench.reports.cells import card, display_name, load_cells, read_artifacts
from pflbench.reports.columns import Column
from pflbench.reports.protocols import ADAPTED, DEFAULT, Protocol
from pflbench.reports.reference import PaperValue, Reference, compare, default_reference_dir, load_references
from pflbench.reports.rows import Row
from pflbench.reports.stats import LEVEL, Paired, PairedTexts, Sample, paired
from pflbench.reports.tables import Entry, Table, accuracy_tables

COLUMN_STUDY = re.compile(r"^table(?P<table>\d+)-full(?:-(?P<dataset>.+))?$")
# The orderings judged (pFedLA, Section 4.3: pFedLA is "superior" to its baselines; FedAvg against
# Local and pFedHN against pFedLA as its tables order them). The direction of each is the paper's.
CLAIMS: tuple[tuple[str, str], ...] = (
    ("fedavg", "local"),
    ("pfedla", "local"),
    ("pfedla", "fedavg"),
    ("pfedhn", "pfedla"),
)
CHAIN = ("local", "fedavg", "pfedla")  # the paper's Table 1-2 chain, judged as a whole
MIXED = "mixed"
JUDGED = ("delivered", "adapted", MIXED)
ALPHA_EXTREME = 1e-6  # an α entry this close to 0 or 1 counts as collapsed


def global_model(algorithm: str) -> bool:
    """The method delivers one global model to every client (its card: it personalizes "nothing")."""
    return card(algorithm).personalizes.lower().startswith("nothing")


# ---- the data ---------------------------------------------------------------------------------------------


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
            return "not run" if self.missing else "no number under the paper's protocol"
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
class Judgement(PairedTexts):
    protocol: str  # delivered, adapted or mixed
    test: Paired | None
    note: str = ""  # "same as adapted" etc.

    @property
    def verdict(self) -> str:
        if self.test is None:
            return "not run"
        if not self.test.separated:
            return "not separated"
        return "holds" if self.test.mean > 0 else "reversed"

    def counts_text(self) -> str:
        return "–" if self.test is None else f"{self.test.up} up / {self.test.down} down"


@dataclass
class Claim:
    better: str  # the algorithm the paper puts above
    worse: str
    paper_difference: float  # the paper's better − worse, points
    judgements: list[Judgement]

    @property
    def text(self) -> str:
        return f"{display_name(self.better)} > {display_name(self.worse)}"

    def judged(self, protocol: str) -> Judgement | None:
        return next((j for j in self.judgements if j.protocol == protocol), None)


@dataclass
class Chain:
    algorithms: tuple[str, ...]  # worst first, as the paper orders them
    links: list[Claim]

    @property
    def text(self) -> str:
        return " < ".join(display_name(a) for a in self.algorithms)

    def verdict(self, protocol: str) -> str:
        judged = [c.judged(protocol) for c in self.links]
        verdicts = [j.verdict if j is not None else "not run" for j in judged]
        if "not run" in verdicts:
            return "not run"
        if "reversed" in verdicts:
            return "fails"
        return "holds" if all(v == "holds" for v in verdicts) else "not shown (a link is not separated)"


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
        if self.other_dataset:
            return f"another dataset than the paper's ({self.column.paper_dataset}): not compared"
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


# ---- building it ------------------------------------------------------------------------------------------


def reference_of(references: Sequence[Reference], number: str) -> Reference | None:
    for ref in references:
        table = ref.meta.get("table", [""])[0]
        if re.match(rf"Table {re.escape(number)}\b", table) and not ref.communication:
            return ref
    return None


def column_studies(published: Path) -> list[tuple[Path, str]]:
    """(study folder, table number) of every reproduced column (module doc)."""
    from pflbench.studies.publish import studies

    out = []
    for folder in studies(published):
        match = COLUMN_STUDY.match(folder.name)
        if match is None:
            continue
        dataset = match.group("dataset")
        if dataset is not None:
            cells = load_cells(folder, (), plugins=loaded_versions())
            if cells.empty or set(cells["dataset"].astype(str)) != {dataset}:
                continue  # a variant of a column (`table1-full-175`), not a dataset of its own
        out.append((folder, match.group("table")))
    return out


def build_glance(published: str | Path, references: Sequence[Reference] | None = None, level: float = LEVEL) -> Glance:
    """The page's data from the published studies under `published` (module doc)."""
    from pflbench.studies.publish import beside_studies

    published = Path(published)
    if references is None:
        references = load_references(default_reference_dir())
    beside = beside_studies(published)
    columns: list[GlanceColumn] = []
    for folder, number in column_studies(published):
        reference = reference_of(references, number)
        built = build_column(folder, beside.get(folder.name, []), reference, f"Table {number}", level)
        if built is None:
            continue
        columns.append(built)
        for name in sorted(beside):  # variant columns: a study with others beside it, named after this one
            if (
                name.startswith(folder.name + "-")
                and name not in {c.study for c in columns}
                and (published / name).is_dir()
                and not COLUMN_STUDY.match(name.replace(folder.name, "x", 1))
            ):
                variant = build_column(
                    published / name, beside[name], reference, f"Table {number}", level, variant_of=folder.name
                )
                if variant is not None:
                    columns.append(variant)
    glance = Glance(columns, str(published), level)
    attach_alpha(glance, published)
    return glance


def _column_cells(cells: pd.DataFrame) -> tuple[Column, str] | None:
    """The column (dataset, clients) and scheme most of the study's cells are on."""
    if cells.empty:
        return None
    key = cells.groupby(["dataset", "clients", "partition"]).size().idxmax()
    return Column(str(key[0]), int(key[1])), str(key[2])


def build_column(
    folder: Path, beside: Sequence[Path], reference: Reference | None, table: str, level: float, variant_of: str = ""
) -> GlanceColumn | None:
    cells = load_cells(folder, beside, plugins=loaded_versions())
    found = _column_cells(cells)
    if found is None:
        return None
    column, scheme = found
    cells = cells[
        (cells["dataset"] == column.dataset) & (cells["clients"] == column.clients) & (cells["partition"] == scheme)
    ].reset_index(drop=True)
    refs = [reference] if reference is not None else []
    paper_rows = (
        pd.DataFrame()
        if reference is None
        else reference.rows[
            (reference.rows["dataset"] == column.paper_dataset)
            & (reference.rows["partition"] == scheme)
            & (reference.rows["clients"].astype(int) == column.clients)
        ]
    )
    protocols = [Protocol.parse(p) for p in paper_rows.get("protocol", pd.Series(dtype=str)).dropna().unique()]
    paper_protocol = protocols[0] if len(protocols) == 1 else ADAPTED
    tables: dict[Protocol, Table | None] = {}

    def table_of(protocol: Protocol) -> Table | None:
        if protocol not in tables:
            made = accuracy_tables(cells, refs, protocol, level)
            tables[protocol] = made[0] if made else None
        return tables[protocol]

    own = str(folder.resolve())

    def base_row(t: Table | None, algorithm: str) -> Row | None:
        """The algorithm's row holding the column study's own cells; else its only row."""
        if t is None:
            return None
        rows = [r for r in t.rows if r.algorithm == algorithm]
        for row in rows:
            entry = t.entry(row, t.columns[0])
            if entry is not None and any(str(Path(p).parent.resolve()) == own for p in entry.paths):
                return row
        return rows[0] if len(rows) == 1 else None

    def entry_of(t: Table | None, row: Row | None) -> Entry | None:
        return None if t is None or row is None else t.entry(row, t.columns[0])

    delivered = table_of(DEFAULT)
    algorithms = list(
        dict.fromkeys(
            [
                *paper_rows.get("algorithm", pd.Series(dtype=str)).astype(str),
                *[r.algorithm for r in (delivered.rows if delivered else []) if not r.reference],
            ]
        )
    )
    rows: list[GlanceRow] = []
    for algorithm in algorithms:
        paper_line = paper_rows[paper_rows["algorithm"] == algorithm] if len(paper_rows) else paper_rows
        protocol = (
            Protocol.parse(paper_line["protocol"].iloc[0])
            if len(paper_line) and "protocol" in paper_line and not pd.isna(paper_line["protocol"].iloc[0])
            else paper_protocol
        )
        ours_table = table_of(protocol)
        row = base_row(ours_table, algorithm) or base_row(delivered, algorithm)
        ours = entry_of(ours_table, row)
        paper = ours.paper if ours is not None else None
        if paper is None and len(paper_line):
            line = paper_line.iloc[0]
            paper = PaperValue(
                float(line["mean"]),
                None if pd.isna(line.get("std")) else float(line["std"]),
                None,
                reference.short if reference is not None else table,
                protocol,
            )
        if variant_of:
            paper = None  # settings differ from the paper's: the column is judged on orderings only
        glance_row = GlanceRow(
            algorithm,
            display_name(algorithm) + (" †" if row is not None and row.tuned else ""),
            paper,
            ours,
            entry_of(delivered, row),
            other_dataset=column.paper_dataset != column.dataset,
            reason=ours.comparison.reason
            if ours is not None and ours.comparison is not None and not ours.comparison.comparable
            else "",
        )
        for t in (ours_table,):
            for other in t.rows if t is not None else []:
                if other.algorithm == algorithm and other != row:
                    entry = entry_of(t, other)
                    glance_row.variants.append(
                        GlanceRow(
                            algorithm,
                            variant_label(other, row),
                            entry.paper if entry is not None and not variant_of else None,
                            entry,
                            entry_of(delivered, other),
                            other_dataset=glance_row.other_dataset,
                            reason=entry.comparison.reason
                            if entry is not None and entry.comparison is not None and not entry.comparison.comparable
                            else "",
                            variant=True,
                        )
                    )
        if row is None and not len(paper_line):
            continue
        rows.append(glance_row)
    seeds = sorted({s for r in rows if r.ours is not None for s in r.ours.seeds}, key=str)
    differences: tuple[str, ...] = ()
    if variant_of and reference is not None and len(paper_rows):
        # what the variant changes against the paper's settings (read off its first paper row's cells)
        first = paper_rows.iloc[0]
        value = PaperValue(
            float(first["mean"]),
            None,
            None,
            reference.short,
            paper_protocol,
            tuple(
                (n, first[n])
                for n in ("samples_per_client", "rounds", "local_epochs", "lr", "batch_size")
                if n in first and not pd.isna(first[n])
            ),
        )
        same = cells[cells["algorithm"] == first["algorithm"]]
        differences = compare(value, same if len(same) else cells, paper_protocol).differences
        differences = tuple(d for d in differences if not d.startswith("finetune_epochs"))
        params = cells.filter(like="partition_params.").iloc[0].dropna().to_dict() if len(cells) else {}
        shown = [d.split(" vs ")[0].replace(" ", "=") for d in differences]
        extra = [
            f"{k.removeprefix('partition_params.')}={v:g}"
            if isinstance(v, float)
            else f"{k.removeprefix('partition_params.')}={v}"
            for k, v in params.items()
            if not any(k.removeprefix("partition_params.") in s for s in shown)
            and k.removeprefix("partition_params.") in _varied_params(folder)
        ]
        differences = tuple(shown + extra)
    claims, chain = judge_claims(paper_rows, cells, table_of, base_row, entry_of)
    return GlanceColumn(
        folder.name,
        table,
        reference,
        column,
        scheme,
        [folder.name, *(p.name for p in beside)],
        rows,
        claims,
        chain,
        paper_protocol,
        seeds,
        variant_of,
        differences,
    )


def variant_label(row: Row, base: Row | None) -> str:
    """A variant row's label by what it changes against the base row ("pFedHN (batch_size=64, ...)")."""
    mine = [part for part in row.variant.split(", ") if part]
    common = set(base.variant.split(", ")) if base is not None else set()
    changed = [part for part in mine if part not in common] or mine
    return display_name(row.algorithm) + (f" ({', '.join(changed)})" if changed else "") + (" †" if row.tuned else "")


def _varied_params(folder: Path) -> set[str]:
    """The partition parameters the study's command sets (`--set partition_params.X=...`)."""
    from pflbench.studies.publish import read_manifest

    command = (read_manifest(folder) or {}).get("command", "")
    return set(re.findall(r"partition_params\.(\w+)=", command))


def judge_claims(
    paper_rows: pd.DataFrame,
    cells: pd.DataFrame,
    table_of: Callable[[Protocol], Table | None],
    base_row: Callable,
    entry_of: Callable,
) -> tuple[list[Claim], Chain | None]:
    means = {str(a): float(m) for a, m in zip(paper_rows.get("algorithm", []), paper_rows.get("mean", []))}

    def sample(algorithm: str, protocol: Protocol) -> Sample | None:
        t = table_of(protocol)
        entry = entry_of(t, base_row(t, algorithm))
        return entry.sample if entry is not None and entry.mean is not None else None

    claims = []
    for a, b in CLAIMS:
        if a not in means or b not in means or means[a] == means[b]:
            continue
        better, worse = (a, b) if means[a] > means[b] else (b, a)
        judgements = []
        for name in JUDGED:
            if name == MIXED:
                if global_model(better) == global_model(worse):
                    continue  # both global or both personalized: the paper does not mix here
                first = ADAPTED if global_model(better) else DEFAULT
                second = ADAPTED if global_model(worse) else DEFAULT
            else:
                first = second = DEFAULT if name == "delivered" else ADAPTED
            x, y = sample(better, first), sample(worse, second)
            judgements.append(Judgement(name, paired(x, y) if x is not None and y is not None else None))
        claims.append(Claim(better, worse, means[better] - means[worse], judgements))
    chain = None
    if all(a in means for a in CHAIN) and all(means[x] < means[y] for x, y in zip(CHAIN, CHAIN[1:])):
        links = [
            next(c for c in claims if (c.better, c.worse) == (y, x))
            for x, y in zip(CHAIN, CHAIN[1:])
            if any((c.better, c.worse) == (y, x) for c in claims)
        ]
        if len(links) == len(CHAIN) - 1:
            chain = Chain(CHAIN, links)
    return claims, chain


# ---- α (pFedLA's Figures 5-6) ------------------------------------------------------------------------------


def layerwise(artifacts: dict) -> bool:
    rounds = artifacts.get("alpha", {})
    return bool(rounds) and all(a.ndim == 3 and a.shape[0] == a.shape[2] for a in rounds.values())


def attach_alpha(glance: Glance, published: Path) -> None:
    """For each reproduced column: the α of its default pFedLA cell (seed 0 or the first) and of every
    variant with layer-wise α on the same column and seed in the published studies, at the same round
    (the last all have) and layer (the last)."""
    from pflbench.studies.publish import studies

    stores = {folder.name: load_cells(folder, (), plugins=loaded_versions()) for folder in studies(published)}
    for column in glance.reproduced:
        base = next((r for r in column.rows if r.algorithm == "pfedla"), None)
        if base is None or base.ours is None or not base.ours.paths:
            continue
        seed = sorted(base.ours.seeds, key=str)[0]
        found: list[tuple[str, str, str, str]] = []  # (label, study, cell, path)
        for path, cell_seed, cell in zip(base.ours.paths, base.ours.seeds, base.ours.hashes):
            if cell_seed == seed:
                found.append((_variant_label(_cell_row(stores, path)), Path(path).parent.name, cell, path))
                break
        rounds = _cell_value(stores, base.ours.paths[0], "rounds")
        for name, cells in sorted(stores.items()):
            if cells.empty or name in column.stores:
                continue
            same = cells[
                (cells["dataset"] == column.column.dataset)
                & (cells["clients"] == column.column.clients)
                & (cells["partition"] == column.scheme)
                & (cells["seed"] == seed)
                & (cells["status"] == "finished")
            ]
            if "partition_params.samples_per_client" in cells and base.ours.paths:
                wanted = _cell_value(stores, base.ours.paths[0], "partition_params.samples_per_client")
                same = same[same["partition_params.samples_per_client"] == wanted]
            if rounds is not None and "rounds" in same:
                same = same[same["rounds"] == rounds]
            for _, cell in same.iterrows():
                label = _variant_label(cell)
                if (
                    cell["algorithm"] == "pfedla"
                    and label not in {f[0] for f in found}
                    and layerwise(read_artifacts(cell["path"]))
                ):
                    found.append((label, name, str(cell["hash"]), str(cell["path"])))
        views = []
        arrays = {}
        for label, study, cell, path in found:
            artifacts = read_artifacts(path)
            if layerwise(artifacts):
                arrays[cell] = artifacts
                views.append((label, study, cell, path))
        if not views:
            continue
        common = set.intersection(*(set(arrays[c]["alpha"]) for _, _, c, _ in views))
        if not common:
            continue
        rnd = max(common)
        for label, study, cell, path in views:
            alpha = np.asarray(arrays[cell]["alpha"][rnd], dtype=float)
            names = arrays[cell].get("alpha_layers", {}).get(rnd)
            layer = str(names[-1]) if names is not None else str(alpha.shape[1] - 1)
            extreme = float(np.mean((alpha <= ALPHA_EXTREME) | (alpha >= 1 - ALPHA_EXTREME)))
            self_weight = float(np.mean([alpha[i, :, i] for i in range(alpha.shape[0])]))
            column.alpha.append(AlphaView(label, study, cell, path, int(rnd), layer, extreme, self_weight))


def _cell_row(stores: dict[str, pd.DataFrame], path: str) -> pd.Series:
    for cells in stores.values():
        match = cells[cells["path"] == path] if "path" in cells else cells.iloc[:0]
        if len(match):
            return match.iloc[0]
    raise KeyError(path)


def _cell_value(stores: dict[str, pd.DataFrame], path: str, column: str) -> Any:
    for cells in stores.values():
        match = cells[cells["path"] == path] if "path" in cells else cells.iloc[:0]
        if len(match) and column in match:
            return match[column].iloc[0]
    return None


def _variant_label(cell: pd.Series) -> str:
    """pFedLA with the hyperparameters its cell sets away from the defaults ("pFedLA (head=softmax)")."""
    from pflbench.reports.rows import current_defaults
    from pflbench.reports.cells import printed_value

    defaults = current_defaults(str(cell["algorithm"]))
    changed = [
        f"{k.removeprefix('hp.')}={printed_value(cell[k])}"
        for k in cell.index
        if k.startswith("hp.")
        and not (np.isscalar(cell[k]) and pd.isna(cell[k]))
        and k in defaults
        and printed_value(cell[k]) != defaults[k]
    ]
    return display_name(str(cell["algorithm"])) + (f" ({', '.join(changed)})" if changed else "")


def write_figures(glance: Glance, folder: str | Path, rel: str = "", formats: Sequence[str] = ("png",)) -> None:
    """Figure 6 (the heatmap of the last layer at the shared round) and Figure 5 (client 0's weights over
    rounds) of each α view, under `folder`; their paths (prefixed by `rel`) are set on the views."""
    from pflbench.reports import figures as fig
    from pflbench.reports.document import safe_name

    folder = Path(folder)
    for column in glance.reproduced:
        for view in column.alpha:
            artifacts = read_artifacts(view.path)
            found = artifacts.get("alpha_layers", {}).get(view.round)
            names = None if found is None else [str(n) for n in found]
            stem = safe_name(f"{column.anchor}_{view.cell}")
            fig.alpha_heatmap(
                artifacts["alpha"][view.round],
                folder / f"alpha_{stem}",
                layer=view.layer,
                layer_names=names,
                title=f"{view.label}: α of layer {view.layer}, round {view.round}",
                formats=formats,
            )
            fig.alpha_evolution(
                artifacts["alpha"],
                folder / f"evolution_{stem}",
                client=0,
                layer_names=names,
                title=f"{view.label}: client 0's α over rounds",
                formats=formats,
            )
            view.heatmap = f"{rel}alpha_{stem}.png"
            view.evolution = f"{rel}evolution_{stem}.png"


# ---- the findings -----------------------------------------------------------------------------------------


@dataclass
class Finding:
    text: str
    link: str  # an anchor of the page ("#table1-full") or a study ("table1-full")
    study: str = ""  # the study it is about (the leaderboard links its page)


def _pp(value: float) -> str:
    return f"{value:+.2f}"


def findings(glance: Glance, limit: int = 15) -> list[Finding]:
    """At most `limit` lines, each a generated statement and where its evidence is."""
    out: list[Finding] = []
    for column in glance.reproduced:
        papered = [r for r in column.rows if r.paper is not None]
        run = [r for r in papered if r.run]
        if column.other_dataset:
            out.append(
                Finding(
                    f"{column.short}: {len(run)} of {len(papered)} paper rows run; the paper's numbers "
                    f"are for {column.column.paper_dataset}, so none is compared",
                    f"#{column.anchor}",
                    column.study,
                )
            )
        else:
            counts: dict[str, int] = {}
            for row in papered:
                word = row.verdict().split(" the paper")[0].removesuffix(":")
                counts[word] = counts.get(word, 0) + 1
            parts = [f"{counts[w]} {w}" for w in ("within", "above", "below", "not run") if w in counts]
            parts += [f"{n} {w}" for w, n in counts.items() if w not in ("within", "above", "below", "not run")]
            deltas = [r.delta for r in column.rows if r.delta is not None]
            spread = f" (Δ {min(deltas):+.2f} to {max(deltas):+.2f})" if deltas else ""
            out.append(
                Finding(
                    f"{column.short}, {column.protocol.model} as the paper: of {len(papered)} paper rows "
                    f"{', '.join(parts)} the paper's ±{spread}; {_seeds_text(column)}",
                    f"#{column.anchor}",
                    column.study,
                )
            )
        if column.chain is not None:
            out.append(Finding(chain_sentence(column), f"#claims-{column.anchor}", column.study))
        for claim in column.claims:
            if column.chain is not None and claim in column.chain.links:
                continue
            out.append(Finding(claim_sentence(column, claim), f"#claims-{column.anchor}", column.study))
    for column in glance.variants:
        for claim in column.claims:
            if claim.better == "pfedla" and claim.worse in ("fedavg", "local"):
                out.append(Finding(claim_sentence(column, claim), f"#claims-{column.anchor}", column.study))
    for column in glance.reproduced:
        if column.alpha:
            parts = [f"{v.label} {100 * v.extreme:.0f}% (self-weight {v.self_weight:.2f})" for v in column.alpha]
            out.append(
                Finding(
                    f"{column.short}, α at round {column.alpha[0].round}: share of its entries at 0 or 1 "
                    f"(to 1e-6): " + "; ".join(parts),
                    f"#alpha-{column.anchor}",
                    column.study,
                )
            )
    return out[:limit]


def _seeds_text(column: GlanceColumn) -> str:
    seeds = column.seeds
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))} where published"


def _judged_text(j: Judgement) -> str:
    if j.test is None:
        return f"{j.protocol} not run"
    return f"{j.protocol} {j.mean_text()}, {j.test.up} up / {j.test.down} down"


def claim_sentence(column: GlanceColumn, claim: Claim) -> str:
    verdicts = list(dict.fromkeys(j.verdict for j in claim.judgements))
    if len(verdicts) == 1:
        head = f"{verdicts[0]} under every protocol"
    else:
        head = ", ".join(f"{j.verdict} {j.protocol}" for j in claim.judgements)
    return f"{column.short}: {claim.text} (paper {_pp(claim.paper_difference)}) {head}: " + "; ".join(
        _judged_text(j) for j in claim.judgements
    )


def chain_sentence(column: GlanceColumn) -> str:
    chain = column.chain
    assert chain is not None
    names = [n for n in JUDGED if any(c.judged(n) is not None for c in chain.links)]
    verdicts = list(dict.fromkeys(chain.verdict(n) for n in names))
    head = (
        f"{verdicts[0]} under every protocol"
        if len(verdicts) == 1
        else ", ".join(f"{chain.verdict(n)} {n}" for n in names)
    )
    parts = []
    for name in names:
        judged = [(c, j) for c in chain.links if (j := c.judged(name)) is not None]
        # the link that decides: a reversed one, else one not separated, else the weakest
        decisive = min(
            judged,
            key=lambda cj: (
                {"reversed": 0, "not separated": 1}.get(cj[1].verdict, 2),
                cj[1].test.mean if cj[1].test is not None else 0.0,
            ),
        )
        parts.append(f"{name} {decisive[0].text} {decisive[1].mean_text()} ({decisive[1].verdict})")
    return f"{column.short}: chain {chain.text} {head}: " + "; ".join(parts)


# ---- tables as CSV and Markdown -----------------------------------------------------------------------------

ROW_FIELDS = (
    "column",
    "study",
    "dataset",
    "paper_dataset",
    "scheme",
    "clients",
    "row",
    "variant_of",
    "protocol",
    "paper_mean",
    "paper_std",
    "ours_mean",
    "ours_std",
    "seeds",
    "delivered_mean",
    "delta",
    "verdict",
    "in_our_column",
    "why_no_delta",
)
CLAIM_FIELDS = (
    "column",
    "study",
    "claim",
    "paper_difference",
    "protocol",
    "difference",
    "se",
    "ci_low",
    "ci_high",
    "clients_up",
    "clients_down",
    "clients_equal",
    "p",
    "paired_on",
    "verdict",
)


def _round(value: float | None, digits: int = 4) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def row_records(glance: Glance) -> list[dict]:
    out = []
    for column in glance.columns:
        for row in column.rows:
            for item in (row, *row.variants):
                ours = item.ours
                out.append(
                    {
                        "column": column.title,
                        "study": column.study,
                        "dataset": column.column.dataset,
                        "paper_dataset": column.column.paper_dataset,
                        "scheme": column.scheme,
                        "clients": column.column.clients,
                        "row": item.label,
                        "variant_of": row.label if item.variant else "",
                        "protocol": (item.paper.protocol.name if item.paper is not None else column.protocol.name),
                        "paper_mean": _round(item.paper.mean if item.paper else None, 2),
                        "paper_std": _round(item.paper.std if item.paper else None, 2),
                        "ours_mean": _round(ours.mean if ours else None),
                        "ours_std": _round(ours.std if ours else None),
                        "seeds": item.seeds,
                        "delivered_mean": _round(item.delivered.mean if item.delivered else None),
                        "delta": _round(item.delta),
                        "verdict": item.verdict(),
                        "in_our_column": item.rank(),
                        "why_no_delta": item.reason,
                    }
                )
    return out


def claim_records(glance: Glance) -> list[dict]:
    out = []
    for column in glance.columns:
        for claim in column.claims:
            for j in claim.judgements:
                t = j.test
                interval = t.interval if t is not None else None
                out.append(
                    {
                        "column": column.title,
                        "study": column.study,
                        "claim": claim.text,
                        "paper_difference": _round(claim.paper_difference, 2),
                        "protocol": j.protocol,
                        "difference": _round(t.mean if t else None),
                        "se": _round(t.se if t else None),
                        "ci_low": _round(interval[0] if interval else None),
                        "ci_high": _round(interval[1] if interval else None),
                        "clients_up": t.up if t else "",
                        "clients_down": t.down if t else "",
                        "clients_equal": t.equal if t else "",
                        "p": _round(t.p if t else None),
                        "paired_on": t.unit_text if t else "",
                        "verdict": j.verdict,
                    }
                )
    return out


def write_csv(glance: Glance, folder: str | Path) -> list[Path]:
    """results_rows.csv and results_orderings.csv: every number of the page's tables."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fields, records in (
        ("results_rows.csv", ROW_FIELDS, row_records(glance)),
        ("results_orderings.csv", CLAIM_FIELDS, claim_records(glance)),
    ):
        path = folder / name
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(records)
        written.append(path)
    return written


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def _entry_text(entry: Entry | None) -> str:
    if entry is None or entry.mean is None:
        return "–"
    return f"{entry.mean:.2f}" + (f" ± {entry.std:.2f}" if entry.std is not None else "")


def _paper_text(row: GlanceRow) -> str:
    if row.paper is None:
        return "–"
    text = f"{row.paper.mean:.2f}" + (f" ± {row.paper.std:.2f}" if row.paper.std is not None else "")
    return text


def markdown(glance: Glance, study_link: Callable[[str], str], csv_rel: str = "") -> str:
    """The page (MkDocs Markdown): findings, what is identified, the column tables, the orderings, α.
    `study_link(study)`: where a study's page is."""
    g = glance
    lines = [
        "# Results at a glance",
        "",
        f"What reproduces of the paper's tables and what does not, generated from the published studies "
        f"(`{Path(g.published).name}/`) when this site was built: no number on this page is typed by hand. "
        f"Every table is also a CSV: [rows]({csv_rel}results_rows.csv), "
        f"[orderings]({csv_rel}results_orderings.csv).",
        "",
        "## Findings",
        "",
    ]
    for f in findings(g):
        lines.append(f"- {_cell(f.text)} [→ evidence]({f.link})")
    lines += ["", "## What is identified, what is only shown, what was not run", "", *IDENTIFIED, ""]
    for column in g.reproduced:
        lines += column_markdown(column, study_link)
    if g.variants:
        lines += [
            "## Variant columns: the same tables at changed settings",
            "",
            "The paper's orderings judged where a setting differs from the paper's (no Δ against the paper: "
            "its numbers are for its settings).",
            "",
        ]
        for column in g.variants:
            lines += [
                f"### {_cell(column.title)} {{#{column.anchor}}}",
                "",
                f"Studies: {', '.join(f'[{s}]({study_link(s)})' for s in column.stores)}.",
                "",
            ]
            lines += claims_markdown(column, study_link)
    lines += ["## How to read this page", "", *HOW_TO_READ.format(level=g.level).split("\n"), ""]
    return "\n".join(lines) + "\n"


IDENTIFIED = [
    "- **Identified** (a measured cause with a control beside it): pFedLA collapses to Local — its default "
    "hypernetwork drives every client's aggregation weights to one-hot self-weights (the α heatmaps: an "
    "identity matrix), so its clients train alone and pFedLA cannot be told from Local; the alive-α variant, "
    "whose weights stay mixed, is the control. And the Local ceiling — at the paper's settings our Local ends "
    "far above the paper's Local in both columns, so the paper's margins over Local cannot appear; no single "
    "setting the paper states brings it down (the Local control studies), while fewer samples per client "
    "(the 175-sample variant column) bring it to the paper's level, where the orderings are judged again.",
    "- **Only shown** (observed, not isolated): how much the seeds move a row (few seeds are published, and "
    "the paper does not say over how many runs its ± is); the orderings under the protocols the paper does not "
    "name (as delivered, mixed); why the rows below the paper's ± are below it.",
    "- **Not run**: the 100-client columns, EMNIST and CIFAR-100; CIFAR-10 only as its offline JPEG "
    "re-encoding (`cifar10-jpeg`), compared with the paper's CIFAR-10 without a Δ; any row a column marks "
    "*not run*.",
]

HOW_TO_READ = (
    "*ours*: the mean over the published seeds (± their std where there are several) under the paper's "
    "protocol, which the reference files declare per row; *delivered*: the same cells as delivered (no local "
    "adaptation), final round, mean over clients. *Δ* = ours − paper, only where every setting the paper "
    "gives equals ours. *Against the paper*: within its ± (|Δ| ≤ the paper's std), above or below it. *In our "
    "column*: the paired test (two-sided Wilcoxon signed-rank on the same clients' test splits, seeds "
    "pooled, level {level:g}) against the column's highest mean: best (separated from every row), ≈ best (not "
    "separated), below best (separated). Orderings: the paired difference better − worse in points (± one "
    "standard error), its {level_ci} t-interval, clients up / down; holds or reversed where the test "
    "separates the two, not separated otherwise. *mixed*: the global-model method (FedAvg) after local "
    "adaptation against the personalized one as delivered."
).replace("{level_ci}", "95%")


def column_markdown(column: GlanceColumn, study_link: Callable[[str], str]) -> list[str]:
    c = column
    out = [
        f"## {_cell(c.title)} {{#{c.anchor}}}",
        "",
        f"**{c.state}.** Protocol: {c.protocol.label} (the paper's, as the reference file reads it). "
        f"{_seeds_text(c).capitalize()}. Studies: " + ", ".join(f"[{s}]({study_link(s)})" for s in c.stores) + ".",
        "",
    ]
    if c.other_dataset:
        out += [
            f"The paper's numbers are for {c.column.paper_dataset}, ours for {c.column.dataset}: shown "
            f"*in italics* as another dataset's, with no Δ and no verdict.",
            "",
        ]
    if c.best_text():
        out += [c.best_text()[0].upper() + _cell(c.best_text()[1:]) + ".", ""]
    out += [
        "| row | paper | ours | Δ | against the paper | in our column | delivered |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in c.rows:
        for item in (row, *row.variants):
            paper = _paper_text(item)
            if item.other_dataset and item.paper is not None:
                paper = f"*{paper} ({c.column.paper_dataset})*"
            label = ("&nbsp;&nbsp;↳ " if item.variant else "") + _cell(item.label)
            delta = "–" if item.delta is None else f"{item.delta:+.2f}"
            verdict = item.verdict()
            if verdict.startswith("settings differ") and item.reason:
                verdict = f"settings differ ({_cell(item.reason.split(': ', 1)[-1])})"
            out.append(
                f"| {label} | {paper} | {_entry_text(item.ours)} | {delta} | {verdict} | {_cell(item.rank())} "
                f"| {_entry_text(item.delivered)} |"
            )
    out += [""]
    out += claims_markdown(c, study_link)
    if c.alpha:
        out += [
            f"### Aggregation weights α (the paper's Figures 5-6) {{#alpha-{c.anchor}}}",
            "",
            f"Round {c.alpha[0].round}, layer {c.alpha[0].layer}, seed {c.seeds[0] if c.seeds else 0}: "
            + "; ".join(
                f"{_cell(v.label)} ([{v.study}]({study_link(v.study)})): {100 * v.extreme:.0f}% of "
                f"entries at 0 or 1, mean self-weight {v.self_weight:.2f}"
                for v in c.alpha
            )
            + ".",
            "",
        ]
        if any(v.heatmap for v in c.alpha):
            out += [
                "| " + " | ".join(_cell(v.label) for v in c.alpha) + " |",
                "|" + "---|" * len(c.alpha),
                "| " + " | ".join(f"![α heatmap, {_cell(v.label)}]({v.heatmap})" for v in c.alpha) + " |",
                "| " + " | ".join(f"![α over rounds, {_cell(v.label)}]({v.evolution})" for v in c.alpha) + " |",
                "",
            ]
    return out


def claims_markdown(column: GlanceColumn, study_link: Callable[[str], str]) -> list[str]:
    c = column
    if not c.claims:
        return []
    out = [f"### Orderings the paper claims {{#claims-{c.anchor}}}", ""]
    if c.chain is not None:
        out += [
            "Chain "
            + c.chain.text
            + ": "
            + "; ".join(
                f"{name} **{c.chain.verdict(name)}**"
                for name in JUDGED
                if any(link.judged(name) is not None for link in c.chain.links)
            )
            + ".",
            "",
        ]
    out += [
        "| ordering | paper | protocol | ours (± s.e.) | 95% CI | clients up / down | p | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim in c.claims:
        for j in claim.judgements:
            out.append(
                f"| {claim.text} | {_pp(claim.paper_difference)} | {j.protocol} | {j.mean_text()} | "
                f"{j.interval_text()} | {j.counts_text()} | {j.p_text()} | {j.verdict} |"
            )
    out += [""]
    return out


def default_glance(published: str | Path = "results/published") -> Glance | None:
    """The glance of `published`, or None when it holds no reproduced column."""
    glance = build_glance(published)
    return glance if glance.columns else None
