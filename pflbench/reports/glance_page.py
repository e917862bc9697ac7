"""The results page as MkDocs Markdown (pflbench.reports.glance): findings, what is identified, the column
tables, the orderings, α."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pflbench.reports.findings import signed_points, seeds_text, findings
from pflbench.reports.glance_data import Glance, GlanceColumn, GlanceRow
from pflbench.reports.orderings import JUDGED
from pflbench.reports.tables import Entry


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
        f"[orderings]({csv_rel}results_orderings.csv)"
        + (f", [what carries over]({csv_rel}results_carry_over.csv)." if any(c.carry for c in g.columns) else "."),
        "",
        "## Findings",
        "",
    ]
    for f in findings(g):
        lines.append(f"- {_cell(f.text)} [→ evidence]({f.link})")
    lines += ["", "## What is identified, what is only shown, what was not run", "", *IDENTIFIED, ""]
    homes = {c.study: c for c in g.reproduced}
    for column in g.reproduced:
        lines += column_markdown(column, study_link, homes.get(column.home))
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
    "*not run* (or *not yet run*: its study's command plans cells for it that have no result yet).",
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
    "adaptation against the personalized one as delivered. *Carries over*: on a column on another dataset "
    "than the paper's, a conclusion of the same table's column on the paper's dataset (which row is above, or "
    "not separated; α one-hot or not) that our cells there say too; not yet decidable while a row it needs "
    "has no result."
).replace("{level_ci}", "95%")


def _other(text: str, column: GlanceColumn) -> str:
    """A number of the paper's for another dataset than ours: greyed and in italics, the difference named."""
    return f'<span class="other-dataset" title="{column.column.data_note}">*{text}*</span>'


def column_markdown(
    column: GlanceColumn, study_link: Callable[[str], str], home: GlanceColumn | None = None
) -> list[str]:
    """A reproduced column's section; `home`: for a column on another dataset, the column on the paper's
    dataset whose conclusions it checks (pflbench.reports.carry_over)."""
    c = column
    out = [
        f"## {_cell(c.title)} {{#{c.anchor}}}",
        "",
        f"**{c.state}.** Protocol: {c.protocol.label} (the paper's, as the reference file reads it). "
        f"{seeds_text(c).capitalize()}. Studies: " + ", ".join(f"[{s}]({study_link(s)})" for s in c.stores) + ".",
        "",
    ]
    if c.other_dataset:
        out += [
            f"The paper's numbers are for {c.column.paper_dataset}, ours for {c.column.dataset}"
            + (f"; {c.column.data_note}" if c.column.data_note else "")
            + ". The paper's are shown greyed and *in italics* as another dataset's, with no Δ and no verdict "
            "against them; a row whose cells are still to run is *not yet run*, with no number.",
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
                paper = _other(f"{paper} ({c.column.paper_dataset})", c)
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
                f"{_cell(v.label)} ([{v.study}]({study_link(v.study)})): {v.collapse_text()}, "
                f"mean self-weight {v.self_weight:.2f}"
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
    if home is not None:
        out += carry_markdown(c, home)
    return out


def carry_markdown(column: GlanceColumn, home: GlanceColumn) -> list[str]:
    """Whether each conclusion of `home` (the paper's dataset) carries over to `column`."""
    c = column
    out = [
        f"### Do the conclusions of {_cell(home.short)} carry over? {{#carry-{c.anchor}}}",
        "",
        f"Each conclusion our cells on {home.column.dataset} draw (which of two rows the paper orders is above "
        f"when the paired test separates them; whether α is one-hot), checked on the cells published here; "
        f"not yet decidable while a row it needs has no result here.",
        "",
    ]
    if not c.carry:
        return out + [f"No conclusion of {_cell(home.short)} to check.", ""]
    out += [
        f"| conclusion | protocol | on {home.column.dataset} | here, on {c.column.dataset} | carries over? |",
        "|---|---|---|---|---|",
    ]
    for item in c.carry:
        out.append(
            f"| {_cell(item.conclusion)} | {item.protocol or '–'} | {_cell(item.there)} | {_cell(item.here)} "
            f"| {item.verdict} |"
        )
    return out + [""]


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
        paper = signed_points(claim.paper_difference)
        if c.other_dataset and not c.variant_of:
            paper = _other(f"{paper} ({c.column.paper_dataset})", c)
        for j in claim.judgements:
            out.append(
                f"| {claim.text} | {paper} | {j.protocol} | {j.mean_text()} | "
                f"{j.interval_text()} | {j.counts_text()} | {j.p_text()} | {j.verdict} |"
            )
    out += [""]
    return out
