"""Normalisation statistics of a cell: the whole pool's (`normalization: pool`, the rule before issue 29)
against the trained clients' train splits' (`train`, the default), and the seconds the latter take.

    PFLBENCH_DATA_MIRROR=../shared/data .venv/bin/python benchmarks/isolation/normalization_stats.py

The cells are table1.yaml's quick FedAvg cells (pathological, 4 classes per client, 300 samples per
client, seed 0), 10 and 100 clients, on fmnist and cifar10-jpeg; the statistics do not depend on the
algorithm. Timed: the train statistics, beside the normalisation of the pool every cell already does
(the ratio is the figure to quote; the machine is shared). Also timed: the statistics of a 10-client cell over the whole pool (no samples_per_client),
the largest train split a cell can have.
"""
import time

import numpy as np

from pflbench.config import CellConfig
from pflbench.data.normalization import normalized_for_cell
from pflbench.simulator.rounds import prepare_cell
from pflbench.newcomers import seen_ids


def row(cell: CellConfig) -> str:
    dataset, splits = prepare_cell(cell)
    trained = seen_ids(cell.unseen_fraction, splits.num_clients, cell.seed)
    start = time.perf_counter()
    cell_stats = normalized_for_cell(dataset, cell.normalization, splits, trained)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    cell_stats.normalized()  # what every cell already did: the whole pool as float32, for comparison
    normalizing = time.perf_counter() - start
    count = sum(len(splits.train[c]) for c in trained)
    fmt = lambda values: "(" + ", ".join(f"{v:.4f}" for v in values) + ")"
    shift = np.abs(np.subtract(cell_stats.mean, dataset.mean)) / np.asarray(cell_stats.std)  # in train std units
    return (f"{cell.dataset:13s} {cell.clients:3d} clients {dict(cell.partition_params)}: train splits {count} of "
            f"{len(dataset)} samples; mean pool {fmt(dataset.mean)} train {fmt(cell_stats.mean)}; std pool "
            f"{fmt(dataset.std)} train {fmt(cell_stats.std)}; |mean difference| / train std up to "
            f"{shift.max():.3f}, std ratio train/pool {fmt(np.divide(cell_stats.std, dataset.std))}; {seconds:.3f} s "
            f"({seconds / normalizing:.2f}x the pool's normalisation, {normalizing:.3f} s)")


if __name__ == "__main__":
    for dataset, lr in (("fmnist", 0.05), ("cifar10-jpeg", 0.1)):
        for clients, participation in ((10, 1.0), (100, 0.1)):
            print(row(CellConfig(algorithm="fedavg", dataset=dataset, partition="pathological",
                                 partition_params={"classes_per_client": 4, "samples_per_client": 300},
                                 clients=clients, participation=participation, lr=lr, seed=0)))
        print(row(CellConfig(algorithm="fedavg", dataset=dataset, partition="pathological",
                             partition_params={"classes_per_client": 4}, clients=10, seed=0)))
