"""Specs: expansion, stable hashes, overrides and `--set`, and one clear error per kind of bad spec."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithm import Hyperparams as BaseHyperparams
from pflbench.fedavg import FedAvg
from pflbench.config import cell_hash
from pflbench.run.spec import load_spec, parse_spec
from pflbench.run.spec_axes import parse_sets
from pflbench.run.spec_problems import SpecError


class ProxLike(FedAvg):
    """Only here to give specs an algorithm with hyperparameters (its training is FedAvg's)."""

    name = "test-spec-prox"

    class Hyperparams(BaseHyperparams):
        mu: float = Field(0.01, ge=0.0)


@pytest.fixture(autouse=True)
def prox_like(monkeypatch):
    """Registered only while a test of this module runs, so no other test ever sees it."""
    monkeypatch.setitem(ALGORITHMS._entries, ProxLike.name, ProxLike)


BASE = {
    "name": "t",
    "matrix": {
        "algorithm": ["fedavg", "local"],
        "dataset": ["synthetic"],
        "partition": [
            {"scheme": "pathological", "params": {"classes_per_client": 2}},
            {"scheme": "dirichlet", "params": {"alpha": 0.5}},
        ],
        "clients": [4, {"clients": 6, "participation": 0.5}],
        "seed": [0, 1],
    },
    "defaults": {"rounds": 3, "lr": 0.05},
}


def spec(**changes):
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node, *keys = path.split("__")
        target = data
        for key in [node, *keys][:-1]:
            target = target.setdefault(key, {})
        target[[node, *keys][-1]] = value
    return data


def errors(data, sets=None) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="bench.yaml", sets=sets)
    return str(caught.value)


