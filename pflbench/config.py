"""The fully resolved configuration of one cell of an experiment matrix.

A cell is identified by the hash of this configuration's content (`cell_hash`), so two cells with the
same settings share results. Execution options that do not change the result's meaning (device,
data root, client batching on/off) are deliberately not part of it.

`hp_source` says where the algorithm's hyperparameters came from: the paper's defaults (or values
written in the spec) or a sweep's tuned configuration (`tuned:` in a spec, benchmarks/tuned/). It is
left out of the hash while it has its default, so adding the field changed no existing cell's id.

`finetune_epochs` (0 = off) adds the after-local-adaptation protocol to a cell's evaluation: every
evaluation round also scores each client's personalized model after that many epochs of plain local
SGD on its own train split (see `pflbench.simulator.federation.Federation.adapt_locally`). Like `hp_source` it is left
out of the hash at its default, so cells without adaptation keep their ids.

`normalization` is the other way round: its default `train` (statistics of the trained
clients' train splits) changed every cell's numbers, so it is in the hash and every such cell has a new
id; `pool` (the rule before) is left out, so stored cells keep their ids and read as `pool` cells
(`CellConfig.stored`). See pflbench.data.normalization.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def reject_boolean(value: Any) -> Any:
    """`seed: true` is a mistake, not seed 1: pydantic's lax mode would take a bool as a number.
    Used by CellConfig's number fields and by the spec's per-key checks."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value!r}")
    return value


# Fields added after cells were stored: left out of the hash while they have these values.
OPTIONAL_AT_DEFAULT = {
    "finetune_epochs": 0,
    "feature_shift": {},
    "concept_shift": {},
    "system": {},
    "privacy": {},
    "unseen_fraction": 0.0,
    "plugin_hashes": {},
    # the rule every cell stored before the field used; the default is "train", so those
    # cells keep their ids as `pool` cells and every default cell has a new one
    # (pflbench.data.normalization)
    "normalization": "pool",
}
# Hyperparameters added to an algorithm after cells of it were stored: the value a stored cell's missing
# entry stands for (how the method ran before the option existed). As with OPTIONAL_AT_DEFAULT, `stored`
# fills it in and the hash leaves it out at that value, so the cells stored before keep their ids.
_PFEDLA_ADDED = {
    "head": "relu",
    "hn_sign": "descend",
    "logit_bound": 0.0,
    "alpha_rule": "learned",
    "self_weight": 0.5,
    "spread": "uniform",
}
HP_ADDED_LATER: dict[str, dict[str, Any]] = {"pfedla": _PFEDLA_ADDED, "heurpfedla": _PFEDLA_ADDED}
# The heterogeneity knobs beyond label skew (benchmarks/README.md, "Heterogeneity"): all off by default.
HETEROGENEITY_FIELDS = ("feature_shift", "concept_shift", "system", "privacy", "unseen_fraction")
# The local training: its budget and SGD settings (numbers; the reports tell rows apart by them too).
TRAINING_FIELDS = ("rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay")


class CellConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str
    dataset: str
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    partition: str = "pathological"
    partition_params: dict[str, Any] = Field(default_factory=dict)
    clients: int = Field(10, ge=1)
    participation: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.01, gt=0.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    eval_every: int = Field(1, ge=1)
    model: str = "auto"
    train_fraction: float = Field(0.7, gt=0.0, lt=1.0)
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0)  # share of each client's train split held out
    hp: dict[str, Any] = Field(default_factory=dict)  # the algorithm's own hyperparameters
    hp_source: Literal["default", "tuned"] = "default"  # tuned: from a sweep (benchmarks/tuned/<algo>.yaml)
    finetune_epochs: int = Field(0, ge=0)  # local epochs of the adapted evaluation; 0: as delivered only
    feature_shift: dict[str, Any] = Field(default_factory=dict)  # per-client input transforms
    concept_shift: dict[str, Any] = Field(default_factory=dict)  # clusters of clients with permuted labels
    system: dict[str, Any] = Field(default_factory=dict)  # stragglers and dropped uploads
    privacy: dict[str, Any] = Field(default_factory=dict)  # per-client differential privacy on the uploads
    unseen_fraction: float = Field(0.0, ge=0.0, lt=1.0)  # clients held out of training, scored as newcomers
    # where the inputs' mean/std come from: the trained clients' train splits, or the whole pool
    normalization: Literal["train", "pool"] = "train"
    # {plugin id: sha256 of its source} of the plugins giving this cell its algorithm, dataset, scheme or
    # model (set by spec resolution, pflbench/loader/plugins.py): part of the id, so a changed plugin is a new cell.
    plugin_hashes: dict[str, str] = Field(default_factory=dict)

    @field_validator(
        "clients",
        "participation",
        "seed",
        *TRAINING_FIELDS,
        "eval_every",
        "train_fraction",
        "val_fraction",
        "finetune_epochs",
        "unseen_fraction",
        mode="before",
    )
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any) -> Any:
        return reject_boolean(value)

    @classmethod
    def stored(cls, data: dict[str, Any]) -> CellConfig:
        """A configuration as a store recorded it: a field it lacks was added later, and the cell ran
        with the value that field's absence stands for (OPTIONAL_AT_DEFAULT), not today's default."""
        data = {**{k: v for k, v in OPTIONAL_AT_DEFAULT.items() if k not in data}, **data}
        added = HP_ADDED_LATER.get(str(data.get("algorithm")), {})
        if added and isinstance(data.get("hp"), dict):
            data["hp"] = {**{k: v for k, v in added.items() if k not in data["hp"]}, **data["hp"]}
        return cls(**data)

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        if data["hp_source"] == "default":
            del data["hp_source"]  # hashes of cells from before the field existed stay the same
        for key in OPTIONAL_AT_DEFAULT:  # likewise: fields added later leave the hash alone at their default
            if data[key] == OPTIONAL_AT_DEFAULT[key]:
                del data[key]
        for key, value in HP_ADDED_LATER.get(data["algorithm"], {}).items():
            if data["hp"].get(key, value) == value:
                data["hp"].pop(key, None)
        params = data["partition_params"]
        if params.get("sha256") and "path" in params:
            # A partition read from a file is identified by the file's content: where it lies (an absolute
            # path in one checkout) is not part of the cell, so two checkouts share results.
            data["partition_params"] = {k: v for k, v in params.items() if k != "path"}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def cell_hash(cell: CellConfig) -> str:
    """Stable content hash: same resolved configuration, same id (12 hex digits)."""
    return hashlib.sha256(cell.canonical_json().encode()).hexdigest()[:12]


# ---- heterogeneous cells: which client gets which architecture ------------------------------------
# A cell's `model` is one name (every client the same), or a group spec: a preset from MODEL_GROUPS
# or a comma-separated list of names. The clients are split into that many contiguous groups of
# equal size (the remainder going to the first groups), group g getting the g-th architecture:
# MH-pFedHN's heterogeneous setting (`--only-cnn False`).
MODEL_GROUPS = {"hetero5": ("mh-cnn", "vgg8", "resnet10", "resnet12", "resnet18")}


def group_names(spec: str) -> tuple[str, ...]:
    """The architectures a cell's `model` names, in group order (one for a homogeneous cell)."""
    if spec in MODEL_GROUPS:
        return MODEL_GROUPS[spec]
    return tuple(part.strip() for part in spec.split(","))


def is_heterogeneous(spec: str) -> bool:
    """Whether clients may get different architectures (a group spec with two or more groups)."""
    return len(group_names(spec)) > 1
