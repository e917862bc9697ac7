"""synthetic-images: a small generated image dataset for fast tests and demos of CNN/BatchNorm code.

Each class has a smooth random template (coarse random grids upsampled bicubically and stretched
to [0, 1]; mostly one pattern shared by the channels). A sample is its class template shifted by
up to +-4 pixels, blended with a smooth random distractor at a random weight, plus pixel noise,
stored as uint8. Classes are balanced. Difficulty, measured on 2000 samples (70/30 split): a small
two-conv CNN reaches about 60% (grayscale) / 87% (RGB) test accuracy after 4 epochs, chance is 10%.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pflbench.data.dataset import Dataset
from pflbench.data.options import Option
from pflbench.data.sources import DATASETS, GeneratedSource

GRID = 5  # coarse grid side: the number of "blobs" across a template
MAX_SHIFT = 4  # pixels, each direction
TEMPLATE_WEIGHT = (0.35, 0.7)  # range of the class template's share in a sample
NOISE_STD = 0.15  # pixel noise, in [0, 1] units
SHARED_SHARE = 0.7  # share of a template's pattern common to all its channels


@DATASETS.register("synthetic-images")
class SyntheticImagesSource(GeneratedSource):
    description = "generated images (smooth class templates + noise), uint8, balanced classes, no files"
    OPTIONS = {
        "channels": Option(1, int, "1 (grayscale, MNIST-like) or 3 (RGB, CIFAR-like)", choices=(1, 3)),
        "size": Option(28, int, "image side in pixels", choices=(28, 32)),
        "num_samples": Option(2000, int, "pool size", minimum=2),
        "num_classes": Option(10, int, "number of classes", minimum=2),
        "seed": Option(0, int, "generator seed", minimum=0),
    }

    def generate(self) -> Dataset:
        channels, size = self.options["channels"], self.options["size"]
        num_samples, num_classes = self.options["num_samples"], self.options["num_classes"]
        if num_samples < num_classes:
            raise ValueError(f"synthetic-images: num_samples ({num_samples}) must be >= num_classes ({num_classes})")
        rng = np.random.default_rng(self.options["seed"])
        # Mostly one pattern shared by the channels, so colour alone gives a class away less easily.
        shared = _smooth_fields(rng, num_classes, 1, size)
        own = _smooth_fields(rng, num_classes, channels, size)
        templates = _stretch(SHARED_SHARE * shared + (1 - SHARED_SHARE) * own)
        labels = rng.permutation(np.arange(num_samples) % num_classes)
        distractors = _smooth_fields(rng, num_samples, channels, size)
        weight = rng.uniform(*TEMPLATE_WEIGHT, (num_samples, 1, 1, 1))
        shifts = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, (num_samples, 2))
        shifted = np.stack([np.roll(templates[c], tuple(s), axis=(1, 2)) for c, s in zip(labels, shifts)])
        images = weight * shifted + (1 - weight) * distractors + rng.normal(0, NOISE_STD, shifted.shape)
        pixels = np.clip(np.rint(images * 255), 0, 255).astype(np.uint8)
        return Dataset.build(
            self.name,
            torch.from_numpy(pixels),
            torch.from_numpy(labels.astype(np.int64)),
            num_classes=num_classes,
            checksum=self.checksum(),
            classes=[str(c) for c in range(num_classes)],
        )


def _smooth_fields(rng: np.random.Generator, count: int, channels: int, size: int) -> np.ndarray:
    """`count` smooth random images [count, channels, size, size], each channel stretched to [0, 1]."""
    coarse = torch.from_numpy(rng.uniform(0, 1, (count, channels, GRID, GRID)))
    return _stretch(F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False).numpy())


def _stretch(fields: np.ndarray) -> np.ndarray:
    """Each image channel linearly mapped onto [0, 1]."""
    low = fields.min(axis=(2, 3), keepdims=True)
    high = fields.max(axis=(2, 3), keepdims=True)
    return (fields - low) / (high - low)