def test_expansion_count_order_and_stable_hashes(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    plan = load_spec(path)
    assert plan.name == "t" and len(plan.cells) == 2 * 1 * 2 * 2 * 2
    first = plan.cells[0]
    assert (first.algorithm, first.partition, first.clients, first.seed) == ("fedavg", "pathological", 4, 0)
    assert plan.cells[1].seed == 1  # the last axis varies fastest
    # Defaults of the scheme and of the dataset are resolved into the cell (and so into its hash).
    assert first.partition_params == {"classes_per_client": 2, "samples_per_client": None}
    assert first.dataset_options["num_samples"] == 6000
    assert {(c.clients, c.participation) for c in plan.cells} == {(4, 1.0), (6, 0.5)}
    hashes = [cell_hash(c) for c in plan.cells]
    assert len(set(hashes)) == len(hashes)

    # Same content written differently -> same cells, same hashes.
    reordered = {
        "defaults": {"lr": 0.05, "rounds": 3},
        "name": "t",
        "matrix": dict(reversed(list(BASE["matrix"].items()))),
    }
    path.write_text(yaml.safe_dump(reordered, sort_keys=False))
    assert sorted(cell_hash(c) for c in load_spec(path).cells) == sorted(hashes)
    explicit = spec(defaults={"rounds": 3, "lr": 0.05, "partition_params": {}, "hp": {}})
    explicit["matrix"]["partition"][1]["params"]["min_samples"] = 10  # the scheme's default, made explicit
    assert [cell_hash(c) for c in parse_spec(explicit).cells] == hashes


def test_overrides_apply_in_order_and_set_wins():
    data = spec(
        overrides=[
            {"when": {"partition": "pathological"}, "set": {"partition_params.samples_per_client": 40, "lr": 0.1}},
            {"when": {"clients": 6, "lr": 0.1}, "set": {"rounds": 7}},  # sees the first override's lr
            {"when": {"algorithm": ["local"], "seed": 1}, "set": {"local_epochs": 2}},
        ]
    )
    cells = parse_spec(data).cells
    for cell in cells:
        pathological = cell.partition == "pathological"
        assert cell.partition_params.get("samples_per_client") == (40 if pathological else None)
        assert cell.lr == (0.1 if pathological else 0.05)
        assert cell.rounds == (7 if pathological and cell.clients == 6 else 3)
        assert cell.local_epochs == (2 if cell.algorithm == "local" and cell.seed == 1 else 1)

    # --set: a plain key overrides every cell (after the overrides); an axis key replaces the axis.
    cells = parse_spec(data, sets={"rounds": 2, "seed": [5, 6, 7], "algorithm": "local"}).cells
    assert len(cells) == 1 * 2 * 2 * 3
    assert {c.rounds for c in cells} == {2} and {c.seed for c in cells} == {5, 6, 7}
    assert {c.algorithm for c in cells} == {"local"}
    plan = parse_spec(data, sets={"resources.gpus": 0.25})
    assert (plan.resources.cpus, plan.resources.gpus) == (1.0, 0.25)


def test_command_line_values_are_yaml_like_the_file(tmp_path):
    assert parse_sets(["rounds=2", "seed=[0, 1]", "algorithm=[fedavg, local]", "lr=1e-3", "model=cnn"]) == {
        "rounds": 2,
        "seed": [0, 1],
        "algorithm": ["fedavg", "local"],
        "lr": "1e-3",
        "model": "cnn",
    }
    path = tmp_path / "e.yaml"
    path.write_text("matrix: {algorithm: fedavg, dataset: synthetic}\ndefaults: {lr: 1e-3}\n")  # YAML: a string
    assert load_spec(path).cells[0].lr == 0.001
    assert load_spec(path, parse_sets(["lr=2e-3"])).cells[0].lr == 0.002


def test_hyperparameters_apply_to_the_algorithms_that_declare_them():
    data = spec(matrix__algorithm=["fedavg", "test-spec-prox"], matrix__seed=[0])
    data["matrix"]["hp.mu"] = [0.1, 1.0]
    cells = parse_spec(data).cells
    prox = sorted(c.hp["mu"] for c in cells if c.algorithm == "test-spec-prox")
    assert prox == [0.1] * 4 + [1.0] * 4  # 2 partitions x 2 client settings, per value of mu
    fedavg = [c for c in cells if c.algorithm == "fedavg"]
    assert len(fedavg) == 4 and all(c.hp == {} for c in fedavg)  # mu does not apply: one cell per setting
    assert len(cells) == 12

    defaults_only = parse_spec(spec(matrix__algorithm=["fedavg", "test-spec-prox"])).cells
    assert {c.hp.get("mu") for c in defaults_only if c.algorithm == "test-spec-prox"} == {0.01}  # the default


def test_dataset_marked_optional():
    data = spec(matrix__dataset=[{"name": "fmnist", "optional": True}, "synthetic"])
    plan = parse_spec(data)
    assert plan.optional_datasets == {"fmnist"} and {c.dataset for c in plan.cells} == {"fmnist", "synthetic"}


def test_algorithm_all_means_every_registered_one():
    cells = parse_spec(spec(matrix__algorithm="all", matrix__seed=[0])).cells
    assert sorted({c.algorithm for c in cells}) == ALGORITHMS.names()


@pytest.mark.parametrize(
    "data,sets,expected",
    [
        (
            spec(matrix__algorithm=["fedavg", "fedavgg"]),
            None,
            "bench.yaml: matrix.algorithm[1]: unknown algorithm 'fedavgg' (did you mean 'fedavg'?); allowed: ",
        ),
        (
            spec(matrix__dataset=["synthetc"]),
            None,
            "bench.yaml: matrix.dataset[0].name: unknown dataset 'synthetc' (did you mean 'synthetic'?); allowed: ",
        ),
        (
            spec(matrix__partition=["dirichlett"]),
            None,
            "bench.yaml: matrix.partition[0].scheme: unknown partition scheme 'dirichlett' (did you mean 'dirichlet'?)",
        ),
        (
            spec(matrix__partition=[{"scheme": "dirichlet", "params": {"alpah": 0.1}}]),
            None,
            "bench.yaml: matrix.partition[0]: partition scheme 'dirichlet': unknown parameter 'alpah'; allowed parameters: "
            "alpha (default 0.3)",
        ),
        (
            spec(matrix__partition=[{"scheme": "dirichlet", "params": {"alpha": -1}}]),
            None,
            "bench.yaml: matrix.partition[0]: partition scheme 'dirichlet': alpha=-1 is not allowed",
        ),
        (
            spec(matrix__dataset=[{"name": "synthetic", "options": {"samples": 10}}]),
            None,
            "bench.yaml: matrix.dataset[0]: unknown option 'samples' for dataset 'synthetic'; allowed options: ",
        ),
        (
            spec(overides=[]),
            None,
            "bench.yaml: file: unknown key 'overides' (did you mean 'overrides'?); allowed: name, ",
        ),
        (
            spec(defaults={"roundz": 3}),
            None,
            "bench.yaml: defaults.roundz: unknown key 'roundz' (did you mean 'rounds'?); allowed: algorithm, ",
        ),
        (
            spec(defaults={"rounds": "ten"}),
            None,
            "bench.yaml: defaults.rounds: Input should be a valid integer, unable to parse string as an integer (got 'ten')",
        ),
        (
            spec(matrix__clients=[0]),
            None,
            "bench.yaml: matrix.clients[0].clients: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            spec(matrix__clients=[{"clients": 4, "participation": 1.5}]),
            None,
            "bench.yaml: matrix.clients[0].participation: Input should be less than or equal to 1 (got 1.5)",
        ),
        (spec(matrix__seed=[]), None, "bench.yaml: matrix.seed: empty list; give at least one value"),
        (
            spec(overrides=[{"when": {"dataset": "fmnsit"}, "set": {"lr": 0.1}}]),
            None,
            "bench.yaml: overrides[0].when.dataset: unknown dataset 'fmnsit' (did you mean 'fmnist'?)",
        ),
        (
            spec(overrides=[{"when": {"dataset": "fmnist"}, "sett": {"lr": 0.1}}]),
            None,
            "bench.yaml: overrides[0]: unknown key 'sett' (did you mean 'set'?); allowed: when, unless, set",
        ),
        (
            spec(overrides=[{"when": {"algorithm": "fedavg"}, "set": {"hp.mu": 0.1}}]),
            None,
            "bench.yaml: overrides[0].set.hp.mu: no algorithm of this spec (fedavg) has the hyperparameter 'mu'; "
            "declared: fedavg: none",
        ),
        (
            spec(matrix__algorithm=["test-spec-prox"], defaults={"hp": {"mu": "big"}}),
            None,
            "bench.yaml: defaults.hp.mu, matrix.algorithm[0]: bad hyperparameters for algorithm 'test-spec-prox': "
            "mu: Input should be a valid number",
        ),
        (
            spec(overrides=[{"when": {"partition": "dirichlet"}, "set": {"partition_params.classes_per_client": 2}}]),
            None,
            "bench.yaml: matrix.partition[1], overrides[0].set.partition_params.classes_per_client: partition scheme "
            "'dirichlet': unknown parameter 'classes_per_client'",
        ),
        (spec(matrix__lr=[0.1, -0.1]), None, "bench.yaml: matrix.lr[1]: Input should be greater than 0 (got -0.1)"),
        (
            spec(defaults={"model": "cnnn"}),
            None,
            "bench.yaml: defaults.model: unknown model 'cnnn' (did you mean 'cnn'?)",
        ),
        (BASE, {"roundz": 1}, "bench.yaml: --set roundz: unknown key 'roundz' (did you mean 'rounds'?)"),
        (BASE, {"algorithm": "fedprox2"}, "bench.yaml: --set algorithm[0]: unknown algorithm 'fedprox2'"),
        (BASE, {"resources.gpu": 1}, "bench.yaml: --set resources: unknown key 'gpu' (did you mean 'gpus'?)"),
        (
            {"matrix": {"algorithm": "fedavg"}},
            None,
            "bench.yaml: matrix.dataset: missing: every cell needs a dataset (give matrix.dataset or defaults.dataset)",
        ),
    ],
)
def test_bad_spec_gives_one_clear_error(data, sets, expected):
    assert expected in errors(data, sets)


def test_every_problem_is_reported_at_once():
    message = errors(spec(defaults={"rounds": 0, "lr": "fast"}, matrix__algorithm=["fedav"]))
    assert message.startswith("invalid spec bench.yaml (3 problems):")
    for part in (
        "matrix.algorithm[0]: unknown algorithm 'fedav'",
        "defaults.rounds: Input should be greater",
        "defaults.lr: Input should be a valid number",
    ):
        assert part in message


def test_file_problems_name_the_file(tmp_path):
    (tmp_path / "table1.yaml").write_text("matrix: {algorithm: fedavg, dataset: synthetic}\n")
    with pytest.raises(SpecError, match=r"unknown spec file '.*tabel1.yaml' \(did you mean '.*table1.yaml'\?\)"):
        load_spec(tmp_path / "tabel1.yaml")
    (tmp_path / "broken.yaml").write_text("matrix: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken.yaml: file: not valid YAML"):
        load_spec(tmp_path / "broken.yaml")


def test_the_demo_spec_runs_every_algorithm_and_a_representative_set_on_fmnist():
    from pathlib import Path

    from pflbench.algorithm import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")  # registers the built-ins
    plan = load_spec(Path(__file__).parents[1] / "benchmarks" / "demo.yaml")
    algorithms = set(ALGORITHMS.names())  # "algorithm: all" (other tests may have registered more)
    synthetic = [c for c in plan.cells if c.dataset == "synthetic"]
    fmnist = [c for c in plan.cells if c.dataset == "fmnist"]
    assert len(plan.cells) == len(synthetic) + len(fmnist)
    assert {c.algorithm for c in synthetic} == algorithms and len(synthetic) == 2 * len(algorithms)  # 2 seeds
    builtin = {
        name for name, cls in ALGORITHMS.items() if cls.__module__.startswith("pflbench.")
    }  # FedAvg: pflbench.fedavg
    # the representative built-ins on fmnist (an algorithm added later runs there too)
    assert {c.algorithm for c in fmnist} & builtin == {"local", "fedavg", "fedbn", "pfedhn", "pfedla", "ditto"}
    assert {c.seed for c in fmnist} == {0} and plan.optional_datasets == {"fmnist"}
    assert all(c.clients == 10 and c.partition == "pathological" and c.finetune_epochs > 0 for c in plan.cells)


SHIPPED_SPECS = sorted((Path(__file__).parents[1] / "benchmarks").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=[p.stem for p in SHIPPED_SPECS])
def test_every_shipped_spec_validates_and_expands(path):
    if path.stem == "crosscheck-flbench" and not (path.parents[2] / "shared" / "crosscheck").is_dir():
        pytest.skip("reads FL-bench's split from ../shared/crosscheck beside the checkout")
    plan = load_spec(path)
    assert plan.cells and len({cell_hash(c) for c in plan.cells}) == len(plan.cells)


def test_the_fedmn_and_hetero5_specs_compare_with_local_at_equal_rounds():
    benchmarks = Path(__file__).parents[1] / "benchmarks"
    plan = load_spec(benchmarks / "fedmn-mhpfedhn.yaml")
    assert {c.algorithm for c in plan.cells} == {"local", "fedavg", "fedmn", "mh-pfedhn", "mh-pfedhngd"}
    assert len(plan.cells) == 5 * 3 and {c.partition for c in plan.cells} == {"dirichlet"}
    hetero = load_spec(benchmarks / "hetero5.yaml")
    assert {c.algorithm for c in hetero.cells} == {"local", "mh-pfedhn", "mh-pfedhngd"}
    assert {c.model for c in hetero.cells} == {"hetero5"} and {c.dataset for c in hetero.cells} == {"cifar10-jpeg"}
    for spec in (plan, hetero):  # equal budgets: only the algorithm (and its hyperparameters) differ
        assert len({(c.rounds, c.local_epochs, c.lr, c.batch_size) for c in spec.cells}) == 1


def test_a_key_written_twice_is_refused_with_its_line(tmp_path):
    spec = tmp_path / "twice.yaml"
    spec.write_text(
        "name: t\nmatrix:\n  algorithm: [fedavg]\n  dataset: [synthetic]\ndefaults:\n  rounds: 2\n"
        "  lr: 0.1\n  rounds: 5\n"
    )
    with pytest.raises(SpecError) as error:
        load_spec(spec)
    message = str(error.value)
    assert "'rounds' appears twice" in message and "line 6" in message and "Traceback" not in message


def test_a_boolean_is_not_a_seed_or_a_count():
    base = {"matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]}}
    for key in ("seed", "rounds", "lr"):
        with pytest.raises(SpecError, match="expected a number, got the boolean True"):
            parse_spec({**base, "defaults": {key: True}})


def test_a_binary_file_is_not_a_spec(tmp_path):
    spec = tmp_path / "garbage.yaml"
    spec.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SpecError, match="not a text file"):
        load_spec(spec)


def test_gpus_asked_where_there_are_none_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import torch

    from pflbench.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = tmp_path / "gpu.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]}, "resources": {"cpus": 1, "gpus": 0.5}}
        )
    )
    results = tmp_path / "results"
    assert main(["run", str(spec), "--results", str(results), "--no-ray"]) == 2
    assert "resources.gpus is 0.5 per cell but torch sees no CUDA device" in capsys.readouterr().err
    assert not results.exists()  # nothing ran
    assert main(["run", str(spec), "--results", str(results), "--dry-run"]) == 0
    assert "warning" in capsys.readouterr().err  # warnings go to stderr


