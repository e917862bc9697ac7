"""The decoded-tensor cache: `<root>/cache/<key>.pt`, so a dataset's files are decoded once per root.

A cache file is trusted as is (the source files may be gone); delete it to force a re-decode.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import torch

from pflbench.data.dataset import Dataset
from pflbench.data.files import staged

log = logging.getLogger(__name__)

# Bump when the payload or the decoding changes meaning; older cache files are then rebuilt.
CACHE_FORMAT = 1


def cache_path(root: Path, key: str) -> Path:
    return root / "cache" / f"{key}.pt"


def write_cache(path: Path, dataset: Dataset) -> None:
    """Store `dataset` atomically (temporary file, then rename)."""
    payload = {
        "format": CACHE_FORMAT,
        "name": dataset.name,
        # contiguous(): torch.save writes a view's whole storage, never just the view.
        "inputs": dataset.inputs.contiguous(),
        "labels": dataset.labels.contiguous(),
        "source_split": dataset.source_split.contiguous(),
        "num_classes": dataset.num_classes,
        "mean": list(dataset.mean),
        "std": list(dataset.std),
        "checksum": dataset.checksum,
        "classes": dataset.classes,
    }
    with staged(path) as tmp:
        torch.save(payload, tmp)


def read_cache(path: Path) -> Dataset | None:
    """The cached dataset, or None when there is no usable cache file at `path`."""
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
        log.warning("ignoring unreadable cache file %s (%s); decoding again", path, error)
        return None
    if payload.get("format") != CACHE_FORMAT:
        return None
    return Dataset(
        name=payload["name"],
        inputs=payload["inputs"],
        labels=payload["labels"],
        num_classes=payload["num_classes"],
        mean=tuple(payload["mean"]),
        std=tuple(payload["std"]),
        source_split=payload["source_split"],
        checksum=payload["checksum"],
        classes=payload["classes"],
    )
