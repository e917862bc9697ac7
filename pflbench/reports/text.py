"""The tables of tables.py as Markdown and as LaTeX (booktabs). Names from the store are escaped
for each format; a missing entry is "–", a failed or diverged one says so. Every table's caption
names its protocol (protocols.py); a paper number without a Δ carries a footnote [n] saying why
(protocol or settings differ); a paper number under another protocol is shown in parentheses;
reference rows (Centralized) come last, in italics, never bold. Bold and the tie mark ≈ are decided by
paired tests (tables.mark_best, stats.py), and every accuracy table's caption names the test."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from pflbench.reports.protocols import Protocol
from pflbench.reports.rows import TUNED, Row
from pflbench.reports.tables import DATA_DIFFER, TIED, Column, CommTable, Entry, Table, mean_or_none, payload_text

if TYPE_CHECKING:
    from pflbench.reports.differences import DifferenceTable
    from pflbench.reports.ranks import StudyRanks

MISSING = "–"


# ---- Markdown ---------------------------------------------------------------------------------


def md_escape(text: str) -> str:
    return (
        str(text)
        .replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("*", "\\*")
        .replace("_", "\\_")
    )


def column_header(table: Table, column: Column) -> str:
    mark = f" {DATA_DIFFER}" if column.data_note and table.has_paper(column) else ""
    return column.label.replace(f"{column.dataset},", f"{column.dataset}{mark},", 1)


def md_entry(entry: Entry | None, reference: bool = False) -> str:
    if entry is None:
        return MISSING
    text = md_escape(entry.text())
    if reference and text:
        return f"*{text}*"
    return f"**{text}**" if entry.best else text


def md_label(row: Row) -> str:
    return f"*{md_escape(row.label)}*" if row.reference else md_escape(row.label)


def paper_cell(entry: Entry | None) -> str:
    """The paper's number; in parentheses when declared under another protocol than the table's."""
    if entry is None or entry.paper is None:
        return MISSING
    return f"({entry.paper_text()})" if entry.other_protocol else entry.paper_text()


def delta_cell(entry: Entry | None) -> str:
    if entry is None or entry.paper is None:
        return MISSING
    return entry.delta_text() or (MISSING + entry.mark())


def footnote_lines(footnotes: list[str]) -> list[str]:
    return [f"[{n}] no Δ: {reason}." for n, reason in enumerate(footnotes, 1)]


def legend(tables: Sequence[Table | CommTable], sources: list[str]) -> list[str]:
    lines = []
    if sources:
        lines.append(
            f"paper: the number reported in {', '.join(sources)} (benchmarks/reference/); "
            f"Δ: ours − paper, in percentage points, only where the paper's protocol and settings "
            f"(rounds, local epochs, clients, participation, lr, samples per client, train/validation fractions, "
            f"batch size, momentum, weight decay, model, dataset: each one its reference declares) are ours; "
            f"otherwise a footnote [n] says what differs. (In parentheses: a paper number declared "
            f"under another protocol than the table's, for reading only.)"
        )
    if any(r.reference for t in tables for r in ([r for r, _ in t.rows] if isinstance(t, CommTable) else t.rows)):
        lines.append(
            "*Italic rows* (Centralized (reference)): reference algorithms, a bound for a single global "
            "model rather than a federated method; listed last, never counted as best."
        )
    if any(t.any_tuned for t in tables):
        lines.append(f"{TUNED} tuned hyperparameters (`hp_source: tuned`); unmarked entries use the paper defaults.")
    notes: dict[str, str] = {}
    for table in tables:
        notes.update(getattr(table, "data_notes", {}))
    for _dataset, note in notes.items():
        lines.append(f"{DATA_DIFFER} {note}.")
    return lines


def markdown_table(table: Table) -> str:
    header, rule = ["algorithm"], ["---"]
    for column in table.columns:
        header.append(md_escape(column_header(table, column)))
        rule.append("---:")
        if table.has_paper(column):
            header += ["paper", "Δ"]
            rule += ["---:", "---:"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    for row in table.rows:
        cells = [md_label(row)]
        for column in table.columns:
            entry = table.entry(row, column)
            cells.append(md_entry(entry, row.reference))
            if table.has_paper(column):
                cells += [paper_cell(entry), delta_cell(entry)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_caption(table: Table) -> str:
    budget = f" {md_escape(table.budget)}" if table.budget else ""
    return f"*{md_escape(table.caption)} Mean ± std over seeds, in %. {md_escape(table.marks)}{budget}*"


def untested_lines(table: Table) -> list[str]:
    return [f"No best marked on {md_escape(line)}." for line in getattr(table, "untested", [])]


def identical_lines(table: Table) -> list[str]:
    return [f"= {md_escape(line)}." for line in getattr(table, "identical", [])]


def fmt(value: float | None, digits: int = 2) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def comm_paper_header(table: CommTable) -> str:
    protocol = table.paper_protocol
    return "paper accuracy (%)" + (f" ({protocol.short})" if protocol else "")


def comm_paper_text(table: CommTable, row: Row) -> tuple[str, str]:
    """The paper's accuracy (with the footnote when not comparable) and MB for one row."""
    entry = table.papered(row)
    if entry is None:
        return MISSING, MISSING
    return entry.paper_text() + entry.mark(), fmt(entry.paper.comm_mbytes if entry.paper is not None else None)


