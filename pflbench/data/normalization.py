"""Which samples a cell's normalisation statistics (per-channel mean and std) come from.

The cell field `normalization`:
- `train` (the default): the trained clients' train splits only. No validation or
  test sample of any client and no sample of a newcomer (`unseen_fraction`) enters the statistics,
  so nothing a model is selected or scored on, and nothing of a client held out of training, shapes
  the inputs training sees. (Validation splits are left out too: they select rounds and tune.)
- `pool`: the whole pooled dataset, torchvision's train and test sets together, every client's
  every split and the newcomers' included: the rule before `train` became the default, kept so that
  results stored before stay readable under their ids, and for comparison.

What this does to the rest:
- A cell's normalisation depends on its partition: the dataset, the scheme and its parameters, the
  number of clients, the seed, `train_fraction`, `val_fraction` and `unseen_fraction`. All of them are
  fields of the cell, so the cell id still names exactly one computation; every algorithm of a matrix
  sees the same statistics on the same split, as it sees the same split.
- Cell ids: `normalization` is part of the hash except at `pool` (config.OPTIONAL_AT_DEFAULT), so every
  cell at the default `train` has a new id and is run again, while a store written before reads its
  cells as `pool` cells under their old ids (`CellConfig.stored`): old and new numbers never mix.
- The dataset cache (`<root>/cache/<key>.pt`) is unchanged: it holds the decoded pool and the pool's
  statistics (used by `pool`). The `train` statistics are computed when a cell builds its Federation,
  from per-channel histograms of the uint8 pixels (exact), so nothing per partition is cached: it
  takes 0.03-0.43x the time the cell already spends converting the pool to normalised floats
  (measured side by side, benchmarks/isolation/normalization_stats.py, load 16 on 2 cores).
- How much it moves the statistics (that script, table1's quick cells, 10 clients): fmnist mean
  0.2862 -> 0.2896, std 0.3529 -> 0.3549; cifar10-jpeg mean (0.4917, 0.4826, 0.4472) -> (0.4922,
  0.4826, 0.4478), std (0.2452, 0.2427, 0.2606) -> (0.2460, 0.2440, 0.2615): at most 0.010 of a
  standard deviation. Small, but every float of every cell moves, so every result does too: FedAvg on
  the fmnist cell (20 rounds, cell ids cd7aae08b4e8 as `pool`, ee2b8705b4c1 as `train`) ends at the
  same 68.56% as delivered, 83.00% -> 82.89% after local adaptation.
- Feature shift (pflbench.simulator.shifts) works in normalised units with the same statistics.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

from pflbench.data.dataset import Dataset, statistics

if TYPE_CHECKING:
    from pflbench.data.partitioning import ClientSplits

NORMALIZATIONS = ("train", "pool")


def trained_train_indices(splits: ClientSplits, trained: np.ndarray) -> torch.Tensor:
    """Sample ids of the train splits of clients `trained` (partition ids), concatenated."""
    parts = [np.asarray(splits.train[int(c)], dtype=np.int64) for c in trained]
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))


def normalized_for_cell(dataset: Dataset, how: str, splits: ClientSplits, trained: np.ndarray) -> Dataset:
    """`dataset` with the mean/std a cell normalises with (see the module doc): `how` is the cell's
    `normalization`, `trained` the partition ids of the clients that train (the newcomers left out).
    A copy for `train` (the cached Dataset keeps the pool's statistics); `dataset` itself for `pool`."""
    if how not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {how!r}")
    if how == "pool":
        return dataset
    indices = trained_train_indices(splits, trained)
    if not len(indices):
        raise ValueError(
            "normalization 'train' needs at least one train sample among the trained clients; "
            "this partition gives them none (use more samples per client, or normalization: pool)"
        )
    mean, std = statistics(dataset.inputs, indices)
    return dataclasses.replace(dataset, mean=mean, std=std)
