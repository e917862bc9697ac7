"""The results page (pflbench/reports/glance.py): generated from the published studies, so a number
that changes in a store changes on the page; every Table 1/2 Fashion-MNIST row of the paper is on it
with paper, ours, Δ and a verdict; a column on another dataset than the paper's, or with rows missing,
says so instead of comparing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pflbench.reports.glance import JUDGED, build_glance, findings, markdown, write_csv
from pflbench.reports.reference import default_reference_dir, load_references
from tests.report_helpers import write_cell

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published"


def link(study: str) -> str:
    return f"studies/{study}.html"


@pytest.fixture(scope="module")
def published_glance():
    return build_glance(PUBLISHED)


def paper_rows(table: str):
    refs = {r.meta["table"][0].split(" (")[0]: r for r in load_references(default_reference_dir())}
    rows = refs[table].rows
    return rows[(rows["dataset"] == "fmnist") & (rows["clients"] == 10)]


@pytest.mark.parametrize("table, study", [("Table 1", "table1-full"), ("Table 2", "table2-full")])
def test_every_fashion_mnist_row_of_tables_1_and_2_has_paper_ours_delta_and_verdict(published_glance, table, study):
    column = next(c for c in published_glance.reproduced if c.study == study)
    assert column.table == table and column.column.dataset == "fmnist" and column.column.clients == 10
    assert column.protocol.name == "adapted-final-clients" and not column.partial
    page = markdown(published_glance, link)
    expected = paper_rows(table)
    assert len(expected) == 9
    for _, paper in expected.iterrows():
        row = next(r for r in column.rows if r.algorithm == paper["algorithm"])
        assert row.paper is not None and row.paper.mean == pytest.approx(paper["mean"])
        assert row.ours is not None and row.ours.mean is not None and row.delta is not None
        assert row.delta == pytest.approx(row.ours.mean - paper["mean"])
        verdict = row.verdict()
        assert verdict in ("within the paper's ±", "above the paper's ±", "below the paper's ±")
        assert (verdict == "within the paper's ±") == (abs(row.delta) <= paper["std"])
        std = f" ± {row.ours.std:.2f}" if row.ours.std is not None else ""
        line = (
            f"| {row.label} | {paper['mean']:.2f} ± {paper['std']:.2f} | {row.ours.mean:.2f}{std} | "
            f"{row.delta:+.2f} | {verdict} |"
        )
        assert line in page, line
    # the paper's orderings, each judged under every protocol (mixed where a global model meets a personal one)
    claims = {c.text: c for c in column.claims}
    assert {"FedAvg > Local", "pFedLA > Local", "pFedLA > FedAvg"} <= set(claims)
    assert any("pFedHN" in text for text in claims)
    assert [j.protocol for j in claims["pFedLA > FedAvg"].judgements] == list(JUDGED)
    assert [j.protocol for j in claims["pFedLA > Local"].judgements] == ["delivered", "adapted"]
    for claim in column.claims:
        for judgement in claim.judgements:
            assert judgement.test is not None and judgement.test.interval is not None
            assert f"| {judgement.protocol} | {judgement.mean_text()} | {judgement.interval_text()} |" in page
    assert column.chain is not None and column.chain.text == "Local < FedAvg < pFedLA"
    assert column.alpha and column.alpha[0].label == "pFedLA"  # default pFedLA's α, then the variants'


def test_findings_are_at_most_15_lines_at_the_top_each_with_its_evidence(published_glance):
    lines = findings(published_glance)
    assert 0 < len(lines) <= 15
    page = markdown(published_glance, link)
    top = page.split("## Findings", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in top.splitlines() if line.startswith("- ")]
    assert len(bullets) == len(lines)
    anchors = set(re.findall(r"\{#[^}]+\}", page))  # every heading anchor the page carries
    for finding, bullet in zip(lines, bullets):
        assert bullet.endswith(f"[→ evidence]({finding.link})")
        assert "{" + finding.link + "}" in anchors
    assert page.index("## Findings") < page.index("## What is identified") < page.index("| row | paper | ours")


def copy_study(tmp_path: Path, name: str) -> Path:
    root = tmp_path / "published"
    shutil.copytree(PUBLISHED / name, root / name)
    return root


def test_a_planted_change_in_a_stored_metric_changes_the_page(tmp_path):
    root = copy_study(tmp_path, "table1-full")
    before = build_glance(root)
    page = markdown(before, link)
    fedavg = next(r for r in before.reproduced[0].rows if r.algorithm == "fedavg")
    cell = next(Path(p) for p in fedavg.ours.paths)
    summary = json.loads((cell / "summary.json").read_text())
    summary["final_accuracy_adapted"] += 0.0123  # 1.23 points more after adaptation
    (cell / "summary.json").write_text(json.dumps(summary))

    after = build_glance(root)
    changed = markdown(after, link)
    assert changed != page
    row = next(r for r in after.reproduced[0].rows if r.algorithm == "fedavg")
    assert row.ours.mean == pytest.approx(fedavg.ours.mean + 1.23)
    assert f"| FedAvg | 91.24 ± 0.98 | {row.ours.mean:.2f} | {row.ours.mean - 91.24:+.2f} |" in changed
    assert (
        f"| FedAvg | 91.24 ± 0.98 | {fedavg.ours.mean:.2f} |" in page
        and f"| FedAvg | 91.24 ± 0.98 | {fedavg.ours.mean:.2f} |" not in changed
    )
    write_csv(after, tmp_path / "csv")
    assert f"{row.ours.mean:.4f}" in (tmp_path / "csv" / "results_rows.csv").read_text()


def manifest(folder: Path, command: str) -> None:
    cells = {p.name: {"sets": []} for p in folder.iterdir() if p.is_dir()}
    (folder / "manifest.json").write_text(json.dumps({"command": command, "cells": cells}))


def test_a_column_on_another_dataset_shows_the_papers_number_greyed_without_delta_and_a_partial_column(tmp_path):
    root = tmp_path / "published"
    jpeg = root / "table1-full-cifar10-jpeg"
    for algorithm, acc in (("local", 0.6), ("fedavg", 0.5)):
        write_cell(
            jpeg,
            algorithm=algorithm,
            dataset="cifar10-jpeg",
            samples_per_client=600,
            partition_params={"classes_per_client": 4},
            accuracies=[acc, acc + 0.1] * 5,
            adapted=[acc + 0.02, acc + 0.12] * 5,
        )
    manifest(jpeg, "pflbench run benchmarks/table1.yaml --set dataset=cifar10-jpeg")
    fmnist = root / "table1-full"
    write_cell(
        fmnist,
        algorithm="local",
        dataset="fmnist",
        samples_per_client=700,
        partition_params={"classes_per_client": 4},
        accuracies=[0.9, 0.8] * 5,
        adapted=[0.9, 0.8] * 5,
    )
    manifest(fmnist, "pflbench run benchmarks/table1.yaml --set dataset=fmnist")

    glance = build_glance(root)
    columns = {c.study: c for c in glance.reproduced}
    assert set(columns) == {"table1-full", "table1-full-cifar10-jpeg"}
    other = columns["table1-full-cifar10-jpeg"]
    assert other.other_dataset and other.column.paper_dataset == "cifar10"
    local = next(r for r in other.rows if r.algorithm == "local")
    assert local.paper is not None and local.paper.mean == pytest.approx(59.44)  # the paper's CIFAR-10
    assert local.ours.mean == pytest.approx(67.0) and local.delta is None
    assert local.verdict() == "another dataset: not compared"
    assert other.partial and next(r for r in other.rows if r.algorithm == "pfedla").verdict() == "not run"
    page = markdown(glance, link)
    greyed = f'<span class="other-dataset" title="{other.column.data_note}">*59.44 ± 0.40 (cifar10)*</span>'
    assert f"| Local | {greyed} | 67.00 | – | another dataset: not compared |" in page
    assert "another dataset than the paper's (cifar10)" in page

    partial = columns["table1-full"]
    assert partial.partial and partial.state == "partial: rows not run"
    assert [r.algorithm for r in partial.rows if r.run] == ["local"]
    assert "| pFedLA | 94.34 ± 0.29 | – | – | not run |" in page
    assert not partial.chain or partial.chain.verdict("adapted") == "not run"
    assert any("of 9 paper rows" in f.text and "8 not run" in f.text for f in findings(glance))


# ---- a reproduction study's page (pflbench/reports/site.py, templates/index.html) ---------------------------

PAPER = dict(
    rounds=600,
    local_epochs=10,
    lr=0.005,
    samples_per_client=700,
    partition_params={"classes_per_client": 4},
    config={"val_fraction": 0.0},
    summary={"model": "cnn"},
)  # pFedLA Table 1's fmnist settings


def test_a_reproduction_study_page_opens_on_the_papers_protocol_with_its_title_seeds_fold_best_and_dots(tmp_path):
    from pflbench.studies.publish import LEADERBOARD
    from pflbench.reports.build import ReportOptions
    from pflbench.reports.studies import build_leaderboard, study_groups

    root = tmp_path / "published"
    column, seeds = root / "table1-full", root / "table1-full-seed1"
    for algorithm, acc, adapted in (("local", 0.90, 0.91), ("fedavg", 0.80, 0.93), ("pfedla", 0.90, 0.91)):
        write_cell(
            column,
            algorithm=algorithm,
            accuracies=[acc, acc - 0.02] * 5,
            adapted=[adapted, adapted - 0.02] * 5,
            **PAPER,
        )
        write_cell(
            seeds,
            algorithm=algorithm,
            seed=1,
            accuracies=[acc, acc - 0.04] * 5,
            adapted=[adapted, adapted - 0.04] * 5,
            **PAPER,
        )
    # a variant of pFedLA beside the column (another hyperparameter): folded under pFedLA's row
    write_cell(
        seeds, algorithm="pfedla", hp={"hn_lr": 0.005}, accuracies=[0.5, 0.6] * 5, adapted=[0.6, 0.7] * 5, **PAPER
    )
    manifest(column, "pflbench run benchmarks/table1.yaml --set dataset=fmnist --set seed=0")
    manifest(seeds, "pflbench run benchmarks/table1.yaml --set dataset=fmnist --set seed=1")
    (root / LEADERBOARD).write_text("beside:\n  table1-full: [table1-full-seed1]\n")
    data = json.loads((column / "manifest.json").read_text())
    (column / "manifest.json").write_text(
        json.dumps({**data, "note": "Issue 9, item 1: pFedLA Table 1 (fmnist), seed 0. The rest."})
    )

    index = build_leaderboard(root, tmp_path / "site", options=ReportOptions(figures=False, partitions=False))
    page = (tmp_path / "site" / "table1-full" / "index.html").read_text()
    assert "<title>table1-full: pFedLA Table 1, seed 0 · pflbench</title>" in page  # no issue number, no aside
    assert "<h1>pFedLA Table 1, seed 0 <small><code>table1-full</code></small></h1>" in page
    banner = page.split('id="study-provenance"', 1)[1].split("<details", 1)[0]
    assert ": pFedLA Table 1 (fmnist), seed 0." in banner and "Issue 9" not in banner  # the banner's lead too
    options = page.split('id="f-protocol"', 1)[1].split("</select>", 1)[0]
    assert 'data-default="adapted-final-clients"' in options
    assert options.index('value="adapted-final-clients"') < options.index('value="delivered-final-clients"')
    assert "Its tables pool seeds 0, 1: seed 0 from this study" in page and "table1-full-seed1" in page
    adapted = page.split('data-protocol="adapted-final-clients"', 1)[1].split("</section>", 1)[0]
    assert '<tr class="flt variant" data-algorithm="pfedla">' in adapted and "↳ " in adapted
    assert adapted.index('<tr class="flt" data-algorithm="pfedla">') < adapted.index('class="flt variant"')
    assert "variant row" in adapted and "hn_lr=0.005" in adapted
    assert 'class="best-group">Best on fmnist, 10 clients: <strong>FedAvg</strong>' in adapted
    assert '<figure class="dots"><svg' in adapted and "ours (± std over seeds)" in adapted
    assert adapted.count("<circle ") == 3  # Local, FedAvg and pFedLA: the base rows with a Δ (variants folded)
    # the index: the results at a glance above the studies, and the studies grouped
    html = index.read_text()
    assert html.index('id="results"') < html.index('id="studies"')
    assert study_groups(root, build_glance(root)) == {
        "table1-full": "reproduction",
        "table1-full-seed1": "reproduction",
    }
    assert (tmp_path / "site" / "results" / "results_rows.csv").is_file()


# ---- a column on another dataset, published cell by cell (pflbench/reports/carry_over.py) ----------------


def one_hot_alpha(clients: int = 10, layers: int = 5):
    """α as pFedLA stores it [clients, layers, clients], every client's weights on itself alone."""
    import numpy as np

    return np.repeat(np.eye(clients, dtype=np.float32)[:, None, :], layers, axis=1)


