"""Plugins (pflbench/loader/plugins.py): a user's algorithm, dataset, partition scheme and model from files
outside the repository run like built-ins, in-process and on Ray, show in the reports under their
declared names, and carry their source hash in the cell id; built-in cells keep their ids; a wrong
plugin is one clear error before any work."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pflbench.loader import plugins
from pflbench.simulator.metrics import RUN_RECORD_KEYS
from pflbench.algorithm import ALGORITHMS
from pflbench.cli import main
from pflbench.config import cell_hash
from pflbench.run.spec import load_spec, parse_spec
from pflbench.run.spec_problems import SpecError
from pflbench.storage.store import Store

REPO = Path(__file__).resolve().parents[1]

MY_AVG = '''
"""A user's method: FedAvg under another name, with the reports' attributes."""
from pflbench.algorithm import ALGORITHMS, Card
from pflbench.fedavg import FedAvg


@ALGORITHMS.register("my-avg", card=Card(display_name="My Average", family="my family", paper="Me & You, 2026"))
class MyAvg(FedAvg):
    pass


@ALGORITHMS.register("my-plain")
class MyPlain(FedAvg):  # declares nothing: shown by its name, not as FedAvg
    pass
'''

DATA_AND_SCHEME = '''
"""A user's dataset (generated blobs), partition scheme (label halves) and model (a tiny MLP)."""
import numpy as np
import torch
from pydantic import Field
from torch import nn

from pflbench.data.dataset import Dataset
from pflbench.data.options import Option
from pflbench.data.sources import DATASETS, GeneratedSource
from pflbench.simulator.models import MODELS
from pflbench.data.partitioning import PARTITIONS, Partitioner, SchemeParams


@DATASETS.register("blobs", display_name="Blobs")
class Blobs(GeneratedSource):
    description = "Gaussian blobs, 8 features, 4 classes (a plugin's dataset)"
    OPTIONS = {"num_samples": Option(400, int, "pool size", minimum=8), "seed": Option(0, int, "seed", minimum=0)}

    def generate(self):
        rng = np.random.default_rng(self.options["seed"])
        labels = np.arange(self.options["num_samples"]) % 4
        centres = rng.normal(0, 3, (4, 8))
        inputs = centres[labels] + rng.normal(0, 1, (len(labels), 8))
        return Dataset.build(self.name, torch.tensor(inputs, dtype=torch.float32), torch.tensor(labels),
                             num_classes=4, checksum=self.checksum(), classes=["a", "b", "c", "d"])


