"""`iid`: the shuffled dataset cut into equal shares (sizes differ by at most one); uses every sample."""
from __future__ import annotations

import numpy as np

from pflbench.partitioning import PARTITIONS, Partitioner


@PARTITIONS.register("iid")
class IID(Partitioner):
    scheme = "iid"

    def assign(self, labels, num_classes, num_clients, rng) -> list[np.ndarray]:
        return np.array_split(rng.permutation(len(labels)), num_clients)
