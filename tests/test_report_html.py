"""The HTML leaderboard: well-formed pages, every cell present with its page, hostile strings from the
store rendered as text, failed and diverged cells shown as such; and `pflbench report` end to end."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from report_helpers import dirichlet_alpha, write_cell

from pflbench.cli import main
from pflbench.reports.build import ReportOptions, build_reports
from pflbench.reports.cells import load_cells

HOSTILE = "<script>alert('pwned')</script>"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Checker(HTMLParser):
    """Tags balanced (void elements aside), scripts counted, text and attributes collected."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.scripts, self.text = [], [], 0, []
        self.rows: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
        attrs = dict(attrs)
        if tag == "tr" and "data-hash" in attrs:
            self.rows.append(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}> at {self.getpos()}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check(path: Path) -> Checker:
    checker = Checker()
    checker.feed(path.read_text())
    checker.close()
    assert not checker.errors and not checker.stack, (path, checker.errors[:3], checker.stack)
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert checker.scripts == 1, f"{path}: only the page's own script may run"
    return checker


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    write_cell(root, algorithm="fedavg", seed=0, accuracies=(0.7, 0.8))
    write_cell(root, algorithm="fedavg", seed=1, accuracies=(0.6, 0.9))
    write_cell(root, algorithm=HOSTILE, hp={"note": HOSTILE}, accuracies=(0.5, 0.5))
    write_cell(root, algorithm="local", status="failed", error=f"Traceback\nValueError: {HOSTILE}")
    write_cell(root, algorithm="local", seed=1, status="diverged", error="round 2: non-finite test loss")
    alpha = {f"alpha_round{r:05d}": dirichlet_alpha(2, 3, seed=r) for r in (1, 2, 3)}
    alpha.update({f"alpha_layers_round{r:05d}": np.array(["conv1", "fc1", HOSTILE]) for r in (1, 2, 3)})
    write_cell(root, algorithm="pfedla", accuracies=(0.9, 0.95), artifacts=alpha)
    # Another algorithm's artifact that happens to be called alpha (APFL's mixing weights): drawn generically.
    write_cell(root, algorithm="apfl", accuracies=(0.6, 0.6), artifacts={"alpha_round00003": np.array([0.25, 0.75])})
    out = tmp_path_factory.mktemp("reports")
    report = build_reports(root, out, ReportOptions(partitions=False, formats=("png",)))
    return root, out, report


def test_pages_are_well_formed_and_escape_store_values(site):
    root, out, _ = site
    pages = [out / "index.html", *(out / "cells").glob("*.html"), *(out / "algorithms").glob("*.html")]
    assert len(pages) == 1 + 7 + 5
    for page in pages:
        check(page)
        assert "<script>alert" not in page.read_text()
    index = check(out / "index.html")
    assert HOSTILE in "".join(index.text)  # shown, as text
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in (out / "index.html").read_text()
    failed = next(p for p in (out / "cells").glob("*.html") if "ValueError" in p.read_text())
    assert HOSTILE in "".join(check(failed).text)
    assert not any(p.name.startswith("<") for p in out.rglob("*"))  # file names made safe


def test_every_cell_is_listed_with_its_status_and_page(site):
    root, out, _ = site
    cells = load_cells(root)
    rows = check(out / "index.html").rows
    assert sorted(r["data-hash"] for r in rows) == sorted(cells["hash"])
    status = {r["data-hash"]: r["data-status"] for r in rows}
    assert sorted(status.values()) == ["diverged", "failed"] + ["finished"] * 5
    for h in cells["hash"]:
        assert (out / "cells" / f"{h}.html").exists()
    html = (out / "index.html").read_text()
    assert "diverged" in html and "failed" in html
    assert ">0.00<" not in html  # a failed cell is not a zero


def test_cell_page_shows_artifacts_and_pfedla_figures(site):
    _, out, report = site
    pfedla = next(p for p in (out / "cells").glob("*.html") if "alpha_layers" in p.read_text())
    text = pfedla.read_text()
    assert "2 × 3 × 2" in text and "fig6_alpha_heatmap.png" in text and "fig5_alpha_evolution.png" in text
    figures = [f for figs in report.cell_figures.values() for f in figs]
    assert sorted(f["kind"] for f in figures) == ["alpha"] * 3 + ["artifact"] and not report.notes
    for f in figures:
        assert (out / f["path"]).stat().st_size > 1000
    assert "<polyline" in text  # the inline accuracy curve
    assert (out / "figures").is_dir() and any((out / "figures").glob("curves_*.png"))


def test_report_command_writes_tables_and_site(site, tmp_path, capsys):
    root, _, _ = site
    assert main(["report", "--results", str(root), "--out", str(tmp_path), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "| FedAvg |" in out and "open it in a browser" in out
    assert {p.name for p in tmp_path.iterdir()} >= {"report.md", "report.tex", "index.html", "cells", "algorithms"}
    assert "\\begin{tabular}" in (tmp_path / "report.tex").read_text()
    with pytest.raises(SystemExit, match="unknown format"):
        main(["report", "--results", str(root), "--out", str(tmp_path), "--formats", "gif"])