def alpha_artifacts(alpha, rounds: int = 3) -> dict:
    return {f"alpha_round{r:05d}": alpha for r in range(1, rounds + 1)}


def test_a_cifar_column_appears_as_soon_as_one_cell_is_published_with_what_carries_over(tmp_path):
    """A synthetic Table 1 column on cifar10-jpeg published cell by cell (3 of its 10 planned rows, the
    rest in its manifest's `missing`) beside a synthetic Fashion-MNIST column: the paper's CIFAR-10
    numbers greyed as another dataset's, the rows still to run "not yet run" with no number, the paper's
    orderings judged as far as the rows allow, α's collapse checked, and each Fashion-MNIST conclusion
    carried over, broken or not yet decidable."""
    from pflbench.config import cell_hash
    from pflbench.reports.glance import write_figures
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets
    from tests.report_helpers import dirichlet_alpha

    root = tmp_path / "published"
    fmnist, jpeg = root / "table1-full", root / "table1-full-cifar10-jpeg"
    spread = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]  # ten clients

    def cell(folder, algorithm, delivered, adapted, dataset, samples, **kw):
        write_cell(
            folder,
            algorithm=algorithm,
            dataset=dataset,
            samples_per_client=samples,
            partition_params={"classes_per_client": 4},
            accuracies=[delivered + s for s in spread],
            adapted=[adapted + s for s in spread],
            **kw,
        )

    # Fashion-MNIST: FedAvg above Local after adaptation (every client), pFedLA = Local, α one-hot
    cell(fmnist, "local", 0.90, 0.90, "fmnist", 700)
    cell(fmnist, "fedavg", 0.80, 0.93, "fmnist", 700)
    cell(fmnist, "pfedla", 0.90, 0.90, "fmnist", 700, artifacts=alpha_artifacts(one_hot_alpha()))
    cell(fmnist, "heurpfedla", 0.89, 0.89, "fmnist", 700, artifacts=alpha_artifacts(one_hot_alpha()))
    manifest(fmnist, "pflbench run benchmarks/table1.yaml --set dataset=fmnist")
    # cifar10-jpeg: Local above FedAvg after adaptation; HeurpFedLA's α mixed; the other 7 rows still to run
    cell(jpeg, "local", 0.60, 0.62, "cifar10-jpeg", 600)
    cell(jpeg, "fedavg", 0.40, 0.55, "cifar10-jpeg", 600)
    cell(jpeg, "heurpfedla", 0.58, 0.60, "cifar10-jpeg", 600, artifacts=alpha_artifacts(dirichlet_alpha(10, 5)))
    sets = ["dataset=cifar10-jpeg", "clients=10", "seed=0"]
    plan = load_spec(ROOT / "benchmarks" / "table1.yaml", parse_sets(sets))
    published = {"local", "fedavg", "heurpfedla"}
    missing = [cell_hash(c) for c in plan.cells if c.algorithm not in published]
    assert len(missing) == 7
    manifest(jpeg, "pflbench run benchmarks/table1.yaml " + " ".join(f"--set {s}" for s in sets))
    data = json.loads((jpeg / "manifest.json").read_text())
    (jpeg / "manifest.json").write_text(
        json.dumps({**data, "spec": "benchmarks/table1.yaml", "sets": sets, "missing": missing})
    )

    glance = build_glance(root)
    columns = {c.study: c for c in glance.reproduced}
    assert set(columns) == {"table1-full", "table1-full-cifar10-jpeg"} and not glance.variants
    jpeg_column = columns["table1-full-cifar10-jpeg"]
    assert jpeg_column.other_dataset and jpeg_column.home == "table1-full"
    refs = {r.meta["table"][0].split(" (")[0]: r for r in load_references(default_reference_dir())}
    cifar = refs["Table 1"].rows
    cifar = cifar[(cifar["dataset"] == "cifar10") & (cifar["clients"] == 10)]
    assert len(cifar) == 10 and len(jpeg_column.rows) == 10
    page = markdown(glance, link)
    for _, paper in cifar.iterrows():
        row = next(r for r in jpeg_column.rows if r.algorithm == paper["algorithm"])
        assert row.paper is not None and row.paper.mean == pytest.approx(paper["mean"])  # the paper's CIFAR-10
        assert row.delta is None  # never a like-for-like Δ
        greyed = f'<span class="other-dataset" title="{jpeg_column.column.data_note}">*{paper["mean"]:.2f} ± {paper["std"]:.2f} (cifar10)*</span>'
        if paper["algorithm"] in published:
            assert row.verdict() == "another dataset: not compared" and row.ours.mean is not None
            assert f"| {row.label} | {greyed} | {row.ours.mean:.2f} | – | another dataset: not compared |" in page
        else:  # still to run: no number of ours, "not yet run"
            assert row.ours is None and row.waiting and row.verdict() == "not yet run"
            assert f"| {row.label} | {greyed} | – | – | not yet run |  | – |" in page
    assert "quality about 75" in jpeg_column.column.data_note and "quality about 75" in page
    assert jpeg_column.state == "another dataset than the paper's (cifar10): not compared; 7 of 10 rows not yet run"

    # the paper's CIFAR-10 orderings (Local above FedAvg there), judged as far as the published rows allow
    claims = {c.text: c for c in jpeg_column.claims}
    assert set(claims) == {"Local > FedAvg", "pFedLA > Local", "pFedLA > FedAvg", "pFedLA > pFedHN"}
    assert jpeg_column.chain is None  # the paper's CIFAR-10 Table 1 does not order Local < FedAvg < pFedLA
    assert claims["Local > FedAvg"].judged("adapted").verdict == "holds"
    assert claims["Local > FedAvg"].judged("adapted").test.mean == pytest.approx(7.0)
    assert claims["Local > FedAvg"].judged("delivered").verdict == "holds"
    for text in ("pFedLA > Local", "pFedLA > FedAvg", "pFedLA > pFedHN"):
        assert {j.verdict for j in claims[text].judgements} == {"not yet run"}
    assert "| Local > FedAvg | " in page and "| pFedLA > Local | " in page

    # α: HeurpFedLA's here is mixed (not one-hot); pFedLA's not yet run
    views = {v.label: v for v in jpeg_column.alpha}
    assert set(views) == {"HeurpFedLA"} and not views["HeurpFedLA"].collapsed
    assert [v.label for v in columns["table1-full"].alpha] == ["pFedLA", "HeurpFedLA"]
    assert all(v.collapsed and v.extreme == 1.0 for v in columns["table1-full"].alpha)

    # every Fashion-MNIST conclusion: carries over, does not, or not yet decidable
    carry = {item.label: item for item in jpeg_column.carry}
    assert carry["FedAvg vs Local (adapted)"].verdict == "does not carry over"
    assert carry["FedAvg vs Local (adapted)"].there == "FedAvg above Local (+3.00)"
    assert carry["FedAvg vs Local (adapted)"].here == "Local above FedAvg (+7.00)"
    assert carry["FedAvg vs Local (delivered)"].verdict == "carries over"  # Local above FedAvg on both
    assert carry["FedAvg vs Local (delivered)"].there == "Local above FedAvg (+10.00)"
    assert carry["FedAvg vs Local (delivered)"].here == "Local above FedAvg (+20.00)"
    assert carry["pFedLA vs Local (adapted)"].there.startswith("not separated")
    assert carry["pFedLA vs Local (adapted)"].verdict == "not yet decidable"
    assert carry["pFedLA vs Local (adapted)"].here == "not yet run"
    assert carry["pFedLA's α one-hot (every entry 0 or 1)"].verdict == "not yet decidable"
    assert carry["HeurpFedLA's α one-hot (every entry 0 or 1)"].verdict == "does not carry over"
    assert carry["HeurpFedLA's α one-hot (every entry 0 or 1)"].there == "collapsed (100% of entries at 0 or 1)"
    assert {item.verdict for item in carry.values()} <= {"carries over", "does not carry over", "not yet decidable"}
    assert (
        "### Do the conclusions of Table 1 (fmnist, 10 clients) carry over? {#carry-table1-full-cifar10-jpeg}" in page
    )
    assert (
        "| FedAvg vs Local | adapted | FedAvg above Local (+3.00) | Local above FedAvg (+7.00) | does not carry over |"
        in page
    )

    # one finding for the column, linking what carries over; at most 15 in all
    lines = [f for f in findings(glance) if f.study == "table1-full-cifar10-jpeg"]
    assert len(lines) == 1 and lines[0].link == "#carry-table1-full-cifar10-jpeg"
    assert lines[0].text.startswith("Table 1 (cifar10-jpeg, 10 clients): 3 of 10 paper rows run, 7 not yet")
    assert (
        "not yet decidable" in lines[0].text
        and "3 do not carry over (FedAvg vs Local (adapted), FedAvg vs Local (mixed), HeurpFedLA's α" in lines[0].text
    )
    assert len(findings(glance)) <= 15

    written = write_csv(glance, tmp_path / "csv")
    assert [p.name for p in written][-1] == "results_carry_over.csv"
    rows = (tmp_path / "csv" / "results_carry_over.csv").read_text()
    assert "FedAvg above Local (+3.00),Local above FedAvg (+7.00),does not carry over" in rows
    write_figures(glance, tmp_path / "figures", formats=("png",))
    assert all((tmp_path / "figures" / Path(v.heatmap).name).is_file() for v in jpeg_column.alpha)

    # the leaderboard's index shows the same column, greyed, with what carries over
    from pflbench.reports.build import ReportOptions
    from pflbench.reports.studies import build_leaderboard

    index = build_leaderboard(root, tmp_path / "site", options=ReportOptions(figures=False, partitions=False))
    html = index.read_text().split('id="table1-full-cifar10-jpeg"', 1)[1].split('class="glance-column"', 1)[0]
    assert (
        'class="paper other-dataset" title="the paper\'s cifar10, not our cifar10-jpeg: cifar10-jpeg is a lossy' in html
    )
    assert "not yet run" in html and 'id="carry-table1-full-cifar10-jpeg"' in html
    assert '<td class="text verdict-does">does not carry over</td>' in html
    assert "HeurpFedLA</a> not collapsed (0% of entries at 0 or 1)" in html


