"""What a researcher sees beside the numbers: each table's training budget, entries that repeat another
algorithm's results bit for bit, ties, datasets a run left out (`<results>/_notes.json`) and cells
still running. Stores written directly (report_helpers), no training, no figures: fast."""

from __future__ import annotations

import json

import pandas as pd
from report_helpers import write_cell

from pflbench.reports.build import ReportOptions, build_reports
from pflbench.reports.budget import budget_text, describe
from pflbench.reports.cells import load_cells
from pflbench.reports.progress import HOW_TO_PROVIDE, progress_text, skipped_datasets, store_progress
from pflbench.reports.tables import accuracy_tables
from pflbench.reports.text import latex_report, markdown_report


def entries(table, column=0):
    col = table.columns[column]
    return {row.algorithm: table.entry(row, col) for row in table.rows if table.entry(row, col) is not None}


def test_identical_entries_are_flagged_with_their_reason_and_not_ranked(tmp_path):
    for seed in (0, 1):
        write_cell(tmp_path, algorithm="fedavg", seed=seed, accuracies=(0.6 + seed / 10, 0.7))
        write_cell(tmp_path, algorithm="fedbn", seed=seed, accuracies=(0.6 + seed / 10, 0.7))  # = FedAvg
        write_cell(tmp_path, algorithm="local", seed=seed, accuracies=(0.5, 0.55))
        # equal to FedAvg on seed 0 only: not the same results
        write_cell(tmp_path, algorithm="fedprox", seed=seed, accuracies=(0.6, 0.7) if seed == 0 else (0.62, 0.7))
    table = accuracy_tables(load_cells(tmp_path))[0]
    found = entries(table)
    assert found["fedbn"].same_as is not None and found["fedbn"].same_as.algorithm == "fedavg"
    assert found["fedavg"].same_as is None and found["local"].same_as is None and found["fedprox"].same_as is None
    assert found["fedavg"].top and not found["fedbn"].top and not found["fedbn"].tied  # one result, ranked once
    assert "(= FedAvg)" in found["fedbn"].text()
    assert len(table.identical) == 1 and "bit-identical to FedAvg" in table.identical[0]
    assert "BatchNorm" in table.identical[0]  # the known reason
    text = markdown_report([table], [], [], seeds=2, statuses={"finished": 8})
    assert "(= FedAvg)" in text and "bit-identical to FedAvg" in text
    assert "bit-identical" in latex_report([table], [], [])


def test_a_different_seed_set_or_a_failed_cell_is_not_identical(tmp_path):
    write_cell(tmp_path, algorithm="fedavg", seed=0, accuracies=(0.6, 0.7))
    write_cell(tmp_path, algorithm="fedavg", seed=1, accuracies=(0.6, 0.7))
    write_cell(tmp_path, algorithm="fedbn", seed=0, accuracies=(0.6, 0.7))
    write_cell(tmp_path, algorithm="fedfomo", seed=0, accuracies=(0.6, 0.7), status="failed")
    found = entries(accuracy_tables(load_cells(tmp_path))[0])
    assert found["fedbn"].same_as is None and found["fedfomo"].same_as is None


def test_rows_the_test_cannot_separate_are_tied_and_references_never_ranked(tmp_path):
    """Two clients cannot separate anything (stats.py: a signed-rank test on 2 pairs): no bold, the
    highest mean and every other ranked row marked ≈; the reference row (Centralized) is neither."""
    write_cell(tmp_path, algorithm="fedavg", accuracies=(0.70001, 0.7))
    write_cell(tmp_path, algorithm="local", accuracies=(0.70004, 0.7))  # 70.00 as displayed
    write_cell(tmp_path, algorithm="pfedla", accuracies=(0.69, 0.7))
    write_cell(tmp_path, algorithm="centralized", accuracies=(0.9, 0.9))
    table = accuracy_tables(load_cells(tmp_path))[0]
    found = entries(table)
    assert found["local"].top and found["local"].tied and not found["local"].best
    assert found["fedavg"].tied and found["pfedla"].tied and not found["fedavg"].best
    assert not any((found["centralized"].best, found["centralized"].top, found["centralized"].tied))
    assert found["fedavg"].versus.algorithm == "local" and "p = " in found["fedavg"].test_title()
    assert "Wilcoxon signed-rank" in table.marks and "level 0.05" in table.marks


