"""Statistical heterogeneity beyond label skew: feature shift and concept shift (cell fields
`feature_shift` and `concept_shift`; benchmarks/README.md, "Heterogeneity beyond label skew").

Both are drawn once from the cell's seed (each on its own stream, "shift.feature" and "shift.concept", never from the training RNG), for
every client of the partition, keyed by partition client id; so every algorithm of a matrix sees the
same shifted clients, and a client held out of training (a newcomer) carries its own shift. They are
applied once, when the Federation is built, to the feature tensor and the per-sample label table
(clients' samples are disjoint, so each sample has exactly one owner): training, evaluation,
adaptation and every algorithm's own code read the shifted data at no extra cost per step. A client's
train, val and test samples get the same shift.

Feature shift (`feature_shift.kind`), per client:
- `rotation`: the image turned counter-clockwise by an angle drawn uniformly in
  [-max_degrees, max_degrees] (bilinear, corners filled with black pixels, i.e. the normalised
  value of a zero pixel). With `clusters: k`, cluster j turns by j * 2 * max_degrees / k, wrapped
  into [-max_degrees, max_degrees): with the default 180, k = 4 gives IFCA's rotated MNIST
  (0, 90, 180, 270 degrees).
- `color`: in pixel units, p -> clamp(contrast * (p - 0.5) + 0.5 + offset[channel], 0, 1), with
  contrast uniform in [1 - strength, 1 + strength] and one offset per channel uniform in
  [-strength / 2, strength / 2] (a brightness shift on grey images, a colour cast on RGB ones).
- `permutation`: a fixed permutation of the pixel positions (the same for every channel), as in
  permuted MNIST; on vector data, a permutation of the features.
- `clusters: k` (default 0: each client its own transform): k transforms shared by groups of
  clients; cluster 0 keeps the original data. Clients are dealt into clusters as evenly as
  possible, in an order shuffled from the seed.

Concept shift (`concept_shift.clusters: k`, default 1 = off): clients are dealt into k clusters the
same way (on its own stream); cluster j relabels y -> s^-1((s(y) + j) mod C), with s a permutation of the
C classes drawn from the seed. Cluster 0 keeps the labels, and any two clusters disagree on every
label (a cyclic shift in a shuffled order), so no single model can fit two clusters: the same x
means a different y in each. Needs k <= C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from torch import Tensor

from pflbench import streams
from pflbench.config import reject_boolean
from pflbench.registry import echo

if TYPE_CHECKING:
    from pflbench.config import CellConfig
    from pflbench.data.dataset import Dataset
    from pflbench.data.partitioning import ClientSplits

CHUNK = 4096  # samples transformed at once (bounds the rotation grid's memory)


class ShiftError(ValueError):
    """A feature_shift / concept_shift setting that cannot be used (names the field and what is allowed)."""


class FeatureShift(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "rotation", "color", "permutation"] = "none"
    max_degrees: float = Field(180.0, gt=0.0, le=180.0)  # rotation only
    strength: float = Field(0.5, gt=0.0, lt=1.0)  # color only
    clusters: int = Field(0, ge=0)  # 0: one transform per client; k: k transforms shared by clusters

    _no_booleans = field_validator("max_degrees", "strength", "clusters", mode="before")(reject_boolean)

    @model_validator(mode="after")
    def _entries_fit_the_kind(self) -> Self:
        # An entry at its default may be written anywhere (it changes nothing); another value must fit the kind.
        changed = {
            name
            for name in self.model_fields_set - {"kind"}
            if getattr(self, name) != type(self).model_fields[name].default
        }
        if self.kind == "none" and changed:
            raise ValueError(
                f"kind is 'none' (off): set kind to one of rotation, color, permutation "
                f"to use {', '.join(sorted(changed))}"
            )
        if self.clusters == 1:
            raise ValueError(
                "clusters=1 would leave every client unshifted (cluster 0 keeps the original data); "
                "allowed: 0 (each client its own transform) or 2 and more"
            )
        for entry, kind in (("max_degrees", "rotation"), ("strength", "color")):
            if entry in changed and self.kind != kind:
                raise ValueError(
                    f"{entry} applies to kind {kind!r} only (kind is {self.kind!r}); in a matrix "
                    f"over kinds, set it in an override with `when: {{feature_shift.kind: {kind}}}`"
                )
        return self

    @property
    def on(self) -> bool:
        return self.kind != "none"


class ConceptShift(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: int = Field(1, ge=1)  # 1: every client keeps the true labels (off)

    _no_booleans = field_validator("clusters", mode="before")(reject_boolean)

    @property
    def on(self) -> bool:
        return self.clusters > 1


Parsed = TypeVar("Parsed", bound=BaseModel)


def _parse(model: type[Parsed], field: str, values: dict[str, Any]) -> Parsed:
    try:
        return model(**values)
    except ValidationError as error:
        allowed = ", ".join(f"{name} (default {f.default!r})" for name, f in model.model_fields.items())
        problems = []
        for e in error.errors(include_url=False):
            name = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown entry {field}.{echo(name)}; allowed entries: {allowed}")
            elif e["type"] == "value_error":
                problems.append(f"{field}: {e['ctx']['error']}")
            else:
                problems.append(f"{field}.{name}={echo(e['input'])} is not allowed: {e['msg']}")
        raise ShiftError("; ".join(problems)) from None


def parse_feature_shift(values: dict[str, Any]) -> FeatureShift:
    return _parse(FeatureShift, "feature_shift", values)


def parse_concept_shift(values: dict[str, Any]) -> ConceptShift:
    return _parse(ConceptShift, "concept_shift", values)


def _non_default(params: BaseModel) -> dict[str, Any]:
    """The entries that differ from their defaults: writing a default gives the same cell (hash) as omitting it."""
    defaults = {name: f.default for name, f in type(params).model_fields.items()}
    return {k: v for k, v in params.model_dump(mode="json").items() if v != defaults[k]}


def resolve(feature_shift: dict[str, Any], concept_shift: dict[str, Any], clients: int) -> dict[str, dict]:
    """The cell's two fields validated and reduced to their non-default entries (ShiftError naming the
    field otherwise). What needs the data (image or vector, number of classes) is checked in `draw`."""
    feature, concept = parse_feature_shift(feature_shift), parse_concept_shift(concept_shift)
    for field, k in (("feature_shift", feature.clusters), ("concept_shift", concept.clusters)):
        if k > clients:
            raise ShiftError(f"{field}.clusters={k} exceeds the cell's {clients} clients; allowed: 1 to {clients}")
    return {"feature_shift": _non_default(feature), "concept_shift": _non_default(concept)}


@dataclass
class ClientShifts:
    """What each partition client's data went through (drawn by `draw`; [clients] arrays)."""

    feature: FeatureShift
    concept: ConceptShift
    transform: np.ndarray  # index of the client's feature transform (cluster, or client itself)
    angles: np.ndarray | None  # rotation: degrees per transform
    contrast: np.ndarray | None  # color: per transform
    offset: np.ndarray | None  # color: [transforms, channels], pixel units
    permutations: np.ndarray | None  # permutation: [transforms, positions]
    concept_cluster: np.ndarray  # the client's concept cluster (all 0 when off)
    label_maps: np.ndarray  # [clusters, classes]: the label of class y in cluster j


