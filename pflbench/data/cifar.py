"""CIFAR-10 and CIFAR-100: the python pickle batches parsed by torchvision's CIFAR10/CIFAR100.

torchvision reads `<root>/cifar-10-batches-py/` (`<root>/cifar-100-python/`) and checks each
file's md5; a mirror may hold the download archive (`cifar-10-python.tar.gz`) or the extracted folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from pflbench.data.files import place_folder
from pflbench.data.sources import DATASETS, TorchvisionSource

if TYPE_CHECKING:
    from torchvision.datasets import CIFAR10


class CifarSource(TorchvisionSource["CIFAR10"]):
    """A CIFAR dataset; subclasses name the torchvision class, which knows the file names."""

    def _file_names(self) -> list[str]:
        tv = self.torchvision_class
        return [name for name, _md5 in tv.train_list + tv.test_list] + [tv.meta["filename"]]

    def required_paths(self, root: Path) -> list[Path]:
        return [root / self.torchvision_class.base_folder / name for name in self._file_names()]

    def mirror_hint(self) -> str:
        tv = self.torchvision_class
        return f"{tv.filename} (torchvision's download) or its extracted folder {tv.base_folder}/"

    def mirror_paths(self, mirror: Path) -> list[Path]:
        return [mirror / self.torchvision_class.filename, mirror / self.torchvision_class.base_folder]

    def in_mirror(self, mirror: Path) -> bool:
        archive, folder = self.mirror_paths(mirror)
        return archive.is_file() or all((folder / name).is_file() for name in self._file_names())

    def place_from_mirror(self, mirror: Path, root: Path) -> str:
        base_folder = self.torchvision_class.base_folder

        def unpack(archive: Path, scratch: Path) -> Path:
            from torchvision.datasets.utils import extract_archive

            extract_archive(archive, scratch)  # torchvision's own extraction
            return scratch / base_folder

        archive, extracted = self.mirror_paths(mirror)
        source = place_folder(root / base_folder, archive, extracted, unpack)
        return f"{self.name}: placed {root / base_folder} from {source}"

    def samples(self, parts: list[CIFAR10]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        pixels = np.concatenate([p.data for p in parts])  # torchvision gives [N, 32, 32, 3] (HWC)
        return (
            torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(),
            torch.tensor([t for p in parts for t in p.targets], dtype=torch.int64),
            list(parts[0].classes),
        )


@DATASETS.register("cifar10", display_name="CIFAR-10", row_order=2)
class Cifar10Source(CifarSource):
    description = "CIFAR-10, 60000 32x32 RGB images (train+test), 10 classes"
    torchvision_name = "CIFAR10"


@DATASETS.register("cifar100", display_name="CIFAR-100", row_order=4)
class Cifar100Source(CifarSource):
    description = "CIFAR-100, 60000 32x32 RGB images (train+test), 100 fine classes"
    torchvision_name = "CIFAR100"
