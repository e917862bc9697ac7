"""FedProx's Synthetic(alpha, beta) (Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020), pooled over several sources and balanced over classes.

Recipe, per source k (a FedProx device), as in FedProx's generate_synthetic.py:
    u_k ~ N(0, alpha), B_k ~ N(0, beta)          (alpha, beta are the normals' scale, as in that code)
    W_k ~ N(u_k, 1) [60 x 10], b_k ~ N(u_k, 1) [10]
    v_k ~ N(B_k, 1) [60], x ~ N(v_k, Sigma), Sigma = diag(j^-1.2), j = 1..60
    y = argmax softmax(W_k^T x + b_k)
One source labels most of its samples with one or two classes, so pooling a few sources leaves
some classes rare or absent. pflbench partitions the pool by label afterwards, so the pool is made
class-balanced: every class gets exactly its share of `num_samples`. Samples are drawn from the
sources in rounds and each class keeps the first ones up to its share; after every round in which
some class is still short, one more source is drawn from the same prior (a class that none of the
sources produces still gets filled). Deterministic given the options.
"""

from __future__ import annotations

import numpy as np
import torch

from pflbench.data.dataset import Dataset
from pflbench.data.options import Option
from pflbench.data.sources import DATASETS, GeneratedSource

NUM_FEATURES = 60
NUM_CLASSES = 10
# Stop rather than loop forever if the prior somehow cannot produce a class.
MAX_EXTRA_SOURCES = 1000
# Standard deviations of the features: Sigma = diag(j^-1.2), j = 1..60.
_FEATURE_SCALE = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -0.6


@DATASETS.register("synthetic")
class SyntheticSource(GeneratedSource):
    description = (
        f"FedProx Synthetic(alpha, beta): float32 vectors [N, {NUM_FEATURES}], {NUM_CLASSES} balanced classes, "
        "generated (no files)"
    )
    OPTIONS = {
        "alpha": Option(1.0, float, "how much the sources' models differ", minimum=0),
        "beta": Option(1.0, float, "how much the sources' inputs differ", minimum=0),
        "sources": Option(10, int, "sources (FedProx devices) pooled at first", minimum=1),
        "num_samples": Option(6000, int, "pool size", minimum=NUM_CLASSES),
        "seed": Option(0, int, "generator seed", minimum=0),
    }

    def generate(self) -> Dataset:
        rng = np.random.default_rng(self.options["seed"])
        num_samples = self.options["num_samples"]
        quota = np.full(NUM_CLASSES, num_samples // NUM_CLASSES)
        quota[: num_samples % NUM_CLASSES] += 1
        kept: list[list[np.ndarray]] = [[] for _ in range(NUM_CLASSES)]
        have = np.zeros(NUM_CLASSES, dtype=np.int64)
        sources = [self._draw_source(rng) for _ in range(self.options["sources"])]
        draws_per_round = max(1, num_samples // len(sources))
        while True:
            for weights, bias, centre in sources:
                x = centre + rng.standard_normal((draws_per_round, NUM_FEATURES)) * _FEATURE_SCALE
                y = np.argmax(x @ weights + bias, axis=1)  # argmax of softmax = argmax of the logits
                for c in np.flatnonzero(have < quota):
                    take = x[y == c][: quota[c] - have[c]]
                    kept[c].append(take)
                    have[c] += len(take)
            if (have == quota).all():
                break
            if len(sources) >= self.options["sources"] + MAX_EXTRA_SOURCES:
                raise RuntimeError(f"synthetic: could not fill classes {np.flatnonzero(have < quota).tolist()}")
            sources.append(self._draw_source(rng))
        inputs = np.concatenate([np.concatenate(parts) for parts in kept])
        labels = np.repeat(np.arange(NUM_CLASSES), quota)
        order = rng.permutation(num_samples)  # mix the classes, as a pooled dataset would be
        return Dataset.build(
            self.name,
            torch.from_numpy(inputs[order].astype(np.float32)),
            torch.from_numpy(labels[order]),
            num_classes=NUM_CLASSES,
            checksum=self.checksum(),
            classes=[str(c) for c in range(NUM_CLASSES)],
        )

    def _draw_source(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One source's (W [60, 10], b [10], v [60]) from the prior."""
        model_mean = rng.normal(0.0, self.options["alpha"])
        input_mean = rng.normal(0.0, self.options["beta"])
        weights = rng.normal(model_mean, 1.0, (NUM_FEATURES, NUM_CLASSES))
        bias = rng.normal(model_mean, 1.0, NUM_CLASSES)
        centre = rng.normal(input_mean, 1.0, NUM_FEATURES)
        return weights, bias, centre
