"""pflbench's datasets: load any registered dataset by name as one pooled `Dataset` of tensors.

    from pflbench.data import load_dataset
    ds = load_dataset("fmnist")            # uint8 [70000, 1, 28, 28], labels int64 [70000]
    x = ds.normalized("cuda")              # float32, standardised with the pool's mean/std
    # a cell standardises with its trained clients' train statistics instead: data.normalization

Files live under the data root (`root=`, $PFLBENCH_DATA, else ./data) in torchvision's layouts,
with decoded tensors cached in `<root>/cache/`. Offline, point `mirror=` or $PFLBENCH_DATA_MIRROR at
a folder laid out like ../shared/data and the files are placed from it on first use (`prepare`
does it ahead of time). Datasets: mnist, fmnist, emnist, cifar10, cifar100 (torchvision's readers),
cifar10-jpeg (a lossy JPEG re-encoding of CIFAR-10, never to be called CIFAR-10), and the
generated synthetic (FedProx) and synthetic-images.
"""

from __future__ import annotations

# Importing the dataset modules registers them in DATASETS.
from pflbench.data import cifar, cifar_jpeg, idx, synthetic, synthetic_images  # noqa: F401
from pflbench.data.dataset import Dataset
from pflbench.data.loading import available, load_dataset, prepare
from pflbench.data.locations import DatasetNotFoundError, data_mirror, data_root
from pflbench.data.sources import DATASETS

# One line per dataset for `pflbench list datasets`: what it is and its options.
DATASET_INFO: dict[str, str] = {name: source.summary() for name, source in DATASETS.items()}

__all__ = [
    "DATASETS",
    "DATASET_INFO",
    "Dataset",
    "DatasetNotFoundError",
    "available",
    "data_mirror",
    "data_root",
    "load_dataset",
    "prepare",
]
