"""`imported`: a split made elsewhere (FL-bench's partition.pkl, or our JSON format), client for client.

`{scheme: imported, params: {path: ..., format: flbench|json, fraction: 1.0}}`. File formats, the index
order they refer to and the checks made are in `pflbench.data.interop`. Choices where the formats are silent:

- The file brings each client's train/val/test; pflbench's stratified train/test split
  (`train_fraction`) is not applied. The number of clients is the file's: a cell's `clients` must equal it.
- `val`: where the file gives a client none (FL-bench's default `val_ratio` 0), `make_splits` carves
  `val_fraction` of that client's train split, stratified by class, with the cell's seed (as for our own
  schemes; `val_fraction: 0` keeps the file's train split whole). A file's non-empty val is used as is.
- `fraction` < 1 keeps, of every split of every client, the first floor(fraction * n) indices in the
  file's order (at least one train and one test index). FL-bench shuffles a client's indices before it
  cuts train and test, so a prefix is a random subset of that client's classes; fraction 0.25 is the
  subsample of ../shared/crosscheck/README.md's measurements. Indices are then kept in increasing
  order, as our own splits are.
- Identity: a spec resolves `path` (relative: to the spec file's folder) to an absolute path and records
  the file's `sha256` in the cell's partition parameters, so cells on different files (or on a file
  that changed) never share results; running a cell whose file no longer has that hash is an error.
  The cell's hash leaves the path out (`CellConfig.canonical_json`): the same content anywhere is one cell.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pflbench.data.interop import FORMATS, PartitionFile, read_bytes, read_partition
from pflbench.data.partitioning import PARTITIONS, SPLITS, ClientSplits, Partitioner, SchemeParams


@PARTITIONS.register("imported")
class Imported(Partitioner):
    scheme = "imported"

    class Params(SchemeParams):
        path: str = Field(min_length=1)
        format: Literal[FORMATS]  # type: ignore[valid-type]  # Literal of a tuple: of its names (mypy cannot see it)
        fraction: float = Field(1.0, gt=0.0, le=1.0)
        sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # filled in by spec resolution

    params: Params  # validated by Partitioner.__init__; typed as this scheme's

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._file: PartitionFile | None = None

    def resolved(self, base_dir: str | Path | None = None) -> Imported:
        """The absolute path and the content hash of the file, read and checked for form now, so that a
        wrong path or a broken file is reported before anything runs."""
        path = Path(self.params.path).expanduser()
        if not path.is_absolute():
            path = Path(base_dir or Path.cwd()) / path
        path = path.resolve()
        content = read_bytes(path)
        digest = hashlib.sha256(content).hexdigest()
        self.check_recorded(
            "sha256",
            digest,
            f"the file {str(path)!r} now has sha256 {digest}: it changed since the cell was made",
            "restore it",
        )
        resolved = Imported(**{**self.params.model_dump(), "path": str(path), "sha256": digest})
        resolved._file = read_partition(path, self.params.format, content)
        return resolved

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        super().check(num_clients, num_classes, class_counts)
        held = self._read().splits.num_clients
        if num_clients != held:
            raise self.error(
                "num_clients", num_clients, f"the file {self.params.path!r} holds {held} clients; set clients: {held}"
            )

    def given_splits(self, labels: np.ndarray, num_classes: int, num_clients: int) -> ClientSplits:
        file = self._read()
        file.check_against(labels, num_classes)
        return ClientSplits(**{name: [self._kept(part) for part in getattr(file.splits, name)] for name in SPLITS})

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        splits = self.given_splits(labels, num_classes, num_clients)
        return [np.sort(np.concatenate(parts)) for parts in zip(splits.train, splits.val, splits.test)]

    def _kept(self, indices: np.ndarray) -> np.ndarray:
        if self.params.fraction < 1.0 and len(indices):
            indices = indices[: max(1, math.floor(self.params.fraction * len(indices)))]
        return np.sort(indices)

    def _read(self) -> PartitionFile:
        if self._file is None:
            self._file = self.resolved()._file
        assert self._file is not None, "Imported.resolved reads the file"
        return self._file
