"""Results stores written directly (no training) for the report tests.

`write_cell` writes a cell the way the engine does: config.json, metrics.parquet (one row per eval
round x client), rounds.parquet and summary.json with every protocol's key (see
pflbench/reports/protocols.py). `adapted=` gives the clients' accuracies after local adaptation (the
cell then has finetune_epochs > 0 and the `_adapted` keys); `legacy=True` writes a store as it was
before local adaptation and protocols existed: no `*_adapted`, `test_samples`, `val_samples` columns,
no `bestval_*`, `*_pooled`, `*_adapted` keys, no `finetune_epochs` in config.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pflbench.config import CellConfig
from pflbench.simulator.rounds import CellResult
from pflbench.storage.store import Store


def worst10(values) -> float:
    values = np.sort(np.asarray(values, dtype=float))
    return float(values[: max(1, int(np.ceil(0.1 * len(values))))].mean())


def cell_result(
    status="finished",
    accuracies=(0.5, 0.5),
    rounds=3,
    artifacts=None,
    bytes_per_round=1_000_000,
    error=None,
    adapted=None,
    legacy=False,
    test_samples=None,
    summary=None,
) -> CellResult:
    """Client accuracies at the last round are `accuracies` (after adaptation: `adapted`); earlier
    rounds climb towards them, so the best validation round is the last. `test_samples` per client
    (default 30 each) weight the pooled numbers; `summary` overrides summary keys."""
    n = len(accuracies)
    test = list(test_samples or [30] * n)
    rows = []
    for rnd in range(1, rounds + 1):
        for client, acc in enumerate(accuracies):
            row = {
                "round": rnd,
                "client": client,
                "accuracy": acc * rnd / rounds,
                "loss": 1.0 / rnd,
                "val_accuracy": acc * rnd / rounds,
                "val_loss": 1.0,
                "bytes_down": 0,
                "bytes_up": 0,
                "wall_time": 0.1 * rnd,
            }
            if not legacy:
                a = adapted[client] * rnd / rounds if adapted is not None else np.nan
                row.update(
                    accuracy_adapted=a,
                    loss_adapted=np.nan if adapted is None else 0.5,
                    val_accuracy_adapted=a,
                    val_loss_adapted=np.nan if adapted is None else 0.5,
                    test_samples=test[client],
                    val_samples=10,
                )
            rows.append(row)
    metrics = pd.DataFrame(rows) if status == "finished" else pd.DataFrame(rows[:n])
    per_round = pd.DataFrame(
        {
            "round": range(1, rounds + 1),
            "clients": n,
            "bytes_down": bytes_per_round // 2,
            "bytes_up": bytes_per_round // 2,
            "wall_time": 0.1,
        }
    )
    if not legacy:
        per_round["adapt_time"] = 0.05 if adapted is not None else 0.0
    last = np.asarray(accuracies, dtype=float)
    result = {
        "status": status,
        "model": "mlp",
        "torch": "x",
        "dataset_checksum": "sha256:0",
        "rounds_completed": rounds,
        "bytes_down_total": bytes_per_round // 2 * rounds,
        "bytes_up_total": bytes_per_round // 2 * rounds,
        "wall_time": 1.0,
    }
    if status == "finished":
        result.update(
            final_accuracy=float(last.mean()), best_accuracy=float(last.mean()), final_worst10_accuracy=worst10(last)
        )
        if not legacy:
            pooled = float(np.average(last, weights=test))
            result.update(
                best_round=rounds,
                final_accuracy_pooled=pooled,
                bestval_accuracy=float(last.mean()),
                bestval_round=rounds,
                bestval_worst10_accuracy=worst10(last),
                bestval_accuracy_pooled=pooled,
            )
            if adapted is not None:
                ad = np.asarray(adapted, dtype=float)
                pooled = float(np.average(ad, weights=test))
                result.update(
                    final_accuracy_adapted=float(ad.mean()),
                    final_worst10_accuracy_adapted=worst10(ad),
                    final_accuracy_adapted_pooled=pooled,
                    bestval_accuracy_adapted=float(ad.mean()),
                    bestval_round_adapted=rounds,
                    bestval_worst10_accuracy_adapted=worst10(ad),
                    bestval_accuracy_adapted_pooled=pooled,
                    adapt_time_total=0.05 * rounds,
                )
    result.update(summary or {})
    return CellResult(status, metrics, per_round, result, artifacts or {}, error)


def write_cell(
    root: Path,
    *,
    algorithm="fedavg",
    dataset="fmnist",
    partition="pathological",
    clients=10,
    seed=0,
    hp=None,
    hp_source=None,
    local_epochs=1,
    lr=0.01,
    participation=1.0,
    samples_per_client=None,
    finetune_epochs=None,
    partition_params=None,
    config=None,
    **result_kwargs,
) -> str:
    """Write one cell (finetune_epochs defaults to 1 when `adapted` is given, else 0); `config` sets
    any other CellConfig field (val_fraction, batch_size, ...)."""
    params = dict(partition_params or {})
    if samples_per_client is not None:
        params["samples_per_client"] = samples_per_client
    if finetune_epochs is None:
        finetune_epochs = 1 if result_kwargs.get("adapted") is not None else 0
    cell = CellConfig(
        algorithm=algorithm,
        dataset=dataset,
        partition=partition,
        clients=clients,
        seed=seed,
        hp=hp or {},
        rounds=result_kwargs.get("rounds", 3),
        local_epochs=local_epochs,
        lr=lr,
        participation=participation,
        partition_params=params,
        hp_source=hp_source or "default",
        finetune_epochs=finetune_epochs,
        **(config or {}),
    )
    folder = Store(root).write(cell, cell_result(**result_kwargs))
    return folder.name


def dirichlet_alpha(clients: int, layers: int, seed: int = 0) -> np.ndarray:
    """A random α [clients, layers, clients] whose rows sum to one, as pFedLA stores it."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(clients), size=(clients, layers)).astype(np.float32)
