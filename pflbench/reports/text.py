"""The tables of tables.py as Markdown and as LaTeX (booktabs). Names from the store are escaped
for each format; a missing entry is "–", a failed or diverged one says so."""
from __future__ import annotations

from pflbench.reports.tables import DATA_DIFFER, TUNED, CommTable, Entry, Table, mean_or_none

MISSING = "–"


# ---- Markdown ---------------------------------------------------------------------------------

def md_escape(text: str) -> str:
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("&", "&amp;")
            .replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*").replace("_", "\\_"))


def column_header(table: Table, column) -> str:
    mark = f" {DATA_DIFFER}" if column.data_note and table.has_paper(column) else ""
    return column.label.replace(f"{column.dataset},", f"{column.dataset}{mark},", 1)


def md_entry(entry: Entry | None) -> str:
    if entry is None:
        return MISSING
    text = md_escape(entry.text())
    return f"**{text}**" if entry.best else text


def legend(tables, sources: list[str]) -> list[str]:
    lines = []
    if sources:
        lines.append(f"paper: the number reported in {', '.join(sources)} (benchmarks/reference/); "
                     f"Δ: ours − paper, in percentage points.")
    if any(t.any_tuned for t in tables):
        lines.append(f"{TUNED} tuned hyperparameters (`hp_source: tuned`); unmarked entries use the paper defaults.")
    notes = {}
    for table in tables:
        notes.update(getattr(table, "data_notes", {}))
    for dataset, note in notes.items():
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
        cells = [md_escape(row.label)]
        for column in table.columns:
            entry = table.entry(row, column)
            cells.append(md_entry(entry))
            if table.has_paper(column):
                has = entry is not None and entry.paper is not None
                cells += [entry.paper_text() if has else MISSING, entry.delta_text() or MISSING if has else MISSING]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 2) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def markdown_comm_table(table: CommTable) -> str:
    header = ["algorithm", "accuracy (%)", "MB per round", "MB total"]
    if table.has_paper:
        header += ["paper accuracy (%)", "paper MB"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row, entry in table.rows:
        cells = [md_escape(row.label), md_entry(entry).replace("**", ""),
                 fmt(mean_or_none(entry.mbytes_per_round), 3), fmt(mean_or_none(entry.mbytes), 2)]
        if table.has_paper:
            cells += [entry.paper_text() or MISSING,
                      fmt(entry.paper.comm_mbytes if entry.paper else None)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(tables: list[Table], worst: list[Table], comm: list[CommTable], *, seeds: int,
                    statuses: dict[str, int], figures: list[tuple[str, str]] = ()) -> str:
    if not tables:
        return "# pflbench results\n\nThe store has no results yet: run `pflbench run SPEC` first.\n"
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    parts = ["# pflbench results", "",
             f"Cells: {counts}. Entries: final accuracy of each client's personalized model on its own test "
             f"split, mean over clients, in %: mean ± std over seeds (up to {seeds} per entry). Best of each "
             f"column in bold; failed or diverged cells are counted beside the entry, never averaged."]
    sources = sorted({s for t in tables for s in t.sources})
    for section, group in (("Accuracy", tables), ("Worst 10% of clients", worst)):
        parts += ["", f"## {section}"]
        for table in group:
            parts += ["", f"### {md_escape(table.title)}", "", markdown_table(table)]
            if table.notes:
                parts += ["", "Note: " + "; ".join(md_escape(n) for n in table.notes) + "."]
    if comm:
        parts += ["", "## Communication", "",
                  "Bytes sent down and up over the whole run (finished cells), in MB; accuracy as above."]
        for table in comm:
            parts += ["", f"### {md_escape(table.title)}", "", markdown_comm_table(table)]
        sources += sorted({e.paper.source for t in comm for _, e in t.rows if e.paper} - set(sources))
    lines = legend([*tables, *comm], sources)
    if lines:
        parts += ["", "## Legend", "", *[f"- {line}" for line in lines]]
    if figures:
        parts += ["", "## Figures", "", *[f"- [{md_escape(title)}]({path})" for title, path in figures]]
    return "\n".join(parts) + "\n"


# ---- LaTeX (booktabs) -------------------------------------------------------------------------

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                 "<": r"\textless{}", ">": r"\textgreater{}"}


def tex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def tex_text(text: str) -> str:
    """Escape, then typeset the report's symbols."""
    return (tex_escape(text).replace("±", r"$\pm$").replace(TUNED, r"$^\dagger$")
            .replace(DATA_DIFFER, r"$^\ddagger$").replace("Δ", r"$\Delta$").replace("×", r"$\times$")
            .replace("−", "-").replace("–", "--"))


def tex_entry(entry: Entry | None) -> str:
    if entry is None:
        return "--"
    text = tex_text(entry.text())
    return rf"\textbf{{{text}}}" if entry.best else text


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
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{tex_text(table.title)}: mean $\pm$ std over seeds (\%).}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(top) + r" \\"]
    if any(s > 1 for s in spans):
        lines += [" ".join(rules), " & ".join(second) + r" \\"]
    lines.append(r"\midrule")
    for row in table.rows:
        cells = [tex_text(row.label)]
        for column, span in zip(table.columns, spans):
            entry = table.entry(row, column)
            cells.append(tex_entry(entry))
            if span > 1:
                has = entry is not None and entry.paper is not None
                cells += [tex_text(entry.paper_text()) if has else "--",
                          tex_text(entry.delta_text() or "--") if has else "--"]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = legend([table], table.sources) + list(table.notes)
    if notes:
        lines.append(r"\par\smallskip\footnotesize " + r" \\ ".join(tex_text(n).replace("`", "") for n in notes))
    lines.append(r"\end{table}")
    return "\n".join(lines)


def latex_comm_table(table: CommTable) -> str:
    paper = table.has_paper
    header = ["Algorithm", r"Accuracy (\%)", "MB/round", "MB total"] + ([r"Paper acc.\ (\%)", "Paper MB"] if paper else [])
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{tex_text(table.title)}.}}",
             rf"\begin{{tabular}}{{l{'r' * (len(header) - 1)}}}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    for row, entry in table.rows:
        cells = [tex_text(row.label), tex_text(entry.text()) or "--",
                 fmt(mean_or_none(entry.mbytes_per_round), 3).replace(MISSING, "--"),
                 fmt(mean_or_none(entry.mbytes)).replace(MISSING, "--")]
        if paper:
            cells += [tex_text(entry.paper_text()) or "--",
                      fmt(entry.paper.comm_mbytes if entry.paper else None).replace(MISSING, "--")]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def latex_report(tables: list[Table], worst: list[Table], comm: list[CommTable]) -> str:
    parts = ["% pflbench results: \\usepackage{booktabs} in the preamble.",
             "% Generated by `pflbench report`; every name from the results store is escaped."]
    parts += [latex_table(t) for t in [*tables, *worst]]
    parts += [latex_comm_table(t) for t in comm]
    return "\n\n".join(parts) + "\n"
