"""Results stores written directly (no training) for the report tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pflbench.config import CellConfig
from pflbench.federation import CellResult
from pflbench.store import Store


def cell_result(status="finished", accuracies=(0.5, 0.5), rounds=3, artifacts=None, bytes_per_round=1_000_000,
                error=None) -> CellResult:
    """Client accuracies at the last round are `accuracies`; earlier rounds climb towards them."""
    rows = []
    for rnd in range(1, rounds + 1):
        for client, acc in enumerate(accuracies):
            rows.append({"round": rnd, "client": client, "accuracy": acc * rnd / rounds, "loss": 1.0 / rnd,
                         "val_accuracy": acc * rnd / rounds, "val_loss": 1.0, "bytes_down": 0, "bytes_up": 0,
                         "wall_time": 0.1 * rnd})
    metrics = pd.DataFrame(rows) if status == "finished" else pd.DataFrame(rows[:len(accuracies)])
    per_round = pd.DataFrame({"round": range(1, rounds + 1), "clients": len(accuracies),
                              "bytes_down": bytes_per_round // 2, "bytes_up": bytes_per_round // 2, "wall_time": 0.1})
    last = np.asarray(accuracies, dtype=float)
    summary = {"status": status, "model": "mlp", "torch": "x", "dataset_checksum": "sha256:0",
               "rounds_completed": rounds, "bytes_down_total": bytes_per_round // 2 * rounds,
               "bytes_up_total": bytes_per_round // 2 * rounds, "wall_time": 1.0}
    if status == "finished":
        summary.update(final_accuracy=float(last.mean()), best_accuracy=float(last.mean()),
                       final_worst10_accuracy=float(np.sort(last)[:max(1, int(np.ceil(0.1 * len(last))))].mean()))
    return CellResult(status, metrics, per_round, summary, artifacts or {}, error)


def write_cell(root: Path, *, algorithm="fedavg", dataset="fmnist", partition="pathological", clients=10, seed=0,
               hp=None, hp_source=None, **result_kwargs) -> str:
    """Write one cell; `hp_source` is added to config.json the way a store with that field has it."""
    cell = CellConfig(algorithm=algorithm, dataset=dataset, partition=partition, clients=clients, seed=seed,
                      hp=hp or {}, rounds=result_kwargs.get("rounds", 3))
    folder = Store(root).write(cell, cell_result(**result_kwargs))
    if hp_source is not None:
        config = json.loads((folder / "config.json").read_text())
        config["cell"]["hp_source"] = hp_source
        (folder / "config.json").write_text(json.dumps(config))
    return folder.name


def dirichlet_alpha(clients: int, layers: int, seed: int = 0) -> np.ndarray:
    """A random α [clients, layers, clients] whose rows sum to one, as pFedLA stores it."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(clients), size=(clients, layers)).astype(np.float32)
