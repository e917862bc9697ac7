"""Which differences are real (pflbench/reports/stats.py): the paired test, how seeds are combined, the
tie marks of every accuracy table (Markdown, LaTeX, HTML), and the Friedman/Nemenyi numbers of the
ranks across a study. Stores written directly (report_helpers): no training, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from report_helpers import write_cell

from pflbench.reports.cells import load_cells
from pflbench.reports.protocols import ADAPTED, Protocol
from pflbench.reports.stats import (
    SEED_UNITS,
    Sample,
    average_ranks,
    check_level,
    cliques,
    friedman,
    nemenyi_cd,
    paired,
    signed_rank_p,
)
from pflbench.reports.tables import accuracy_tables
from pflbench.reports.text import latex_table, markdown_report, markdown_table


def sample(per_seed: dict) -> Sample:
    """{seed: [client accuracies in %]} -> Sample."""
    return Sample(
        {s: dict(enumerate(v)) for s, v in per_seed.items()}, {s: float(np.mean(v)) for s, v in per_seed.items()}
    )


def test_paired_difference_mean_se_interval_and_counts():
    base = [90, 91, 92, 93, 94, 95, 96, 97, 98, 99]
    better = [b + d for b, d in zip(base, [2, 3, 1, 2, 4, 2, 1, 3, 0, -1])]
    found = paired(sample({0: better}), sample({0: base}))
    d = np.array([2, 3, 1, 2, 4, 2, 1, 3, 0, -1], dtype=float)
    assert found.unit == "client" and found.n == 10 and found.mean == pytest.approx(d.mean())
    assert found.se == pytest.approx(d.std(ddof=1) / math.sqrt(10))
    low, high = found.interval
    assert low == pytest.approx(d.mean() - 2.2621571628 * found.se, abs=1e-6) and high > d.mean()
    assert (found.up, found.down, found.equal) == (8, 1, 1)
    assert found.separated and found.p < 0.05 and found.unit_text == "10 clients"


def test_identical_clients_are_equal_and_never_separated():
    same = sample({0: [80, 85, 90, 95, 70]})
    found = paired(same, same)
    assert (found.up, found.down, found.equal) == (0, 0, 5) and found.p == 1.0 and not found.separated
    assert signed_rank_p([0.0, 0.0]) == 1.0 and signed_rank_p([1.0]) is None


@pytest.mark.parametrize(
    "d",
    [
        [1.0, 0.0, 0.0, 2.0, -1.0, 3.0, 1.0, 0.5, 2.0, -0.5],  # zeros and ties, 10 clients
        [0.48, -0.48, 0.95, 0.95, 1.43, 0.0, -0.95, 0.48, 2.86, 0.48],  # k/210 steps, as on table1-full
        [2.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 0.0],  # 13 with a zero: every flip
        [1.0, 1.0, -1.0],  # ties only
        [0.5, 2.0, -1.0, 3.0, 4.0],  # neither: scipy's exact branch
        [1.0, 0.0, 2.0, 2.0, 3.0, -1.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.0, 2.0],  # 14 with ties: asymptotic
    ],
)
def test_signed_rank_p_is_scipys_wilcoxon_to_the_bit(d):
    """The exact permutation branch computes the statistic for all sign flips at once; its p is the one
    scipy's wilcoxon gives (zsplit, two-sided) on the same differences, exactly."""
    assert signed_rank_p(d) == float(sps.wilcoxon(d, zero_method="zsplit", alternative="two-sided").pvalue)


def test_seeds_pooled_below_six_and_the_unit_from_six_shared_seeds_on():
    a = {s: [80 + s, 81, 82] for s in range(SEED_UNITS)}
    b = {s: [79 + s, 81, 81] for s in range(SEED_UNITS)}
    pooled = paired(sample({s: a[s] for s in range(SEED_UNITS - 1)}), sample({s: b[s] for s in range(SEED_UNITS - 1)}))
    assert pooled.unit == "client" and pooled.n == 3 * (SEED_UNITS - 1) and "seeds pooled" in pooled.unit_text
    by_seed = paired(sample(a), sample(b))
    assert by_seed.unit == "seed" and by_seed.n == SEED_UNITS and by_seed.clients == 3 * SEED_UNITS
    assert by_seed.mean == pytest.approx(2 / 3) and by_seed.up == 2 * SEED_UNITS  # counts stay per client
    # Only seeds both rows have are compared; none shared: nothing to test.
    assert paired(sample({0: a[0], 1: a[1]}), sample({1: b[1], 2: b[2]})).seeds == (1,)
    assert paired(sample({0: a[0]}), sample({1: b[1]})) is None