def test_budget_caption_names_rounds_epochs_lr_samples_clients_and_exceptions(tmp_path):
    for algorithm in ("local", "fedavg", "fedbn"):
        write_cell(
            tmp_path, algorithm=algorithm, lr=0.05, local_epochs=2, samples_per_client=300, accuracies=(0.6, 0.7)
        )
    write_cell(tmp_path, algorithm="pfedhn", lr=0.01, local_epochs=2, samples_per_client=300, accuracies=(0.6, 0.7))
    table = accuracy_tables(load_cells(tmp_path))[0]
    assert table.budget.startswith("Budget: 3 rounds, 2 local epochs, lr 0.05 (pFedHN: lr 0.01)")
    assert "300 samples per client" in table.budget and "10 clients, all in every round" in table.budget
    text = markdown_report([table], [], [], seeds=1, statuses={"finished": 4})
    assert "Budget: 3 rounds, 2 local epochs" in text
    assert "Budget: 3 rounds" in latex_report([table], [], [])


def test_budget_per_column_when_columns_differ_and_varies_without_a_majority(tmp_path):
    write_cell(tmp_path, algorithm="fedavg", dataset="fmnist", participation=0.1, clients=100, accuracies=(0.6, 0.7))
    write_cell(tmp_path, algorithm="fedavg", dataset="fmnist", clients=10, accuracies=(0.6, 0.7))
    table = accuracy_tables(load_cells(tmp_path))[0]
    assert table.budget.startswith("Budget per column: ")
    assert "fmnist, 10 clients: " in table.budget and "100 clients, 10% per round" in table.budget
    assert describe({"a": "lr 0.1", "b": "lr 0.2"}).startswith("varies: lr 0.1 (a); lr 0.2 (b)")
    cells = pd.DataFrame(
        [
            {
                "algorithm": "local",
                "rounds": 5,
                "local_epochs": 1,
                "finetune_epochs": 2,
                "partition_params.mean_samples_per_client": 300.0,
                "clients": 10,
                "participation": 1.0,
            }
        ]
    )
    text = budget_text(cells)
    assert "5 rounds, 1 local epoch" in text and "300 samples per client on average" in text
    assert "local adaptation 2 epochs" in text


def test_skipped_datasets_note_is_on_the_report_and_leaderboard(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    write_cell(store, algorithm="fedavg", dataset="synthetic", accuracies=(0.6, 0.7))
    (store / "_notes.json").write_text(
        json.dumps(
            {
                "skipped_datasets": {
                    "fmnist": {
                        "cells": 16,
                        "reason": "no copy in the data root or the mirror, and no download",
                        "looked_in": ["/data/root/fmnist", "/mirror/fmnist"],
                    },
                    "synthetic": {"cells": 3},
                }
            }
        )
    )  # has results now: not listed
    listed = skipped_datasets(store, {"synthetic"})
    assert [item["dataset"] for item in listed] == ["fmnist"] and listed[0]["how_to_provide"] == HOW_TO_PROVIDE
    report = build_reports(store, out, ReportOptions(figures=False))
    markdown, html = report.markdown.read_text(), report.index.read_text()
    for text in (markdown.replace("\\_", "_"), html):
        assert "16 cells on" in text and "fmnist" in text and "/mirror/fmnist" in text
        assert "--from" in text and "PFLBENCH_DATA_MIRROR" in text and "pflbench data prepare" in text
    assert 'class="skipped"' in html


def test_a_store_being_filled_says_how_many_cells_run(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    write_cell(store, algorithm="fedavg", accuracies=(0.6, 0.7))
    for name, files in (
        ("aaaaaaaaaaaa", ("config.json", "claim.json")),
        ("bbbbbbbbbbbb", ("config.json",)),
        ("cccccccccccc", ("config.json",)),
    ):
        (store / name).mkdir()
        for file in files:
            (store / name / file).write_text("{}")
    assert store_progress(store) == {"running": 1, "unfinished": 2}
    assert "1 cell is being run" in progress_text(store_progress(store))
    report = build_reports(store, out, ReportOptions(figures=False))
    for text in (report.markdown.read_text(), report.index.read_text()):
        assert "still being filled" in text and "2 cells were started" in text
    assert progress_text({"running": 0, "unfinished": 0}) == ""