def test_dry_run_json_stays_parseable_on_a_gpu_spec_without_cuda(monkeypatch, capsys):
    """`run table1.yaml --dry-run --json` on a machine without CUDA: the GPU warning goes to stderr,
    stdout is the JSON alone."""
    import json

    import torch

    from pflbench.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = Path(__file__).resolve().parent.parent / "benchmarks" / "table1.yaml"
    assert main(["run", str(spec), "--dry-run", "--json", "--results", "/nonexistent-store"]) == 0
    captured = capsys.readouterr()
    cells = json.loads(captured.out)
    assert len(cells) > 1 and all({"hash", "status", "config"} <= set(cell) for cell in cells)
    assert "torch sees no CUDA device" in captured.err


BILLION_LAUGHS = """name: x
description: &f [&e [&d [&c [&b [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], *a, *a, *a, *a, *a, *a, *a, *a],
  *b, *b, *b, *b, *b, *b, *b, *b], *c, *c, *c, *c, *c, *c, *c, *c], *d, *d, *d, *d, *d, *d, *d, *d], *e, *e, *e, *e, *e, *e, *e, *e]
matrix:
  algorithm: [fedavg]
  dataset: [synthetic]
  seed: *f
"""


def test_a_yaml_alias_bomb_is_one_short_error(tmp_path):
    # 300 bytes that expand to 9^6 = 531,441 strings: once a 3.9 MB error message
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert len(message) < 300 and "expands to more than 100,000 values" in message
    with pytest.raises(SpecError, match="expands to more than"):
        parse_sets(["seed=" + BILLION_LAUGHS.split("description: ")[1].split("\nmatrix")[0]])


