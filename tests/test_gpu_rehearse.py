"""The rehearsal runs the device calls as the device will (benchmarks/gpu/rehearse.py): on the tree as the
device tool sends it, through in_kit.sh with the kit's environment (PYTHONSAFEPATH=1: a script's folder is
not on sys.path). A sibling import planted in column.py, which a plain `python column.py` accepts (its folder
is on sys.path there), fails the rehearsal's column call, as it would fail the device's; the scripts as they
are import there. Needs the kit (`make gpu-kit`; `make gpu-rehearse` runs this module after it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import rehearse  # noqa: E402

pytestmark = pytest.mark.skipif(not (REPO / ".gpu-kit" / "wheels").is_dir(), reason="no kit: make gpu-kit")


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    """The tree as sent (with the kit), and the rehearsal's device-image Python."""
    work = tmp_path_factory.mktemp("rehearse")
    tree = work / "tree"
    size = rehearse.build_tree(REPO, tree, [".gpu-kit"])
    rehearse.add_rehearsal_wheels(tree)
    assert size <= rehearse.TREE_LIMIT
    assert not (tree / ".git").exists() and (tree / ".gpu-kit" / "wheels").is_dir()
    return tree, rehearse.rehearsal_python(work / "env")


def plan_scripts() -> list[str]:
    """Every script a call of the plan runs: the calls' own and each step of check.py's (on the device and in
    its rehearsal), as paths in the tree."""
    import check

    scripts = {"column.py", "check.py", "graphs.py", "cifar_travel.py"}
    for step in check.steps("cuda", False, Path("/w")) + check.steps("cpu", True, Path("/w")):
        scripts |= {
            Path(part).name for part in step.command if part.startswith(str(rehearse.HERE)) and part.endswith(".py")
        }
    return [f"benchmarks/gpu/{name}" for name in sorted(scripts)]


def test_the_scripts_of_the_plan_import_in_the_kits_environment(sent):
    """Each script's imports (its --help), in the kit's environment: what CI checks of check.py's steps, whose
    end-to-end rehearsal (`rehearse.py --steps check`, 20 minutes on a loaded CPU) is left to the loan's own
    `make gpu-rehearse`; `pflbench bench` (check.py's bench steps) is pflbench's command line."""
    tree, python = sent
    scripts = plan_scripts()
    assert {"benchmarks/gpu/sharing.py", "benchmarks/gpu/kernels.py", "benchmarks/gpu/column_groups.py"} <= set(scripts)
    for command in [["python3", script, "--help"] for script in scripts] + [
        ["python3", "-m", "pflbench.cli", "bench", "--help"]
    ]:
        call = rehearse.in_kit(tree, python, command, 300)
        assert call["status"] == "ok", (command, call["output_tail"])


def test_a_planted_sibling_import_fails_the_rehearsal_as_it_would_the_device(sent, tmp_path):
    tree, python = sent
    column = tree / "benchmarks" / "gpu" / "column.py"
    original = column.read_text()
    (tree / "benchmarks" / "gpu" / "planted_sibling.py").write_text("VALUE = 1\n")
    column.write_text(
        original.replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport planted_sibling  # noqa\n",
            1,
        )
    )
    try:
        plain = subprocess.run(
            [sys.executable, str(column), "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )
        assert plain.returncode == 0, plain.stderr  # outside the kit's environment the plant goes unseen
        calls = rehearse.column_loans(tree, python, tmp_path / "out", tmp_path / "work")
        assert calls["status"] == "failed"
        assert calls["loan1"]["status"].startswith("failed")
        assert "ModuleNotFoundError: No module named 'planted_sibling'" in calls["loan1"]["output_tail"]
    finally:
        column.write_text(original)
        (tree / "benchmarks" / "gpu" / "planted_sibling.py").unlink()
