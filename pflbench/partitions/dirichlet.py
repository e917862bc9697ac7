"""`dirichlet`: each class is spread over the clients in proportions drawn from Dir(alpha).

The common recipe (Hsu et al. 2019; used by the pFL survey with alpha 0.3 and 0.1): for every class,
proportions p ~ Dir(alpha * 1_N) over the N clients, and the class's shuffled samples are cut at the
cumulative proportions. Every sample is used, unless `mean_samples_per_client` asks for fewer: then
each class contributes the same fraction of its samples (chosen at random), so clients average that
size while the skew stays Dirichlet's (small demos and tests need small clients). Smaller alpha means
more skew.

Reference code enforces a minimum client size by redrawing until every client has it, which loops
forever at small alpha with many clients. Here the redraws are bounded (`max_redraws`), after which
a PartitionError suggests a larger alpha or a smaller min_samples. Only the count matrix is redrawn,
so a thousand redraws take a fraction of a second. Defaults: alpha=0.3 (the survey's main setting),
min_samples=10 (as in NIID-Bench: with the 70/30 split that leaves 7 train and 3 test samples),
max_redraws=1000.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from pflbench.partitions._sampling import draw
from pflbench.data.partitioning import PARTITIONS, Partitioner, SchemeParams


@PARTITIONS.register("dirichlet")
class Dirichlet(Partitioner):
    scheme = "dirichlet"

    class Params(SchemeParams):
        alpha: float = Field(0.3, gt=0.0)
        min_samples: int = Field(10, ge=2)
        max_redraws: int = Field(1000, ge=1)
        mean_samples_per_client: int | None = Field(None, ge=2)

    params: Params  # validated by Partitioner.__init__; typed as this scheme's

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        super().check(num_clients, num_classes, class_counts)
        min_samples, total = self.params.min_samples, int(class_counts.sum())
        mean = self.params.mean_samples_per_client
        if mean is not None:
            if mean * num_clients > total:
                raise self.error(
                    "mean_samples_per_client",
                    mean,
                    f"{num_clients} clients x {mean} samples exceeds the {total} samples; "
                    f"allowed: at most {total // num_clients} (or None for every sample)",
                )
            if mean < min_samples:
                raise self.error(
                    "mean_samples_per_client", mean, f"below min_samples={min_samples}; allowed: at least {min_samples}"
                )
        if min_samples * num_clients > total:
            raise self.error(
                "min_samples",
                min_samples,
                f"{num_clients} clients x {min_samples} samples exceeds the {total} samples; "
                f"allowed: at most {total // num_clients} (or fewer clients)",
            )

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        class_counts = self._used_class_counts(np.bincount(labels, minlength=num_classes), num_clients)
        alpha, min_samples = self.params.alpha, self.params.min_samples
        for _ in range(self.params.max_redraws):
            proportions = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)  # [classes, clients]
            cuts = np.floor(np.cumsum(proportions, axis=1) * class_counts[:, None]).astype(np.int64)
            cuts[:, -1] = class_counts  # the float cumsum may end just below 1
            counts = np.diff(cuts, axis=1, prepend=0).T  # [clients, classes]
            if counts.sum(axis=1).min() >= min_samples:
                return draw(labels, counts, rng)
        raise self.error(
            "alpha",
            alpha,
            f"in max_redraws={self.params.max_redraws} draws some client always had fewer than "
            f"min_samples={min_samples} samples ({num_clients} clients); allowed: a larger alpha or a "
            f"smaller min_samples",
        )

    def _used_class_counts(self, class_counts: np.ndarray, num_clients: int) -> np.ndarray:
        """Samples of each class to distribute: all, or the same fraction of every class."""
        mean = self.params.mean_samples_per_client
        if mean is None:
            return class_counts
        fraction = mean * num_clients / class_counts.sum()
        return np.floor(class_counts * fraction).astype(np.int64)