def test_long_user_values_are_quoted_short(tmp_path):
    long_name = "a" * 200_000
    path = tmp_path / "long.yaml"
    path.write_text(f"name: x\nmatrix:\n  algorithm: [{long_name}]\n  dataset: [synthetic]\n  lr: [{'9' * 5000}x]\n")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert len(message) < 1500, len(message)
    assert "unknown algorithm 'aaaa" in message and "(200,000 characters)" in message
    assert "matrix.lr[0]" in message and "(5,001 characters)" in message
    for _where, problem in caught.value.problems:  # every line stays short whatever the value
        assert len(problem) < 1000


# ---- `--set clients=N`: the spec's own client settings --------------------------------------------


def test_set_clients_picks_the_specs_entries_for_that_count_participation_included():
    everything = parse_spec(BASE).cells
    six = parse_spec(BASE, sets={"clients": 6}).cells
    assert {(c.clients, c.participation) for c in six} == {(6, 0.5)}
    assert sorted(cell_hash(c) for c in six) == sorted(cell_hash(c) for c in everything if c.clients == 6)
    both = parse_spec(BASE, sets={"clients": [6, 4]}).cells
    assert sorted(cell_hash(c) for c in both) == sorted(cell_hash(c) for c in everything)


def test_set_clients_with_a_count_or_mapping_the_spec_lacks_is_taken_as_written():
    assert {(c.clients, c.participation) for c in parse_spec(BASE, sets={"clients": 5}).cells} == {(5, 1.0)}
    written = parse_spec(BASE, sets={"clients": {"clients": 6, "participation": 1.0}}).cells
    assert {(c.clients, c.participation) for c in written} == {(6, 1.0)}
    # a later plain `--set participation` applies to the picked entries too
    full = parse_spec(BASE, sets={"clients": 6, "participation": 1.0}).cells
    assert sorted(cell_hash(c) for c in full) == sorted(cell_hash(c) for c in written)
    assert "--set clients[0].clients: Input should be greater than or equal to 1 (got 0)" in errors(
        BASE, {"clients": 0}
    )


