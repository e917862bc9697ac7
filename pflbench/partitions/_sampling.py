"""Steps shared by the built-in schemes: a balanced choice of classes per client, even integer
splits, and drawing a per-client, per-class count matrix from the data."""

from __future__ import annotations

import numpy as np


def balanced_class_choice(num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """[num_clients, per_client] distinct classes per client; every class is chosen by either
    floor or ceil of num_clients * per_client / num_classes clients.

    Each client in turn takes the classes chosen least often so far, ties broken at random. Taking
    the least used keeps the usage counts within one of each other after every client, and the
    random ties keep the class sets random rather than a fixed rotation.
    """
    used = np.zeros(num_classes, dtype=np.int64)
    choice = np.empty((num_clients, per_client), dtype=np.int64)
    for client in range(num_clients):
        # The random fraction in [0, 1) only reorders classes with equal usage counts.
        choice[client] = np.argsort(used + rng.random(num_classes))[:per_client]
        used[choice[client]] += 1
    return choice


def even_split(total: int, parts: int) -> np.ndarray:
    """`parts` integers summing to `total` that differ by at most one (the larger ones first)."""
    return total // parts + (np.arange(parts) < total % parts)


def most_clients_per_class(num_clients: int, num_classes: int, per_client: int) -> int:
    """The largest number of clients that `balanced_class_choice` gives any one class."""
    return -(-num_clients * per_client // num_classes)


def draw(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Client i gets counts[i, c] samples of class c, drawn at random without replacement.

    The caller guarantees that no class is asked for more samples than it has; samples not asked
    for stay unused.
    """
    num_clients, num_classes = counts.shape
    shuffled = rng.permutation(len(labels))
    by_class = shuffled[np.argsort(labels[shuffled], kind="stable")]  # grouped by class, random order inside
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=num_classes))])
    owners, picked = [], []
    for cls in range(num_classes):
        wanted = counts[:, cls]
        picked.append(by_class[starts[cls] : starts[cls] + wanted.sum()])
        owners.append(np.repeat(np.arange(num_clients), wanted))
    order = np.argsort(np.concatenate(owners), kind="stable")
    return np.split(np.concatenate(picked)[order], np.cumsum(counts.sum(axis=1))[:-1])
