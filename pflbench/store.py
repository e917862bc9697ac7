"""The results store: one directory per cell, named by the cell's hash.

    results/<hash>/config.json       resolved configuration + versions (pflbench, torch, python, dataset checksum)
                  metrics.parquet    per eval round and client: accuracy, loss, val_*, bytes, wall time
                  rounds.parquet     per round: clients, bytes down/up, wall time
                  artifacts/arrays.npz   e.g. aggregation weights, one array per name and round
                  error.txt          the traceback (failed) or the reason (diverged)
                  summary.json       status, final/best/worst-10% accuracy, communication, wall time

Every file is written atomically (temporary file in the same folder, then os.replace), and
summary.json is written last and removed first: a cell has a result exactly when its summary exists,
so a kill at any moment leaves a readable store in which an interrupted cell simply has no result.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from pflbench.config import CellConfig, cell_hash

CONFIG, SUMMARY, ERROR = "config.json", "summary.json", "error.txt"
METRICS, ROUNDS = "metrics.parquet", "rounds.parquet"
ARTIFACTS = Path("artifacts") / "arrays.npz"
# Outcomes that are results of the configuration itself (divergence is deterministic given the seed),
# so resuming skips them; "failed" (a crash, a lost worker) is retried.
COMPLETE = ("finished", "diverged")


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` then rename over `path`: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"))


class Store:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cell_dir(self, cell: CellConfig) -> Path:
        return self.root / cell_hash(cell)

    def status(self, cell: CellConfig) -> str | None:
        """The recorded outcome ("finished", "diverged", "failed"), or None if the cell has no result."""
        return self.summary(cell).get("status")

    def summary(self, cell: CellConfig) -> dict:
        """The recorded summary, {} if none."""
        try:
            return json.loads((self.cell_dir(cell) / SUMMARY).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def write(self, cell: CellConfig, result) -> Path:
        """Record a `CellResult` (status finished, diverged or failed); replaces an earlier result."""
        folder = self.cell_dir(cell)
        (folder / SUMMARY).unlink(missing_ok=True)  # from here until the new summary: no result
        for stale in (ERROR, METRICS, ROUNDS, *(p.name for p in folder.glob(".*.tmp"))):  # tmp: left by a kill
            (folder / stale).unlink(missing_ok=True)
        shutil.rmtree(folder / ARTIFACTS.parent, ignore_errors=True)
        summary = dict(result.summary, status=result.status, hash=cell_hash(cell),
                       completed_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        if result.error:
            summary["error"] = result.error.strip().splitlines()[-1]
        write_json(folder / CONFIG, {
            "hash": cell_hash(cell),
            "cell": cell.model_dump(mode="json"),
            "versions": {"pflbench": version("pflbench"), "torch": result.summary.get("torch", version("torch")),
                         "python": platform.python_version()},
            "dataset_checksum": result.summary.get("dataset_checksum"),
        })
        if result.error:
            atomic_write(folder / ERROR, lambda tmp: tmp.write_text(result.error))
        atomic_write(folder / METRICS, lambda tmp: result.metrics.to_parquet(tmp, index=False))
        atomic_write(folder / ROUNDS, lambda tmp: result.rounds.to_parquet(tmp, index=False))
        if result.artifacts:
            atomic_write(folder / ARTIFACTS, lambda tmp: _save_npz(tmp, result.artifacts))
        write_json(folder / SUMMARY, summary)  # last: the cell now has a result
        return folder


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as file:  # a file object: np.savez would append ".npz" to a path
        np.savez_compressed(file, **arrays)


def flatten(data: dict, prefix: str = "") -> dict:
    """{"hp": {"mu": 1}} -> {"hp.mu": 1}"""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def load_store(results_dir: str | Path) -> pd.DataFrame:
    """One row per cell with a result: `hash`, the configuration's columns flattened
    (`algorithm`, ..., `partition_params.alpha`, `hp.mu`), the summary's columns (`status`,
    `final_accuracy`, ...; a summary key that is also a config key, like `model`, becomes
    `resolved_model`), `pflbench` (version) and `path`. Cells without a summary (running or killed)
    are not included."""
    rows = []
    for summary_path in sorted(Path(results_dir).glob(f"*/{SUMMARY}")):
        folder = summary_path.parent
        try:
            summary = json.loads(summary_path.read_text())
            config = json.loads((folder / CONFIG).read_text())
        except FileNotFoundError:
            continue  # removed by a concurrent rerun of this cell
        row = {"hash": folder.name, **flatten(config["cell"])}
        for key, value in summary.items():
            row[f"resolved_{key}" if key in config["cell"] else key] = value
        row.update(pflbench=config["versions"]["pflbench"], path=str(folder))
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=["hash", "status"])
    return pd.DataFrame(rows)
