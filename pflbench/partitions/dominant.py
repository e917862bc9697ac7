"""`dominant` (pFedLA non-IID_2): every client holds every class, and a few of its classes (its
dominant classes) hold many more samples than the others.

pFedLA (Sec. 4.1) says only: "each client contains all classes, while the data on each class is not
uniformly distributed. Two classes in EMNIST, FashionMNIST, CIFAR10 datasets have higher number of data
samples than other classes, while six classes in CIFAR100 have more data samples than the others". No
reference code implements it, so the definition here is ours:

- A client of size m puts D = round(dominant_share * m) samples in its `dominant_classes` (d) classes
  and m - D in the other C - d classes, each group split evenly (amounts within one of each other).
  So the dominant classes together carry `dominant_share` of every client's data, up to rounding.
- Every client has the same composition and size m. `samples_per_client=None` takes the largest m
  that every class can supply whichever classes get the one-sample remainders (checked for the
  smallest class with the most dominant holders). FashionMNIST/CIFAR-10 with 10 or 100 clients then
  use every sample; CIFAR-100 with d=6 uses 530 per client at 100 clients (53,000 of 60,000) and
  4,290 at 10 clients, where 40 classes are never dominant.
- Dominant classes rotate: each client in turn takes the classes that are dominant for the fewest
  clients so far, ties at random, so each class is dominant for floor or ceil of N * d / C clients.
- Default `dominant_share=0.6`: a clear majority (on 10 classes, each dominant class holds 30% of
  the client's data versus 5% for each other class, 6x as much) while the other classes keep enough
  samples to appear in the client's 30% test split (35 per class at 100 FashionMNIST clients).
  0.8 would leave 2.5% per class, a handful of test samples, making the scenario close to
  `pathological` and noisy to evaluate. Default `dominant_classes=2` as in pFedLA (use 6 for CIFAR-100).
- Validity: 1 <= d < C; d/C < dominant_share < 1 (d/C is the uniform share); each dominant class
  must get more samples than each other class, and each other class at least one.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from pflbench.partitions._sampling import balanced_class_choice, draw, even_split, most_clients_per_class
from pflbench.data.partitioning import PARTITIONS, Partitioner, SchemeParams


@PARTITIONS.register("dominant")
class Dominant(Partitioner):
    scheme = "dominant"

    class Params(SchemeParams):
        dominant_classes: int = Field(2, ge=1)
        dominant_share: float = Field(0.6, gt=0.0, lt=1.0)
        samples_per_client: int | None = Field(None, ge=2)

    params: Params  # validated by Partitioner.__init__; typed as this scheme's

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        super().check(num_clients, num_classes, class_counts)
        self._client_size(num_clients, num_classes, class_counts)

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        size = self._client_size(num_clients, num_classes, np.bincount(labels, minlength=num_classes))
        dominant_amounts, other_amounts = self._composition(size, num_classes)
        dominant = balanced_class_choice(num_clients, num_classes, self.params.dominant_classes, rng)
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        for client, classes in enumerate(dominant):
            others = rng.permutation(np.setdiff1d(np.arange(num_classes), classes))  # who gets the +1s
            counts[client, classes] = dominant_amounts
            counts[client, others] = other_amounts
        return draw(labels, counts, rng)

    def _composition(self, size: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-class amounts of a client of `size` samples: its dominant classes, then the others."""
        d = self.params.dominant_classes
        in_dominant = math.floor(self.params.dominant_share * size + 0.5)
        return even_split(in_dominant, d), even_split(size - in_dominant, num_classes - d)

    def _client_size(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> int:
        d, share = self.params.dominant_classes, self.params.dominant_share
        if d >= num_classes:
            raise self.error("dominant_classes", d, f"allowed: 1..{num_classes - 1} (below num_classes)")
        if share <= d / num_classes:
            raise self.error(
                "dominant_share", share, f"allowed: {d}/{num_classes} = {d / num_classes:g} < dominant_share < 1"
            )
        holders = most_clients_per_class(num_clients, num_classes, d)
        smallest = int(class_counts.min())

        def demand(size: int) -> int:
            """Most samples one class may be asked for: by `holders` clients as dominant, the rest as other."""
            dominant_amounts, other_amounts = self._composition(size, num_classes)
            return holders * int(dominant_amounts[0]) + (num_clients - holders) * int(other_amounts[0])

        # demand() grows with size, so bisect for the largest size the smallest class can supply.
        low, high = 0, int(class_counts.sum())
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if demand(middle) <= smallest else (low, middle - 1)
        largest = low

        wanted = self.params.samples_per_client
        size = largest if wanted is None else wanted
        if wanted is not None and wanted > largest:
            raise self.error(
                "samples_per_client",
                wanted,
                f"with {num_clients} clients each class is dominant for up to {holders} of them and the "
                f"smallest class has {smallest} samples; allowed: at most {largest}",
            )
        dominant_amounts, other_amounts = self._composition(size, num_classes)
        if other_amounts[-1] < 1 or dominant_amounts[-1] <= other_amounts[0]:
            param, value = ("num_clients", num_clients) if wanted is None else ("samples_per_client", wanted)
            raise self.error(
                param,
                value,
                f"clients of {size} samples cannot give each of the {num_classes - d} other classes at least "
                f"one sample and each dominant class more than any other class at dominant_share={share}; "
                f"allowed: fewer clients or more samples per client",
            )
        return size