def test_the_page_changes_when_a_still_running_cifar_row_is_published(tmp_path):
    """A cell published later (the store's `missing` shrinks) turns its row from "not yet run" into a
    number, without anything else to change."""
    root = tmp_path / "published"
    jpeg = root / "table2-full-cifar10-jpeg"
    for algorithm, acc in (("local", 0.4), ("fedavg", 0.45)):
        write_cell(
            jpeg,
            algorithm=algorithm,
            dataset="cifar10-jpeg",
            partition="dominant",
            samples_per_client=600,
            accuracies=[acc] * 10,
            adapted=[acc + 0.01 * i for i in range(10)],
        )
    manifest(jpeg, "pflbench run benchmarks/table2.yaml --set dataset=cifar10-jpeg")
    glance = build_glance(root)
    (column,) = glance.reproduced
    assert column.home == "" and not column.carry  # no Fashion-MNIST column published: nothing to carry
    assert next(r for r in column.rows if r.algorithm == "pfedla").verdict() == "not run"  # no manifest plan
    assert column.chain is not None and column.chain.verdict("adapted") == "not run"  # Local < FedAvg < pFedLA
    write_cell(
        jpeg,
        algorithm="pfedla",
        dataset="cifar10-jpeg",
        partition="dominant",
        samples_per_client=600,
        accuracies=[0.5] * 10,
        adapted=[0.5 + 0.01 * i for i in range(10)],
    )
    after = build_glance(root)
    row = next(r for r in after.reproduced[0].rows if r.algorithm == "pfedla")
    assert row.run and row.ours.mean == pytest.approx(54.5) and row.delta is None
    assert "| pFedLA | " in markdown(after, link) and "54.50" in markdown(after, link)


