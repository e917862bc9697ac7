"""The table builder on a store written directly: mean ± std over seeds, the best in bold only where a
paired test separates it (two clients cannot: ties marked ≈, test_report_stats.py has the rest), missing entries
shown as missing, failed and diverged entries as such, the paper's numbers and deltas in the right
cells, tuned entries marked, Table 3 matched by HeurpFedLA's k."""

from __future__ import annotations

import pytest
from report_helpers import write_cell

from pflbench.reports.cells import load_cells
from pflbench.reports.reference import default_reference_dir, load_references
from pflbench.reports.tables import accuracy_tables, communication_tables
from pflbench.reports.text import latex_report, markdown_table


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    for seed, acc in enumerate((0.80, 0.82, 0.84)):  # 82.00 ± 2.00
        write_cell(root, algorithm="fedavg", seed=seed, accuracies=(acc, acc))
    for seed, acc in enumerate((0.90, 0.92)):  # 91.00 ± 1.41, the best on fmnist
        write_cell(root, algorithm="pfedla", seed=seed, accuracies=(acc - 0.1, acc + 0.1))
    write_cell(root, algorithm="local", status="failed", error="Traceback\nRuntimeError: boom")
    write_cell(root, algorithm="local", seed=1, status="diverged", error="round 2: nan")
    write_cell(root, algorithm="fedavg", dataset="cifar10-jpeg", accuracies=(0.40, 0.50))
    write_cell(root, algorithm="pfedla", dataset="cifar10-jpeg", accuracies=(0.60, 0.60), hp_source="tuned")
    write_cell(root, algorithm="fedavg", partition="dominant", accuracies=(0.70, 0.70))
    for k, acc in ((1, 0.93), (2, 0.95)):
        write_cell(
            root,
            algorithm="heurpfedla",
            dataset="emnist",
            hp={"retain_layers": k},
            accuracies=(acc, acc),
            bytes_per_round=2_000_000 * (3 - k),
        )
    return root


@pytest.fixture(scope="module")
def tables(store):
    cells = load_cells(store)
    refs = load_references(default_reference_dir())
    return {t.scheme: t for t in accuracy_tables(cells, refs)}, communication_tables(cells, refs), cells


def entry(table, algorithm, dataset, clients=10, tuned=False, variant=""):
    row = next(r for r in table.rows if r.algorithm == algorithm and r.tuned == tuned and r.variant == variant)
    column = next(c for c in table.columns if c.dataset == dataset and c.clients == clients)
    return table.entry(row, column)


def md_rows(text: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()]
    return lines[0], {cells[0]: cells for cells in lines[2:]}


def test_references_transcribe_pfedla_tables():
    refs = {r.name: r for r in load_references(default_reference_dir())}
    assert {"pfedla_table1", "pfedla_table2", "pfedla_table3"} <= set(refs)
    t1, t2, t3 = refs["pfedla_table1"].rows, refs["pfedla_table2"].rows, refs["pfedla_table3"].rows
    # 10 algorithms x 8 columns, FedBN without EMNIST/FashionMNIST
    assert len(t1) == len(t2) == 76
    for rows in (t1, t2, t3):  # every number declared after local adaptation, with its samples per client
        assert set(rows["protocol"]) == {"adapted-final-clients"} and rows["samples_per_client"].notna().all()
    assert dict(zip(t1.dataset, t1.samples_per_client)) == {
        "emnist": 1244,
        "fmnist": 700,
        "cifar10": 600,
        "cifar100": 600,
    }
    assert dict(zip(t2.dataset, t2.samples_per_client)) == {
        "emnist": 1170,
        "fmnist": 700,
        "cifar10": 600,
        "cifar100": 530,
    }
    assert (
        any("91.24" in line and "79.9-86.2%" in line for line in refs["pfedla_table1"].meta["protocol"])
        and set(t1["partition"]) == {"pathological"}
        and set(t2["partition"]) == {"dominant"}
    )
    row = t1[(t1.algorithm == "pfedla") & (t1.dataset == "cifar10") & (t1.clients == 100)].iloc[0]
    assert (row["mean"], row["std"]) == (73.15, 0.83)
    assert "settings" in refs["pfedla_table1"].meta and "source" in refs["pfedla_table1"].meta
    assert t3["comm_mbytes"].tolist() == [491.08, 488.65, 312.52, 693.98, 418.97, 382.25, 379.82]


