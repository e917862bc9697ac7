"""The GPU check's rehearsal environment: this machine's packages, cut down to the device image's.

`check.sh --rehearse` runs the check on the CPU in a fresh virtual environment that sees exactly the
packages the lent device's image holds (device-image.txt, with torch's own dependencies), taken from
the environment that runs this script (links, nothing copied), and nothing else: no pydantic, no
opacus, no pflbench. The check then installs the kit into it with --no-deps, as on the device, so a
package the kit lacks fails the rehearsal here instead of the device's few minutes.

    python benchmarks/gpu/rehearse_env.py FOLDER     # prints the environment's python
"""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    lines = (HERE / "device-image.txt").read_text().splitlines()
    return {normalize(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def requirements_of(dist: metadata.Distribution) -> list[str]:
    """The names `dist` requires unconditionally (no extras, markers true here)."""
    from packaging.requirements import Requirement

    names = []
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.append(normalize(requirement.name))
    return names


def image_distributions() -> list[metadata.Distribution]:
    """The distributions installed here that the device image has, with torch's dependencies."""
    installed = {normalize(d.metadata["Name"]): d for d in metadata.distributions()}
    wanted = device_packages() & set(installed)
    queue = ["torch"]
    while queue:  # torch's own dependencies come with the image's torch
        name = queue.pop()
        if name in installed:
            for dep in requirements_of(installed[name]):
                if dep in installed and dep not in wanted:
                    wanted.add(dep)
                    queue.append(dep)
    return [installed[name] for name in sorted(wanted)]


def top_level_entries(dist: metadata.Distribution) -> set[Path]:
    """The site-packages entries (folders and modules) a distribution installed, with its metadata."""
    base = Path(dist.locate_file(""))
    entries = set()
    for file in dist.files or []:
        first = Path(file).parts[0]
        if first in ("..", "") or first.endswith(".pth"):
            continue
        entries.add(base / first)
    return {entry for entry in entries if entry.exists()}


def build(folder: Path) -> Path:
    folder = folder.resolve()
    farm = folder / "image"
    farm.mkdir(parents=True, exist_ok=True)
    for dist in image_distributions():
        for entry in top_level_entries(dist):
            link = farm / entry.name
            if not link.exists():
                link.symlink_to(entry)
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                       check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "device-image.pth").write_text(f"{farm}\n")
    return venv / "bin" / "python"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: rehearse_env.py FOLDER")
    print(build(Path(sys.argv[1])))
