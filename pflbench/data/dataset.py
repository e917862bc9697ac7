"""The loaded form of every dataset: one pooled set of tensors plus its metadata.

torchvision's train and test sets are merged into one pool because pflbench re-splits each
client's share 70/30 itself (as pFedLA does); `source_split` keeps the original membership for
reference only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRAIN, TEST = 0, 1  # values of `Dataset.source_split`

# Images are summed in chunks of this many samples, so the statistics of CIFAR-sized pools need
# no float copy of the whole pool.
_STATS_CHUNK = 8192


@dataclass(eq=False)  # compared by identity: field-wise == is ambiguous for tensors
class Dataset:
    """A dataset pooled into tensors.

    `inputs` is uint8 [N, C, H, W] for images (raw pixels, as stored) and float32 [N, D] for vector
    data; `labels` is int64 [N] in 0..num_classes-1. `mean`/`std` hold one constant per image
    channel (in [0, 1] pixel units) or per vector feature, computed from the pool: what is cached.
    A cell normalises with the statistics of its trained clients' train splits instead
    (`pflbench.data.normalization`), a copy of this Dataset with `mean`/`std` replaced.
    """

    name: str
    inputs: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source_split: torch.Tensor  # uint8 [N]: TRAIN or TEST (which torchvision set a sample came from)
    checksum: str  # sha256 digest of the source files, or of the generator's parameters
    classes: list[str] | None = None

    def __post_init__(self) -> None:
        n = len(self.inputs)
        if self.labels.shape != (n,) or self.source_split.shape != (n,):
            raise ValueError(
                f"{self.name}: inputs, labels and source_split disagree on the number of samples "
                f"({tuple(self.inputs.shape)}, {tuple(self.labels.shape)}, {tuple(self.source_split.shape)})"
            )
        if self.labels.dtype != torch.int64 or self.source_split.dtype != torch.uint8:
            raise ValueError(f"{self.name}: labels must be int64 and source_split uint8")
        if n and not (int(self.labels.min()) >= 0 and int(self.labels.max()) < self.num_classes):
            raise ValueError(f"{self.name}: labels must lie in 0..{self.num_classes - 1}")
        if len(self.mean) != self.inputs.shape[1] or len(self.std) != self.inputs.shape[1]:
            raise ValueError(f"{self.name}: need one mean/std per channel or feature")

    @classmethod
    def build(
        cls,
        name: str,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        *,
        num_classes: int,
        checksum: str,
        source_split: torch.Tensor | None = None,
        classes: list[str] | None = None,
    ) -> Dataset:
        """A Dataset whose mean/std are computed from `inputs` (all samples count as TRAIN if no split given)."""
        if source_split is None:
            source_split = torch.full((len(inputs),), TRAIN, dtype=torch.uint8)
        mean, std = statistics(inputs)
        return cls(name, inputs, labels, num_classes, mean, std, source_split, checksum, classes)

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def is_image(self) -> bool:
        return self.inputs.dim() == 4

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample: (C, H, W) for images, (D,) for vectors."""
        return tuple(self.inputs.shape[1:])

    def normalized(self, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 inputs on `device`: images scaled to [0, 1], then (x - mean) / std per channel
        (per feature for vectors). The uint8 pixels move first, so the transfer is 4x smaller."""
        x = self.inputs.to(device).float()
        shape = (1, -1, 1, 1) if self.is_image else (1, -1)
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(shape)
        if self.is_image:
            x = x / 255.0
        return (x - mean) / std


def statistics(
    inputs: torch.Tensor, indices: torch.Tensor | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Population mean and std per image channel (in [0, 1] units) or per vector feature, over the
    samples `indices` (default: all). A zero std (a constant channel) is returned as 1."""
    if indices is not None:
        indices = torch.as_tensor(indices, dtype=torch.long)
        if not len(indices):
            raise ValueError("normalisation statistics need at least one sample")
    if inputs.dim() == 4:
        # A histogram of the uint8 values per channel gives exact integer sums (no precision lost,
        # whatever the pool size) without widening the pixels: 6x faster than int64 sums (measured,
        # 37,800 CIFAR images), which matters now that every cell computes its own (normalization.py).
        if inputs.dtype != torch.uint8:
            raise ValueError(f"image inputs must be uint8 pixels, got {inputs.dtype}")
        counts = torch.zeros(inputs.shape[1], 256, dtype=torch.int64)
        chunks = inputs.split(_STATS_CHUNK) if indices is None else (inputs[i] for i in indices.split(_STATS_CHUNK))
        for chunk in chunks:
            for channel in range(inputs.shape[1]):
                counts[channel] += torch.bincount(chunk[:, channel].reshape(-1), minlength=256)
        values = torch.arange(256, dtype=torch.float64)
        # every product and partial sum is an integer below 2**53: exact in float64
        total, total_sq = (counts.double() * values).sum(1), (counts.double() * values * values).sum(1)
        count = (inputs.shape[0] if indices is None else len(indices)) * inputs.shape[2] * inputs.shape[3]
        mean = total / count / 255.0
        var = total_sq / count / 255.0**2 - mean**2
    elif inputs.dim() == 2:
        values = (inputs if indices is None else inputs[indices]).double()
        mean, var = values.mean(dim=0), values.var(dim=0, unbiased=False)
    else:
        raise ValueError(f"inputs must be [N, C, H, W] images or [N, D] vectors, got {tuple(inputs.shape)}")
    std = var.clamp(min=0).sqrt()
    # A constant channel would divide by zero; leave it unscaled (only centred) instead.
    std = torch.where(std > 0, std, torch.ones_like(std))
    return tuple(mean.tolist()), tuple(std.tolist())
