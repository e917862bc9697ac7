"""The difference view (pflbench/reports/differences.py): every row against a reference row, per column,
paired on the clients' test splits — checked on the published paper-scale column (table1-full) against
the numbers benchmarks/README.md computed by hand, and on small stores written directly."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import write_cell

from pflbench.cli import main
from pflbench.reports.cells import load_cells
from pflbench.reports.differences import UnknownBaseline, difference_tables, find_baseline
from pflbench.reports.protocols import ADAPTED, DEFAULT
from pflbench.reports.tables import accuracy_tables
from pflbench.reports.text import markdown_differences

TABLE1_FULL = Path(__file__).resolve().parents[1] / "results" / "published" / "table1-full"


@pytest.fixture(scope="module")
def table1_full():
    if not TABLE1_FULL.is_dir():
        pytest.skip("results/published/table1-full is not in this checkout")
    return load_cells(TABLE1_FULL)


def lines_of(view) -> dict[str, object]:
    return {d.row.algorithm: d for d in view.lines}


def test_table1_full_reproduces_the_readme_hand_computed_differences(table1_full):
    """benchmarks/README.md, "The paper-scale FashionMNIST 10-client column": ± one standard error of the
    per-client difference over the 10 clients (round 600, seed 0)."""
    (adapted,) = accuracy_tables(table1_full, protocol=ADAPTED)
    (delivered,) = accuracy_tables(table1_full, protocol=DEFAULT)
    (view,) = difference_tables([adapted], "local")
    found = lines_of(view)
    expected = {
        "fedavg": (1.8, 0.5),
        "fedrep": (1.1, 0.6),
        "fedfomo": (-0.1, 0.3),
        "pfedme": (0.9, 0.4),
        "perfedavg": (0.1, 0.9),
        "pfedhn": (-1.7, 0.7),
        "pfedla": (-0.1, 0.2),
        "heurpfedla": (0.4, 0.3),
    }
    for algorithm, (mean, se) in expected.items():
        test = found[algorithm].test
        assert (round(test.mean, 1), round(test.se, 1)) == (mean, se), algorithm
    assert (found["fedavg"].test.up, found["fedavg"].test.down) == (9, 1)  # "9 of 10 clients up"
    assert (found["pfedme"].test.up, found["pfedme"].test.down) == (6, 3)  # "6 clients up, 3 down"
    assert found["fedavg"].separated and not found["fedrep"].separated
    assert found["fedavg"].mean_text() == "+1.81 ± 0.54" and found["fedavg"].counts_text() == "9 / 1 / 0"
    as_delivered = lines_of(difference_tables([delivered], "local")[0])
    assert (round(as_delivered["fedrep"].test.mean, 1), round(as_delivered["fedrep"].test.se, 1)) == (1.8, 0.5)
    # The README's "+0.4 ± 0.6 as delivered": the s.e. is 0.549 (0.55 rounded once more, to 0.6).
    assert as_delivered["pfedme"].mean_text() == "+0.38 ± 0.55" and as_delivered["pfedme"].test.se < 0.55
    # "the paper's HeurpFedLA > pFedLA ... +0.5 ± 0.2: 6 clients up, none down, 4 equal"
    heur = lines_of(difference_tables([adapted], "pFedLA")[0])["heurpfedla"].test
    assert (round(heur.mean, 1), round(heur.se, 1), heur.up, heur.down, heur.equal) == (0.5, 0.2, 6, 0, 4)


def test_table1_full_ties_with_the_best(table1_full):
    """After adaptation FedAvg has the highest mean, but FedRep and Per-FedAvg cannot be told from it."""
    (adapted,) = accuracy_tables(table1_full, protocol=ADAPTED)
    column = adapted.columns[0]
    by = {r.algorithm: adapted.entry(r, column) for r in adapted.rows}
    assert by["fedavg"].top and by["fedavg"].tied and not by["fedavg"].best
    assert {a for a, e in by.items() if e.tied} == {"fedavg", "fedrep", "perfedavg"}
    (delivered,) = accuracy_tables(table1_full)
    assert [r.algorithm for r in delivered.rows if delivered.entry(r, column).best] == ["fedrep"]


def test_rows_against_the_reference_row_of_their_own_setting_and_column(tmp_path):
    for dataset in ("fmnist", "emnist"):
        write_cell(tmp_path, algorithm="local", dataset=dataset, accuracies=(0.70, 0.72, 0.74))
        write_cell(tmp_path, algorithm="fedavg", dataset=dataset, accuracies=(0.75, 0.72, 0.70))
    write_cell(tmp_path, algorithm="fedrep", dataset="fmnist", accuracies=(0.71, 0.73, 0.75), hp_source="tuned")
    (table,) = accuracy_tables(load_cells(tmp_path))
    (view,) = difference_tables([table])
    assert view.several_columns and view.baseline_label == "Local"
    by = {(d.row.algorithm, d.column.dataset): d for d in view.lines}
    assert set(by) == {("fedavg", "fmnist"), ("fedavg", "emnist"), ("fedrep", "fmnist")}
    fedavg = by[("fedavg", "fmnist")]
    assert fedavg.test.mean == pytest.approx(1 / 3, abs=1e-4) and fedavg.counts_text() == "1 / 1 / 1"
    assert by[("fedrep", "fmnist")].counts_text() == "3 / 0 / 0" and by[("fedrep", "fmnist")].p_text() == "0.250"
    md = markdown_differences(view)
    assert md.splitlines()[0].startswith("| algorithm | column | − Local (pp, ± s.e.) | 95% CI |")
    assert "| FedRep † | fmnist, 10 clients | +1.00 ± 0.00 |" in md
    assert find_baseline(table.rows, "FedRep †").algorithm == "fedrep"
    with pytest.raises(
        UnknownBaseline, match="'pfedhn'.*allowed: an algorithm of the store \\(fedavg, fedrep, local\\)"
    ):
        difference_tables([table], "pfedhn")


def test_report_cli_writes_the_view_and_refuses_an_unknown_reference(tmp_path, capsys):
    store = tmp_path / "results"
    write_cell(store, algorithm="local", accuracies=(0.70, 0.72))
    write_cell(store, algorithm="fedavg", accuracies=(0.75, 0.74))
    out = tmp_path / "out"
    assert main(["report", "--results", str(store), "--out", str(out), "--no-figures", "--quiet"]) == 0
    md = (out / "report.md").read_text()
    assert "#### Paired differences against Local" in md and "| FedAvg | +3.50 ± 1.50 |" in md
    html = (out / "index.html").read_text()
    assert "Paired differences against Local" in html and "+3.50 ± 1.50" in html
    assert (
        main(["report", "--results", str(store), "--out", str(out), "--no-figures", "--quiet", "--baseline", "fedavg"])
        == 0
    )
    assert "#### Paired differences against FedAvg" in (out / "report.md").read_text()
    assert (
        main(["report", "--results", str(store), "--out", str(out), "--no-figures", "--quiet", "--baseline", "nosuch"])
        == 2
    )
    assert "--baseline: reference row 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--level must be a probability"):
        main(["report", "--results", str(store), "--out", str(out), "--level", "2"])