def test_mean_std_best_missing_and_problems(tables):
    by_scheme, _, _ = tables
    table = by_scheme["pathological"]
    fedavg = entry(table, "fedavg", "fmnist")
    assert fedavg.mean == pytest.approx(82.0) and fedavg.std == pytest.approx(2.0) and fedavg.text() == "82.00 ± 2.00 ≈"
    pfedla = entry(table, "pfedla", "fmnist")  # the highest mean, but 2 clients x 2 seeds cannot separate it
    assert pfedla.mean == pytest.approx(91.0) and pfedla.top and pfedla.tied and not pfedla.best and not fedavg.best
    local = entry(table, "local", "fmnist")
    assert local.mean is None and local.problems == {"diverged": 1, "failed": 1} and local.text() == "diverged, failed"
    assert entry(table, "local", "cifar10-jpeg") is None  # never run: missing

    header, rows = md_rows(markdown_table(table))
    fmnist = header.index("fmnist, 10 clients")
    assert rows["pFedLA"][fmnist] == "91.00 ± 1.41 ≈"
    assert rows["FedAvg"][fmnist] == "82.00 ± 2.00 ≈"
    assert rows["Local"][fmnist] == "diverged, failed"  # not 0
    jpeg = header.index("cifar10-jpeg ‡, 10 clients")
    assert rows["Local"][jpeg] == "–"


def test_paper_numbers_in_the_right_cells_without_a_delta_for_other_protocols_and_settings(tables):
    """pFedLA's numbers are declared after local adaptation, and these 3-round cells differ from its
    settings: each paper number is shown (in parentheses: another protocol) with a footnote, no Δ."""
    by_scheme, _, _ = tables
    table = by_scheme["pathological"]
    header, rows = md_rows(markdown_table(table))
    fmnist = header.index("fmnist, 10 clients")
    assert header[fmnist + 1 : fmnist + 3] == ["paper", "Δ"]
    fedavg = entry(table, "fedavg", "fmnist")
    assert fedavg.delta is None and fedavg.other_protocol
    assert rows["FedAvg"][fmnist + 1 : fmnist + 3] == [
        "(91.24 ± 0.98)",
        f"– [{fedavg.footnote}]",
    ]  # Table 1, FMNIST, 10
    reason = table.footnotes[fedavg.footnote - 1]
    assert "protocol differs" in reason and "after local adaptation · final round · mean over clients" in reason
    assert "rounds 3 vs 600, local_epochs 1 vs 10, lr 0.01 vs 0.005, samples_per_client unset vs 700" in reason
    assert rows["pFedLA"][fmnist + 1] == "(94.34 ± 0.29)"
    assert rows["Local"][fmnist + 1 : fmnist + 3] == ["(85.83 ± 0.17)", "–"]  # no number of ours: no footnote
    jpeg = header.index("cifar10-jpeg ‡, 10 clients")  # compared with CIFAR-10, marked
    assert rows["FedAvg"][jpeg : jpeg + 2] == ["45.00 ≈", "(48.57 ± 0.63)"]
    assert rows["pFedLA †"][jpeg : jpeg + 2] == ["60.00 ≈ †", "(61.43 ± 0.56)"]  # tuned: marked
    assert not table.any_delta
    header, rows = md_rows(markdown_table(by_scheme["dominant"]))  # Table 2 for the dominant scheme
    assert rows["FedAvg"][1:3] == ["70.00", "(89.09 ± 0.57)"] and rows["FedAvg"][3].startswith("– [")


def test_table3_matches_heurpfedla_by_k(tables):
    _, comm, _ = tables
    emnist = next(t for t in comm if t.column.dataset == "emnist")
    by_label = {row.label: e for row, e in emnist.rows}
    assert set(by_label) == {"HeurpFedLA (retain_layers=1)", "HeurpFedLA (retain_layers=2)"}
    assert (
        by_label["HeurpFedLA (retain_layers=1)"].paper.mean,
        by_label["HeurpFedLA (retain_layers=1)"].paper.comm_mbytes,
    ) == (94.11, 488.65)
    assert by_label["HeurpFedLA (retain_layers=2)"].paper.comm_mbytes == 312.52
    assert by_label["HeurpFedLA (retain_layers=1)"].mbytes_per_round == [pytest.approx(4.0)]
    assert by_label["HeurpFedLA (retain_layers=2)"].mbytes == [pytest.approx(6.0)]


