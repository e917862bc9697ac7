"""Filesystem helpers: writes that are never seen half-done, and content digests for provenance."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator


@contextmanager
def staged(dest: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `dest` to write (a file or a folder); move it onto `dest` on success.

    A process killed mid-way leaves a hidden `.NAME.tmp-*` sibling, never a half-written `dest`, so
    torchvision's "files exist" checks and our cache can trust whatever is at `dest`. Several
    workers may prepare the same dataset at once: a folder someone else placed first is kept.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if not (tmp.is_dir() and dest.exists()):
            os.replace(tmp, dest)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp)
        elif tmp.exists():
            tmp.unlink()


def place_folder(dest: Path, archive: Path, folder: Path, unpack: Callable[[Path, Path], Path]) -> Path:
    """Place a dataset folder at `dest` (through `staged`) from a mirror: its `archive` when present,
    unpacked by `unpack(archive, scratch)` (which returns the extracted folder to move), else a copy
    of its already-extracted `folder`. Returns the source used."""
    with staged(dest) as tmp:
        if archive.is_file():
            with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".unpack-") as scratch:
                unpack(archive, Path(scratch)).rename(tmp)
            return archive
        shutil.copytree(folder, tmp)
        return folder


class ContentDigest:
    """sha256 over files given as (relative name, bytes), in the order added: 'sha256:<hex>'.

    Names and sizes are hashed too, so a renamed or re-split file changes the digest.
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, name: str, data: bytes) -> None:
        self._sha.update(f"{name}\0{len(data)}\0".encode())
        self._sha.update(data)

    def add_file(self, path: Path, base: Path) -> None:
        self._sha.update(f"{path.relative_to(base).as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                self._sha.update(block)

    def result(self) -> str:
        return "sha256:" + self._sha.hexdigest()


def digest_files(paths: Iterable[Path], base: Path) -> str:
    """ContentDigest of `paths` (named relative to `base`), in the given order."""
    digest = ContentDigest()
    for path in paths:
        digest.add_file(path, base)
    return digest.result()
