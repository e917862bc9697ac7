"""Import paths of 0.1 (pflbench/loader/moved.py): each old path gives the module at its new path, the same
object, with a DeprecationWarning naming the new path; nothing else under pflbench is found by the table."""

from __future__ import annotations

import importlib
from contextlib import nullcontext
import subprocess
import sys
from pathlib import Path

import pytest

from pflbench.loader.moved import MOVED, REMOVED_IN

ROOT = Path(__file__).resolve().parents[1]


def test_every_old_path_is_the_module_at_its_new_path():
    for old, new in MOVED.items():
        assert not (ROOT / "pflbench" / f"{old}.py").exists(), f"pflbench/{old}.py is back: drop it from MOVED"
        with pytest.warns(DeprecationWarning) if f"pflbench.{old}" not in sys.modules else nullcontext():
            module = importlib.import_module(f"pflbench.{old}")
        assert module is importlib.import_module(f"pflbench.{new}"), old


def test_an_old_import_warns_with_the_new_path_and_works():
    """In a fresh interpreter: a 0.1 plugin's imports run, each with one warning naming where to import from."""
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "from pflbench.training import State\n"
        "from pflbench.rounds import run_cell\n"
        "from pflbench.partitioning import Partitioner\n"
        "import pflbench.simulator.rounds as rounds\n"
        "assert run_cell is rounds.run_cell\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(lines) == 3, done.stderr
    assert (
        f"pflbench.training moved to pflbench.simulator.training in pflbench 0.2; the old path goes in {REMOVED_IN}"
        in lines[0]
    )
    assert "<string>:2" in lines[0]  # the warning points at the user's import, not at the finder


def test_a_name_that_never_existed_is_still_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pflbench.no_such_module")
