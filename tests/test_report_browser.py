"""A real browser: headless Chromium loads reports/index.html from disk, sorting by a column (a click
on its header, made by the page's own script from the address's #sort=...) changes the order of the
rows, filtering hides rows, and a screenshot is taken. Installs nothing: skipped where no Chromium
binary is on PATH (`.ci/run` installs Debian's `chromium`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from budgets import scaled
from report_helpers import write_cell

from pflbench.reports.build import ReportOptions, build_reports

BROWSER = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(name)),
    None,
)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium binary on PATH (apt-get install chromium; .ci/run does)"
)


def chromium(tmp_path, *args: str) -> str:
    command = [
        BROWSER,
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.insert(2, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(90))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def hashes(dom: str, hidden: bool = True) -> list[str]:
    """The cells table's rows in page order (optionally without the hidden ones)."""
    table = dom[dom.index('id="cells"') :]
    rows = re.findall(r"<tr ([^>]*data-hash=\"([0-9a-f]+)\"[^>]*)>", table)
    return [h for attrs, h in rows if hidden or " hidden" not in f" {attrs}"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    accuracy = {}
    # Stored order (algorithm, then seed) differs from accuracy order.
    for algorithm, seed, acc in (("fedavg", 0, 0.55), ("fedavg", 1, 0.95), ("local", 0, 0.75), ("pfedla", 0, 0.65)):
        accuracy[write_cell(root, algorithm=algorithm, seed=seed, accuracies=(acc, acc))] = acc
    accuracy[write_cell(root, algorithm="local", seed=1, status="failed", error="boom")] = None
    out = tmp_path_factory.mktemp("reports")
    build_reports(root, out, ReportOptions(figures=False))
    return out, accuracy


def test_sorting_filtering_and_screenshot(site, tmp_path):
    out, accuracy = site
    url = (out / "index.html").as_uri()
    before = hashes(chromium(tmp_path, "--dump-dom", url))
    assert sorted(before) == sorted(accuracy) and before[-1] != max(accuracy, key=lambda h: accuracy[h] or 0)

    after = hashes(chromium(tmp_path, "--dump-dom", url + "#sort=cells-final_accuracy"))
    finished = sorted((h for h in accuracy if accuracy[h] is not None), key=lambda h: -accuracy[h])
    assert after == finished + [h for h in accuracy if accuracy[h] is None]  # descending; the failed cell last
    assert after != before

    ascending = hashes(chromium(tmp_path, "--dump-dom", url + "#sort=cells-final_accuracy&dir=asc"))
    assert ascending[:-1] == finished[::-1]

    dom = chromium(tmp_path, "--dump-dom", url + "#algorithm=local")
    assert len(hashes(dom, hidden=False)) == 2 and len(hashes(dom)) == 5

    shot = tmp_path / "leaderboard.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", url + "#sort=cells-final_accuracy")
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000


def test_protocol_switch(tmp_path_factory, tmp_path):
    """#protocol=NAME shows that protocol's tables only (the others hidden); opening shows the default."""
    root = tmp_path_factory.mktemp("store")
    write_cell(root, algorithm="fedavg", accuracies=(0.6, 0.7), adapted=(0.8, 0.9))
    write_cell(root, algorithm="local", accuracies=(0.7, 0.7), adapted=(0.75, 0.75))
    out = tmp_path_factory.mktemp("reports")
    build_reports(root, out, ReportOptions(figures=False))
    url = (out / "index.html").as_uri()

    def visible(dom: str) -> set[str]:
        sections = re.findall(r'<section class="flt board"([^>]*)>', dom)
        return {re.search(r'data-protocol="([^"]+)"', a)[1] for a in sections if " hidden" not in f" {a}"}

    assert visible(chromium(tmp_path, "--dump-dom", url)) == {"delivered-final-clients"}
    assert visible(chromium(tmp_path, "--dump-dom", url + "#protocol=adapted-final-clients")) == {
        "adapted-final-clients"
    }