def test_latex_is_booktabs_and_escaped(tables):
    by_scheme, comm, _ = tables
    text = latex_report(list(by_scheme.values()), [], comm)
    assert text.count(r"\toprule") == text.count(r"\bottomrule") == len(by_scheme) + len(comm)
    assert r"91.00 $\pm$ 1.41 $\approx$" in text and r"\multicolumn{3}{c}{fmnist, 10 clients}" in text
    assert "classes_per_client" not in text  # underscores escaped
    assert r"$^\dagger$" in text and r"$^\ddagger$" in text


def test_a_hyperparameter_chosen_per_dataset_is_one_row(tmp_path):
    write_cell(tmp_path, algorithm="fedprox", hp={"mu": 0.1}, accuracies=(0.8, 0.8))
    write_cell(tmp_path, algorithm="fedprox", dataset="emnist", hp={"mu": 0.01}, accuracies=(0.7, 0.7))
    write_cell(tmp_path, algorithm="fedprox", dataset="emnist", seed=1, hp={"mu": 0.1}, accuracies=(0.6, 0.6))
    (table,) = accuracy_tables(load_cells(tmp_path))
    assert [r.label for r in table.rows] == ["FedProx (mu=0.01)", "FedProx (mu=0.1)"]  # emnist holds both
    write_cell(tmp_path / "b", algorithm="fedprox", hp={"mu": 0.1}, accuracies=(0.8, 0.8))
    write_cell(tmp_path / "b", algorithm="fedprox", dataset="emnist", hp={"mu": 0.01}, accuracies=(0.7, 0.7))
    (table,) = accuracy_tables(load_cells(tmp_path / "b"))
    assert [r.label for r in table.rows] == ["FedProx"]


def test_cells_of_one_method_with_other_budgets_are_other_rows_never_seeds(tmp_path):
    """A 100-round validation run beside the 600-round cell (or an MLP beside the CNN) is another row,
    labelled by what differs; cells differing only in their seed are one entry."""
    write_cell(tmp_path, algorithm="perfedavg", rounds=3, accuracies=(0.9, 0.9))
    write_cell(tmp_path, algorithm="perfedavg", rounds=3, seed=1, accuracies=(0.8, 0.8))
    write_cell(tmp_path, algorithm="perfedavg", rounds=2, config={"val_fraction": 0.0}, accuracies=(0.5, 0.5))
    (table,) = accuracy_tables(load_cells(tmp_path))
    (column,) = table.columns
    entries = {row.label: table.entries[(row.key, column.key)] for row in table.rows}
    assert set(entries) == {"Per-FedAvg (rounds=2, val_fraction=0)", "Per-FedAvg (rounds=3, val_fraction=0.1)"}
    assert entries["Per-FedAvg (rounds=3, val_fraction=0.1)"].values == pytest.approx([90.0, 80.0])  # two seeds
    assert entries["Per-FedAvg (rounds=2, val_fraction=0)"].values == pytest.approx([50.0])


