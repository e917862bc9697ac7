"""Reports of a results store: tables, figures and the static HTML leaderboard.

One idea per module, each reading only what the one before it produced:

    cells.py      the store as one row per cell, plus each cell's curves and artifacts
    reference.py  papers' numbers transcribed into benchmarks/reference/*.csv
    tables.py     pFedLA's table layout (algorithms x (dataset, clients) per scheme) and Table 3's
                  accuracy/communication layout, as data: entries with mean, std, status, paper number
    text.py       those tables as Markdown and LaTeX (booktabs)
    figures.py    matplotlib figures (PNG and SVG); each returns the data it drew
    site.py       the self-contained HTML leaderboard (Jinja2 templates in templates/)
    build.py      everything above for one store: `build_reports(results, out)`
"""
from pflbench.reports.build import ReportOptions, build_reports

__all__ = ["ReportOptions", "build_reports"]