@pytest.mark.parametrize("scale", [None, "quick"])
def test_table1_set_clients_100_plans_its_own_100_client_cells(scale):
    """The paper's 100-client setting has 10% of the clients joining a round: `--set clients=100` keeps
    that, so the planned cells are the full plan's 100-client cells, ids and all."""
    path = Path(__file__).parents[1] / "benchmarks" / "table1.yaml"
    own = [c for c in load_spec(path, scale=scale).cells if c.clients == 100]
    picked = load_spec(path, sets={"clients": 100}, scale=scale).cells
    assert own and {c.participation for c in picked} == {0.1}
    assert sorted(cell_hash(c) for c in picked) == sorted(cell_hash(c) for c in own)


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=[p.stem for p in SHIPPED_SPECS])
def test_set_clients_of_each_shipped_count_gives_the_specs_own_cells(path):
    if path.stem == "crosscheck-flbench" and not (path.parents[2] / "shared" / "crosscheck").is_dir():
        pytest.skip("reads FL-bench's split from ../shared/crosscheck beside the checkout")
    cells = load_spec(path).cells
    for count in sorted({c.clients for c in cells}):
        picked = load_spec(path, sets={"clients": count}).cells
        assert sorted(cell_hash(c) for c in picked) == sorted(cell_hash(c) for c in cells if c.clients == count)