def test_stores_beside_join_the_tables_and_keep_their_own_provenance(tmp_path):
    """`beside` stores (pflbench report --beside, the leaderboard's leaderboard.yaml): their cells join
    the tables as rows told apart by what differs; a cell id in both stores is one cell."""
    from pflbench.reports.build import ReportOptions, build_reports

    main, variants = tmp_path / "column", tmp_path / "variants"
    write_cell(main, algorithm="local", accuracies=(0.9, 0.9))
    write_cell(main, algorithm="pfedhn", hp={"inner_optimizer": "cell"}, accuracies=(0.8, 0.8))
    shared = write_cell(variants, algorithm="local", accuracies=(0.9, 0.9))  # the same cell, stored twice
    write_cell(variants, algorithm="pfedhn", hp={"inner_optimizer": "official"}, accuracies=(0.95, 0.95))
    cells = load_cells(main, beside=[variants])
    assert len(cells) == 3 and (cells["hash"] == shared).sum() == 1
    assert cells.loc[cells["hash"] == shared, "path"].item().startswith(str(main))  # the first store's
    (table,) = accuracy_tables(cells)
    assert [row.label for row in table.rows] == [
        "Local",
        "pFedHN (inner_optimizer=cell)",
        "pFedHN (inner_optimizer=official)",
    ]
    report = build_reports(main, tmp_path / "out", ReportOptions(figures=False, partitions=False, beside=(variants,)))
    assert any("beside this store's cells: 1 cell of variants" in note for note in report.notes)
    assert "pFedHN (inner\\_optimizer=official) | 95.00" in report.markdown.read_text()
    alone = build_reports(main, tmp_path / "alone", ReportOptions(figures=False, partitions=False))
    assert "official" not in alone.markdown.read_text()


def test_a_hyperparameter_equal_in_every_cell_is_not_a_variant_when_its_column_types_differ(tmp_path):
    """100 read from a store where the column also has gaps (a float column) and 100 from one where it
    has none (an int column) are one value: only what really differs names the rows."""
    main, variants, others = tmp_path / "column", tmp_path / "variants", tmp_path / "others"
    write_cell(main, algorithm="local", accuracies=(0.9, 0.9))  # no embed_dim: that column has a gap
    write_cell(main, algorithm="pfedla", hp={"embed_dim": 100, "hn_lr": 0.01}, accuracies=(0.9, 0.9))
    write_cell(variants, algorithm="pfedla", hp={"embed_dim": 100, "hn_lr": 0.005}, accuracies=(0.8, 0.8))
    write_cell(others, algorithm="pfedhn", hp={"embed_dim": None}, accuracies=(0.9, 0.9))  # an empty column
    cells = load_cells(main, beside=[variants, others])
    assert sorted(map(repr, cells.loc[cells["algorithm"] == "pfedla", "hp.embed_dim"])) == ["100", "100.0"]
    (table,) = accuracy_tables(cells)
    assert [row.label for row in table.rows] == ["Local", "pFedHN", "pFedLA (hn_lr=0.005)", "pFedLA (hn_lr=0.01)"]


def test_a_hyperparameter_set_to_none_is_a_setting_of_its_own(tmp_path):
    """`hp.inner_steps: null` (pFedHN's 10 local epochs instead of 50 steps) is not the 50-step cell's
    seed: it gets its own row, in one store (where the frame shows None as NaN) and beside another;
    a key a cell's configuration lacks (an option added later) is the algorithm's default."""
    one, other = tmp_path / "one", tmp_path / "other"
    write_cell(one, algorithm="pfedhn", hp={"inner_steps": 50}, accuracies=(0.9, 0.9))
    write_cell(one, algorithm="pfedhn", hp={"inner_steps": None}, accuracies=(0.8, 0.8))
    write_cell(other, algorithm="pfedhn", hp={"inner_steps": None}, accuracies=(0.8, 0.8))
    write_cell(other, algorithm="pfedla", accuracies=(0.7, 0.7))  # no hn_sign
    write_cell(other, algorithm="pfedla", seed=1, hp={"hn_sign": "descend"}, accuracies=(0.7, 0.7))
    (table,) = accuracy_tables(load_cells(one))
    assert [row.label for row in table.rows] == ["pFedHN (inner_steps=50)", "pFedHN (inner_steps=null)"]
    assert entry(table, "pfedhn", "fmnist", variant="inner_steps=null").mean == pytest.approx(80.0)
    (table,) = accuracy_tables(load_cells(tmp_path / "none", beside=[other, one]))
    assert [row.label for row in table.rows] == ["pFedHN (inner_steps=50)", "pFedHN (inner_steps=null)", "pFedLA"]
    # beside a cell that does set it otherwise, the lacking key reads as the default (as `pflbench
    # rerun` resolves it): the cells without it and with the default are seeds of one row
    write_cell(other, algorithm="pfedla", hp={"hn_sign": "ascend"}, accuracies=(0.5, 0.5))
    (table,) = accuracy_tables(load_cells(other))
    assert [row.label for row in table.rows] == ["pFedHN", "pFedLA (hn_sign=ascend)", "pFedLA (hn_sign=descend)"]
    assert len(entry(table, "pfedla", "fmnist", variant="hn_sign=descend").seeds) == 2


