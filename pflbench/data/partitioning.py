"""Non-IID partitions: which samples each client holds, and each client's train/val/test splits.

A scheme (`pflbench/partitions/<scheme>.py`, registered in `PARTITIONS`) only decides which sample indices each
client gets (`Partitioner.assign`). Everything shared lives here: parameter validation, the per-client
stratified train/val/test split, the on-disk cache that makes every algorithm of a matrix see
identical splits, and the label-count table and plot used to inspect a partition.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from pflbench import streams
from pflbench.registry import NAME, Registry, echo

# `scheme`, `display_name` and `paper` are each scheme class's own (`register` fills in what it leaves out).
PARTITIONS: Registry[type[Partitioner]] = Registry(
    "partition scheme", own_attributes={"scheme": NAME, "display_name": NAME, "paper": ""}
)

SPLITS = ("train", "val", "test")

# Bump when a change to the splitting code changes the splits a given request produces, so that old
# cache files are no longer picked up.
SPLITS_FORMAT_VERSION = 1


class PartitionError(ValueError):
    """An impossible or invalid partition request (names the scheme, parameter, value and what is allowed)."""


class SchemeParams(BaseModel):
    """Base of every scheme's `Params`: unknown names are errors and values cannot change later."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Partitioner(ABC):
    """One partition scheme: validated parameters plus `assign`, which gives each client its samples."""

    scheme: ClassVar[str]  # the registered name, used in error messages
    Params: ClassVar[type[SchemeParams]] = SchemeParams

    def __init__(self, **params: Any) -> None:
        try:
            self.params = self.Params(**params)
        except ValidationError as exc:
            raise PartitionError(self._describe(exc)) from None

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        """Raise PartitionError, before any work, if the request cannot be met.

        Schemes extend this with their own conditions (call super() first).
        """
        total = int(class_counts.sum())
        if num_clients < 1:
            raise self.error("num_clients", num_clients, "allowed: at least 1")
        if total < 2 * num_clients:
            raise self.error(
                "num_clients",
                num_clients,
                f"every client needs at least 2 samples (one train, one test) and the dataset has "
                f"{total}; allowed: at most {total // 2}",
            )

    @abstractmethod
    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Sample indices held by each client (disjoint; a scheme may leave samples unused)."""

    def resolved(self, base_dir: str | Path | None = None) -> Partitioner:
        """This scheme with parameters that pin down everything it reads, for a cell's identity (an
        imported file: its absolute path, `base_dir` resolving a relative one, and its content hash).
        Schemes that read nothing return themselves."""
        return self

    def given_splits(self, labels: np.ndarray, num_classes: int, num_clients: int) -> ClientSplits | None:
        """Each client's train/val/test when the scheme brings them (an imported file); None (the default):
        `make_splits` splits the clients `assign` gives, stratified by class."""
        return None

    def error(self, param: str, value: Any, reason: str) -> PartitionError:
        return _request_error(self.scheme, param, value, reason)

    def check_recorded(self, param: str, now: str, changed: str, remedy: str) -> None:
        """Refuse a cell whose `param`, recorded when its spec was resolved, is no longer what is read
        now (`now`): `changed` says what changed, `remedy` how to get it back."""
        recorded = getattr(self.params, param)
        if recorded is not None and recorded != now:
            raise self.error(param, recorded, f"{changed}; {remedy} or resolve the spec again (a new cell)")

    def _describe(self, exc: ValidationError) -> str:
        fields = self.Params.model_fields
        allowed = ", ".join(f"{name} (default {field.default!r})" for name, field in fields.items()) or "none"
        problems = []
        for err in exc.errors():
            name = ".".join(str(part) for part in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown parameter {echo(name)}; allowed parameters: {allowed}")
            else:
                problems.append(f"{name}={echo(err['input'])} is not allowed: {err['msg']}")
        return f"partition scheme {self.scheme!r}: " + "; ".join(problems)


@dataclass
class ClientSplits:
    """Per-client int64 sample indices. `val` is carved from the client's train data, so the three are disjoint."""

    train: list[np.ndarray]
    val: list[np.ndarray]
    test: list[np.ndarray]

    def __post_init__(self) -> None:
        if not len(self.train) == len(self.val) == len(self.test):
            raise ValueError("train, val and test must list the same number of clients")
        for name in SPLITS:
            setattr(self, name, [np.asarray(part, dtype=np.int64) for part in getattr(self, name)])

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def label_counts(self, labels: np.ndarray, num_classes: int, split: str = "all") -> np.ndarray:
        """[clients, classes] sample counts of one split, or of all three together."""
        if split != "all" and split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: all, {', '.join(SPLITS)}")
        labels = np.asarray(labels)
        counts = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for name in SPLITS if split == "all" else (split,):
            for client, indices in enumerate(getattr(self, name)):
                counts[client] += np.bincount(labels[indices], minlength=num_classes)
        return counts

    def save(self, path: str | Path) -> None:
        """Write an .npz (each split as one flat array plus client offsets), atomically."""
        arrays: dict[str, Any] = {}  # (Any: numpy's stubs take **arrays for its own keywords)
        for name in SPLITS:
            parts = getattr(self, name)
            arrays[name] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            arrays[f"{name}_offsets"] = np.cumsum([0] + [len(part) for part in parts])
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file in the same folder and os.replace: concurrent runs never see a half-written file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                np.savez(file, **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> ClientSplits:
        with np.load(path, allow_pickle=False) as data:
            return cls(**{name: np.split(data[name], data[f"{name}_offsets"][1:-1]) for name in SPLITS})


def make_partitioner(scheme: str, params: dict) -> Partitioner:
    """The registered scheme with validated params (unknown scheme: the registry's UnknownNameError)."""
    return PARTITIONS.get(scheme)(**params)  # the registry loads the built-in schemes and plugins first


def make_splits(
    labels: np.ndarray,
    num_classes: int,
    *,
    scheme: str,
    params: dict,
    num_clients: int,
    seed: int,
    train_fraction: float = 0.7,
    val_fraction: float = 0.1,
    cache_dir: Path | None = None,
    dataset_key: str = "",
) -> ClientSplits:
    """Partition `labels` over clients and split each client into train/val/test.

    Per client, `train_fraction` of each class goes to train and the rest to test (pFedLA: 70/30, same
    label distribution); then `val_fraction` of the client's train split, again per class, becomes val
    (at least one sample when val_fraction > 0 and the client has two or more train samples).
    Deterministic in its arguments; with `cache_dir` the result is stored as <cache_dir>/<hash>.npz and
    reused, so every algorithm of an experiment sees identical splits.
    """
    partitioner = make_partitioner(scheme, params).resolved()
    labels = _checked_labels(labels, num_classes)
    _check_fractions(scheme, train_fraction, val_fraction)
    cache_path = None
    if cache_dir is not None:
        key = _cache_key(labels, num_classes, partitioner, num_clients, seed, train_fraction, val_fraction, dataset_key)
        cache_path = Path(cache_dir) / f"{key}.npz"
        if cache_path.exists():
            return ClientSplits.load(cache_path)

    partitioner.check(num_clients, num_classes, np.bincount(labels, minlength=num_classes))
    # Separate streams: changing the split fractions does not change which samples each client holds.
    assign_rng, split_rng = (
        streams.generator(seed, name, kind="numpy") for name in ("partition.assign", "partition.split")
    )
    given = partitioner.given_splits(labels, num_classes, num_clients)
    train, val, test = [], [], []
    if given is not None:  # the scheme's own train/test; val carved from train where the scheme gives none
        for client_train, client_val, client_test in zip(given.train, given.val, given.test):
            if not len(client_val):
                client_val, client_train = _carve_val(client_train, labels, val_fraction, split_rng)
            train.append(client_train)
            val.append(client_val)
            test.append(client_test)
    else:
        clients = partitioner.assign(labels, num_classes, num_clients, assign_rng)
        _check_assignment(partitioner, clients, num_clients, len(labels))
        for indices in clients:
            client_train, client_test = _stratified_split(indices, labels, train_fraction, 1, 1, split_rng)
            client_val, client_train = _carve_val(client_train, labels, val_fraction, split_rng)
            train.append(client_train)
            val.append(client_val)
            test.append(client_test)
    splits = ClientSplits(train, val, test)
    if cache_path is not None:
        splits.save(cache_path)
    return splits


def _checked_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(
            f"labels must lie in 0..{num_classes - 1} (num_classes={num_classes}), got {labels.min()}..{labels.max()}"
        )
    return labels.astype(np.int64, copy=False)


def _check_fractions(scheme: str, train_fraction: float, val_fraction: float) -> None:
    if not 0 < train_fraction < 1:
        raise _request_error(scheme, "train_fraction", train_fraction, "allowed: 0 < train_fraction < 1")
    if not 0 <= val_fraction < 1:
        raise _request_error(scheme, "val_fraction", val_fraction, "allowed: 0 <= val_fraction < 1")


def _request_error(scheme: str, param: str, value: Any, reason: str) -> PartitionError:
    return PartitionError(f"partition scheme {scheme!r}: {param}={echo(value)} is not possible: {reason}")


def _cache_key(
    labels: np.ndarray,
    num_classes: int,
    partitioner: Partitioner,
    num_clients: int,
    seed: int,
    train_fraction: float,
    val_fraction: float,
    dataset_key: str,
) -> str:
    request = {
        "version": SPLITS_FORMAT_VERSION,
        "dataset_key": dataset_key,
        # The labels' digest keeps two datasets apart even when the caller passes no dataset_key.
        "labels": hashlib.sha256(labels.tobytes()).hexdigest(),
        "num_classes": num_classes,
        "scheme": partitioner.scheme,
        # Validated params with defaults filled in: {} and the explicit defaults are the same partition.
        "params": partitioner.params.model_dump(mode="json"),
        "num_clients": int(num_clients),
        "seed": int(seed),
        "train_fraction": float(train_fraction),
        "val_fraction": float(val_fraction),
    }
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]