def test_run_dry_run_set_clients_100_lists_the_10_percent_cells(monkeypatch, capsys):
    import json

    import torch

    from pflbench.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = Path(__file__).resolve().parent.parent / "benchmarks" / "table1.yaml"
    assert (
        main(
            [
                "run",
                str(spec),
                "--dry-run",
                "--json",
                "--results",
                "/nonexistent-store",
                "--set",
                "clients=100",
                "--set",
                "dataset=fmnist",
                "--set",
                "seed=0",
            ]
        )
        == 0
    )
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 10
    assert {(c["config"]["clients"], c["config"]["participation"], c["config"]["rounds"]) for c in cells} == {
        (100, 0.1, 2500)
    }


# ---- the variants axis ----------------------------------------------------------------------------


def _with_variants(variants, **matrix):
    return {
        "name": "v",
        "matrix": {"algorithm": ["fedavg", "local"], "dataset": ["synthetic"], "variants": variants, **matrix},
    }


def test_variants_cross_the_matrix_and_keep_the_ids_of_the_same_settings():
    plan = parse_spec(
        _with_variants(
            [
                {"name": "plain"},
                {"name": "slow", "set": {"lr": 0.001, "rounds": 3}},
                {"name": "prox", "set": {"hp": {"mu": 0.5}}},
            ],
            algorithm=["fedavg", "test-spec-prox"],
        )
    )
    # fedavg has no `mu`: its "prox" variant is its "plain" cell again (identical cells run once)
    assert len(plan.cells) == 5
    by_setting = {(c.algorithm, c.lr, c.rounds, c.hp.get("mu")) for c in plan.cells}
    assert ("fedavg", 0.001, 3, None) in by_setting and ("test-spec-prox", 0.01, 10, 0.5) in by_setting
    written_out = parse_spec(
        {
            "name": "w",
            "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]},
            "defaults": {"lr": 0.001, "rounds": 3},
        }
    )
    assert cell_hash(written_out.cells[0]) in {cell_hash(c) for c in plan.cells}  # the name is in no cell
    assert cell_hash(parse_spec(_with_variants([{"name": "plain"}])).cells[0]) == cell_hash(
        parse_spec({"name": "x", "matrix": {"algorithm": ["fedavg", "local"], "dataset": ["synthetic"]}}).cells[0]
    )


def test_overrides_see_a_variants_settings():
    spec = _with_variants([{"name": "a"}, {"name": "b", "set": {"rounds": 7}}])
    spec["overrides"] = [{"when": {"rounds": 7}, "set": {"lr": 0.2}}]
    cells = parse_spec(spec).cells
    assert {(c.rounds, c.lr) for c in cells} == {(10, 0.01), (7, 0.2)}


