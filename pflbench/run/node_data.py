"""The data on every node: a cell on a Ray worker runs on exactly the dataset and partition that the
driver prepared, or fails with one message naming the node and the path. A worker never downloads.

The driver prepares every distinct dataset and partition of a run before any cell starts
(`pflbench.run.runner.prepare_partitions`) and gives each cell a `DataFingerprint`: the dataset's checksum
(the SHA-256 of its source files, or a generated dataset's recipe) and the partition's digest (every
client's train/val/test indices), with the data root and mirror it used. A cell whose Ray worker is on
another node than the driver's checks, before its first round (`check_node_data`):

- a dataset read from files must already be on this node, under the driver's data root or mirror (the
  same absolute paths): a download here could bring another copy than the driver's (torchvision fetches
  whatever its address serves that day), so none is tried; where it is missing, `NodeDataError` names
  the node, the dataset and every path looked at;
- the dataset loaded here must have the driver's checksum, else `NodeDataError` names the node, the
  path and both checksums;
- the partition comes from this node's partition cache where it has it, else it is made here from the
  verified dataset (a pure function of the data and the cell's partition settings); either way its
  digest must be the driver's, else `NodeDataError`.
On the driver's node nothing is checked: the driver prepared those very files.

Why the data is not sent from the driver: a dataset is read whole by every cell and is large (CIFAR-10
decoded: 0.7 GB); moving it through Ray per cell would cost more than many cells take, while the data
root is set up once per node (`pflbench data prepare` there, a copy, or a read-only shared mount). A
partition is small, but once the data is verified it is identical by construction; its digest proves
that it is the driver's without moving it. The check loads the dataset once more than the cell itself
does (from the node's decoded cache after the first cell).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pflbench.data.dataset import Dataset
    from pflbench.data.partitioning import ClientSplits

from pflbench.config import CellConfig


class NodeDataError(RuntimeError):
    """This node lacks the cell's data, or holds another copy than the driver's (one message)."""


@dataclass(frozen=True)
class DataFingerprint:
    """What the driver prepared for a cell, and where (module doc)."""

    dataset: str
    checksum: str  # the dataset's (`Dataset.checksum`)
    partition: str  # `splits_digest` of the cell's partition
    data_root: str
    mirror: str | None
    driver: str  # the driver's machine, for messages
    driver_node: str | None = None  # its Ray node id (set once Ray is joined): nothing is checked there


def splits_digest(splits: ClientSplits) -> str:
    """SHA-256 over every client's train, val and test indices (int64), in order."""
    digest = hashlib.sha256()
    for name in ("train", "val", "test"):
        parts = getattr(splits, name)
        digest.update(f"{name}:{len(parts)}\0".encode())
        for part in parts:
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part.astype("<i8", copy=False).tobytes())
    return "sha256:" + digest.hexdigest()


def fingerprint(
    dataset: Dataset, splits: ClientSplits, data_root: Path, mirror: Path | None, driver: str
) -> DataFingerprint:
    return DataFingerprint(
        dataset.name,
        dataset.checksum,
        splits_digest(splits),
        str(data_root),
        None if mirror is None else str(mirror),
        driver,
    )


def check_node_data(cell: CellConfig, expected: DataFingerprint, node: str) -> None:
    """Raise NodeDataError unless this node (`node`, for the message) has the cell's dataset and
    partition exactly as the driver prepared them (module doc). Leaves them in this node's caches."""
    from pflbench.data.cache import cache_path
    from pflbench.data.locations import DatasetNotFoundError
    from pflbench.data.sources import FileSource, make_source
    from pflbench.simulator.rounds import prepare_cell

    root = Path(expected.data_root)
    mirror = Path(expected.mirror) if expected.mirror else None
    advice = (
        f"Give every node the driver's data: the same data root {root}"
        + (f" or mirror {mirror}" if mirror else "")
        + f" (`pflbench data prepare {cell.dataset}` on the node, a copy, or a shared mount)."
    )
    source = make_source(cell.dataset, cell.dataset_options)
    if isinstance(source, FileSource):
        cached = cache_path(root, source.cache_key())
        if not (cached.is_file() or source.present(root) or (mirror is not None and source.in_mirror(mirror))):
            looked = [str(cached), *map(str, source.required_paths(root))]
            looked += [str(p) for p in source.mirror_paths(mirror)] if mirror is not None else []
            raise NodeDataError(
                f"node {node} has no copy of dataset {cell.dataset!r} (looked at {', '.join(looked)}); "
                f"the driver ({expected.driver}) has it, checksum {expected.checksum}. A worker never "
                f"downloads a dataset. {advice}"
            )
    try:
        dataset, splits = prepare_cell(cell, root, mirror)
    except DatasetNotFoundError as error:
        raise NodeDataError(f"node {node}: {error} {advice}") from None
    if dataset.checksum != expected.checksum:
        raise NodeDataError(
            f"node {node} has another copy of dataset {cell.dataset!r} under {root}"
            + (f" or {mirror}" if mirror else "")
            + f": checksum {dataset.checksum}, the driver's "
            f"({expected.driver}) is {expected.checksum}. {advice}"
        )
    digest = splits_digest(splits)
    if digest != expected.partition:
        raise NodeDataError(
            f"node {node} makes another partition of {cell.dataset!r} for this cell than the driver "
            f"({expected.driver}) did (digest {digest}, the driver's {expected.partition}; partition "
            f"cache {root / 'cache' / 'partitions'}): remove that node's partition cache, and check "
            f"that it runs the same code. {advice}"
        )
