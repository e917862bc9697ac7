"""benchmarks/table1.yaml and table2.yaml: pFedLA's Tables 1-2 cell for cell (rows x columns x
seeds, the paper's settings), their quick scale, and the spec options behind them (`scales`, `tuned`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from pflbench.algorithms.fedavg import FedAvg
from pflbench.algorithm import ALGORITHMS, get_algorithm
from pflbench.config import CellConfig, cell_hash
from pflbench.data.partitioning import make_partitioner
from pflbench.run.spec import load_spec, parse_spec
from pflbench.run.spec_problems import SpecError

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
ROWS = ["local", "fedavg", "perfedavg", "pfedme", "pfedhn", "fedbn", "fedrep", "fedfomo", "pfedla", "heurpfedla"]
DATASETS = ["emnist", "fmnist", "cifar10", "cifar100"]
CLIENTS = [(10, 1.0), (100, 0.1)]
# Per-class sample counts of the real datasets (train + test pooled), for partition checks offline.
CLASS_COUNTS = {
    "emnist": [2800] * 47,
    "fmnist": [7000] * 10,
    "cifar10": [6000] * 10,
    "cifar10-jpeg": [6000] * 10,
    "cifar100": [600] * 100,
}
TABLES = {"table1": ("pathological", "classes_per_client", 4, 12), "table2": ("dominant", "dominant_classes", 2, 6)}


def missing_rows() -> list[str]:
    get_algorithm("fedavg")  # registers the built-in algorithms
    return [name for name in ROWS if name not in ALGORITHMS]


@pytest.fixture
def table_rows(monkeypatch):
    """The tables' algorithms. Those not merged yet (Per-FedAvg, pFedMe, pFedHN, FedRep, FedFomo,
    pFedLA, HeurpFedLA are other issues) get a FedAvg stand-in under their name while a test of this
    module runs, so the counts are checked now; once an algorithm exists, its real class is used."""
    for name in missing_rows():
        monkeypatch.setitem(ALGORITHMS._entries, name, type(f"StandIn_{name}", (FedAvg,), {"name": name}))


@pytest.mark.parametrize("table", TABLES)
def test_full_scale_is_the_papers_table_rows_x_columns_x_seeds(table, table_rows):
    plan = load_spec(BENCHMARKS / f"{table}.yaml")
    assert plan.scale == "full" and plan.scales == ("full", "quick")
    assert len(plan.cells) == len(ROWS) * len(DATASETS) * len(CLIENTS) * 3 == 240
    entries = Counter((c.algorithm, c.dataset, c.clients, c.participation) for c in plan.cells)
    assert set(entries) == {(a, d, n, p) for a in ROWS for d in DATASETS for n, p in CLIENTS}
    assert set(entries.values()) == {3}
    assert {c.seed for c in plan.cells} == {0, 1, 2}
    assert len({cell_hash(c) for c in plan.cells}) == 240
    assert plan.optional_datasets == frozenset(DATASETS)
    assert plan.resources.gpus > 0


@pytest.mark.parametrize("table", TABLES)
def test_full_scale_has_the_papers_settings(table, table_rows):
    scheme, key, usual, cifar100 = TABLES[table]
    plan = load_spec(BENCHMARKS / f"{table}.yaml")
    per_client = {}
    for cell in plan.cells:
        assert cell.partition == scheme and cell.batch_size == 32 and cell.train_fraction == 0.7
        assert cell.momentum == 0 and cell.hp_source == "default"
        assert cell.lr == (0.01 if cell.dataset.startswith("cifar") else 0.005)
        assert (cell.rounds, cell.local_epochs) == ((600, 10) if cell.clients == 10 else (2500, 20))
        assert cell.partition_params[key] == (cifar100 if cell.dataset == "cifar100" else usual)
        per_client.setdefault(cell.dataset, set()).add(cell.partition_params["samples_per_client"])
        defaults = get_algorithm(cell.algorithm).Hyperparams().model_dump(mode="json")
        # The one deliberate departure (see the spec): pFedMe's personal_lr, as 0.09 diverged on fmnist.
        assert cell.hp == ({**defaults, "personal_lr": 0.01} if cell.algorithm == "pfedme" else defaults)
    # "all clients have the same amount of training data for both 10 and 100 clients cases"
    assert all(len(sizes) == 1 for sizes in per_client.values())
    # ... and every partition can be made from the real datasets' class sizes.
    for cell in {(c.dataset, c.clients): c for c in plan.cells}.values():
        counts = np.array(CLASS_COUNTS[cell.dataset])
        make_partitioner(cell.partition, cell.partition_params).check(cell.clients, len(counts), counts)


@pytest.mark.parametrize("table", TABLES)
def test_quick_scale_has_the_same_structure_on_offline_data(table, table_rows):
    """Documented in benchmarks/README.md: 10 rows x (fmnist, cifar10-jpeg) x (10, 100 clients) x 1 seed."""
    plan = load_spec(BENCHMARKS / f"{table}.yaml", scale="quick")
    assert plan.scale == "quick" and len(plan.cells) == 40
    assert set(Counter((c.algorithm, c.dataset, c.clients, c.participation) for c in plan.cells)) == {
        (a, d, n, p) for a in ROWS for d in ("fmnist", "cifar10-jpeg") for n, p in CLIENTS
    }
    assert {c.seed for c in plan.cells} == {0} and plan.resources.gpus == 0
    for cell in plan.cells:
        assert (cell.rounds, cell.local_epochs) == ((20, 2) if cell.clients == 10 else (30, 2))
        assert cell.partition_params["samples_per_client"] == 300
        assert cell.lr == (0.1 if cell.dataset == "cifar10-jpeg" else 0.05)  # 10x the paper's (fewer rounds)
        counts = np.array(CLASS_COUNTS[cell.dataset])
        make_partitioner(cell.partition, cell.partition_params).check(cell.clients, len(counts), counts)


def test_the_table_specs_name_only_registered_algorithms():
    """Needs the merge of the algorithm issues; until then it says which rows are missing."""
    missing = missing_rows()
    if missing:
        pytest.skip(f"not merged yet: {', '.join(missing)}")
    assert len(load_spec(BENCHMARKS / "table1.yaml").cells) == len(load_spec(BENCHMARKS / "table2.yaml").cells) == 240


# ---- the spec options: scales and tuned configurations ------------------------------------------

SPEC = {
    "name": "t",
    "matrix": {"algorithm": ["fedavg", "fedprox"], "dataset": ["synthetic"], "seed": [0, 1, 2]},
    "defaults": {"rounds": 50, "lr": 0.05},
    "overrides": [{"when": {"algorithm": "fedprox"}, "set": {"hp.mu": 0.5}}],
    "resources": {"cpus": 1, "gpus": 0.5},
    "scales": {
        "quick": {
            "matrix": {"seed": [0]},
            "defaults": {"local_epochs": 2},
            "overrides": [{"set": {"rounds": 3}}],
            "resources": {"gpus": 0},
        }
    },
}


def test_a_scale_replaces_axes_and_resources_and_comes_after_the_specs_overrides():
    full, quick = parse_spec(SPEC), parse_spec(SPEC, scale="quick")
    assert len(full.cells) == 6 and {c.rounds for c in full.cells} == {50} and full.resources.gpus == 0.5
    assert len(quick.cells) == 2 and {(c.rounds, c.local_epochs, c.seed) for c in quick.cells} == {(3, 2, 0)}
    assert quick.resources.gpus == 0 and quick.resources.cpus == 1
    assert [c.hp for c in quick.cells if c.algorithm == "fedprox"] == [{"mu": 0.5}]
    # --set still wins over the scale
    assert {c.rounds for c in parse_spec(SPEC, sets={"rounds": 7}, scale="quick").cells} == {7}


def test_scale_errors_name_the_scale_and_the_allowed_ones():
    with pytest.raises(
        SpecError, match=r"--scale: unknown scale 'quik' \(did you mean 'quick'\?\); allowed: full, quick"
    ):
        parse_spec(SPEC, scale="quik")
    bad = {**SPEC, "scales": {"quick": {"overrides": [{"set": {"rounds": 0}}]}}}
    with pytest.raises(SpecError, match=r"scales\.quick\.overrides\[0\]\.set\.rounds"):
        parse_spec(bad, scale="quick")
    with pytest.raises(SpecError, match="'full' is the spec as written"):
        parse_spec({**SPEC, "scales": {"full": {}}})


def write_tuned(folder: Path, algorithm: str, assign: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{algorithm}.yaml").write_text(
        yaml.safe_dump({"algorithm": algorithm, "set": assign, "tuned_on": {"trials": 20}})
    )


def test_tuned_configurations_apply_to_their_algorithm_and_mark_the_cells(tmp_path):
    write_tuned(tmp_path / "tuned", "fedprox", {"lr": 0.02, "hp": {"mu": 0.03}})
    default = parse_spec(SPEC)
    plan = parse_spec({**SPEC, "tuned": True}, base_dir=tmp_path)  # tuned/ next to the spec
    assert plan.tuned == {"fedprox": str(tmp_path / "tuned" / "fedprox.yaml")}
    for before, after in zip(default.cells, plan.cells):
        if after.algorithm == "fedprox":  # tuned values win over the spec's overrides; --set would win over them
            assert (after.lr, after.hp, after.hp_source) == (0.02, {"mu": 0.03}, "tuned")
            assert cell_hash(after) != cell_hash(before)
        else:  # no tuned file: paper defaults, same cell as without `tuned`
            assert after == before and after.hp_source == "default"
    assert {c.lr for c in parse_spec({**SPEC, "tuned": True}, base_dir=tmp_path, sets={"lr": 0.1}).cells} == {0.1}
    # A list requires those files; `dir` points elsewhere.
    with pytest.raises(
        SpecError, match=r"tuned\.algorithms\[0\]: no tuned configuration for 'fedavg'.*pflbench sweep --algo fedavg"
    ):
        parse_spec({**SPEC, "tuned": ["fedavg"]}, base_dir=tmp_path)
    same = parse_spec({**SPEC, "tuned": {"dir": str(tmp_path / "tuned"), "algorithms": ["fedprox"]}})
    assert same.cells == plan.cells
    assert parse_spec({**SPEC, "tuned": False}).cells == default.cells


def test_a_bad_tuned_file_is_an_error_naming_it(tmp_path):
    write_tuned(tmp_path / "tuned", "fedprox", {"hp": {"nu": 1.0}})
    with pytest.raises(SpecError, match=r"fedprox\.yaml: set.*'nu'"):
        parse_spec({**SPEC, "tuned": True}, base_dir=tmp_path)


def test_hp_source_leaves_existing_hashes_alone():
    cell = CellConfig(algorithm="fedavg", dataset="synthetic")
    assert "hp_source" not in cell.canonical_json()
    assert cell_hash(cell.model_copy(update={"hp_source": "tuned"})) != cell_hash(cell)


@pytest.mark.parametrize("table", TABLES)
def test_validation_split_and_quick_scale_choices(table, table_rows):
    """Full scale: no validation carve-out (the paper scores the final round and trains on all 70%),
    except FedFomo, whose weighting needs validation data of its own; quick scale: 10% validation,
    and Per-FedAvg's meta step at the value chosen on validation accuracy (issue 29, items 6 and 8)."""
    full = load_spec(BENCHMARKS / f"{table}.yaml")
    for cell in full.cells:
        assert cell.train_fraction == 0.7
        assert cell.val_fraction == (0.1 if cell.algorithm == "fedfomo" else 0.0), cell.algorithm
        assert cell.algorithm != "perfedavg" or cell.hp["beta"] == 0.001  # the references' meta step
    quick = load_spec(BENCHMARKS / f"{table}.yaml", scale="quick")
    assert {c.val_fraction for c in quick.cells} == {0.1}
    assert {c.hp.get("beta") for c in quick.cells if c.algorithm == "perfedavg"} == {0.05}
    assert {(c.dataset, c.lr) for c in quick.cells} == {("fmnist", 0.05), ("cifar10-jpeg", 0.1)}
