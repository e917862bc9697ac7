"""The dataset registry and the two kinds of entry in it: datasets read from files, and generated ones.

Each registered class says how its dataset is found, placed from a mirror and decoded (files), or
generated (no files); `pflbench.data.loading` runs those steps in order for any name. Files that
torchvision's own dataset classes read share `TorchvisionSource` (its train and test sets, as one Dataset).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch

from pflbench.data.dataset import TEST, TRAIN, Dataset
from pflbench.data.files import digest_files
from pflbench.data.options import Option, resolve_options
from pflbench.registry import NAME, Registry


class Source(ABC):
    """One dataset with its options resolved. Subclasses declare `description` and `OPTIONS`."""

    description: ClassVar[str]
    OPTIONS: ClassVar[dict[str, Option]] = {}
    # How the reports show it (DATASETS below): set by `register` where the class does not declare them.
    display_name: ClassVar[str]
    paper: ClassVar[str]
    row_order: ClassVar[int | None]
    paper_dataset: ClassVar[str]
    paper_dataset_note: ClassVar[str]

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options

    @classmethod
    def summary(cls) -> str:
        """One line for `pflbench list datasets`: what it is and its options."""
        options = ", ".join(opt.describe(name) for name, opt in cls.OPTIONS.items())
        return f"{cls.description}; options: {options}" if options else cls.description


# How the reports show a dataset, each the class's own (`register` fills in what it leaves out; a plugin
# dataset may declare them as class attributes or as `register(name, display_name=...)`):
#   display_name, paper (where it comes from), row_order (its column among the tables' datasets; None:
#   after those with one, by name), paper_dataset (the papers' dataset its cells are compared with, when
#   not itself) and paper_dataset_note (the footnote saying how the two differ).
DATASETS: Registry[type[Source]] = Registry(
    "dataset",
    own_attributes={
        "display_name": NAME,
        "paper": "",
        "row_order": None,
        "paper_dataset": "",
        "paper_dataset_note": "",
    },
)


def make_source(name: str, options: dict[str, Any]) -> Source:
    """The registered dataset `name` with `options` checked (UnknownNameError / ValueError otherwise)."""
    source_class = DATASETS.get(name)
    return source_class(name, resolve_options(name, source_class.OPTIONS, options))


class GeneratedSource(Source):
    """A dataset computed from its options alone: nothing to find, download or cache."""

    # Bump when the recipe changes, so the checksum of a generated dataset changes with it.
    RECIPE_VERSION: ClassVar[int] = 1

    @abstractmethod
    def generate(self) -> Dataset:
        """The dataset for `self.options` (deterministic given the seed)."""

    def checksum(self) -> str:
        """Digest of the generator's name, recipe version and parameters."""
        recipe = {"generator": self.name, "version": self.RECIPE_VERSION, "options": self.options}
        return "sha256:" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


DOWNLOAD_OPTION = Option(
    None,
    bool,
    "let torchvision download missing files",
    changes_data=False,
    default_text="yes unless a mirror is configured",
)


def torchvision_dataset(name: str) -> Any:
    """torchvision's dataset class `name` (e.g. "FashionMNIST"), imported when first needed: importing
    torchvision costs every command about as much CPU again as torch itself, and most never read a file."""
    return getattr(importlib.import_module("torchvision.datasets"), name)


class FileSource(Source):
    """A dataset read from files in the data root, in the layout its reader (torchvision) expects."""

    downloadable: ClassVar[bool] = True  # whether `decode(root, download=True)` can fetch it

    def cache_key(self) -> str:
        """Cache file stem: the name plus every option that changes the data, e.g. 'emnist-split=letters'."""
        parts = [f"{k}={v}" for k, v in sorted(self.options.items()) if self.OPTIONS[k].changes_data]
        return "-".join([self.name, *parts])

    @abstractmethod
    def required_paths(self, root: Path) -> list[Path]:
        """The files (or folders) the reader needs under `root`."""

    def present(self, root: Path) -> bool:
        return all(path.exists() for path in self.required_paths(root))

    @abstractmethod
    def mirror_hint(self) -> str:
        """What a mirror must hold for this dataset, in words (for error messages)."""

    @abstractmethod
    def mirror_paths(self, mirror: Path) -> list[Path]:
        """Where this dataset may be in a mirror, every accepted form (for messages)."""

    @abstractmethod
    def in_mirror(self, mirror: Path) -> bool:
        """Whether `mirror` holds everything `place_from_mirror` needs."""

    @abstractmethod
    def place_from_mirror(self, mirror: Path, root: Path) -> str:
        """Put the mirror's files where the reader looks under `root`; a line saying what was done."""

    @abstractmethod
    def decode(self, root: Path, download: bool) -> Dataset:
        """Read the files under `root` (torchvision downloads them first if `download`).

        Raises RuntimeError (torchvision's "not found or corrupted") or OSError (a failed download).
        """


class TorchvisionSet(Protocol):
    """What `TorchvisionSource` asks of torchvision's dataset class: made from a root folder and
    options (train, download, ...), it says which set it is (train or test) and its length."""

    train: bool

    def __init__(self, root: Path, **options: Any) -> None: ...

    def __len__(self) -> int: ...


TorchvisionSetT = TypeVar("TorchvisionSetT", bound=TorchvisionSet)


class TorchvisionSource(FileSource, Generic[TorchvisionSetT]):
    """A dataset read (and, when allowed, downloaded) by torchvision's dataset class `torchvision_name`:
    its train set, then its test set, as one Dataset. Subclasses say how the files are laid out and
    mirrored, and what the samples of torchvision's sets are (`samples`)."""

    torchvision_name: ClassVar[str]
    OPTIONS = {"download": DOWNLOAD_OPTION}

    @property
    def torchvision_class(self) -> type[TorchvisionSetT]:
        return torchvision_dataset(self.torchvision_name)

    def torchvision_set(self, root: Path, train: bool, download: bool) -> TorchvisionSetT:
        """torchvision's train (or test) set of the files under `root`."""
        return self.torchvision_class(root, train=train, download=download)

    @abstractmethod
    def samples(self, parts: list[TorchvisionSetT]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """The inputs ([N, C, H, W] uint8), labels (int64) and class names of torchvision's train and
        test sets `parts`, their samples in that order."""

    def decode(self, root: Path, download: bool) -> Dataset:
        parts = [self.torchvision_set(root, train, download) for train in (True, False)]
        inputs, labels, classes = self.samples(parts)
        return Dataset.build(
            self.name,
            inputs,
            labels,
            num_classes=len(classes),
            checksum=digest_files(self.required_paths(root), root),
            source_split=torch.cat(
                [torch.full((len(p),), TRAIN if p.train else TEST, dtype=torch.uint8) for p in parts]
            ),
            classes=classes,
        )