def markdown_comm_table(table: CommTable) -> str:
    header = (
        ["algorithm", "accuracy (%)"]
        + (["adapted accuracy (%)"] if table.adapted else [])
        + (["newcomers accuracy (%)"] if table.newcomers else [])
        + [
            "model",
            "parameters per client (down)",
            "KB per client per round (down / up)",
            "MB per round",
            "MB total",
            "wall s",
        ]
    )
    if table.has_paper:
        header += [comm_paper_header(table), "paper MB"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row, entry in table.rows:
        cells = [md_label(row), md_entry(entry).replace("**", "")]
        if table.adapted:
            cells.append(md_entry(table.adapted.get(row.key)).replace("**", ""))
        if table.newcomers:
            cells.append(md_entry(table.newcomers.get(row.key)).replace("**", ""))
        cells += [md_escape(t) for t in payload_text(entry)]
        cells += [
            fmt(mean_or_none(entry.mbytes_per_round), 3),
            fmt(mean_or_none(entry.mbytes), 2),
            fmt(mean_or_none(entry.wall_times), 1),
        ]
        if table.has_paper:
            cells += list(comm_paper_text(table, row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_differences(view: DifferenceTable) -> str:
    """A difference view (differences.py) as a Markdown table: a line per (row, column)."""
    several = view.several_columns
    header = (
        ["algorithm"]
        + (["column"] if several else [])
        + [
            f"− {md_escape(view.baseline_label)} (pp, ± s.e.)",
            f"{100 * (1 - view.table.level):g}% CI",
            "clients up / down / equal",
            "p",
            "paired on",
        ]
    )
    lines = ["| " + " | ".join(header) + " |", "|---|" + ("---|" if several else "") + "---:|---:|---:|---:|---|"]
    for d in view.lines:
        label = md_label(d.row) + (f" {md_escape(d.entry.same_text())}" if d.entry.same_as is not None else "")
        mean = d.mean_text()
        cells = (
            [label]
            + ([md_escape(d.column.label)] if several else [])
            + [
                f"**{mean}**" if d.separated else mean,
                d.interval_text(),
                d.counts_text(),
                d.p_text(),
                md_escape(d.units_text()),
            ]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_difference_section(view: DifferenceTable) -> list[str]:
    parts = [
        "",
        f"#### {md_escape(view.title)}",
        "",
        markdown_differences(view),
        "",
        f"*{md_escape(view.caption)} Bold: the test separates the two at level {view.table.level:g}.*",
    ]
    if view.missing:
        parts += ["", f"No {md_escape(view.baseline_label)} row on: {md_escape(', '.join(view.missing))}."]
    return parts


def markdown_ranks(ranks: StudyRanks) -> list[str]:
    """The ranks across a study under one protocol (ranks.py): a table by average rank, the Friedman
    test, the critical difference and its groups, and the diagram."""
    lines = ["| method | average rank | best in columns |", "|---|---:|---:|"]
    for i in ranks.order:
        lines.append(f"| {md_escape(ranks.methods[i])} | {ranks.ranks[i]:.2f} | {ranks.best_block_count(i)} |")
    parts = [
        "",
        f"## Ranks across the study: {md_escape(ranks.protocol.label)}",
        "",
        *lines,
        "",
        f"*{md_escape(ranks.caption)}*",
        "",
        f"Not told apart (within CD = {ranks.cd:.2f}): {md_escape(ranks.group_text())}.",
        "",
        f"Columns: {md_escape('; '.join(ranks.blocks))}.",
    ]
    if ranks.left_out:
        parts += ["", f"Not ranked: {md_escape('; '.join(ranks.left_out))}."]
    if ranks.figure:
        parts += ["", f"![critical-difference diagram]({ranks.figure})"]
    return parts


def by_protocol(tables: list[Table]) -> list[tuple[Protocol, list[Table]]]:
    groups: dict[Protocol, list[Table]] = {}
    for table in tables:
        groups.setdefault(table.protocol, []).append(table)
    return list(groups.items())


def markdown_report(
    tables: list[Table],
    worst: list[Table],
    comm: list[CommTable],
    *,
    seeds: int,
    statuses: dict[str, int],
    figures: Sequence[tuple[str, str]] = (),
    notices: Sequence[str] = (),
    differences: dict[str, DifferenceTable] | None = None,
    ranks: Sequence[StudyRanks] = (),
) -> str:
    """`tables` and `worst`: the accuracy and worst-10% tables of every protocol shown, in order;
    `notices`: what the tables do not show (datasets left out, cells still running), listed first;
    `differences`: the difference view of a table, by its id (differences.py), shown below it;
    `ranks`: the ranks across the study, per protocol (ranks.py)."""
    differences = differences or {}
    notice = ["", "## Not in these tables", "", *[f"- {md_escape(n)}" for n in notices]] if notices else []
    if not tables:
        return (
            "\n".join(
                ["# pflbench results", "", "The store has no results yet: run `pflbench run SPEC` first.", *notice]
            )
            + "\n"
        )
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    shown = list(dict.fromkeys(t.protocol.label for t in tables))
    parts = [
        "# pflbench results",
        "",
        f"Cells: {counts}. Entries: the test accuracy of each client's personalized model on its own test "
        f"split, in %: mean ± std over seeds (up to {seeds} per entry), under the protocol each table's "
        f"caption names (the model scored, the round selected, the averaging); shown: "
        f"{'; '.join(shown)}. Bold: the best of a column, only where a paired test on the clients' test splits "
        f"separates it from every other row; {TIED}: rows the test cannot tell from the best (each caption names "
        f"the test and its level; rows of a heterogeneity knob setting are ranked among themselves); failed or "
        f"diverged cells are counted beside the entry, never averaged.",
    ]
    parts += notice
    sources = sorted({s for t in tables for s in t.sources})
    for section, group in (("Accuracy", tables), ("Worst 10% of clients", worst)):
        for protocol, members in by_protocol(group):
            parts += ["", f"## {section}: {md_escape(protocol.label)}"]
            for table in members:
                parts += ["", f"### {md_escape(table.title)}", "", markdown_table(table), "", markdown_caption(table)]
                if table.footnotes:
                    parts += ["", *[f"- {md_escape(line)}" for line in footnote_lines(table.footnotes)]]
                if table.identical:
                    parts += ["", *[f"- {line}" for line in identical_lines(table)]]
                if table.untested:
                    parts += ["", *[f"- {line}" for line in untested_lines(table)]]
                if table.notes:
                    parts += ["", "Note: " + "; ".join(md_escape(n) for n in table.notes) + "."]
                if table.id in differences:
                    parts += markdown_difference_section(differences[table.id])
    if comm:
        parts += [
            "",
            "## Communication",
            "",
            f"Bytes sent down and up over the whole run (finished cells), in MB; accuracy "
            f"{md_escape(comm[0].caption.removeprefix('Accuracy: '))}",
        ]
        for comm_table in comm:
            budget = f" {md_escape(comm_table.budget)}" if comm_table.budget else ""
            parts += [
                "",
                f"### {md_escape(comm_table.title)}",
                "",
                markdown_comm_table(comm_table),
                "",
                f"*{md_escape(comm_table.caption)}{budget}*",
            ]
            if comm_table.footnotes:
                parts += ["", *[f"- {md_escape(line)}" for line in footnote_lines(comm_table.footnotes)]]
        sources += sorted(
            {e.paper.source for t in comm for r, _ in t.rows if (e := t.papered(r)) and e.paper is not None}
            - set(sources)
        )
    for ranking in ranks:
        parts += markdown_ranks(ranking)
    lines = legend([*tables, *comm], sources)
    if lines:
        parts += ["", "## Legend", "", *[f"- {line}" for line in lines]]
    if figures:
        parts += ["", "## Figures", "", *[f"- [{md_escape(title)}]({path})" for title, path in figures]]
    return "\n".join(parts) + "\n"


# ---- LaTeX (booktabs) -------------------------------------------------------------------------

LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


def tex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def tex_text(text: str) -> str:
    """Escape, then typeset the report's symbols."""
    return (
        tex_escape(text)
        .replace("±", r"$\pm$")
        .replace(TUNED, r"$^\dagger$")
        .replace(DATA_DIFFER, r"$^\ddagger$")
        .replace("Δ", r"$\Delta$")
        .replace("×", r"$\times$")
        .replace("−", "-")
        .replace("—", "---")
        .replace("–", "--")
        .replace("·", r"$\cdot$")
        .replace("≈", r"$\approx$")
    )


def tex_entry(entry: Entry | None, reference: bool = False) -> str:
    if entry is None:
        return "--"
    text = tex_text(entry.text())
    if reference:
        return rf"\textit{{{text}}}" if text else text
    return rf"\textbf{{{text}}}" if entry.best else text


def tex_label(row: Row) -> str:
    return rf"\textit{{{tex_text(row.label)}}}" if row.reference else tex_text(row.label)


def tex_rows(rows: Iterable[Row]) -> Iterator[tuple[Row, bool]]:
    r"""Rows with a \midrule before the first reference row (Centralized: apart from the methods)."""
    previous = None
    for row in rows:
        yield row, bool(row.reference and previous is not None and not previous.reference)
        previous = row


def latex_table(table: Table) -> str:
    spans = [3 if table.has_paper(c) else 1 for c in table.columns]
    spec = "l" + "".join("c" * s for s in spans)
    top, second, rules, start = ["Algorithm"], [""], [], 2
    for column, span in zip(table.columns, spans):
        head = tex_text(column_header(table, column))
        top.append(rf"\multicolumn{{{span}}}{{c}}{{{head}}}" if span > 1 else head)
        second += ["ours", "paper", r"$\Delta$"] if span > 1 else ["ours"]
        rules.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
        start += span
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_text(table.title)}: mean $\pm$ std over seeds (\%). {tex_text(table.caption)} "
        rf"{tex_text(table.marks)}{(' ' + tex_text(table.budget)) if table.budget else ''}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(top) + r" \\",
    ]
    if any(s > 1 for s in spans):
        lines += [" ".join(rules), " & ".join(second) + r" \\"]
    lines.append(r"\midrule")
    for row, rule in tex_rows(table.rows):
        if rule:
            lines.append(r"\midrule")
        cells = [tex_label(row)]
        for column, span in zip(table.columns, spans):
            entry = table.entry(row, column)
            cells.append(tex_entry(entry, row.reference))
            if span > 1:
                cells += [tex_text(paper_cell(entry)), tex_text(delta_cell(entry))]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = (
        legend([table], table.sources)
        + footnote_lines(table.footnotes)
        + [f"= {line}." for line in table.identical]
        + [f"No best marked on {line}." for line in table.untested]
        + list(table.notes)
    )
    if notes:
        lines.append(r"\par\smallskip\footnotesize " + r" \\ ".join(tex_text(n).replace("`", "") for n in notes))
    lines.append(r"\end{table}")
    return "\n".join(lines)


def latex_comm_table(table: CommTable) -> str:
    paper = table.has_paper
    header = (
        ["Algorithm", r"Accuracy (\%)"]
        + ([r"Adapted (\%)"] if table.adapted else [])
        + ([r"Newcomers (\%)"] if table.newcomers else [])
        + ["Model", "Params/client", "KB/client/round (down/up)", "MB/round", "MB total", "Wall s"]
        + ([tex_text(comm_paper_header(table)).replace("paper accuracy", "Paper acc."), "Paper MB"] if paper else [])
    )
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_text(table.title)}. {tex_text(table.caption)}{(' ' + tex_text(table.budget)) if table.budget else ''}}}",
        rf"\begin{{tabular}}{{l{'r' * (len(header) - 1)}}}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
    ]
    for (row, entry), (_, rule) in zip(table.rows, tex_rows([r for r, _ in table.rows])):
        if rule:
            lines.append(r"\midrule")
        cells = [tex_label(row), tex_text(entry.text()) or "--"]
        if table.adapted:
            adapted = table.adapted.get(row.key)
            cells.append(tex_text(adapted.text()) if adapted is not None and adapted.text() else "--")
        if table.newcomers:
            newcomers = table.newcomers.get(row.key)
            cells.append(tex_text(newcomers.text()) if newcomers is not None and newcomers.text() else "--")
        cells += [tex_text(t).replace(MISSING, "--") for t in payload_text(entry)]
        cells += [
            fmt(mean_or_none(entry.mbytes_per_round), 3).replace(MISSING, "--"),
            fmt(mean_or_none(entry.mbytes)).replace(MISSING, "--"),
            fmt(mean_or_none(entry.wall_times), 1).replace(MISSING, "--"),
        ]
        if paper:
            cells += [tex_text(t).replace(MISSING, "--") for t in comm_paper_text(table, row)]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.footnotes:
        lines.append(
            r"\par\smallskip\footnotesize " + r" \\ ".join(tex_text(n) for n in footnote_lines(table.footnotes))
        )
    lines.append(r"\end{table}")
    return "\n".join(lines)


def latex_report(tables: list[Table], worst: list[Table], comm: list[CommTable]) -> str:
    parts = [
        "% pflbench results: \\usepackage{booktabs} (and amssymb, for the who-copes marks) in the preamble.",
        "% Generated by `pflbench report`; every name from the results store is escaped.",
    ]
    parts += [latex_table(t) for t in [*tables, *worst]]
    parts += [latex_comm_table(t) for t in comm]
    return "\n\n".join(parts) + "\n"
