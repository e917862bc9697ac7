"""`pathological` (pFedLA non-IID_1): each client holds exactly `classes_per_client` classes, with the
same number of samples of each.

pFedLA (Sec. 4.1): "each client is randomly assigned four classes (twelve classes per client in
CIFAR100) with the same amount of data on each class", and every client has the same amount of data.
Where the paper is silent we chose:

- Class choice: random but balanced. Each client in turn takes the classes held by the fewest
  clients so far, ties broken at random, so every class is held by floor or ceil of
  num_clients * k / num_classes clients (the "i mod C plus k-1 random others" recipe of reference
  code, made exactly balanced).
- Amounts: one amount `s` per (client, class) for all clients, so every client has k * s samples.
  With `samples_per_client=None`, `s` is the largest amount the smallest class can give each of the
  most clients any class is held by: s = min_c n_c // ceil(num_clients * k / num_classes). When the
  classes are equally large and each class's samples divide evenly among its holders (FashionMNIST
  and CIFAR-10 with 10 or 100 clients and k=4), every sample is used; otherwise the remainder stays
  unused so that amounts stay equal (CIFAR-100, 10 clients, k=12: 120 class slots on 100 classes,
  20 classes held twice, s = 300, so 36,000 of the 60,000 samples).
- `samples_per_client=m` fixes the size; when k does not divide m, m mod k of the client's classes
  get one sample more (equal per class up to one).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from pflbench.partitions._sampling import balanced_class_choice, draw, even_split, most_clients_per_class
from pflbench.data.partitioning import PARTITIONS, Partitioner, SchemeParams


@PARTITIONS.register("pathological")
class Pathological(Partitioner):
    scheme = "pathological"

    class Params(SchemeParams):
        classes_per_client: int = Field(4, ge=1)
        samples_per_client: int | None = Field(None, ge=2)

    params: Params  # validated by Partitioner.__init__; typed as this scheme's

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        super().check(num_clients, num_classes, class_counts)
        self._amounts_per_class(num_clients, num_classes, class_counts)

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        amounts = self._amounts_per_class(num_clients, num_classes, np.bincount(labels, minlength=num_classes))
        choice = self.choose_classes(num_clients, num_classes, self.params.classes_per_client, rng)
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        counts[np.arange(num_clients)[:, None], choice] = amounts
        return draw(labels, counts, rng)

    def choose_classes(self, num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> np.ndarray:
        """[num_clients, k] distinct classes per client: balanced (module doc)."""
        return balanced_class_choice(num_clients, num_classes, k, rng)

    def most_holders(self, num_clients: int, num_classes: int, k: int) -> int:
        """The most clients `choose_classes` can give one class: what the amounts are sized for."""
        return most_clients_per_class(num_clients, num_classes, k)

    def most_clients(self, num_classes: int, k: int, per_class: int) -> int:
        """The most clients this choice can serve when a class can give `per_class` clients a share."""
        return num_classes * per_class // k

    def _amounts_per_class(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> np.ndarray:
        """The samples a client takes of each of its k classes (the same for every client)."""
        k = self.params.classes_per_client
        if k > num_classes:
            raise self.error("classes_per_client", k, f"allowed: 1..{num_classes} (the dataset's number of classes)")
        holders = self.most_holders(num_clients, num_classes, k)
        smallest = int(class_counts.min())
        largest_amount = smallest // holders  # what the smallest class can give each of its holders
        if largest_amount * k < 2:  # a client needs a train and a test sample
            per_class_needed = 2 if k == 1 else 1
            raise self.error(
                "num_clients",
                num_clients,
                f"with classes_per_client={k} each class is held by up to {holders} clients but the smallest "
                f"class has {smallest} samples; allowed: at most "
                f"{self.most_clients(num_classes, k, smallest // per_class_needed)} clients",
            )
        wanted = self.params.samples_per_client
        if wanted is None:
            return np.full(k, largest_amount)
        if not k <= wanted <= k * largest_amount:
            raise self.error(
                "samples_per_client",
                wanted,
                f"with {num_clients} clients and classes_per_client={k} each class is held by up to {holders} "
                f"clients and the smallest class has {smallest} samples; allowed: {k}..{k * largest_amount}",
            )
        return even_split(wanted, k)