def test_set_variant_picks_entries_of_the_variants_axis_by_name():
    spec = _with_variants(
        [{"name": "plain"}, {"name": "slow run", "set": {"rounds": 3}}, {"name": "c", "set": {"rounds": 4}}]
    )
    everything = {cell_hash(c) for c in parse_spec(spec).cells}
    slow = parse_spec(spec, sets={"variant": "slow run", "algorithm": "local"}).cells
    assert [(c.algorithm, c.rounds) for c in slow] == [("local", 3)] and cell_hash(slow[0]) in everything
    assert {c.rounds for c in parse_spec(spec, sets={"variant": ["c", "plain"]}).cells} == {10, 4}
    with pytest.raises(
        SpecError, match=r"variant: unknown variant 'slow' \(did you mean 'slow run'\?\); allowed: plain, slow run, c"
    ):
        parse_spec(spec, sets={"variant": "slow"})
    with pytest.raises(SpecError, match=r"variant: this spec has no matrix\.variants axis"):
        parse_spec({"name": "x", "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]}}, sets={"variant": "a"})


@pytest.mark.parametrize(
    "variants, matrix, expected",
    [
        ([{"name": "a", "set": {"lrr": 0.1}}], {}, r"matrix\.variants\[0\]\.set\.lrr: unknown key 'lrr'"),
        ([{"name": "a", "set": {"rounds": "many"}}], {}, r"matrix\.variants\[0\]\.set\.rounds: .*integer"),
        (
            [{"name": "a"}, {"name": "a", "set": {"rounds": 2}}],
            {},
            r"matrix\.variants\[1\]\.name: 'a' names two variants",
        ),
        ([{"set": {"rounds": 2}}], {}, r"matrix\.variants\[0\]\.name: Field required"),
        ([{"name": "a", "sett": {"rounds": 2}}], {}, r"unknown key 'sett'"),
        (
            [{"name": "a", "set": {"seed": 3}}],
            {"seed": [0, 1]},
            r"matrix\.seed: 'seed' is already varied by matrix\.variants",
        ),
        (
            [{"name": "a", "set": {"system.dropout": 2.0}}],
            {},
            r"matrix\.variants\[0\]\.set\.system\.dropout: .*dropout",
        ),
    ],
)
def test_a_bad_variant_is_named_where_it_was_written(variants, matrix, expected):
    with pytest.raises(SpecError, match=expected):
        parse_spec(_with_variants(variants, **matrix))


def test_a_hyperparameter_naming_a_model_is_checked_by_the_dry_run():
    """MH-pFedHNGD's `global_model` names a registry entry: a wrong one is refused when the spec is
    validated (it used to pass the dry-run and fail only when the cell ran)."""
    spec = {
        "name": "g",
        "matrix": {"algorithm": ["mh-pfedhngd"], "dataset": ["synthetic-images"]},
        "defaults": {"model": "hetero5", "clients": 5, "hp.global_model": "not-a-model"},
    }
    with pytest.raises(SpecError, match=r"hp\.global_model.*unknown model 'not-a-model'.*allowed.*mh-cnn"):
        parse_spec(spec)
    spec["defaults"]["hp.global_model"] = "mh-cnn"
    assert parse_spec(spec).cells[0].hp["global_model"] == "mh-cnn"


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=[p.stem for p in SHIPPED_SPECS])
def test_a_resolved_cell_resolves_to_itself(path):
    """`run_cell` trusts a resolved cell: resolving it again changes nothing (same content, same id)."""
    from pflbench.simulator.resolve import resolve

    if path.stem == "crosscheck-flbench" and not (path.parents[2] / "shared" / "crosscheck").is_dir():
        pytest.skip("reads FL-bench's split from ../shared/crosscheck beside the checkout")
    for cell in load_spec(path).cells[:20]:
        assert resolve(cell, path.parent) == cell, (path.name, cell_hash(cell))


def test_an_override_with_unless_leaves_the_cells_it_matches_alone():
    plan = parse_spec(
        {
            "name": "x",
            "matrix": {"algorithm": ["fedavg", "local", "fedprox"], "dataset": ["synthetic"]},
            "overrides": [{"when": {"dataset": "synthetic"}, "unless": {"algorithm": ["local"]}, "set": {"rounds": 3}}],
        }
    )
    assert {c.algorithm: c.rounds for c in plan.cells} == {"fedavg": 3, "local": 10, "fedprox": 3}
    with pytest.raises(SpecError, match=r"overrides\[0\]\.unless\.algorithmm"):
        parse_spec(
            {
                "name": "x",
                "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]},
                "overrides": [{"when": {}, "unless": {"algorithmm": "x"}, "set": {"rounds": 3}}],
            }
        )
