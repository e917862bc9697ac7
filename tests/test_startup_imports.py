"""What a command that reads no dataset file imports: not torchvision or scipy.optimize (nor pandas, to list).

torchvision alone costs a command about as much CPU again as torch (it pulls in torch._dynamo), pandas and
scipy.optimize about a second each on a loaded 2-core machine. `pflbench list algorithms` needs none of them and
a dry run no dataset reader or solver, so the dataset readers, the result records and FedPAC's solver import
them where they are used.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torchvision", "pandas", "scipy.optimize")  # each module's name and its submodules

PROBE = """
import json, sys
from pflbench.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def heavy_imports(modules: set[str], heavy: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


def test_listing_the_algorithms_imports_no_dataset_reader_no_pandas_and_no_solver():
    modules = imported_by("list", "algorithms")
    assert {"torch", "pflbench.algorithms.fedpac", "pflbench.data.idx"} <= modules  # the probe sees the imports
    assert heavy_imports(modules, HEAVY) == []


def test_a_dry_run_imports_no_dataset_reader_and_no_solver():
    """It checks that the datasets are there without reading them (pandas comes with the run's recording)."""
    modules = imported_by("run", "benchmarks/demo.yaml", "--dry-run")
    assert "pflbench.data.idx" in modules
    assert heavy_imports(modules, ("torchvision", "scipy.optimize")) == []


def test_listing_the_datasets_asks_torchvision_for_file_names_only():
    """`list datasets` says which files are where, and torchvision's classes know CIFAR's file names."""
    modules = imported_by("list", "datasets")
    assert "torchvision.datasets" in modules
    assert heavy_imports(modules, ("pandas", "scipy.optimize")) == []
