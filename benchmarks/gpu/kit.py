"""`make gpu-kit`: everything the GPU check needs that a lent device lacks, in one git-ignored folder.

A lent GPU machine has no network, its own Python (3.12) and PyTorch (2.11), and a 64 MiB limit on the
working tree that travels to it (the device tool's README). So the check's dependencies travel as
wheels, and its data as files:

  .gpu-kit/wheels/   kit-requirements.txt's wheels, for CPython 3.12 manylinux x86-64 (the device);
                     `pip download --no-deps --only-binary`. This machine's Python's own (the rehearsal's),
                     where it is another version, go to .gpu-rehearsal-wheels/, which does not travel
  .gpu-kit/data/     the datasets (`--datasets`): Fashion-MNIST's four files, in the offline mirror's layout
                     (PFLBENCH_DATA_MIRROR), and/or cifar10-jpeg as cifar_travel.py packs it
  .gpu-kit/kit.json  what is in it, and its size

A kit for a cifar10-jpeg loan: `--kit .gpu-kit-cifar --datasets cifar10-jpeg` (Fashion-MNIST and CIFAR
together do not fit the carry beside the tree).

It prints the kit's size and what would travel in all (tracked and untracked-not-ignored files, less the
folders `make gpu-aside` moves out before a loan, plus the kit), and fails where that passes 64 MiB.

    python benchmarks/gpu/kit.py [--kit .gpu-kit] [--mirror ../shared/data] [--datasets fmnist,cifar10-jpeg]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rehearse import sent_files  # the tree as the device tool sends it (this script's folder is on sys.path)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIMIT = 64 * 2 ** 20  # the device's working-tree limit
REHEARSAL_WHEELS = REPO / ".gpu-rehearsal-wheels"  # this machine's Python's wheels: the rehearsal's, never carried
DATASETS = ("fmnist", "cifar10-jpeg")
DEVICE_PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
FMNIST = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
          "t10k-labels-idx1-ubyte.gz"]


def requirements() -> list[str]:
    lines = (HERE / "kit-requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def download(wheels: Path, python_version: str) -> None:
    """The wheels of every requirement for CPython `python_version` (no dependencies: each is listed)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
               *[arg for platform in PLATFORMS for arg in ("--platform", platform)], "-d", str(wheels),
               *requirements()]
    subprocess.run(command, check=True)


def pack_cifar(mirror: Path, data: Path) -> None:
    target = data / "cifar10-jpeg.travel"
    if not target.exists():
        subprocess.run([sys.executable, str(HERE / "cifar_travel.py"), "pack", "--mirror", str(mirror),
                        "--out", str(target)], check=True)


def copy_data(mirror: Path, data: Path) -> None:
    source = mirror / "fashion-mnist"
    missing = [name for name in FMNIST if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"gpu-kit: the offline mirror {source} lacks {', '.join(missing)} "
                         f"(give --mirror, or set PFLBENCH_DATA_MIRROR)")
    target = data / "fashion-mnist"
    target.mkdir(parents=True, exist_ok=True)
    for name in FMNIST:
        if not (target / name).exists() or (target / name).stat().st_size != (source / name).stat().st_size:
            shutil.copyfile(source / name, target / name)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def travelling_bytes(kit: Path) -> int:
    """What the device tool sends: tracked and untracked-not-ignored files less what `make gpu-aside` moves out
    (rehearse.sent_files), plus the kit (carried)."""
    tree = sum((REPO / name).stat().st_size for name in sent_files(REPO))
    return tree + folder_bytes(kit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", default=str(REPO / ".gpu-kit"), help="the kit's folder (default: .gpu-kit)")
    parser.add_argument("--mirror", default=os.environ.get("PFLBENCH_DATA_MIRROR", str(REPO.parent / "shared" / "data")),
                        help="the offline dataset mirror (default: $PFLBENCH_DATA_MIRROR or ../shared/data)")
    parser.add_argument("--datasets", default="fmnist", help=f"comma-separated, of {', '.join(DATASETS)}")
    args = parser.parse_args(argv)
    datasets = args.datasets.split(",")
    if set(datasets) - set(DATASETS):
        parser.error(f"--datasets: {', '.join(sorted(set(datasets) - set(DATASETS)))} unknown; allowed: {', '.join(DATASETS)}")
    kit = Path(args.kit)
    wheels = kit / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for stale in wheels.glob("*-cp3*-cp3*"):  # an older kit's rehearsal wheels: not for the device
        if f"cp{DEVICE_PYTHON.replace('.', '')}" not in stale.name:
            stale.unlink()
    download(wheels, DEVICE_PYTHON)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != DEVICE_PYTHON:
        REHEARSAL_WHEELS.mkdir(exist_ok=True)
        download(REHEARSAL_WHEELS, here)
    if "fmnist" in datasets:
        copy_data(Path(args.mirror), kit / "data")
    if "cifar10-jpeg" in datasets:
        (kit / "data").mkdir(parents=True, exist_ok=True)
        pack_cifar(Path(args.mirror), kit / "data")
    size = folder_bytes(kit)
    total = travelling_bytes(kit)
    (kit / "kit.json").write_text(json.dumps({
        "requirements": requirements(), "pythons": sorted({DEVICE_PYTHON, here}),
        "wheels": sorted(p.name for p in wheels.glob("*.whl")), "data": datasets,
        "kit_bytes": size, "travelling_bytes": total, "limit_bytes": LIMIT}, indent=1) + "\n")
    print(f"gpu-kit: {kit} holds {len(list(wheels.glob('*.whl')))} wheels and {', '.join(datasets)}, "
          f"{size / 2 ** 20:.1f} MiB; with the working tree {total / 2 ** 20:.1f} MiB travel "
          f"(limit {LIMIT / 2 ** 20:.0f} MiB)")
    if total > LIMIT:
        print("gpu-kit: over the device's limit: leave untracked files out of the tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