def test_a_number_without_clients_is_tested_on_seeds_only_from_six_on():
    few = paired(Sample({}, {0: 50.0, 1: 52.0}), Sample({}, {0: 40.0, 1: 41.0}))
    assert few.unit == "seed" and few.p is None and few.clients == 0 and not few.separated
    many = paired(Sample({}, {s: 50.0 + s for s in range(8)}), Sample({}, {s: 40.0 for s in range(8)}))
    assert many.p is not None and many.separated


def test_friedman_nemenyi_and_cliques_follow_demsar():
    # Demšar (2006), Table 5: q_0.05 = 2.569 for k = 4 methods (CD = q sqrt(k(k+1)/6N)).
    assert nemenyi_cd(4, 10) == pytest.approx(2.569 * math.sqrt(4 * 5 / 60), abs=2e-3)
    assert nemenyi_cd(2, 10) == pytest.approx(1.960 * math.sqrt(2 * 3 / 60), abs=2e-3)
    scores = np.array([[90, 80, 70, 60], [91, 79, 72, 61], [88, 81, 69, 62], [92, 82, 71, 58]] * 3, dtype=float)
    ranks = average_ranks(scores)
    assert ranks.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert friedman(scores) < 0.001 and friedman(scores[:, :2]) is None and friedman(np.ones((3, 4))) == 1.0
    assert average_ranks(np.array([[1.0, 1.0, 0.0]])).tolist() == [1.5, 1.5, 3.0]  # ties share their ranks
    assert cliques([1.0, 1.5, 3.0, 3.2], cd=1.0) == [(0, 1), (2, 3)]
    assert cliques([1.0, 1.8, 2.6], cd=1.0) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="at least 2 methods"):
        nemenyi_cd(1, 5)


def ten_clients(mean: float, spread=(0, 1, -1, 2, -2, 0, 1, -1, 2, -2)) -> tuple:
    return tuple(mean + s / 100 for s in spread)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("ties")
    write_cell(root, algorithm="fedavg", accuracies=ten_clients(0.90), adapted=ten_clients(0.93))
    write_cell(
        root,
        algorithm="fedrep",
        accuracies=ten_clients(0.80),
        adapted=ten_clients(0.929, (1, 2, 0, 1, -3, 0, 1, -1, 1, -2)),
    )  # adapted: level with FedAvg on some clients
    write_cell(root, algorithm="local", accuracies=ten_clients(0.85), adapted=ten_clients(0.85))
    write_cell(root, algorithm="centralized", accuracies=ten_clients(0.99), adapted=ten_clients(0.99))
    return root


def test_the_best_is_bold_only_when_the_test_separates_it_from_every_row(store):
    cells = load_cells(store)
    (delivered,) = accuracy_tables(cells)
    column = delivered.columns[0]
    by = {r.algorithm: delivered.entry(r, column) for r in delivered.rows}
    assert by["fedavg"].best and by["fedavg"].top and not by["fedavg"].tied
    assert not by["local"].tied and by["local"].test.p < 0.05 and by["local"].versus.algorithm == "fedavg"
    assert not by["centralized"].best and not by["centralized"].tied  # a reference: never ranked
    rows = markdown_table(delivered)
    assert "| FedAvg | **90.00** |" in rows and "| Local | 85.00 |" in rows

    (adapted,) = accuracy_tables(cells, protocol=ADAPTED)
    by = {r.algorithm: adapted.entry(r, column) for r in adapted.rows}
    assert by["fedavg"].top and by["fedavg"].tied and not by["fedavg"].best  # FedRep cannot be told from it
    assert by["fedrep"].tied and by["fedrep"].test.p >= 0.05 and not by["local"].tied
    md = markdown_table(adapted)
    assert "| FedAvg | 93.00 ≈ |" in md and "| FedRep | 92.90 ≈ |" in md and "| Local | 85.00 |" in md
    tex = latex_table(adapted)
    assert r"93.00 $\approx$" in tex and r"\textbf" not in tex and "Wilcoxon signed-rank" in tex
    report = markdown_report([adapted], [], [], seeds=1, statuses={"finished": 4})
    assert "Wilcoxon signed-rank test on paired per-client accuracies" in report and "level 0.05" in report


def test_a_column_that_cannot_be_tested_marks_nothing_and_says_so(store):
    (worst,) = accuracy_tables(load_cells(store), protocol=Protocol("delivered", "final", "worst10"))
    column = worst.columns[0]
    assert not any(e.best or e.tied or e.top for r in worst.rows if (e := worst.entry(r, column)) is not None)
    assert worst.untested and "fewer than 6 shared seeds" in worst.untested[0]
    assert "per-seed values" in worst.marks
    assert "No best marked on fmnist, 10 clients" in markdown_report([worst], [], [], seeds=1, statuses={})


def test_level_is_checked():
    with pytest.raises(ValueError, match="level must be a probability strictly between 0 and 1"):
        check_level(1.5)
