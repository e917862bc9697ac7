"""`make gpu-aside` / `make gpu-back`: the tracked folders a GPU loan leaves behind (rehearse.LEFT_BEHIND),
moved out of the working tree into the git-ignored .gpu-aside/ before the loan's first call (the device copies
only the files present) and back after it.

    python benchmarks/gpu/aside.py out|back [--repo .]
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from rehearse import LEFT_BEHIND, REPO  # this script's folder is on sys.path

ASIDE = ".gpu-aside"


def move_out(repo: Path) -> list[str]:
    """Each LEFT_BEHIND folder present, moved to repo/.gpu-aside/ under the same path; refuses (SystemExit)
    where something is already set aside, so there are never two copies."""
    if (repo / ASIDE).exists():
        raise SystemExit(f"gpu-aside: {repo / ASIDE} exists: run make gpu-back first")
    moved = []
    for folder in (name.rstrip("/") for name in LEFT_BEHIND):
        if (repo / folder).is_dir():
            (repo / ASIDE / folder).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(repo / folder, repo / ASIDE / folder)
            moved.append(folder)
    return moved


def move_back(repo: Path) -> list[str]:
    """What move_out set aside, returned to its place; .gpu-aside/ removed."""
    returned = []
    for folder in (name.rstrip("/") for name in LEFT_BEHIND):
        if (repo / ASIDE / folder).is_dir():
            (repo / folder).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(repo / ASIDE / folder, repo / folder)
            returned.append(folder)
    if (repo / ASIDE).exists():
        shutil.rmtree(repo / ASIDE)
    return returned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["out", "back"])
    parser.add_argument("--repo", default=str(REPO), help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    repo = Path(args.repo)
    if args.action == "out":
        moved = move_out(repo)
        print(f"gpu-aside: {', '.join(moved) or 'nothing'} moved to {ASIDE}/ (make gpu-back after the loan)")
    else:
        returned = move_back(repo)
        print(f"gpu-back: {', '.join(returned) or 'nothing'} returned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
