"""The GPU check's cell-group steps (benchmarks/gpu/column_groups.py: `column_groups`, `group_100`): the group's
pace from its cells' round stamps, and a rehearsal-size run of each step's command on the CPU giving its
figures with sane values (positive throughput, every projection its seconds a round times the rounds)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import column_groups  # noqa: E402

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"  # the offline copy (the GPU kit carries one too)


@pytest.fixture
def fmnist(tmp_path_factory, monkeypatch):
    """Fashion-MNIST from the offline mirror, decoded once for this file's runs (the steps' dataset)."""
    if not (MIRROR / "fashion-mnist").is_dir():
        pytest.skip("the Fashion-MNIST mirror is not on this machine")
    root = tmp_path_factory.getbasetemp() / "fmnist-data"
    monkeypatch.setenv("PFLBENCH_DATA", str(root))
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(MIRROR))


def test_the_group_pace_is_its_last_cells_round_ends_whatever_the_skew():
    """Two cells in lock-step, 2 s a group cycle: A ends its rounds early in the cycle, B late; round 4
    evaluates (3 s more). Each cell alone is skewed at the first round; the group is not."""
    a = [(1, 10.0, 0.0), (2, 10.5, 0.0), (3, 12.5, 0.0), (4, 17.5, 0.0)]
    b = [(1, 11.9, 0.0), (2, 13.9, 0.0), (3, 15.9, 0.0), (4, 20.9, 0.0)]
    group = column_groups.group_figures(
        [a, b], evaluated=4, eval_every=10, rounds=600, round_work=[100.0, 300.0], eval_work=[50.0, 50.0]
    )
    assert group["seconds_per_round"] == pytest.approx(2.0) and group["evaluation"] == "timed"
    assert group["evaluation_seconds"] == pytest.approx(3.0)
    assert group["seconds_per_round_with_evaluation"] == pytest.approx(2.3)
    assert group["projected_seconds"] == pytest.approx(600 * 2.3)
    assert group["sample_steps_per_second"] == pytest.approx(400 / 2.0)
    alone = column_groups.row_figures(a, 4, 10, 600, {"round": 10.0, "evaluation": 5.0, "counted": False}, 10, 10)
    assert alone["seconds_per_round"] == pytest.approx(1.25)  # A's few rounds, skewed by its place in the cycle


def test_an_evaluation_not_timed_is_projected_from_the_rounds_counted_work():
    stamps = [[(1, 5.0, 1.0), (2, 7.0, 2.5), (3, 9.0, 4.0)]]
    group = column_groups.group_figures(
        stamps, evaluated=None, eval_every=50, rounds=2500, round_work=[1000.0], eval_work=[10000.0]
    )
    assert group["seconds_per_round"] == pytest.approx(2.0) and group["rounds_timed"] == 2
    assert group["evaluation_seconds"] == pytest.approx(20.0) and group["evaluation"].startswith("projected")
    assert group["projected_seconds"] == pytest.approx(2500 * (2.0 + 20.0 / 50))
    row = column_groups.row_figures(
        stamps[0], None, 50, 2500, {"round": 100.0, "evaluation": 1000.0, "counted": True}, 10, 100
    )
    assert row["own_seconds_per_round"] == pytest.approx(0.5)  # 2 s a round, 1.5 of them at the rendezvous


def test_a_cell_that_left_early_bounds_the_rounds_the_group_timed():
    stamps = [[(1, 1.0, 0), (2, 2.0, 0), (3, 3.0, 0), (4, 4.0, 0)], [(1, 1.5, 0), (2, 2.5, 0), (3, 3.5, 0)], []]
    group = column_groups.group_figures(
        stamps, evaluated=None, eval_every=10, rounds=600, round_work=[1, 1, 1], eval_work=[1, 1, 1]
    )
    assert group["rounds_timed"] == 2 and group["seconds_per_round"] == pytest.approx(1.0)
    assert "error" in column_groups.group_figures([[(1, 1.0, 0)]], None, 10, 600, [1], [1])


def test_the_cells_are_table1s_at_each_client_count():
    """Picked from the spec's own cells (the 100-client setting with its 10% joining): the paper's settings."""
    ten = column_groups.column_cells(["fedavg"], 10, 5, "timed", None, None)
    hundred = column_groups.column_cells(["pfedme"], 100, 3, "projected", 30, 1)
    [(cell, every)] = ten
    assert (cell.clients, cell.participation, cell.rounds, cell.local_epochs, cell.finetune_epochs) == (
        10,
        1.0,
        600,
        10,
        10,
    )
    assert every == 10 and cell.eval_every == 5 and cell.partition_params["samples_per_client"] == 700
    [(cell, every)] = hundred
    assert (cell.clients, cell.participation, cell.rounds, cell.local_epochs) == (100, 0.1, 2500, 1)
    assert every == 50 and cell.eval_every == 2500 and cell.partition_params["samples_per_client"] == 30
    assert cell.hp["personal_lr"] == 0.01  # the spec's overrides kept


def sane(figures: dict, rounds: int, eval_every: int, rows: list[str]) -> None:
    group = figures["group"]
    assert figures["failed"] == [] and sorted(figures["rows"]) == sorted(rows)
    assert group["seconds_per_round"] > 0 and group["evaluation_seconds"] >= 0
    assert figures["sample_steps_per_second"] > 0
    assert figures["sample_steps_per_second"] == pytest.approx(
        group["sample_steps_per_round"] / group["seconds_per_round"]
    )
    assert figures["projected_column_seconds"] == pytest.approx(rounds * group["seconds_per_round_with_evaluation"])
    assert group["seconds_per_round_with_evaluation"] == pytest.approx(
        group["seconds_per_round"] + group["evaluation_seconds"] / eval_every
    )
    for name, row in figures["rows"].items():
        assert row["status"] == "finished" and row["path"] == "batched", (name, row)
        assert row["projected_cell_seconds"] == pytest.approx(rounds * row["seconds_per_round_with_evaluation"])
        assert row["calls"] > 0 and 0 <= row["own_seconds_per_round"] <= row["seconds_per_round"] + 1e-9
    assert not figures["counted"]  # the rehearsal's settings have no step count: nominal, and said so
    assert math.isfinite(figures["setup_seconds"])


def test_the_column_groups_step_rehearsed_gives_its_figures(tmp_path, fmnist):
    """The check's `column_groups` command at rehearsal size (two rows; the check runs all ten): the
    evaluation timed at the last round, the 600 rounds projected."""
    out = tmp_path / "column_groups.json"
    assert (
        column_groups.main(
            [
                "--device",
                "cpu",
                "--clients",
                "10",
                "--algorithms",
                "fedavg,pfedme",
                "--rounds",
                "3",
                "--samples",
                "30",
                "--epochs",
                "1",
                "--client-batching",
                "on",
                "--seconds",
                "300",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    sane(figures, 600, 10, ["fedavg", "pfedme"])
    assert figures["group"]["evaluation"] == "timed" and figures["rows"]["fedavg"]["merged_calls"] > 0


def test_the_group_100_step_rehearsed_gives_its_figures(tmp_path, fmnist):
    """The check's `group_100` command at rehearsal size (two rows): 100 clients, 10 a round, no round
    evaluating; the evaluation projected from the counted work, the 2500 rounds projected."""
    out = tmp_path / "group_100.json"
    assert (
        column_groups.main(
            [
                "--device",
                "cpu",
                "--clients",
                "100",
                "--algorithms",
                "fedavg,local",
                "--rounds",
                "3",
                "--evaluation",
                "projected",
                "--samples",
                "30",
                "--epochs",
                "1",
                "--client-batching",
                "on",
                "--seconds",
                "300",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    sane(figures, 2500, 50, ["fedavg", "local"])
    group = figures["group"]
    assert group["evaluation"].startswith("projected")
    # an evaluation adapts all 100 clients where a round trains 10: ten rounds' work
    assert group["evaluation_seconds"] == pytest.approx(10 * group["seconds_per_round"])
