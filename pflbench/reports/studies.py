"""The leaderboard of all published studies (`pflbench leaderboard`, `make leaderboard`):

    out/index.html        one row per study: what ran (command), on which commit and machine, when, how
                          long, its cells' statuses, the methods' average ranks over its columns (ranks.py;
                          studies of several columns), and whether it is current, stale or failed
                          (pflbench/studies/publish.py, `study_state`); stale and failed studies are listed apart
    out/<study>/          that study's report, exactly as `pflbench report` makes it (tables under every
                          protocol, figures, a page per cell); each page carries the study's provenance
                          (`study_facts`) and each cell page the commands that reproduce it. The studies
                          that results/published/leaderboard.yaml puts beside it (its variants:
                          `pflbench.studies.publish.beside_studies`) have their rows in its tables too, as
                          `pflbench report --beside` shows them

Besides the published studies, `extra` stores (e.g. CI's fresh run of benchmarks/ci.yaml) are shown as
unpublished studies: made by the code being tested, with no manifest.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

from pflbench.studies.publish import beside_studies, read_manifest, studies, study_state
from pflbench.reports.build import ReportOptions, build_reports
from pflbench.reports.document import Report, safe_name
from pflbench.reports.glance import HOW_TO_READ, IDENTIFIED, Glance, build_glance, findings, write_csv, write_figures
from pflbench.reports.ranks import StudyRanks
from pflbench.reports.provenance import study_facts
from pflbench.reports.site import environment


def build_leaderboard(
    published: str | Path,
    out: str | Path,
    extra: dict[str, Path] | None = None,
    options: ReportOptions = ReportOptions(),
) -> Path:
    """Every study's report under `out/<study>/` and the index `out/index.html` (module doc)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    study_state.cache_clear()  # the code may have changed since the last build in this process
    beside = beside_studies(published)
    for folder in studies(published):
        name = safe_name(folder.name)
        report = build_reports(folder, out / name, replace(options, beside=tuple(beside.get(folder.name, ()))))
        facts = study_facts(folder)
        assert facts is not None, folder  # a published study's folder
        rows.append(
            {
                **facts,
                "url": f"{name}/index.html",
                "notes": report.notes,
                "published": True,
                "ranks": _first_ranks(report),
            }
        )
    for name, store in (extra or {}).items():
        report = build_reports(store, out / safe_name(name), options)
        manifest = read_manifest(store)
        rows.append(
            {
                "name": name,
                "url": f"{safe_name(name)}/index.html",
                "published": manifest is not None,
                "state": "unpublished",
                "command": "",
                "commit_short": "this checkout",
                "machines": [],
                "date": "–",
                "elapsed": "–",
                "cell_time": "–",
                "statuses": _statuses(store),
                "missing": 0,
                "cells": sum(_statuses(store).values()),
                "note": f"the store {store} (not published)",
                "stale": [],
                "failed": [],
                "incomplete": [],
                "dirty": False,
                "same_commit": True,
                "versions": {},
                "published_at": "–",
                "notes": report.notes,
                "ranks": _first_ranks(report),
            }
        )
    order = {"current": 0, "incomplete": 1, "unpublished": 2, "failed": 3, "stale": 4}
    glance = build_glance(published, level=options.level) if studies(published) else None
    kinds = study_groups(published, glance)
    for row in rows:
        row["group"] = kinds.get(row["name"], "other")
    rows.sort(key=lambda r: (order.get(r["state"], 9), GROUPS.index(r["group"]), r["name"]))
    context: dict = {"glance": None}
    if glance is not None and glance.columns:
        if options.figures:
            write_figures(glance, out / GLANCE_DIR, rel=f"{GLANCE_DIR}/", formats=("png",))
        write_csv(glance, out / GLANCE_DIR)
        context = {
            "glance": glance,
            "glance_findings": findings(glance),
            "glance_dir": f"{GLANCE_DIR}/",
            "glance_identified": [line.removeprefix("- ").replace("**", "") for line in IDENTIFIED],
            "glance_how": HOW_TO_READ.format(level=glance.level).replace("*", ""),
        }
    index = out / "index.html"
    index.write_text(
        environment()
        .get_template("studies.html")
        .render(
            studies=rows,
            generated=datetime.datetime.now().isoformat(timespec="seconds"),
            published=str(published),
            root="",
            results=str(published),
            study=None,
            docs_url=options.docs_url,
            docs_relative=False,
            groups=GROUP_TITLES,
            **context,
        )
    )
    return index


GLANCE_DIR = "results"  # the results page's figures and CSV, beside the index
GROUPS = ("reproduction", "variant", "other")
GROUP_TITLES = {
    "reproduction": "Reproduced columns (the paper's settings, every seed and variant beside them)",
    "variant": "Variants and controls (the paper's columns at changed settings or methods)",
    "other": "Other studies",
}


def study_groups(published: str | Path, glance: Glance | None) -> dict[str, str]:
    """{study: "reproduction" | "variant" | "other"}: a reproduced column's study and those beside it;
    then a study with cells on a reproduced column's dataset, scheme and clients (another setting, a
    variant method, a control); the rest."""
    from pflbench.loader.plugins import loaded_versions
    from pflbench.reports.cells import load_cells

    kinds: dict[str, str] = {}
    if glance is None:
        return kinds
    for column in glance.reproduced:
        for name in column.stores:
            kinds[name] = "reproduction"
    keys = {(c.column.dataset, c.scheme, c.column.clients) for c in glance.reproduced}
    for folder in studies(published):
        if folder.name in kinds:
            continue
        cells = load_cells(folder, (), plugins=loaded_versions())
        if len(cells) and any(
            (str(d), str(p), int(n)) in keys for d, p, n in zip(cells["dataset"], cells["partition"], cells["clients"])
        ):
            kinds[folder.name] = "variant"
    return kinds


def _first_ranks(report: Report) -> StudyRanks | None:
    """The study's ranks under the default protocol (as delivered, final round, mean over clients) when
    it has them (ranks.py: at least 2 columns), else under the first protocol that has them; or None."""
    from pflbench.reports.protocols import DEFAULT

    ranks = sorted(report.ranks, key=lambda r: r.protocol != DEFAULT)
    return ranks[0] if ranks else None


def _statuses(store: Path) -> dict:
    from collections import Counter

    from pflbench.storage.store import scan_store

    return dict(Counter(summary.get("status", "?") for _, _, summary in scan_store(store)[0]))
