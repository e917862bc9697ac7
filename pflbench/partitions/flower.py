"""`flwr`: Flower Datasets' partitioners (flwr-datasets), run by the library itself on our labels.

`{scheme: flwr, params: {partitioner: DirichletPartitioner, alpha: 0.3, seed: 42, ...}}`: the class
name from `flwr_datasets.partitioner` and its keyword arguments, so a spec names exactly the
partitioner a Flower user called. Choices where Flower is silent about use outside its own pipeline:

- The library runs on a Hugging Face `datasets.Dataset` built in memory from our labels (a `label`
  column and a column of our sample indices); nothing is downloaded, the hub is never asked (the tests
  run with HF_DATASETS_OFFLINE=1). Client i holds the indices of `load_partition(i)`, in Flower's order.
- `num_partitions` is the cell's `clients` and `partition_by` is "label": neither is a parameter here.
  Partitioners with `partition_sizes` (SizePartitioner, InnerDirichletPartitioner) need one size per client.
- `seed`: the partitioner's own keyword, default the library's (42), not the cell's seed, so that the
  split is the one a Flower user with the same call got; set `seed` to vary it.
- Each client's indices are then split train/val/test by pflbench's usual per-client stratified split
  (`train_fraction`, `val_fraction`, with the cell's seed), as for our own schemes.
- The library version is part of the cell (`version`, filled in when a spec is resolved): another
  version may split differently, so a cell made with one refuses to run with another.

Tested with flwr-datasets 0.6.1 (with datasets 4.8.5). Its metadata caps rich below 15 while pflbench
pins rich 15.0.0, so it is installed without its dependencies (benchmarks/README.md, "Partitions from
Flower Datasets"); the partitioners do not use rich.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from pydantic import ConfigDict, Field

from pflbench.data.partitioning import PARTITIONS, Partitioner, PartitionError, SchemeParams
from pflbench.registry import echo, unknown_message

# The label-driven partitioners (the others need a natural-id or feature column).
SUPPORTED = (
    "IidPartitioner",
    "DirichletPartitioner",
    "InnerDirichletPartitioner",
    "PathologicalPartitioner",
    "ShardPartitioner",
    "LinearPartitioner",
    "SquarePartitioner",
    "ExponentialPartitioner",
    "SizePartitioner",
)
TESTED_VERSION = "0.6.1"
_SET_HERE = ("num_partitions", "partition_by")
_INDEX_COLUMN = "pflbench_index"


def _library() -> tuple[str, ModuleType]:
    try:
        import flwr_datasets
        import flwr_datasets.partitioner as partitioner_module
    except ImportError as exc:
        raise PartitionError(
            f"partition scheme 'flwr' needs flwr-datasets (tested: {TESTED_VERSION}), which is not installed here "
            f"({exc}); install: pip install datasets==4.8.5 && pip install --no-deps "
            f"flwr-datasets=={TESTED_VERSION}"
        ) from None
    return flwr_datasets.__version__, partitioner_module


@PARTITIONS.register("flwr")
class Flower(Partitioner):
    scheme = "flwr"

    class Params(SchemeParams):
        model_config = ConfigDict(extra="allow", frozen=True)  # the extras are the partitioner's kwargs
        partitioner: str = Field(min_length=1)
        version: str | None = None  # flwr-datasets' version, filled in by spec resolution

    params: Params  # validated by Partitioner.__init__; typed as this scheme's

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.params.partitioner not in SUPPORTED:
            raise PartitionError(
                "partition scheme 'flwr': "
                + unknown_message("Flower Datasets partitioner", self.params.partitioner, list(SUPPORTED))
            )
        for name in _SET_HERE:
            if name in self.kwargs:
                raise self.error(
                    name,
                    self.kwargs[name],
                    "set by pflbench (num_partitions: the cell's clients; partition_by: 'label'); leave it out",
                )

    @property
    def kwargs(self) -> dict:
        return dict(self.params.model_extra or {})

    def resolved(self, base_dir: str | Path | None = None) -> Flower:
        """The installed library's version recorded (checked against a recorded one); the kwargs checked
        against the partitioner's signature now, before anything runs."""
        version, module = _library()
        self.check_recorded(
            "version",
            version,
            f"this cell was made with flwr-datasets {self.params.version}, installed is {version}",
            "install that version",
        )
        self._signature_check(module)
        return Flower(**{**self.params.model_dump(), "version": version})

    def check(self, num_clients: int, num_classes: int, class_counts: np.ndarray) -> None:
        super().check(num_clients, num_classes, class_counts)
        sizes = self.kwargs.get("partition_sizes")
        if sizes is not None and (not isinstance(sizes, list) or len(sizes) != num_clients):
            raise self.error("partition_sizes", sizes, f"allowed: a list of {num_clients} sizes, one per client")

    def assign(
        self, labels: np.ndarray, num_classes: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        partitioner = self.build(num_clients)
        partitioner.dataset = in_memory_dataset(labels)
        try:
            return [
                np.asarray(partitioner.load_partition(i)[_INDEX_COLUMN], dtype=np.int64) for i in range(num_clients)
            ]
        except (ValueError, KeyError, IndexError) as exc:  # the library's own refusal of an impossible request
            raise PartitionError(
                f"partition scheme 'flwr' ({self.params.partitioner}, {len(labels)} samples, "
                f"{num_clients} clients): flwr-datasets refused: {exc}"
            ) from None

    def build(self, num_clients: int) -> Any:
        """The library's partitioner object for `num_clients` clients, not yet given a dataset."""
        _, module = _library()
        cls = getattr(module, self.params.partitioner)
        kwargs = self._full_kwargs(cls, num_clients)
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise PartitionError(
                f"partition scheme 'flwr': {self.params.partitioner}({_shown(kwargs)}) was "
                f"refused by flwr-datasets: {exc}"
            ) from None

    def _full_kwargs(self, cls: Any, num_clients: int) -> dict:  # cls: a flwr-datasets partitioner class
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = self.kwargs
        if "num_partitions" in accepted:
            kwargs["num_partitions"] = num_clients
        if "partition_by" in accepted:
            kwargs["partition_by"] = "label"
        return kwargs

    def _signature_check(self, module: ModuleType) -> None:
        cls = getattr(module, self.params.partitioner)
        signature = inspect.signature(cls.__init__)
        allowed = [name for name in signature.parameters if name not in ("self", *_SET_HERE)]
        for name in self.kwargs:
            if name not in allowed:
                raise PartitionError(
                    "partition scheme 'flwr': "
                    + unknown_message(f"keyword argument of {self.params.partitioner}", name, allowed)
                )
        try:
            signature.bind(None, **self._full_kwargs(cls, 2))
        except TypeError as exc:
            raise PartitionError(
                f"partition scheme 'flwr': {self.params.partitioner} {exc}; its keyword "
                f"arguments: {', '.join(allowed) or 'none'}"
            ) from None


def in_memory_dataset(labels: np.ndarray) -> Any:
    """A Hugging Face Dataset of our labels and sample indices, built in memory (no files, no hub)."""
    from datasets import Dataset

    labels = np.asarray(labels, dtype=np.int64)
    return Dataset.from_dict({"label": labels, _INDEX_COLUMN: np.arange(len(labels), dtype=np.int64)})


def _shown(kwargs: dict) -> str:
    return ", ".join(f"{key}={echo(value)}" for key, value in kwargs.items())