def test_an_empty_store_reports_that_it_is_empty(tmp_path):
    from pflbench.reports.build import ReportOptions, build_reports

    report = build_reports(tmp_path / "none", tmp_path / "out", ReportOptions(partitions=False))
    assert "no results yet" in report.markdown.read_text() and "no results yet" in report.index.read_text()


def test_a_table_mixing_training_paths_or_devices_says_so(tmp_path):
    from pflbench.reports.cells import load_cells

    write_cell(
        tmp_path, algorithm="fedavg", accuracies=(0.5, 0.5), summary={"client_batching": "loop", "device": "cpu"}
    )
    write_cell(tmp_path, algorithm="local", accuracies=(0.6, 0.6), summary={"client_batching": "loop", "device": "cpu"})
    (table,) = accuracy_tables(load_cells(tmp_path))
    assert not any("mixes" in note for note in table.notes)
    write_cell(
        tmp_path, algorithm="pfedla", accuracies=(0.7, 0.7), summary={"client_batching": "batched", "device": "cuda"}
    )
    (table,) = accuracy_tables(load_cells(tmp_path))
    notes = " ".join(table.notes)
    assert "different training paths (1 batched, 2 loop)" in notes and "different devices (2 cpu, 1 cuda)" in notes
    write_cell(
        tmp_path,
        algorithm="ditto",
        accuracies=(0.7, 0.7),
        summary={"client_batching": "loop", "device": "cpu", "channels_last": True, "client_threads": 2},
    )
    write_cell(
        tmp_path,
        algorithm="fedper",
        accuracies=(0.7, 0.7),
        summary={"client_batching": "loop", "device": "cpu", "channels_last": False, "client_threads": 1},
    )
    notes = " ".join(accuracy_tables(load_cells(tmp_path))[0].notes)
    assert "different memory layouts (channels-last or not) (1 False, 1 True)" in notes
    assert "different client-thread counts (1 1, 1 2)" in notes


def test_execution_settings_are_compared_within_a_column_not_across_columns(tmp_path):
    """A CNN column run channels-last beside an MLP column run without (the demo's fmnist and synthetic)
    compares no cell of one with a cell of the other: no note. A column whose own cells differ is named."""
    from pflbench.reports.cells import load_cells

    for algorithm in ("fedavg", "local"):
        write_cell(
            tmp_path, algorithm=algorithm, dataset="fmnist", accuracies=(0.6, 0.6), summary={"channels_last": True}
        )
        write_cell(
            tmp_path, algorithm=algorithm, dataset="synthetic", accuracies=(0.6, 0.6), summary={"channels_last": False}
        )
    (table,) = accuracy_tables(load_cells(tmp_path))
    assert len(table.columns) == 2 and not any("mixes" in note or "different" in note for note in table.notes)
    write_cell(tmp_path, algorithm="pfedla", dataset="fmnist", accuracies=(0.7, 0.7), summary={"channels_last": False})
    (table,) = accuracy_tables(load_cells(tmp_path))
    [note] = [note for note in table.notes if "memory layouts" in note]
    assert (
        note.startswith("fmnist, 10 clients: its cells were run on different memory layouts")
        and "(1 False, 2 True)" in note
    )


def test_a_setting_is_mixed_only_where_its_printed_values_differ():
    """100 (an int column) beside 100.0 (a float column with gaps elsewhere) is one setting, as the row
    labels print it; another value, or a cell lacking the field, is a difference the table notes."""
    import pandas as pd

    from pflbench.reports.tables import mixed_columns

    group = pd.DataFrame(
        {
            "partition_params.samples_per_client": pd.Series([100, 100.0], dtype=object),
            "rounds": [600, 600],
            "lr": [0.01, 0.005],
            "batch_size": [32.0, float("nan")],
            "seed": [0, 1],
            "hp.beta": [1e-3, 5e-3],
            "accuracy": [0.8, 0.9],
        }
    )
    assert mixed_columns(group) == ["lr", "batch_size"]
