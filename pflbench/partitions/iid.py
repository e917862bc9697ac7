"""`iid`: the shuffled dataset cut into equal shares (sizes differ by at most one); uses every sample."""

from __future__ import annotations

import numpy as np

from pflbench.data.partitioning import PARTITIONS, Partitioner


@PARTITIONS.register("iid")
class IID(Partitioner):
    scheme = "iid"

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        return np.array_split(rng.permutation(len(labels)), num_clients)
