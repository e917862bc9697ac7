"""Reports of a results store: tables, figures and the static HTML leaderboard.

One idea per module, each reading only what the one before it produced:

    cells.py      the store as one row per cell, plus each cell's curves and artifacts
    protocols.py  evaluation protocols: (model delivered|adapted) x (selection final|bestval|besttest)
                  x (averaging clients|pooled|worst10) -> the summary key, label and caption
    reference.py  papers' numbers transcribed into benchmarks/reference/*.csv, each with its protocol
                  and settings; `compare` says whether a cell may get a Δ against one
    rows.py       what makes a row: an algorithm, the setting its cells differ in (labelled by it), tuned
    tables.py     pFedLA's table layout (algorithms x (dataset, clients) per scheme), one per protocol,
                  and Table 3's accuracy/communication layout, as data: entries with mean, std, status,
                  paper number and its comparison
    stats.py      which differences are real: the paired test behind each table's bold and ≈ marks,
                  paired differences, Friedman + Nemenyi ranks (scipy.stats)
    samples.py    an entry's per-client accuracies under a protocol, for those tests
    text.py       those tables as Markdown and LaTeX (booktabs)
    figures.py    matplotlib figures (PNG and SVG); each returns the data it drew
    site.py       the self-contained HTML leaderboard (Jinja2 templates in templates/)
    build.py      everything above for one store: `build_reports(results, out)`

(`from pflbench.reports.build import build_reports`: the package itself imports nothing, so a module of it
loads only what it needs.)
"""