def deal(num_clients: int, clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Clients dealt into `clusters` groups as evenly as possible, in a shuffled order."""
    cluster = np.empty(num_clients, dtype=np.int64)
    cluster[rng.permutation(num_clients)] = np.arange(num_clients) % clusters
    return cluster


def draw(cell: CellConfig, num_clients: int, input_shape: tuple[int, ...], num_classes: int) -> ClientShifts:
    """Every partition client's shifts, from the cell's seed alone (the same for every algorithm)."""
    feature, concept = parse_feature_shift(cell.feature_shift), parse_concept_shift(cell.concept_shift)
    is_image = len(input_shape) == 3
    if feature.kind in ("rotation", "color") and not is_image:
        raise ShiftError(
            f"feature_shift.kind={feature.kind!r} needs images and {cell.dataset!r} has vector "
            f"inputs {input_shape}; allowed on vector data: permutation"
        )
    if feature.kind == "rotation" and input_shape[1] != input_shape[2]:
        raise ShiftError(f"feature_shift.kind='rotation' needs square images, {cell.dataset!r} has {input_shape}")
    if concept.clusters > num_classes:
        raise ShiftError(
            f"concept_shift.clusters={concept.clusters} exceeds the {num_classes} classes of "
            f"{cell.dataset!r} (each cluster needs its own label for every class); "
            f"allowed: 1 to {num_classes}"
        )
    rng = streams.generator(cell.seed, "shift.feature", kind="numpy")
    k = feature.clusters
    count = k or num_clients  # transforms to draw
    transform = deal(num_clients, k, rng) if k else np.arange(num_clients)
    angles = contrast = offset = permutations = None
    if feature.kind == "rotation":
        if k:
            step = 2 * feature.max_degrees / k
            angles = (np.arange(k) * step + feature.max_degrees) % (2 * feature.max_degrees) - feature.max_degrees
        else:
            angles = rng.uniform(-feature.max_degrees, feature.max_degrees, count)
    elif feature.kind == "color":
        s = feature.strength
        contrast = rng.uniform(1 - s, 1 + s, count)
        offset = rng.uniform(-s / 2, s / 2, (count, input_shape[0]))
        if k:
            contrast[0], offset[0] = 1.0, 0.0
    elif feature.kind == "permutation":
        positions = math.prod(input_shape[1:]) if is_image else input_shape[0]
        permutations = np.stack([rng.permutation(positions) for _ in range(count)])
        if k:
            permutations[0] = np.arange(positions)
    rng = streams.generator(cell.seed, "shift.concept", kind="numpy")
    order = rng.permutation(num_classes)  # s^-1: position -> class
    rank = np.argsort(order)  # s: class -> position
    label_maps = np.stack([order[(rank + j) % num_classes] for j in range(concept.clusters)])
    concept_cluster = deal(num_clients, concept.clusters, rng) if concept.on else np.zeros(num_clients, np.int64)
    return ClientShifts(
        feature, concept, transform, angles, contrast, offset, permutations, concept_cluster, label_maps
    )


def apply(
    cell: CellConfig, dataset: Dataset, splits: ClientSplits, features: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor, ClientShifts | None]:
    """The Federation's features and labels with the cell's shifts applied to every partition client's
    samples (train, val and test alike); the inputs themselves when both knobs are off. `features` are
    `dataset`'s normalised inputs (its per-channel mean/std) and may be modified in place."""
    if not cell.feature_shift and not cell.concept_shift:
        return features, labels, None
    num_clients = splits.num_clients
    shifts = draw(cell, num_clients, tuple(features.shape[1:]), dataset.num_classes)
    mean, std = dataset.mean, dataset.std
    owned = [
        torch.as_tensor(
            np.concatenate([splits.train[c], splits.val[c], splits.test[c]]), dtype=torch.long, device=features.device
        )
        for c in range(num_clients)
    ]
    if shifts.feature.on:
        for t in np.unique(shifts.transform).tolist():
            members = np.flatnonzero(shifts.transform == t)
            ids = torch.cat([owned[c] for c in members])
            for part in ids.split(CHUNK):
                features[part] = _transform(features[part], shifts, t, mean, std)
    if shifts.concept.on:
        labels = labels.clone()  # the dataset's own tensor may be shared (e.g. on the CPU, `.to` is a no-op)
        maps = torch.as_tensor(shifts.label_maps, device=labels.device)
        for c in range(num_clients):
            cluster = int(shifts.concept_cluster[c])
            if cluster:
                labels[owned[c]] = maps[cluster][labels[owned[c]]]
    return features, labels, shifts


def _transform(x: Tensor, shifts: ClientShifts, t: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """Transform number `t` applied to a batch of normalised samples."""
    kind = shifts.feature.kind
    if kind == "permutation":
        assert shifts.permutations is not None  # drawn for this kind (`draw`), as the others below
        perm = torch.as_tensor(shifts.permutations[t], device=x.device)
        return x.flatten(2)[:, :, perm].view_as(x) if x.dim() == 4 else x[:, perm]
    shape = (1, -1, 1, 1)
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(shape)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(shape)
    if kind == "color":
        pixels = x * s + m
        assert shifts.contrast is not None and shifts.offset is not None
        contrast = float(shifts.contrast[t])
        offset = torch.as_tensor(shifts.offset[t], dtype=x.dtype, device=x.device).view(shape)
        pixels = (contrast * (pixels - 0.5) + 0.5 + offset).clamp(0.0, 1.0)
        return (pixels - m) / s
    assert shifts.angles is not None
    return rotate(x, float(shifts.angles[t]), fill=-m / s)


def rotate(x: Tensor, degrees: float, fill: Tensor) -> Tensor:
    """Square images [n, C, H, H] turned counter-clockwise (as displayed, row 0 on top) by `degrees`,
    bilinear; what comes from outside the image is `fill` (per channel)."""
    phi = math.radians(degrees)
    cos, sin = math.cos(phi), math.sin(phi)
    # affine_grid maps output coordinates (x right, y down, in [-1, 1]) to where they are read in the input.
    theta = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=x.dtype, device=x.device)
    grid = F.affine_grid(theta.expand(len(x), 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill
