"""`pip install` of a built wheel gives a working `pflbench` outside the checkout: the built-in
algorithms and partitions (pflbench/algorithms, pflbench/partitions), the specs of benchmarks/ (the data
package `pflbench.benchmarks`) and the report templates come with it, all inside the pflbench namespace
(no top-level `algorithms`, `partitions` or `benchmarks` in site-packages), every module of pflbench/ is
in it (pyproject.toml lists the packages), and a user's plugin file runs beside them.

Offline: the wheel is built without build isolation and installed with `--no-deps --no-index` into a
fresh virtual environment that sees this environment's packages (torch, Ray, ...) through a .pth
line, not this checkout: the checkout's editable install is a .pth *file* of this environment's
site-packages, which a plain path entry does not execute."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

MY_AVG = """from pflbench.algorithm import ALGORITHMS, Card
from pflbench.algorithms.fedavg import FedAvg


@ALGORITHMS.register("my-avg", card=Card(display_name="My Average", family="my family"))
class MyAvg(FedAvg):
    pass
"""


def run(args, cwd, env, timeout=600) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's bin folder, the wheel, an environment for commands run outside the checkout)."""
    if shutil.which("git") is None:
        pytest.skip("needs git to list the checkout's files")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # what a clone has: tracked files and new ones not ignored
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PFLBENCH_DATA_MIRROR", "VIRTUAL_ENV")}
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(work / "dist"),
            str(source),
        ],
        cwd=work,
        env=env,
    )
    [wheel] = (work / "dist").glob("pflbench-*.whl")
    fresh = work / "fresh"
    run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], cwd=work, env=env)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(fresh / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        cwd=work,
        env=env,
    )
    fresh_site = next((fresh / "lib").glob("python3*/site-packages"))
    (fresh_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return fresh / "bin", wheel, env


def test_the_wheel_holds_the_package_and_its_data_inside_the_pflbench_namespace(installed):
    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"pflbench", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for shipped in (
        "pflbench/algorithms/fedavg.py",
        "pflbench/partitions/dirichlet.py",
        "pflbench/benchmarks/table1.yaml",
        "pflbench/benchmarks/sweeps/default.yaml",
        "pflbench/benchmarks/reference/pfedla_table1.csv",
        "pflbench/reports/templates/index.html",
        "pflbench/cli/templates/algorithm.py.tmpl",
        "pflbench/algorithms/README.md",
        "pflbench/benchmarks/tuned/README.md",
    ):
        assert shipped in names
    # every module of the package (a new subpackage must be added to pyproject.toml's list)
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "pflbench").rglob("*.py")}
    assert modules - set(names) == set()
    # the benchmarks' scripts (gpu/, analysis/, speed/) are not installed
    assert not [n for n in names if n.startswith(("pflbench/benchmarks/gpu/", "pflbench/benchmarks/analysis/"))]


def test_the_installed_pflbench_runs_a_spec_and_a_plugin_from_an_empty_directory(installed, tmp_path):
    bin_dir, _, env = installed
    here = tmp_path / "empty"
    here.mkdir()
    python, pflbench = str(bin_dir / "python"), str(bin_dir / "pflbench")
    where = run(
        [
            python,
            "-c",
            "import importlib.util, pflbench.algorithms, pflbench.partitions;"
            "print(pflbench.algorithms.__file__);"
            "print(importlib.util.find_spec('algorithms'), importlib.util.find_spec('partitions'))",
        ],
        here,
        env,
    )
    assert str(bin_dir.parent) in where.splitlines()[0] and where.splitlines()[1] == "None None"
    assert "pfedla" in run([pflbench, "list", "algorithms"], here, env)
    assert "table1: 40 cells" in run([pflbench, "run", "table1", "--scale", "quick", "--dry-run"], here, env)
    small = [
        "--no-ray",
        "--set",
        "dataset=[{name: synthetic, options: {num_samples: 400}}]",
        "--set",
        "seed=0",
        "--set",
        "rounds=2",
        "--set",
        "clients=4",
        "--set",
        "finetune_epochs=0",
        "--set",
        "partition_params.samples_per_client=60",
    ]
    # One run: the built-ins and the user's plugin beside them (a run of the built-ins alone before it
    # started a second `pflbench` and checked nothing this one does not).
    (here / "my_avg.py").write_text(MY_AVG)
    run(
        [
            pflbench,
            "run",
            "demo",
            "--set",
            "algorithm=[fedavg,local]",
            "--plugin",
            "my_avg.py",
            "--set",
            "algorithm+=[my-avg]",
            *small,
        ],
        here,
        env,
    )
    run([pflbench, "report", "--no-figures", "--quiet", "--plugin", "my_avg.py"], here, env)
    assert "My Average" in (here / "reports" / "report.md").read_text()
    assert "family: my family" in (here / "reports" / "algorithms" / "my-avg.html").read_text()
    assert len(list((here / "results").iterdir())) >= 3  # fedavg, local, my-avg
    run([pflbench, "new", "algorithm", "my-prox", "--from", "fedprox"], here, env)
    assert '@ALGORITHMS.register("my-prox", card=Card(' in (here / "my_prox.py").read_text()