def _check_assignment(partitioner: Partitioner, clients: list[np.ndarray], num_clients: int, num_samples: int) -> None:
    """Guard the cache against a faulty scheme: a bad partition would silently spoil every result built on it."""
    if len(clients) != num_clients:
        raise RuntimeError(f"scheme {partitioner.scheme!r} returned {len(clients)} clients, expected {num_clients}")
    used = np.bincount(np.concatenate(clients).astype(np.int64), minlength=num_samples)
    if len(used) > num_samples or used.max(initial=0) > 1:
        raise RuntimeError(f"scheme {partitioner.scheme!r} returned out-of-range or overlapping indices")
    smallest = min(len(indices) for indices in clients)
    if smallest < 2:
        raise partitioner.error(
            "num_clients", num_clients, f"a client got {smallest} samples; every client needs a train and a test sample"
        )


def _carve_val(
    train: np.ndarray, labels: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(val, train): `val_fraction` of a client's train split, stratified, at least one sample when
    val_fraction > 0 and the client has two or more."""
    min_val = 1 if val_fraction > 0 and len(train) >= 2 else 0
    return _stratified_split(train, labels, val_fraction, min_val, 1, rng)


def _stratified_split(
    indices: np.ndarray, labels: np.ndarray, fraction: float, min_first: int, min_second: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's indices in two, putting `fraction` of every class into the first part.

    The first part's size is round(fraction * n), kept within [min_first, n - min_second]; it is shared
    among classes by largest remainder, so each class is within rounding of `fraction`.
    """
    n = len(indices)
    # Shuffle, then a stable sort by class: grouped by class, in random order inside each class.
    indices = indices[rng.permutation(n)]
    indices = indices[np.argsort(labels[indices], kind="stable")]
    class_sizes = np.bincount(labels[indices])
    size = min(max(math.floor(fraction * n + 0.5), min_first), n - min_second)
    per_class = _apportion(size, class_sizes, rng)
    rank_in_class = np.arange(n) - np.repeat(np.cumsum(class_sizes) - class_sizes, class_sizes)
    first = rank_in_class < np.repeat(per_class, class_sizes)
    return np.sort(indices[first]), np.sort(indices[~first])


def _apportion(total: int, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Integers summing to `total`, each within 1 of total*w/sum(w) (largest remainder; ties at random)."""
    weights = np.asarray(weights, dtype=np.int64)
    exact = total * weights  # integer arithmetic: no float rounding at exact shares such as 0.7 * 10
    parts, remainders = np.divmod(exact, weights.sum())
    short = total - int(parts.sum())
    parts[np.lexsort((rng.random(len(weights)), -remainders))[:short]] += 1
    return parts


def format_label_counts(counts: np.ndarray, class_names: Sequence[str] | None = None) -> str:
    """A plain-text table: one row per client, one column per class (zeros shown as '.'), with totals.

    Plain text rather than a rich table, so it reads the same in a terminal, a log file and a report
    however many classes there are.
    """
    counts = np.asarray(counts)
    names = [str(name) for name in (class_names if class_names is not None else range(counts.shape[1]))]
    if len(names) != counts.shape[1]:
        raise ValueError(f"{len(names)} class names for {counts.shape[1]} classes")

    def row(label: str, values: Sequence[Any] | np.ndarray) -> list[str]:
        return [label, *(str(v) if v else "." for v in values), str(int(np.sum(values)))]

    header = ["client", *names, "total"]
    body = [row(str(client), values) for client, values in enumerate(counts)]
    footer = row("total", counts.sum(axis=0))
    widths = [max(len(cells[col]) for cells in [header, *body, footer]) for col in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, body), rule, line(footer)])
