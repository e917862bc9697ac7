"""Partition files shared with other suites: reading a split made elsewhere, writing ours for them.

Two formats, both holding per-client train/val/test sample indices:

- `flbench`: FL-bench's `partition.pkl` (its `generate_data.py`): a pickled dict with `data_indices`,
  one `{"train", "val", "test"}` dict of integer index arrays per client, and `separation` (which
  clients train/validate/test; pflbench scores every client, so it is written as "all clients" and
  ignored on reading). A pickle can run code when loaded, so it is read with an unpickler that builds
  nothing but dicts, lists, strings, numbers and numpy arrays (the only classes it may name are
  numpy's array and dtype reconstructors); anything else is refused. When FL-bench's `all_stats.json`
  lies beside the pickle, its per-client label counts are checked against the dataset's labels.
- `json`: ours, plain JSON (`pflbench data export --format json`):

      {"format": "pflbench-partition", "version": 1,
       "dataset": "fmnist", "num_samples": 70000, "num_classes": 10,       (optional: checked)
       "clients": [{"train": [...], "val": [...], "test": [...]}, ...],  ("val" may be empty or absent)
       "label_counts": [[...], ...]}                                      (optional: [client][class], checked)

Indices refer to the dataset as pflbench loads it: one pool, for the datasets torchvision ships as a
train and a test set (MNIST, Fashion-MNIST, EMNIST, CIFAR-10/100, cifar10-jpeg) the train set's samples
first, then the test set's, each in torchvision's order — the same order FL-bench indexes them in.

Every file is checked before anything runs: readable, well formed, every client with at least one
train and one test sample, no index in two places (clients are disjoint); then against the dataset:
every index in range, and the declared sizes and label counts equal to the dataset's.
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from pflbench.data.partitioning import SPLITS, ClientSplits, PartitionError

FORMATS = ("flbench", "json")
JSON_FORMAT_NAME = "pflbench-partition"
JSON_FORMAT_VERSION = 1

# The only globals a partition pickle may name: numpy's array and dtype reconstruction (numpy 1.x
# pickles name numpy.core, numpy 2.x numpy._core). Nothing here runs code beyond building an array.
_PICKLE_GLOBALS = {
    (module, name)
    for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("_reconstruct", "scalar")
} | {("numpy", "ndarray"), ("numpy", "dtype")}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}; a partition file may hold only dicts, lists, numbers, strings "
                f"and numpy arrays (a pickle that names other classes can run code, so it is not loaded)"
            )
        return super().find_class(module, name)


@dataclass
class PartitionFile:
    """A partition file's content, checked for form (not yet against a dataset)."""

    path: Path
    format: str
    splits: ClientSplits  # per client, in the file's order of clients and of indices
    num_samples: int | None = None  # declared by the file: must equal the dataset's size
    label_counts: np.ndarray | None = None  # declared [clients, classes] counts over all three splits

    def check_against(self, labels: np.ndarray, num_classes: int) -> None:
        """PartitionError when the file cannot be a split of this dataset (indices, size, labels)."""
        labels = np.asarray(labels)
        size = len(labels)
        if self.num_samples is not None and self.num_samples != size:
            raise self._error(
                f"it declares num_samples={self.num_samples} but the dataset has {size} "
                f"samples: is the file for another dataset?"
            )
        for name in SPLITS:
            for client, indices in enumerate(getattr(self.splits, name)):
                if len(indices) and indices.max() >= size:
                    raise self._error(
                        f"client {client}'s {name} index {int(indices.max())} is out of range: the "
                        f"dataset has {size} samples (0..{size - 1}): is the file for another dataset?"
                    )
        if self.label_counts is not None:
            declared = np.asarray(self.label_counts)
            actual = self.splits.label_counts(labels, num_classes)
            width = max(declared.shape[1], actual.shape[1])  # FL-bench's stats name only the classes present
            declared, actual = (np.pad(c, ((0, 0), (0, width - c.shape[1]))) for c in (declared, actual))
            if declared.shape != actual.shape or not np.array_equal(declared, actual):
                client = _first_difference(declared, actual)
                raise self._error(
                    f"its label counts do not match the dataset's labels (first at client {client}: "
                    f"file {_row(declared, client)}, dataset {_row(actual, client)}): "
                    f"is the file for another dataset, or another version of it?"
                )

    def _error(self, reason: str) -> PartitionError:
        return PartitionError(f"partition file {str(self.path)!r} ({self.format}): {reason}")


