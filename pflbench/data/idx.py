"""MNIST, Fashion-MNIST and EMNIST: IDX files parsed by torchvision's own MNIST/FashionMNIST/EMNIST.

torchvision reads the decompressed files in `<root>/<ClassName>/raw/`; a mirror folder may hold
them decompressed, gzipped, or (EMNIST) inside torchvision's download archive `gzip.zip`.
"""

from __future__ import annotations

import gzip
import shutil
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, ClassVar, cast
from collections.abc import Iterator

import torch

from pflbench.data.files import staged
from pflbench.data.options import Option
from pflbench.data.sources import DATASETS, DOWNLOAD_OPTION, TorchvisionSource

if TYPE_CHECKING:
    from torchvision.datasets import MNIST

# Where one raw file is in a mirror: a file on disk, or a member (name) of a zip archive on disk.
MirrorFile = tuple[Path, str | None]


class IdxSource(TorchvisionSource["MNIST"]):
    """An MNIST-format dataset; subclasses name the torchvision class (`torchvision_name`, also the
    folder torchvision reads: <root>/<name>/raw) and the mirror folder."""

    mirror_folder: ClassVar[str]

    def raw_names(self) -> list[str]:
        """The decompressed IDX files torchvision reads: train images/labels, then test."""
        return [f"{part}-{kind}" for part in ("train", "t10k") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]

    def relabel(self, labels: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, list[str]]:
        """Map torchvision's labels and class names to 0..num_classes-1 (identity unless overridden)."""
        return labels, classes

    def raw_folder(self, root: Path) -> Path:
        return root / self.torchvision_name / "raw"

    def required_paths(self, root: Path) -> list[Path]:
        return [self.raw_folder(root) / name for name in self.raw_names()]

    def mirror_hint(self) -> str:
        return f"a folder {self.mirror_folder}/ holding {', '.join(self.raw_names())} (each may be .gz)"

    def mirror_paths(self, mirror: Path) -> list[Path]:
        return [mirror / self.mirror_folder]

    def in_mirror(self, mirror: Path) -> bool:
        return self._find_in_mirror(mirror) is not None

    def place_from_mirror(self, mirror: Path, root: Path) -> str:
        found = self._find_in_mirror(mirror)
        if found is None:
            raise FileNotFoundError(f"{self.name}: {mirror} lacks {self.mirror_hint()}")
        written = []
        for name, where in found.items():
            dest = self.raw_folder(root) / name
            if dest.exists():
                continue
            with _open_decompressed(where) as src, staged(dest) as tmp, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            written.append(name)
        folder = mirror / self.mirror_folder
        return f"{self.name}: wrote {len(written)} IDX files to {self.raw_folder(root)} from {folder}"

    def _find_in_mirror(self, mirror: Path) -> dict[str, MirrorFile] | None:
        """Each raw file's location in the mirror, or None if any is missing."""
        folder = mirror / self.mirror_folder
        if not folder.is_dir():
            return None
        archive = folder / "gzip.zip"  # torchvision's EMNIST download, kept as is
        members: dict[str, str] = {}
        if archive.is_file():
            with zipfile.ZipFile(archive) as z:
                members = {PurePosixPath(m).name: m for m in z.namelist()}
        found: dict[str, MirrorFile] = {}
        for name in self.raw_names():
            on_disk = [folder / name, folder / f"{name}.gz", folder / "gzip" / f"{name}.gz"]
            in_zip = [members[m] for m in (f"{name}.gz", name) if m in members]
            if hit := next((p for p in on_disk if p.is_file()), None):
                found[name] = (hit, None)
            elif in_zip:
                found[name] = (archive, in_zip[0])
            else:
                return None
        return found

    def samples(self, parts: list[MNIST]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        labels, classes = self.relabel(torch.cat([p.targets for p in parts]), list(parts[0].classes))
        return torch.cat([p.data for p in parts]).unsqueeze(1), labels, classes  # [N, 28, 28] -> [N, 1, 28, 28]


@contextmanager
def _open_decompressed(where: MirrorFile) -> Iterator[BinaryIO]:
    """The decompressed bytes of a mirror file (gunzipped when its name ends in .gz)."""
    path, member = where
    with ExitStack() as stack:
        stream: BinaryIO  # (each a binary file object; typeshed types a zip member and a GzipFile otherwise)
        if member is None:
            stream = stack.enter_context(open(path, "rb"))
        else:
            stream = cast(BinaryIO, stack.enter_context(stack.enter_context(zipfile.ZipFile(path)).open(member)))
        if (member or path.name).endswith(".gz"):
            stream = cast(BinaryIO, stack.enter_context(gzip.open(stream)))
        yield stream


@DATASETS.register("mnist", display_name="MNIST")
class MnistSource(IdxSource):
    description = "MNIST handwritten digits, 70000 28x28 grayscale images (train+test), 10 classes"
    torchvision_name = "MNIST"
    mirror_folder = "mnist"


@DATASETS.register("fmnist", display_name="Fashion-MNIST", row_order=1)
class FashionMnistSource(IdxSource):
    description = "Fashion-MNIST clothing images, 70000 28x28 grayscale (train+test), 10 classes"
    torchvision_name = "FashionMNIST"
    mirror_folder = "fashion-mnist"


EMNIST_SPLITS = ("balanced", "byclass", "letters", "digits")


@DATASETS.register("emnist", display_name="EMNIST", row_order=0)
class EmnistSource(IdxSource):
    """EMNIST through torchvision, whose images keep the files' transposed orientation (as in
    other torchvision-based pFL code); learning is unaffected, so we do not flip them."""

    description = (
        "EMNIST handwritten characters, 28x28 grayscale (train+test); classes: balanced 47, "
        "byclass 62, letters 26, digits 10"
    )
    torchvision_name = "EMNIST"
    mirror_folder = "emnist"
    OPTIONS = {
        "split": Option("balanced", str, "which EMNIST split", choices=EMNIST_SPLITS),
        "download": DOWNLOAD_OPTION,
    }

    def mirror_hint(self) -> str:
        return (
            "a folder emnist/ holding torchvision's download gzip.zip, or the split's files "
            f"({', '.join(self.raw_names())}, each may be .gz)"
        )

    def raw_names(self) -> list[str]:
        split = self.options["split"]
        return [
            f"emnist-{split}-{part}-{kind}"
            for part in ("train", "test")
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
        ]

    def torchvision_set(self, root: Path, train: bool, download: bool) -> MNIST:
        return self.torchvision_class(root, split=self.options["split"], train=train, download=download)

    def relabel(self, labels: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, list[str]]:
        if self.options["split"] == "letters":
            # torchvision keeps the files' labels 1..26 with a placeholder class "N/A" at 0.
            return labels - 1, classes[1:]
        return labels, classes