@PARTITIONS.register("halves")
class Halves(Partitioner):
    """Even clients get the lower half of the classes, odd clients the upper half."""

    class Params(SchemeParams):
        spread: int = Field(1, ge=1)

    def assign(self, labels, num_classes, num_clients, rng):
        low = rng.permutation(np.flatnonzero(labels < num_classes // 2))
        high = rng.permutation(np.flatnonzero(labels >= num_classes // 2))
        evens, odds = list(range(0, num_clients, 2)), list(range(1, num_clients, 2))
        parts = [None] * num_clients
        for group, pool in ((evens, low), (odds, high)):
            for client, share in zip(group, np.array_split(pool, max(1, len(group)))):
                parts[client] = np.sort(share)
        return parts


@MODELS.register("tiny-mlp")
def tiny_mlp(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.ReLU(), nn.Linear(16, num_classes))
'''

SMALL = {"rounds": 2, "clients": 4, "batch_size": 16, "lr": 0.05, "eval_every": 1}

pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def my_avg(tmp_path) -> Path:
    folder = tmp_path / "outside"  # outside the repository, as a user's file is
    folder.mkdir()
    path = folder / "my_avg.py"
    path.write_text(MY_AVG)
    return path


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def avg_spec(folder: Path, plugin: str = "my_avg.py") -> Path:
    return write_spec(
        folder / "mine.yaml",
        {
            "name": "mine",
            "plugins": [plugin],
            "matrix": {
                "algorithm": ["fedavg", "my-avg", "my-plain"],
                "dataset": [{"name": "synthetic", "options": {"num_samples": 400}}],
                "seed": [0],
            },
            "defaults": SMALL,
        },
    )


def by_algorithm(cells):
    return {c.algorithm: c for c in cells}


def test_a_plugin_algorithm_runs_in_process_and_shows_in_the_reports_under_its_names(my_avg, tmp_path):
    spec = avg_spec(my_avg.parent)
    results, out = tmp_path / "results", tmp_path / "report"
    assert main(["run", str(spec), "--no-ray", "--results", str(results), "--root", str(tmp_path / "data")]) == 0
    cells = by_algorithm(load_spec(spec).cells)
    sha = hashlib.sha256(my_avg.read_bytes()).hexdigest()
    assert cells["my-avg"].plugin_hashes == {"my_avg.py": sha} == cells["my-plain"].plugin_hashes
    assert cells["fedavg"].plugin_hashes == {} and "plugin_hashes" not in cells["fedavg"].canonical_json()
    store = Store(results)
    assert all(store.summary(c)["status"] == "finished" for c in cells.values())
    assert json.loads((store.cell_dir(cells["my-avg"]) / "config.json").read_text())["cell"]["plugin_hashes"] == {
        "my_avg.py": sha
    }

    assert (
        main(
            ["report", "--results", str(results), "--out", str(out), "--no-figures", "--quiet", "--plugin", str(my_avg)]
        )
        == 0
    )
    report = (out / "report.md").read_text()
    assert "My Average" in report and "my-plain" in report
    page = (out / "algorithms" / "my-avg.html").read_text()
    assert "My Average" in page and "family: my family" in page and "Me &amp; You, 2026" in page
    from pflbench.reports.figures import family_of, family_order

    assert family_of("My Average") == "my family" and family_of("my-plain") == "other"
    assert family_order(["my family", "baselines", "other"]) == ["baselines", "my family", "other"]
    assert ALGORITHMS.get("my-plain").card.display_name == "my-plain"  # not FedAvg's, though it derives from it


def test_editing_the_plugin_gives_its_cells_new_ids_and_leaves_the_built_ins_alone(my_avg, tmp_path):
    spec = avg_spec(my_avg.parent)
    results = tmp_path / "results"
    assert main(["run", str(spec), "--no-ray", "--results", str(results), "--root", str(tmp_path / "data")]) == 0
    before = by_algorithm(load_spec(spec).cells)
    my_avg.write_text(MY_AVG.replace('paper="Me & You, 2026"', 'paper="Me & You, 2027"'))
    after = by_algorithm(load_spec(spec).cells)
    assert cell_hash(after["fedavg"]) == cell_hash(before["fedavg"])
    for name in ("my-avg", "my-plain"):
        assert cell_hash(after[name]) != cell_hash(before[name])
        assert after[name].plugin_hashes == {"my_avg.py": hashlib.sha256(my_avg.read_bytes()).hexdigest()}
    assert ALGORITHMS.get("my-avg").card.paper == "Me & You, 2027"  # the new code is what runs
    store = Store(results)
    assert not store.summary(after["my-avg"])  # no result yet: never the old code's
    assert main(["run", str(spec), "--no-ray", "--results", str(results), "--root", str(tmp_path / "data")]) == 0
    assert store.summary(after["my-avg"])["status"] == "finished"
    assert store.summary(before["my-avg"])["status"] == "finished"  # the old result stays, under the old id

    # The report shows one version of the plugin (the one loaded now), never both pooled as seeds.
    from pflbench.loader.plugins import loaded_versions
    from pflbench.reports.cells import load_cells

    cells = load_cells(results, plugins=loaded_versions())
    assert set(cells["hash"]) == {cell_hash(c) for c in after.values()}
    assert cells.attrs["notes"] == [
        "2 cells of another version of plugin 'my_avg.py' are left out: the report shows the version loaded now, "
        f"sha256 {after['my-avg'].plugin_hashes['my_avg.py'][:12]}...; their results stay in the store under their own ids"
    ]


# Cell ids of built-in cells, computed on main (2eaedce and 7e48e7f) before plugins existed.
BUILTIN_SPEC = {
    "matrix": {
        "algorithm": ["fedavg", "fedprox", "pfedla", "local"],
        "dataset": [{"name": "synthetic", "options": {"num_samples": 1000}}, "fmnist"],
        "partition": [
            {"scheme": "pathological", "params": {"classes_per_client": 3}},
            {"scheme": "dirichlet", "params": {"alpha": 0.3}},
        ],
        "seed": [0, 1],
    },
    # normalization pool: the rule those cells ran with (the default `train` gave every cell a
    # new id, for a reason of its own: pflbench.data.normalization)
    "defaults": {"rounds": 3, "clients": 5, "finetune_epochs": 1, "normalization": "pool"},
    "overrides": [{"when": {"algorithm": "fedprox"}, "set": {"hp.mu": 0.1}}],
}
BUILTIN_IDS = [
    "04f9728e5ac4",
    "06b392c371a9",
    "087641534103",
    "095f2696f13e",
    "236b13c4e7d9",
    "245ce0c48e6b",
    "331407516db0",
    "377cb68a2399",
    "3a2b15fd9f2e",
    "3f567e807fe8",
    "3fc6842c57c5",
    "590512cab0e1",
    "5d0beb024826",
    "5dd28e3a24bd",
    "5e0b310abd10",
    "6d913e5b65c5",
    "72fb9aa25ba3",
    "78ed90e125a9",
    "7d072b9f03ae",
    "805cdc89baf3",
    "9997983b644b",
    "9bd974c7c8bc",
    "afa93bfd63b3",
    "bb954f934a5d",
    "bef128bbede4",
    "d8f3a3027570",
    "f23f2dc8c05a",
    "f50b0f35ed8f",
    "f64e7f7dcd6a",
    "f6585311501b",
    "fb3d64ecd470",
    "fc90b62b6083",
]


def test_built_in_cells_keep_the_ids_they_had_before_plugins(my_avg):
    plugins.load([str(my_avg)])  # a plugin loaded changes nothing for cells that do not use it
    assert sorted(cell_hash(c) for c in parse_spec(BUILTIN_SPEC).cells) == BUILTIN_IDS


def test_set_adds_a_plugin_method_beside_a_shipped_specs_rows(my_avg, capsys):
    assert (
        main(
            [
                "run",
                "table1",
                "--scale",
                "quick",
                "--dry-run",
                "--json",
                "--plugin",
                str(my_avg),
                "--set",
                "algorithm+=[my-avg]",
            ]
        )
        == 0
    )
    cells = json.loads(capsys.readouterr().out)
    algorithms = {c["config"]["algorithm"] for c in cells}
    assert "my-avg" in algorithms and {"local", "fedavg", "pfedla", "heurpfedla"} <= algorithms


@pytest.mark.slow
def test_a_plugin_algorithm_runs_on_ray_as_in_process(my_avg, tmp_path):
    spec = avg_spec(my_avg.parent)
    root = tmp_path / "data"
    assert main(["run", str(spec), "--no-ray", "--results", str(tmp_path / "here"), "--root", str(root)]) == 0
    assert main(["run", str(spec), "--workers", "2", "--results", str(tmp_path / "ray"), "--root", str(root)]) == 0
    volatile = RUN_RECORD_KEYS | {"train_time_total", "server_time_total", "eval_time_total"}
    for cell in load_spec(spec).cells:
        here, there = Store(tmp_path / "here").summary(cell), Store(tmp_path / "ray").summary(cell)
        assert there["status"] == "finished"
        assert {k: v for k, v in here.items() if k not in volatile} == {
            k: v for k, v in there.items() if k not in volatile
        }


# On a cluster joined with --ray-address (`ray start`), a plugin method's cells run as in process: the
# cluster test's matrix includes `my-avg` (tests/test_ray_cluster.py), on the one cluster that test starts.


def test_a_worker_without_the_file_loads_the_shipped_source(my_avg, tmp_path):
    """A Ray worker on another machine has no copy of the user's file: the source travels with the cells."""
    [source] = plugins.load([str(my_avg)])
    shipped = tmp_path / "source.pickle"
    shipped.write_bytes(pickle.dumps(source))
    my_avg.unlink()
    script = textwrap.dedent(f"""
        import pickle
        from pflbench.loader.plugins import activate
        from pflbench.algorithm import ALGORITHMS
        activate([pickle.load(open({str(shipped)!r}, "rb"))])
        print(ALGORITHMS.get("my-avg").card.display_name, ALGORITHMS.origin("my-avg"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "My Average my_avg.py"


def test_a_plugin_dataset_partition_scheme_and_model_run_end_to_end(tmp_path, capsys):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "my_data.py").write_text(DATA_AND_SCHEME)
    spec = write_spec(
        folder / "data.yaml",
        {
            "plugins": ["my_data.py"],
            "matrix": {
                "algorithm": ["fedavg", "local"],
                "dataset": ["blobs"],
                "partition": [{"scheme": "halves", "params": {"spread": 2}}],
            },
            "defaults": {**SMALL, "model": "tiny-mlp"},
        },
    )
    results = tmp_path / "results"
    assert main(["run", str(spec), "--no-ray", "--results", str(results), "--root", str(tmp_path / "data")]) == 0
    sha = hashlib.sha256((folder / "my_data.py").read_bytes()).hexdigest()
    for cell in load_spec(spec).cells:
        assert cell.plugin_hashes == {"my_data.py": sha}
        summary = Store(results).summary(cell)
        assert summary["status"] == "finished" and summary["final_accuracy"] > 0.5  # 2 of 4 blob classes each
    capsys.readouterr()
    assert main(["list", "datasets", "--plugin", str(folder / "my_data.py")]) == 0
    assert "blobs" in capsys.readouterr().out
    assert main(["list", "partitions"]) == 0
    listing = capsys.readouterr().out
    assert "halves" in listing and "[plugin my_data.py]" in listing


def test_an_installed_packages_entry_point_is_a_plugin(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "mypkg").mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_text(
        MY_AVG.replace('"my-avg"', '"ep-avg"').replace('"my-plain"', '"ep-plain"')
    )
    info = site / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pflbench.loader.plugins]\nmine = mypkg\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        [source] = plugins.load_entry_points()
        assert (source.id, source.kind) == ("mypkg", "entry point")
        assert ALGORITHMS.origin("ep-avg") == "mypkg"
        cell = parse_spec({"matrix": {"algorithm": ["ep-avg"], "dataset": ["synthetic"]}}).cells[0]
        assert cell.plugin_hashes == {
            "mypkg": plugins.digest([("mypkg/__init__.py", (site / "mypkg" / "__init__.py").read_bytes())])
        }
    finally:
        plugins.unload("mypkg")
        sys.modules.pop("mypkg", None)


# ---- one clear error each, before any work ----------------------------------------------------------


def run_fails(args, capsys) -> str:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_a_name_that_clashes_with_a_built_in_is_one_error_and_nothing_runs(tmp_path, capsys):
    clash = tmp_path / "clash.py"
    clash.write_text(
        "from pflbench.algorithm import ALGORITHMS\nfrom pflbench.fedavg import FedAvg\n\n\n"
        "@ALGORITHMS.register('my-ok')\nclass Fine(FedAvg):\n    pass\n\n\n"
        "@ALGORITHMS.register('fedavg')\nclass Mine(FedAvg):\n    pass\n"
    )
    results = tmp_path / "results"
    err = run_fails(["run", "benchmarks/demo.yaml", "--plugin", str(clash), "--results", str(results)], capsys)
    assert "plugin 'clash.py' registers the algorithm 'fedavg'" in err and "pflbench (built-in)" in err
    assert err.count("\n") == 1 and not results.exists()
    assert "my-ok" not in ALGORITHMS  # what it registered before the clash is undone
    spec = write_spec(
        tmp_path / "s.yaml", {"plugins": ["clash.py"], "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]}}
    )
    with pytest.raises(SpecError, match=r"plugins\[0\]: .*registers the algorithm 'fedavg'"):
        load_spec(spec)


def test_two_plugins_with_one_name_is_one_error(my_avg, tmp_path):
    other = tmp_path / "other.py"
    other.write_text(MY_AVG.replace('"my-plain"', '"my-other"'))
    plugins.load([str(my_avg)])
    with pytest.raises(
        plugins.PluginError,
        match="plugin 'other.py' registers the algorithm 'my-avg', a name that plugin 'my_avg.py' already registered",
    ):
        plugins.load([str(other)])


def test_a_plugin_path_that_does_not_exist_is_one_error(tmp_path, capsys):
    err = run_fails(
        ["run", "benchmarks/demo.yaml", "--plugin", "nowhere/mine.py", "--results", str(tmp_path / "r")], capsys
    )
    assert "plugin 'nowhere/mine.py': no such file" in err and err.count("\n") == 1
    err = run_fails(["list", "algorithms", "--plugin", "not_a_module_anywhere"], capsys)
    assert "no module named 'not_a_module_anywhere'" in err
    spec = write_spec(
        tmp_path / "s.yaml", {"plugins": ["missing.py"], "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]}}
    )
    with pytest.raises(
        SpecError, match=rf"s.yaml: plugins\[0\]: plugin 'missing.py': no such file '{tmp_path}/missing.py'"
    ):
        load_spec(spec)


def test_a_plugin_that_fails_to_import_is_one_error_naming_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from pflbench.algorithm import ALGORITHMS\nfrom pflbench.fedavg import FedAvg\n\n"
        "@ALGORITHMS.register('half-done')\nclass Half(FedAvg):\n    pass\n\n"
        "raise RuntimeError('boom')\n"
    )
    err = run_fails(["sweep", "--algo", "half-done", "--plugin", str(bad), "--results", str(tmp_path / "r")], capsys)
    assert "bad.py failed to import: RuntimeError: boom (bad.py, line 8)" in err and err.count("\n") == 1
    assert "half-done" not in ALGORITHMS and not (tmp_path / "r").exists()


def test_a_plugin_with_a_syntax_error_is_one_error_naming_its_file_and_line(tmp_path, capsys):
    """The line the parser stopped at, in the user's file (not pflbench's loader, which compiled it)."""
    bad = tmp_path / "typo.py"
    bad.write_text("from pflbench.algorithm import ALGORITHMS\n\n\ndef broken(:\n    pass\n")
    err = run_fails(["list", "algorithms", "--plugin", str(bad)], capsys)
    assert f"plugin {bad} failed to import: SyntaxError: invalid syntax (typo.py, line 4: def broken(:)" in err, err
    assert "plugins.py" not in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_plugin_algorithm_is_tuned_by_pflbench_sweep_in_ray_tune_workers(tmp_path):
    from pflbench.cli.scaffold import write_scaffold

    plugin, _ = write_scaffold("algorithm", "my-prox", tmp_path / "outside", base="fedprox")
    base = write_spec(
        tmp_path / "base.yaml",
        {
            "matrix": {
                "algorithm": "fedavg",
                "dataset": "synthetic",
                "partition": [
                    {"scheme": "pathological", "params": {"classes_per_client": 2, "samples_per_client": 60}}
                ],
            },
            "defaults": {"clients": 4, "rounds": 2, "lr": 0.05, "dataset_options": {"num_samples": 1000}},
        },
    )
    out = tmp_path / "tuned"
    assert (
        main(
            [
                "sweep",
                "--algo",
                "my-prox",
                "--plugin",
                str(plugin),
                "--spec",
                str(base),
                "--trials",
                "2",
                "--workers",
                "2",
                "--results",
                str(tmp_path / "results"),
                "--out",
                str(out),
                "--root",
                str(tmp_path / "data"),
            ]
        )
        == 0
    )
    tuned = yaml.safe_load((out / "my-prox.yaml").read_text())
    assert tuned["algorithm"] == "my-prox" and set(tuned["set"]["hp"]) == {"mu"}
    sweep = json.loads(next((tmp_path / "results" / "sweeps").glob("my-prox-*/sweep.json")).read_text())
    assert len(sweep["outcomes"]) == 2
    assert all(t["status"] in ("completed", "stopped early") and t["error"] is None for t in sweep["outcomes"])
    assert sweep["base_cell"]["plugin_hashes"] == {"my_prox.py": hashlib.sha256(plugin.read_bytes()).hexdigest()}
