"""Which clients are newcomers: drawn once from the cell's seed (stream "newcomers"), the same for
every algorithm, never from the training generators (pflbench.newcomers)."""

from __future__ import annotations

import numpy as np

from pflbench import streams


def newcomer_count(unseen_fraction: float, clients: int) -> int:
    return int(round(unseen_fraction * clients))


def newcomer_ids(unseen_fraction: float, clients: int, seed: int) -> np.ndarray:
    """Partition ids of the newcomers, sorted: drawn from the seed alone."""
    count = newcomer_count(unseen_fraction, clients)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    rng = streams.generator(seed, "newcomers", kind="numpy")
    return np.sort(rng.choice(clients, count, replace=False)).astype(np.int64)


def seen_ids(unseen_fraction: float, clients: int, seed: int) -> np.ndarray:
    held = set(newcomer_ids(unseen_fraction, clients, seed).tolist())
    return np.array([c for c in range(clients) if c not in held], dtype=np.int64)