def read_partition(path: str | Path, fmt: str, content: bytes | None = None) -> PartitionFile:
    """Read and check the form of a partition file (`content`: its bytes, when already read)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise PartitionError(f"partition file format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    if content is None:
        content = read_bytes(path)
    reader = _read_flbench if fmt == "flbench" else _read_json
    return reader(path, content)


def read_bytes(path: Path) -> bytes:
    if not path.is_file():
        where = "no such file" if not path.exists() else "not a file"
        raise PartitionError(
            f"partition file {str(path)!r}: {where} (a relative path is read from the spec "
            f"file's folder, or from the current directory outside a spec)"
        )
    return path.read_bytes()


def _read_flbench(path: Path, content: bytes) -> PartitionFile:
    def error(reason: str) -> PartitionError:
        return PartitionError(f"partition file {str(path)!r} (flbench): {reason}")

    try:
        data = _ArraysOnlyUnpickler(io.BytesIO(content)).load()
    except Exception as exc:  # any failure to unpickle is the same user-facing problem
        raise error(f"not a readable FL-bench partition.pkl: {type(exc).__name__}: {str(exc)[:300]}") from None
    if not isinstance(data, dict) or "data_indices" not in data:
        raise error(
            "expected a dict with 'data_indices' (one {train, val, test} dict per client) and "
            f"'separation', as FL-bench's generate_data.py writes; got {_kind(data)}"
        )
    clients = data["data_indices"]
    if not isinstance(clients, list) or not clients:
        raise error(f"'data_indices' must be a non-empty list of per-client dicts, got {_kind(clients)}")
    splits = _splits_of(clients, error)
    counts = _flbench_stats(path.with_name("all_stats.json"), len(clients), error)
    return PartitionFile(path, "flbench", splits, label_counts=counts)


def _flbench_stats(stats_path: Path, num_clients: int, error: Callable[[str], PartitionError]) -> np.ndarray | None:
    """FL-bench's per-client label counts ({"0": {"x": n, "y": {label: count}}, ...}) when present."""
    if not stats_path.is_file():
        return None
    try:
        stats = json.loads(stats_path.read_text())
        rows = [
            {int(label): int(count) for label, count in stats[str(client)]["y"].items()}
            for client in range(num_clients)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise error(
            f"{stats_path.name} beside it is not FL-bench's per-client statistics "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    num_classes = 1 + max((label for row in rows for label in row), default=0)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for client, row in enumerate(rows):
        for label, count in row.items():
            counts[client, label] = count
    return counts


def _read_json(path: Path, content: bytes) -> PartitionFile:
    def error(reason: str) -> PartitionError:
        return PartitionError(f"partition file {str(path)!r} (json): {reason}")

    try:
        data = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"not valid JSON: {str(exc)[:300]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("clients"), list) or not data["clients"]:
        raise error(
            'expected an object with "clients": a non-empty list of {"train", "val", "test"} index lists '
            f"(see pflbench/data/interop.py); got {_kind(data)}"
        )
    if data.get("format", JSON_FORMAT_NAME) != JSON_FORMAT_NAME or data.get("version", 1) != JSON_FORMAT_VERSION:
        raise error(
            f"format {data.get('format')!r} version {data.get('version')!r} is not "
            f"{JSON_FORMAT_NAME!r} version {JSON_FORMAT_VERSION}"
        )
    splits = _splits_of(data["clients"], error)
    num_samples = data.get("num_samples")
    if num_samples is not None and (not isinstance(num_samples, int) or isinstance(num_samples, bool)):
        raise error(f'"num_samples" must be an integer, got {_kind(num_samples)}')
    counts = data.get("label_counts")
    if counts is not None:
        counts = np.asarray(counts)
        if counts.ndim != 2 or counts.shape[0] != splits.num_clients or not np.issubdtype(counts.dtype, np.integer):
            raise error(
                f'"label_counts" must be one list of integer counts per client '
                f"({splits.num_clients} clients), got shape {counts.shape}"
            )
    return PartitionFile(path, "json", splits, num_samples=num_samples, label_counts=counts)


def _splits_of(clients: list, error: Callable[[str], PartitionError]) -> ClientSplits:
    """Per-client train/val/test integer arrays from dicts of index sequences, checked for form."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for client, entry in enumerate(clients):
        if not isinstance(entry, dict) or not {"train", "test"} <= set(entry):
            raise error(
                f"client {client} must be a dict with 'train', 'test' (and optionally 'val') index lists, "
                f"got {_kind(entry)}"
            )
        for name in SPLITS:
            values = entry.get(name, [])
            try:
                array = np.asarray(values)
            except ValueError:
                array = np.asarray([None])
            if array.size == 0:
                array = np.zeros(0, dtype=np.int64)
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
                raise error(
                    f"client {client}'s {name!r} must be a flat list of integer sample indices, got {_kind(values)}"
                )
            if len(array) and array.min() < 0:
                raise error(f"client {client}'s {name} holds the negative index {int(array.min())}")
            parts[name].append(array.astype(np.int64))
        for name in ("train", "test"):
            if not len(parts[name][-1]):
                raise error(
                    f"client {client} has no {name} samples; every client needs a train and a test split "
                    f"(FL-bench's split 'user' files, with train-only and test-only clients, are not supported)"
                )
    splits = ClientSplits(**parts)
    _check_disjoint(splits, error)
    return splits


def _check_disjoint(splits: ClientSplits, error: Callable[[str], PartitionError]) -> None:
    """No sample index in two places (two clients, or two splits of one client)."""
    places = [(client, name) for client in range(splits.num_clients) for name in SPLITS]
    arrays = [getattr(splits, name)[client] for client, name in places]
    every = np.concatenate(arrays)
    owner = np.repeat(np.arange(len(arrays)), [len(a) for a in arrays])
    order = np.argsort(every, kind="stable")
    repeated = np.flatnonzero(every[order][1:] == every[order][:-1])
    if len(repeated):
        first, second = owner[order[repeated[0]]], owner[order[repeated[0] + 1]]
        (client_a, split_a), (client_b, split_b) = places[first], places[second]
        raise error(
            f"sample {int(every[order[repeated[0]]])} is in client {client_a}'s {split_a} and in client "
            f"{client_b}'s {split_b} ({len(repeated)} repeated indices in all); clients and their splits "
            f"must be disjoint"
        )


def write_partition(
    splits: ClientSplits, path: str | Path, fmt: str, *, labels: np.ndarray, num_classes: int, dataset: str = ""
) -> Path:
    """Write `splits` as a partition file (indices in increasing order per split); returns the path.

    `flbench` writes partition.pkl plus FL-bench's all_stats.json beside it (per-client sample and label
    counts), so that FL-bench can train on the split and pflbench checks labels when reading it back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clients = [
        {name: np.sort(getattr(splits, name)[client]) for name in SPLITS} for client in range(splits.num_clients)
    ]
    counts = splits.label_counts(labels, num_classes)
    if fmt == "flbench":
        everyone = list(range(splits.num_clients))
        partition = {
            "separation": {"train": everyone, "val": everyone, "test": everyone, "total": splits.num_clients},
            "data_indices": clients,
        }
        with open(path, "wb") as file:
            pickle.dump(partition, file)
        stats = {
            str(client): {
                "x": int(counts[client].sum()),
                "y": {str(label): int(n) for label, n in enumerate(counts[client]) if n},
            }
            for client in range(splits.num_clients)
        }
        path.with_name("all_stats.json").write_text(json.dumps(stats, indent=1))
    elif fmt == "json":
        document = {
            "format": JSON_FORMAT_NAME,
            "version": JSON_FORMAT_VERSION,
            "dataset": dataset,
            "num_samples": int(len(labels)),
            "num_classes": int(num_classes),
            "clients": [{name: part.tolist() for name, part in client.items()} for client in clients],
            "label_counts": counts.tolist(),
        }
        path.write_text(json.dumps(document, separators=(",", ":")))
    else:
        raise PartitionError(f"partition file format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    return path


def _kind(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    rows = min(len(a), len(b))
    for client in range(rows):
        if not np.array_equal(_row(a, client), _row(b, client)):
            return client
    return rows


def _row(counts: np.ndarray, client: int) -> list[int]:
    row = np.asarray(counts[client]) if client < len(counts) else np.zeros(0, dtype=np.int64)
    return np.trim_zeros(row.astype(np.int64), "b").tolist()
