"""A loan leaves the CPU cells' carried checkpoints behind (benchmarks/gpu/PLAN.md): `make gpu-aside` moves
rehearse.LEFT_BEHIND out of the working tree, and the tree the device tool then sends (tracked files present,
untracked files git does not ignore) is exactly what rehearse.sent_files, and so kit.py's 64 MiB count,
counts; `make gpu-back` returns the folder byte for byte."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import rehearse  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def present(repo: Path) -> set[str]:
    """What the device tool copies: tracked and untracked-not-ignored files that exist in the working tree."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {name for name in listed if name and (repo / name).is_file()}


def test_gpu_aside_leaves_exactly_what_the_kit_does_not_count_and_gpu_back_returns_it(tmp_path):
    repo = tmp_path / "checkout"
    carried = repo / "contributing" / "inflight" / "checkpoints" / "7348687" / "c10-t1" / "abc"
    carried.mkdir(parents=True)
    (carried / "checkpoint.pt.xz.part-aa").write_bytes(b"\x00" * 4096)
    (repo / "contributing" / "inflight.md").write_text("how to resume\n")
    (repo / "pflbench").mkdir()
    (repo / "pflbench" / "__init__.py").write_text("")
    (repo / ".gitignore").write_text((REPO / ".gitignore").read_text())
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree")
    counted = set(rehearse.sent_files(repo))
    assert "contributing/inflight.md" in counted and "pflbench/__init__.py" in counted
    assert not any(name.startswith(rehearse.LEFT_BEHIND) for name in counted)

    makefile = (REPO / "Makefile").read_text()
    assert "benchmarks/gpu/aside.py out" in makefile and "benchmarks/gpu/aside.py back" in makefile
    aside = [sys.executable, str(REPO / "benchmarks" / "gpu" / "aside.py")]  # what make gpu-aside / gpu-back run
    subprocess.run([*aside, "out", "--repo", str(repo)], check=True, capture_output=True)
    assert present(repo) == counted  # the device gets what kit.py counted, and .gpu-aside/ is ignored
    assert (repo / ".gpu-aside" / "contributing" / "inflight" / "checkpoints").is_dir()
    again = subprocess.run([*aside, "out", "--repo", str(repo)], capture_output=True, text=True)
    assert again.returncode != 0 and "gpu-back first" in again.stderr  # never two copies set aside

    subprocess.run([*aside, "back", "--repo", str(repo)], check=True, capture_output=True)
    assert (carried / "checkpoint.pt.xz.part-aa").read_bytes() == b"\x00" * 4096
    assert not (repo / ".gpu-aside").exists() and git(repo, "status", "--porcelain") == ""
