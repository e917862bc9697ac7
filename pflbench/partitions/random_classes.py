"""`random-classes`: pFedLA's non-IID_1 read literally: each client draws its `classes_per_client`
classes uniformly at random, independently of the other clients, and holds the same number of
samples of each.

`pathological` draws the classes too, but balanced (every class held by about as many clients), and
so spreads the clients apart: with FashionMNIST, 10 clients and 4 classes each, no two clients of
seed 0 share more than 2 classes. Drawn independently, a pair shares 3 or 4 of its 4 classes with
probability 25/210 (about 5 of the 45 pairs): the "similar" and "same classes" clients of pFedLA's
Figure 5 exist. Whether the paper's split was balanced or not it does not say; this scheme is the
other reading, for controls (benchmarks/table1-split-controls.yaml).

Amounts as in `pathological`, but sized for the worst case of an independent draw: any class may be
drawn by every client, so the default amount per (client, class) is min_c n_c // num_clients and
`samples_per_client` may be at most k times that. Every request that passes `check` can be met
whatever the draw; samples no client drew stay unused.
"""

from __future__ import annotations

import numpy as np

from pflbench.data.partitioning import PARTITIONS
from pflbench.partitions.pathological import Pathological


@PARTITIONS.register("random-classes")
class RandomClasses(Pathological):
    scheme = "random-classes"

    def choose_classes(self, num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> np.ndarray:
        return np.stack([rng.choice(num_classes, size=k, replace=False) for _ in range(num_clients)])

    def most_holders(self, num_clients: int, num_classes: int, k: int) -> int:
        return num_clients

    def most_clients(self, num_classes: int, k: int, per_class: int) -> int:
        return per_class