def page_width(tmp_path, page) -> tuple[int, int]:
    """(document.scrollWidth, clientWidth) of `page` laid out 1400 px wide: a wrapper page loads it in
    an iframe of that width and writes the numbers into its own DOM."""
    wrapper = tmp_path / f"measure-{page.stem}.html"
    wrapper.write_text(
        f'<!doctype html><html><body style="margin:0"><iframe id="f" style="width:1400px;height:900px;border:0" '
        f'src="{page.as_uri()}"></iframe><pre id="out">pending</pre><script>'
        'document.getElementById("f").onload = function () { var d = this.contentDocument.documentElement;'
        ' document.getElementById("out").textContent = "width " + d.scrollWidth + " " + d.clientWidth; };'
        "</script></body></html>"
    )
    dom = chromium(
        tmp_path, "--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom", wrapper.as_uri()
    )
    found = re.search(r"width (\d+) (\d+)", dom)
    assert found, dom[-500:]
    return int(found[1]), int(found[2])


def test_budget_captions_identical_flags_notes_and_no_overflow_at_1400px(tmp_path_factory, tmp_path):
    """The leaderboard as a researcher sees it: each table's budget in its caption, an entry that
    repeats another algorithm's results flagged "(= FedAvg)" with the reason, the datasets the run
    left out, and nothing wider than a 1400 px window (the index and a cell page)."""
    import json

    root = tmp_path_factory.mktemp("store")
    for seed in (0, 1):
        for algorithm in ("fedavg", "fedbn"):  # FedBN = FedAvg on a model without BatchNorm
            write_cell(
                root,
                algorithm=algorithm,
                seed=seed,
                lr=0.05,
                samples_per_client=300,
                accuracies=(0.6 + seed / 10, 0.7, 0.72, 0.8),
                adapted=(0.7, 0.75, 0.8, 0.85),
            )
        write_cell(
            root,
            algorithm="pfedhn",
            seed=seed,
            lr=0.01,
            samples_per_client=300,
            accuracies=(0.65, 0.7, 0.75, 0.8),
            adapted=(0.7, 0.75, 0.8, 0.85),
        )
        write_cell(
            root,
            algorithm="local",
            seed=seed,
            dataset="synthetic",
            lr=0.05,
            samples_per_client=300,
            accuracies=(0.9, 0.95, 0.91, 0.93),
        )
    (root / "_notes.json").write_text(
        json.dumps(
            {
                "skipped_datasets": {
                    "cifar10-jpeg": {
                        "cells": 8,
                        "reason": "no copy in the data root or the mirror, and no download",
                        "looked_in": ["/nonexistent/data/" + "cifar10-jpeg/" * 12],
                    }
                }
            }
        )
    )
    out = tmp_path_factory.mktemp("reports")
    build_reports(root, out, ReportOptions(figures=False))
    dom = chromium(tmp_path, "--dump-dom", (out / "index.html").as_uri())
    captions = re.findall(r'<caption class="protocol">(.*?)</caption>', dom, re.S)
    assert captions and all("Budget" in c for c in captions)
    assert any("3 rounds, 1 local epoch, lr 0.05 (pFedHN: lr 0.01)" in c for c in captions)
    assert "300 samples per client" in dom and "10 clients, all in every round" in dom
    assert re.search(r'<td class="[^"]*identical[^"]*"[^>]*>[^<]*\(= FedAvg\)', dom)
    assert "bit-identical to FedAvg" in dom and "BatchNorm" in dom
    assert 'class="skipped"' in dom and "pflbench data prepare" in dom and "PFLBENCH_DATA_MIRROR" in dom
    for page in (out / "index.html", next((out / "cells").glob("*.html"))):
        scroll, client = page_width(tmp_path, page)
        assert client == 1400 and scroll <= client, (page.name, scroll, client)
