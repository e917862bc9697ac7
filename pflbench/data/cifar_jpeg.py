"""cifar10-jpeg: CIFAR-10 re-encoded as JPEG (quality about 75), in torchvision's ImageFolder layout.

The re-encoding is lossy, so this is not CIFAR-10 and is never called so: results on it carry the
name `cifar10-jpeg`. Files: `<root>/cifar10-jpeg/{train,test}/<class>/*.jpg`, extracted from a
mirror's `cifar10-jpeg.zip`. There is no download: its only source is that archive.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pflbench.data.dataset import TEST, TRAIN, Dataset
from pflbench.data.files import ContentDigest, place_folder
from pflbench.data.sources import DATASETS, FileSource

FOLDER = "cifar10-jpeg"
ARCHIVE = "cifar10-jpeg.zip"
SPLITS = (("train", TRAIN), ("test", TEST))
IMAGE_SHAPE = (32, 32, 3)


# Compared with the paper's CIFAR-10 numbers in the reports, with a note that the data differ.
@DATASETS.register(
    "cifar10-jpeg",
    display_name="CIFAR-10 (JPEG)",
    row_order=3,
    paper_dataset="cifar10",
    paper_dataset_note="cifar10-jpeg is a lossy JPEG re-encoding of CIFAR-10 (quality about 75), not the data the paper used",
)
class Cifar10JpegSource(FileSource):
    description = (
        "cifar10-jpeg: CIFAR-10 re-encoded as JPEG (lossy, quality ~75; not CIFAR-10), "
        "60000 32x32 RGB images (train+test), 10 classes"
    )
    downloadable = False

    def required_paths(self, root: Path) -> list[Path]:
        return [root / FOLDER / split for split, _ in SPLITS]

    def mirror_hint(self) -> str:
        return f"{ARCHIVE} (train/<class>/*.jpg, test/<class>/*.jpg) or that layout in a folder {FOLDER}/"

    def mirror_paths(self, mirror: Path) -> list[Path]:
        return [mirror / ARCHIVE, mirror / FOLDER]

    def in_mirror(self, mirror: Path) -> bool:
        archive, folder = self.mirror_paths(mirror)
        return archive.is_file() or all((folder / split).is_dir() for split, _ in SPLITS)

    def place_from_mirror(self, mirror: Path, root: Path) -> str:
        def unpack(archive: Path, scratch: Path) -> Path:
            with zipfile.ZipFile(archive) as z:
                z.extractall(scratch)
            return _layout_top(scratch)

        archive, extracted = self.mirror_paths(mirror)
        source = place_folder(root / FOLDER, archive, extracted, unpack)
        return f"{self.name}: extracted {source} into {root / FOLDER}"

    def decode(self, root: Path, download: bool) -> Dataset:
        from torchvision.datasets import ImageFolder  # imported when read: see sources.torchvision_dataset

        digest = ContentDigest()
        inputs, labels, source_split = [], [], []
        classes: list[str] | None = None
        for split, code in SPLITS:
            folder = ImageFolder(root / FOLDER / split)  # torchvision's listing: sorted classes and files
            if classes is not None and folder.classes != classes:
                raise ValueError(f"{self.name}: train and test have different class folders under {root / FOLDER}")
            classes = folder.classes
            pixels = np.empty((len(folder.samples), *IMAGE_SHAPE), dtype=np.uint8)
            for i, (path, _) in enumerate(folder.samples):
                data = Path(path).read_bytes()  # read once: hashed and decoded from the same bytes
                digest.add(Path(path).relative_to(root).as_posix(), data)
                with Image.open(io.BytesIO(data)) as image:
                    decoded = np.asarray(image.convert("RGB"))
                if decoded.shape != IMAGE_SHAPE:
                    raise ValueError(f"{path}: expected a 32x32 RGB image, got shape {decoded.shape}")
                pixels[i] = decoded
            inputs.append(torch.from_numpy(pixels).permute(0, 3, 1, 2))
            labels.append(torch.tensor(folder.targets, dtype=torch.int64))
            source_split.append(torch.full((len(pixels),), code, dtype=torch.uint8))
        return Dataset.build(
            self.name,
            torch.cat(inputs),
            torch.cat(labels),
            num_classes=len(classes or ()),  # (set by the first split)
            checksum=digest.result(),
            source_split=torch.cat(source_split),
            classes=classes,
        )


def _layout_top(unpacked: Path) -> Path:
    """The folder holding train/ and test/: the archive's top, or its single top folder (as in
    GitHub's "Download ZIP" of the source repository)."""
    if (unpacked / "train").is_dir():
        return unpacked
    entries = list(unpacked.iterdir())
    if len(entries) == 1 and (entries[0] / "train").is_dir():
        return entries[0]
    raise FileNotFoundError(f"{ARCHIVE} holds no train/ and test/ folders (found: {[e.name for e in entries]})")
