"""Ranks across a study (pflbench/reports/ranks.py): average ranks over the columns (and knob settings),
the Friedman test, the Nemenyi critical difference and its diagram, in report.md, on the study's page and
on the leaderboard of studies. Stores written directly (report_helpers), no training."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import write_cell

from pflbench.reports.build import ReportOptions, build_reports
from pflbench.reports.build import rank_figure
from pflbench.reports.cells import load_cells
from pflbench.reports.protocols import ADAPTED
from pflbench.reports.ranks import method_of, study_ranks
from pflbench.reports.studies import build_leaderboard
from pflbench.reports.rows import Row
from pflbench.reports.tables import accuracy_tables

TABLE1_QUICK = Path(__file__).resolve().parents[1] / "results" / "published" / "table1-quick"
FAST = ReportOptions(figures=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Four methods over four columns (two datasets x two schemes): FedAvg first everywhere, Local last
    but where FedProx diverged; Ditto ran on fmnist only (left out of the ranking)."""
    root = tmp_path_factory.mktemp("ranks")
    order = {"fedavg": 0.9, "fedrep": 0.8, "fedprox": 0.7, "local": 0.6}
    for dataset in ("fmnist", "emnist"):
        for partition in ("pathological", "dominant"):
            for algorithm, acc in order.items():
                if algorithm == "fedprox" and (dataset, partition) == ("emnist", "dominant"):
                    write_cell(
                        root,
                        algorithm=algorithm,
                        dataset=dataset,
                        partition=partition,
                        status="diverged",
                        error="round 2: nan",
                    )
                    continue
                write_cell(root, algorithm=algorithm, dataset=dataset, partition=partition, accuracies=(acc, acc))
    write_cell(root, algorithm="ditto", accuracies=(0.95, 0.95))
    write_cell(root, algorithm="centralized", accuracies=(0.99, 0.99))  # a reference: never ranked
    return root


def test_average_ranks_friedman_and_the_critical_difference(store):
    ranks = study_ranks(accuracy_tables(load_cells(store)))
    by = dict(zip(ranks.methods, ranks.ranks.tolist()))
    assert by == {
        "FedAvg": 1.0,
        "FedProx": pytest.approx((3 * 3 + 4) / 4),
        "FedRep": 2.0,
        "Local": pytest.approx((4 * 3 + 3) / 4),
    }  # a divergence ranks last
    assert len(ranks.blocks) == 4 and "fmnist, 10 clients, pathological" in ranks.blocks
    assert ranks.left_out == ["Ditto: no result in 3 of 4 columns"] and "Centralized (reference)" not in by
    assert ranks.friedman_p < 0.05 and ranks.rejected
    assert ranks.cd == pytest.approx(2.569 * (4 * 5 / 24) ** 0.5, abs=2e-3)  # Demšar: q_0.05 = 2.569 for k = 4
    assert [ranks.methods[i] for i in ranks.order] == ["FedAvg", "FedRep", "FedProx", "Local"]
    assert ranks.best_block_count(ranks.methods.index("FedAvg")) == 4
    assert "Friedman test over 4 columns" in ranks.caption and "CD = 2.35" in ranks.caption


def test_the_diagram_is_drawn_and_the_report_and_pages_show_the_ranks(store, tmp_path):
    report = build_reports(store, tmp_path / "out", FAST)
    md = report.markdown.read_text()
    assert "## Ranks across the study: as delivered · final round · mean over clients" in md
    assert "| FedAvg | 1.00 | 4 |" in md and "Not ranked: Ditto: no result in 3 of 4 columns." in md
    html = (tmp_path / "out" / "index.html").read_text()
    assert 'id="ranks-delivered-final-clients"' in html and "Not told apart (within CD = 2.35)" in html
    ranks = report.ranks[0]
    rank_figure(ranks, tmp_path / "out", ReportOptions(formats=("png",)))
    assert (
        ranks.figure == "figures/cd_delivered-final-clients.png"
        and (tmp_path / "out" / ranks.figure).stat().st_size > 0
    )
    index = build_leaderboard(tmp_path / "none", tmp_path / "board", extra={"mine": store}, options=FAST)
    assert (
        'href="mine/index.html#ranks-delivered-final-clients">FedAvg 1.00, FedRep 2.00, FedProx 3.25 …'
        in index.read_text()
    )


def test_a_knob_setting_is_a_column_of_the_same_method():
    row = Row("fedavg", "mu=0.1, concept_shift.clusters=4", False, "concept_shift.clusters=4")
    assert method_of(row) == (("fedavg", "mu=0.1", False), "FedAvg (mu=0.1)")
    assert method_of(Row("fedrep", "feature_shift.kind=rotation", True, "feature_shift.kind=rotation"))[1] == "FedRep †"


def test_one_column_has_no_ranks_and_protocols_are_not_mixed(tmp_path):
    write_cell(tmp_path, algorithm="fedavg", accuracies=(0.9, 0.9))
    write_cell(tmp_path, algorithm="local", accuracies=(0.8, 0.8))
    cells = load_cells(tmp_path)
    assert study_ranks(accuracy_tables(cells)) is None
    with pytest.raises(ValueError, match="ranks are per protocol"):
        write_cell(tmp_path, algorithm="fedavg", accuracies=(0.9, 0.9), adapted=(0.9, 0.9), dataset="emnist")
        cells = load_cells(tmp_path)
        study_ranks([*accuracy_tables(cells), *accuracy_tables(cells, protocol=ADAPTED)])


def test_published_table1_quick_ranks():
    if not TABLE1_QUICK.is_dir():
        pytest.skip("results/published/table1-quick is not in this checkout")
    ranks = study_ranks(accuracy_tables(load_cells(TABLE1_QUICK)))
    assert len(ranks.blocks) == 4 and len(ranks.methods) == 10
    assert ranks.methods[ranks.order[0]] == "pFedMe" and ranks.ranks[ranks.order[0]] == pytest.approx(2.75)
    assert sum(ranks.ranks) == pytest.approx(55.0)  # 1 + ... + 10 per column
    assert not ranks.rejected and len(ranks.groups) == 1  # 4 columns cannot separate 10 methods