def test_a_column_on_another_dataset_with_studies_beside_it_is_a_column_not_a_variant(tmp_path):
    from pflbench.studies.publish import LEADERBOARD

    root = tmp_path / "published"
    for name, dataset, seed in (
        ("table1-full", "fmnist", 0),
        ("table1-full-cifar10-jpeg", "cifar10-jpeg", 0),
        ("table1-full-cifar10-jpeg-seed1", "cifar10-jpeg", 1),
    ):
        write_cell(
            root / name,
            algorithm="local",
            dataset=dataset,
            seed=seed,
            partition_params={"classes_per_client": 4},
            accuracies=[0.6] * 10,
            adapted=[0.6] * 10,
        )
        manifest(root / name, f"pflbench run benchmarks/table1.yaml --set dataset={dataset} --set seed={seed}")
    (root / LEADERBOARD).write_text("beside:\n  table1-full-cifar10-jpeg: [table1-full-cifar10-jpeg-seed1]\n")
    glance = build_glance(root)
    assert not glance.variants  # not a variant column of table1-full, though its name extends it
    columns = {c.study: c for c in glance.reproduced}
    assert set(columns) == {"table1-full", "table1-full-cifar10-jpeg"}
    jpeg = columns["table1-full-cifar10-jpeg"]
    assert jpeg.stores == ["table1-full-cifar10-jpeg", "table1-full-cifar10-jpeg-seed1"] and jpeg.seeds == [0, 1]
    assert jpeg.home == "table1-full"
