"""Results at a glance: what reproduces and what does not, generated from the published studies.

A *reproduced column* is a published study named `table<N>-full` (or `table<N>-full-<dataset>`, a
column on another dataset than the paper's, e.g. `table1-full-cifar10-jpeg`) together with the studies
`leaderboard.yaml` puts beside it (its other seeds, its variants). Its paper is the reference file
(benchmarks/reference/*.csv) whose `table:` header is "Table <N>". A *variant column* is another
study with studies beside it whose name extends a column's (`table1-full-175`): the same table at
changed settings, judged on the paper's orderings only (no Δ: the settings differ).

For each column, one row per paper row: the paper's number, ours under the protocol the reference
declares for that row (and as delivered, for context), Δ = ours − paper, and two verdicts (against the
paper, within our column), and the orderings the paper claims judged under each protocol. The parts:

- pflbench.reports.glance_data     the page's data (rows, columns, the page) and the rows' verdicts;
- pflbench.reports.glance_columns  which studies are columns, and a column built from its studies;
- pflbench.reports.orderings       the paper's orderings, judged under each protocol;
- pflbench.reports.alpha_views     the aggregation weights α shown beside a column (pFedLA's Figures 5-6);
- pflbench.reports.carry_over      whether a column's conclusions hold on the same table on another dataset;
- pflbench.reports.findings        the findings at the top of the page;
- pflbench.reports.glance_page     the page as Markdown; pflbench.reports.glance_csv: its tables as CSV.

This module builds the page's data (`build_glance`) and is the page's way in: the names in `__all__` (the
data, the findings, the Markdown, CSV and figures); every other name is imported from its part.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pflbench.reports.alpha_views import attach_alpha, write_figures
from pflbench.reports.carry_over import attach_carry_over
from pflbench.reports.findings import findings
from pflbench.reports.glance_columns import build_column, column_studies, reference_of
from pflbench.reports.glance_csv import write_csv
from pflbench.reports.glance_data import Glance, GlanceColumn
from pflbench.reports.glance_page import HOW_TO_READ, IDENTIFIED, markdown
from pflbench.reports.orderings import JUDGED
from pflbench.reports.reference import Reference, default_reference_dir, load_references
from pflbench.reports.stats import LEVEL

# The page's way in: its data (`build_glance`), its findings, the page as Markdown and CSV, its figures;
# every other name is its part's (module doc).
__all__ = [
    "HOW_TO_READ",
    "IDENTIFIED",
    "JUDGED",
    "Glance",
    "build_glance",
    "findings",
    "markdown",
    "write_csv",
    "write_figures",
]


def build_glance(published: str | Path, references: Sequence[Reference] | None = None, level: float = LEVEL) -> Glance:
    """The page's data from the published studies under `published` (module doc): its columns, their α
    views and, for a column on another dataset, which conclusions of the paper's dataset carry over."""
    from pflbench.studies.publish import beside_studies

    published = Path(published)
    if references is None:
        references = load_references(default_reference_dir())
    beside = beside_studies(published)
    columns: list[GlanceColumn] = []
    found = column_studies(published)
    names = {folder.name for folder, _ in found}
    for folder, number in found:
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
                and name not in names  # a column of its own (`table1-full-cifar10-jpeg`)
                and not any(len(n) > len(folder.name) and name.startswith(n + "-") for n in names)
            ):
                variant = build_column(
                    published / name, beside[name], reference, f"Table {number}", level, variant_of=folder.name
                )
                if variant is not None:
                    columns.append(variant)
    glance = Glance(columns, str(published), level)
    attach_alpha(glance, published)
    attach_carry_over(glance)
    return glance
