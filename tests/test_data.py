"""Tests of pflbench.data on small files generated here in each dataset's exact on-disk format.

The real files are not needed (CIFAR-100 and EMNIST are not even available offline); the parsing
is torchvision's own in every case. Nothing is downloaded: a mirror is configured for every test
(which turns the download default off) and torchvision's download functions fail the test if called.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import string
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar as tv_cifar
import torchvision.datasets.mnist as tv_mnist
import torchvision.datasets.utils as tv_utils
from PIL import Image
from torchvision.datasets import CIFAR10, CIFAR100

from pflbench.data import (
    DATASET_INFO,
    DATASETS,
    Dataset,
    DatasetNotFoundError,
    available,
    data_mirror,
    data_root,
    load_dataset,
    prepare,
)
from pflbench.registry import UnknownNameError

ALL_NAMES = ["cifar10", "cifar10-jpeg", "cifar100", "emnist", "fmnist", "mnist", "synthetic", "synthetic-images"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may reach the network, and none uses the real ./data or a user's mirror."""
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp_path / "default-root"))
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "empty-mirror"))  # turns the download default off

    def no_download(*args, **kwargs):
        raise AssertionError(f"a test tried to download: {args}")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", no_download)
    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", no_download)
    monkeypatch.setattr(tv_utils, "download_url", no_download)


# ---- writers of the on-disk formats ----------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX (SN3 / "Pascal Vincent") file of uint8 data: magic 0x0000 08 <ndim>, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def idx_dataset(prefixes: tuple[str, str], labels: range, seed: int, n_train: int = 30, n_test: int = 12):
    """IDX files for a train and a test part (file name -> bytes), and the images/labels they hold."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n_train + n_test, 28, 28), dtype=np.uint8)
    targets = rng.integers(labels.start, labels.stop, n_train + n_test).astype(np.uint8)
    files = {}
    for prefix, part in zip(prefixes, (slice(0, n_train), slice(n_train, None))):
        files[f"{prefix}-images-idx3-ubyte"] = idx_bytes(images[part])
        files[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(targets[part])
    return files, images, targets


def write_files(folder: Path, files: dict[str, bytes], gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


def cifar_dataset(tv_class: type[CIFAR10], seed: int, per_file: int = 6):
    """The python-pickle files of torchvision's CIFAR folder (name -> bytes), and the images/labels they hold."""
    rng = np.random.default_rng(seed)
    names = tv_class.train_list + tv_class.test_list
    is_100 = tv_class is CIFAR100
    num_classes = 100 if is_100 else 10
    images = rng.integers(0, 256, (per_file * len(names), 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, num_classes, per_file * len(names))
    files = {}
    for i, (name, _md5) in enumerate(names):
        part = slice(i * per_file, (i + 1) * per_file)
        entry = {
            "batch_label": f"batch {i}",
            "data": images[part].reshape(per_file, 3072),  # row-major R, G, B planes, as in the real files
            "filenames": [f"img_{j}.png" for j in range(per_file)],
        }
        if is_100:
            entry["fine_labels"] = labels[part].tolist()
            entry["coarse_labels"] = (labels[part] // 5).tolist()
        else:
            entry["labels"] = labels[part].tolist()
        files[name] = pickle.dumps(entry, protocol=2)
    class_names = [f"class_{c:03d}" for c in range(num_classes)]
    if is_100:
        meta = {"fine_label_names": class_names, "coarse_label_names": class_names[:20]}
    else:
        meta = {"label_names": class_names, "num_cases_per_batch": per_file, "num_vis": 3072}
    files[tv_class.meta["filename"]] = pickle.dumps(meta, protocol=2)
    return files, images, labels, class_names


def accept_generated_cifar_files(monkeypatch, tv_class: type[CIFAR10], files: dict[str, bytes]) -> None:
    """torchvision checks each CIFAR file against the md5 of the real file, which generated files
    cannot match. Point its list of md5s at the generated files instead: the check still runs (a
    changed file is still rejected) and the parsing is untouched."""
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in files.items()}
    monkeypatch.setattr(tv_class, "train_list", [[n, md5[n]] for n, _ in tv_class.train_list])
    monkeypatch.setattr(tv_class, "test_list", [[n, md5[n]] for n, _ in tv_class.test_list])
    monkeypatch.setattr(tv_class, "meta", {**tv_class.meta, "md5": md5[tv_class.meta["filename"]]})


def jpeg_zip(path: Path, classes: list[str], per_split: dict[str, int], seed: int) -> dict[str, bytes]:
    """A zip in the cifar10-jpeg layout (split/class/NNNN.jpg); returns member name -> JPEG bytes."""
    rng = np.random.default_rng(seed)
    members = {}
    for split, count in per_split.items():
        for name in classes:
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, format="JPEG", quality=75)
                members[f"{split}/{name}/{i:04d}.jpg"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for split in per_split:  # folder entries first, as in the real archive
            z.writestr(f"{split}/", b"")
        for name, data in members.items():
            z.writestr(name, data)
    return members


def decoded_jpeg(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def assert_pooled(ds: Dataset, images: np.ndarray, labels: np.ndarray, n_train: int) -> None:
    """`ds` holds exactly `images`/`labels`, train part first, with correct statistics."""
    assert ds.inputs.dtype == torch.uint8 and ds.labels.dtype == torch.int64
    assert ds.input_shape == images.shape[1:] and len(ds) == len(images)
    assert torch.equal(ds.inputs, torch.from_numpy(images))  # pixels round-trip exactly
    assert torch.equal(ds.labels, torch.from_numpy(labels.astype(np.int64)))
    assert ds.source_split.tolist() == [0] * n_train + [1] * (len(images) - n_train)
    pixels = images.astype(np.float64) / 255
    np.testing.assert_allclose(ds.mean, pixels.mean(axis=(0, 2, 3)), atol=1e-9)
    np.testing.assert_allclose(ds.std, pixels.std(axis=(0, 2, 3)), atol=1e-9)
    assert ds.checksum.startswith("sha256:") and len(ds.checksum) == 7 + 64


# ---- registry, options and locations ----------------------------------------------------------


def test_every_dataset_is_registered_and_described():
    assert DATASETS.names() == ALL_NAMES
    assert sorted(DATASET_INFO) == ALL_NAMES
    assert "split=balanced|byclass|letters|digits" in DATASET_INFO["emnist"]
    assert "not CIFAR-10" in DATASET_INFO["cifar10-jpeg"]
    assert "alpha=" in DATASET_INFO["synthetic"] and "seed=" in DATASET_INFO["synthetic-images"]


def test_wrong_names_and_options_say_what_is_allowed():
    with pytest.raises(UnknownNameError, match=r"'fminst' \(did you mean 'fmnist'\?\).*cifar10-jpeg"):
        load_dataset("fminst")
    with pytest.raises(ValueError, match=r"unknown option 'splt' for dataset 'emnist'.*split=balanced"):
        load_dataset("emnist", splt="letters")
    with pytest.raises(ValueError, match=r"option 'split' of dataset 'emnist' must be one of balanced, byclass"):
        load_dataset("emnist", split="bymerge")
    with pytest.raises(ValueError, match=r"option 'num_samples' of dataset 'synthetic' must be int"):
        load_dataset("synthetic", num_samples=True)
    with pytest.raises(ValueError, match=r"option 'alpha' of dataset 'synthetic' must be >= 0"):
        load_dataset("synthetic", alpha=-1)
    with pytest.raises(ValueError, match=r"unknown option 'download' for dataset 'cifar10-jpeg'"):
        load_dataset("cifar10-jpeg", download=False)


def test_data_root_and_mirror_resolution(monkeypatch, tmp_path):
    assert data_root(tmp_path / "a") == tmp_path / "a"
    assert data_root() == tmp_path / "default-root"  # from $PFLBENCH_DATA
    monkeypatch.delenv("PFLBENCH_DATA")
    monkeypatch.chdir(tmp_path)
    assert data_root() == tmp_path / "data"
    assert data_mirror(tmp_path / "m") == tmp_path / "m"
    assert data_mirror() == tmp_path / "empty-mirror"  # from $PFLBENCH_DATA_MIRROR
    monkeypatch.delenv("PFLBENCH_DATA_MIRROR")
    assert data_mirror() is None


# ---- torchvision-backed datasets ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name, folder, classes",
    [
        ("mnist", "MNIST", tv_mnist.MNIST.classes),
        ("fmnist", "FashionMNIST", tv_mnist.FashionMNIST.classes),
    ],
)
def test_mnist_like_load_from_idx_files(tmp_path, name, folder, classes):
    files, images, labels = idx_dataset(("train", "t10k"), range(10), seed=1)
    write_files(tmp_path / folder / "raw", files)
    ds = load_dataset(name, root=tmp_path)
    assert ds.name == name and ds.num_classes == 10 and ds.classes == classes
    assert_pooled(ds, images[:, None], labels, n_train=30)
    assert (tmp_path / "cache" / f"{name}.pt").is_file()


@pytest.mark.parametrize(
    "split, file_labels, num_classes, first_classes",
    [
        ("balanced", range(0, 47), 47, ["0", "1"]),
        ("letters", range(1, 27), 26, ["a", "b"]),  # the files label letters 1..26
    ],
)
def test_emnist_splits_load_with_labels_from_zero(tmp_path, split, file_labels, num_classes, first_classes):
    prefixes = (f"emnist-{split}-train", f"emnist-{split}-test")
    files, images, labels = idx_dataset(prefixes, file_labels, seed=2)
    write_files(tmp_path / "EMNIST" / "raw", files)
    options = {} if split == "balanced" else {"split": split}  # balanced is the default
    ds = load_dataset("emnist", root=tmp_path, **options)
    expected_labels = labels - 1 if split == "letters" else labels
    assert_pooled(ds, images[:, None], expected_labels, n_train=30)
    assert ds.num_classes == num_classes and len(ds.classes) == num_classes
    assert ds.classes[:2] == first_classes
    if split == "letters":
        assert ds.classes == list(string.ascii_lowercase)
    assert (tmp_path / "cache" / f"emnist-split={split}.pt").is_file()


@pytest.mark.parametrize("name, tv_class", [("cifar10", CIFAR10), ("cifar100", CIFAR100)])
def test_cifar_loads_from_python_batches(monkeypatch, tmp_path, name, tv_class):
    files, images, labels, class_names = cifar_dataset(tv_class, seed=3)
    write_files(tmp_path / tv_class.base_folder, files)
    accept_generated_cifar_files(monkeypatch, tv_class, files)
    ds = load_dataset(name, root=tmp_path)
    n_train = 6 * len(tv_class.train_list)
    assert_pooled(ds, images, labels, n_train=n_train)
    assert ds.num_classes == len(class_names) and ds.classes == class_names


def test_cifar_file_that_fails_torchvisions_md5_check_is_reported(monkeypatch, tmp_path):
    files, *_ = cifar_dataset(CIFAR10, seed=4)
    write_files(tmp_path / CIFAR10.base_folder, files)
    accept_generated_cifar_files(monkeypatch, CIFAR10, files)
    (tmp_path / CIFAR10.base_folder / "data_batch_3").write_bytes(b"corrupted")
    reason = r"(?s)'cifar10'.*the files could not be read: Dataset not found or corrupted"
    with pytest.raises(DatasetNotFoundError, match=reason):
        load_dataset("cifar10", root=tmp_path)


def test_cifar10_jpeg_is_extracted_from_the_zip_and_decoded(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    members = jpeg_zip(mirror / "cifar10-jpeg.zip", ["truck", "airplane", "cat"], {"train": 4, "test": 2}, seed=5)
    ds = load_dataset("cifar10-jpeg", root=tmp_path / "root", mirror=mirror)
    assert ds.name == "cifar10-jpeg" and ds.classes == ["airplane", "cat", "truck"]  # ImageFolder's sorted order
    assert (tmp_path / "root" / "cifar10-jpeg" / "train" / "truck" / "0003.jpg").is_file()
    order = [
        f"{split}/{c}/{i:04d}.jpg" for split, n in (("train", 4), ("test", 2)) for c in ds.classes for i in range(n)
    ]
    expected = np.stack([decoded_jpeg(members[m]) for m in order]).transpose(0, 3, 1, 2)
    labels = np.array([ds.classes.index(m.split("/")[1]) for m in order])
    assert_pooled(ds, expected, labels, n_train=12)


# ---- cache, mirror, prepare, availability -----------------------------------------------------


def test_second_load_comes_from_the_cache(tmp_path):
    files, images, labels = idx_dataset(("train", "t10k"), range(10), seed=6)
    write_files(tmp_path / "MNIST" / "raw", files)
    first = load_dataset("mnist", root=tmp_path)
    (tmp_path / "MNIST").rename(tmp_path / "MNIST-moved")  # the source files are gone
    second = load_dataset("mnist", root=tmp_path)
    for field in ("inputs", "labels", "source_split"):
        assert torch.equal(getattr(first, field), getattr(second, field))
    assert (second.mean, second.std, second.checksum, second.classes, second.num_classes) == (
        first.mean,
        first.std,
        first.checksum,
        first.classes,
        first.num_classes,
    )
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary file left behind


def test_prepare_places_every_mirror_form_where_torchvision_looks(monkeypatch, tmp_path):
    mirror, root = tmp_path / "mirror", tmp_path / "root"
    # The layout of ../shared/data: gzipped IDX folders and the cifar10-jpeg zip ...
    mnist_files, mnist_images, _ = idx_dataset(("train", "t10k"), range(10), seed=7)
    write_files(mirror / "mnist", mnist_files, gz=True)
    fmnist_files, *_ = idx_dataset(("train", "t10k"), range(10), seed=8)
    write_files(mirror / "fashion-mnist", fmnist_files, gz=True)
    jpeg_zip(mirror / "cifar10-jpeg.zip", ["cat", "dog"], {"train": 2, "test": 1}, seed=9)
    # ... plus what a user may have: torchvision's EMNIST gzip.zip, a CIFAR-10 tarball, an extracted CIFAR-100.
    emnist_files, *_ = idx_dataset(("emnist-balanced-train", "emnist-balanced-test"), range(47), seed=10)
    (mirror / "emnist").mkdir()
    with zipfile.ZipFile(mirror / "emnist" / "gzip.zip", "w") as z:
        for name, data in emnist_files.items():
            z.writestr(f"gzip/{name}.gz", gzip.compress(data))
    cifar10_files, *_ = cifar_dataset(CIFAR10, seed=11)
    accept_generated_cifar_files(monkeypatch, CIFAR10, cifar10_files)
    with tarfile.open(mirror / "cifar-10-python.tar.gz", "w:gz") as tar:
        for name, data in cifar10_files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cifar100_files, *_ = cifar_dataset(CIFAR100, seed=12)
    accept_generated_cifar_files(monkeypatch, CIFAR100, cifar100_files)
    write_files(mirror / "cifar-100-python", cifar100_files)

    lines = prepare(root=root, mirror=mirror)

    report = "\n".join(lines)
    for name in ("mnist", "fmnist", "emnist", "cifar10", "cifar100", "cifar10-jpeg"):
        assert f"{name}: decoded in" in report
    assert "synthetic" not in report  # generated datasets need no preparation
    raw = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    assert raw.read_bytes() == mnist_files["train-images-idx3-ubyte"]  # decompressed, as torchvision expects
    assert (root / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").is_file()
    assert (root / "EMNIST" / "raw" / "emnist-balanced-test-images-idx3-ubyte").is_file()
    assert (root / "cifar-10-batches-py" / "batches.meta").is_file()
    assert (root / "cifar-100-python" / "meta").is_file()
    assert (root / "cifar10-jpeg" / "test" / "dog" / "0000.jpg").is_file()
    cached = sorted(p.name for p in (root / "cache").iterdir())
    assert cached == [
        "cifar10-jpeg.pt",
        "cifar10.pt",
        "cifar100.pt",
        "emnist-split=balanced.pt",
        "fmnist.pt",
        "mnist.pt",
    ]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folders left behind
    assert torch.equal(load_dataset("mnist", root=root, mirror=mirror).inputs[:, 0], torch.from_numpy(mnist_images))
    again = "\n".join(prepare(["mnist", "cifar10"], root=root, mirror=mirror))
    assert "mnist: already cached" in again and "cifar10: already cached" in again and "decoded" not in again


def test_prepare_without_the_files_skips_or_raises(tmp_path):
    lines = prepare(root=tmp_path / "root", mirror=tmp_path / "mirror")
    assert len(lines) == 6 and all("skipped" in line for line in lines)
    assert prepare(["synthetic"], root=tmp_path) == ["synthetic: generated on demand, nothing to prepare"]
    with pytest.raises(DatasetNotFoundError):
        prepare(["cifar100"], root=tmp_path / "root", mirror=tmp_path / "mirror")


def test_load_uses_the_mirror_from_the_environment(monkeypatch, tmp_path):
    files, images, _ = idx_dataset(("train", "t10k"), range(10), seed=13)
    write_files(tmp_path / "shared" / "fashion-mnist", files, gz=True)
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp_path / "root"))
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "shared"))
    ds = load_dataset("fmnist")
    assert torch.equal(ds.inputs[:, 0], torch.from_numpy(images))
    assert (tmp_path / "root" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()


def test_missing_dataset_error_names_the_dataset_and_every_place_looked(monkeypatch, tmp_path):
    root, mirror = tmp_path / "root", tmp_path / "mirror"
    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("cifar100", root=root, mirror=mirror)
    message = str(caught.value)
    assert isinstance(caught.value, FileNotFoundError)
    assert message.startswith("dataset 'cifar100' is not available here")
    for path in (
        root / "cifar-100-python" / "train",
        root / "cache" / "cifar100.pt",
        mirror / "cifar-100-python.tar.gz",
        mirror / "cifar-100-python",
    ):
        assert str(path) in message
    assert "PFLBENCH_DATA_MIRROR" in message and "pflbench data prepare --from DIR" in message
    assert "download=True" in message

    with pytest.raises(DatasetNotFoundError, match=r"(?s)'emnist'.*emnist-letters-train-images-idx3-ubyte"):
        load_dataset("emnist", root=root, split="letters")
    monkeypatch.delenv("PFLBENCH_DATA_MIRROR")
    with pytest.raises(DatasetNotFoundError, match=r"(?s)no mirror configured.*cannot be downloaded"):
        load_dataset("cifar10-jpeg", root=root)


def test_download_runs_torchvisions_own_download(monkeypatch, tmp_path):
    """Without a mirror the default is to download, through torchvision's MNIST.download (its
    network function is replaced by one serving generated files)."""
    monkeypatch.delenv("PFLBENCH_DATA_MIRROR")
    files, images, _ = idx_dataset(("train", "t10k"), range(10), seed=14)
    requested = []

    def serve(url, download_root, filename, md5):
        requested.append(url)
        Path(download_root, filename).write_bytes(gzip.compress(files[filename.removesuffix(".gz")]))
        tv_utils.extract_archive(str(Path(download_root, filename)), download_root)

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", serve)
    ds = load_dataset("mnist", root=tmp_path)
    assert torch.equal(ds.inputs[:, 0], torch.from_numpy(images))
    assert len(requested) == 4 and all(url.startswith(tv_mnist.MNIST.mirrors[0]) for url in requested)

    def unreachable(*args, **kwargs):
        raise RuntimeError("network unreachable")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", unreachable)
    # torchvision 0.29 wraps the error ("Error downloading ..."), 0.26 (the GPU image's) passes it on as is
    reason = r"(?s)'fmnist'.*the download failed: (Error downloading.*)?network unreachable"
    with pytest.raises(DatasetNotFoundError, match=reason):
        load_dataset("fmnist", root=tmp_path)


def test_available_reports_what_loads_offline(tmp_path):
    root, mirror = tmp_path / "root", tmp_path / "mirror"
    files, *_ = idx_dataset(("train", "t10k"), range(10), seed=15)
    write_files(root / "MNIST" / "raw", files)
    write_files(mirror / "fashion-mnist", files, gz=True)
    assert available(root, mirror) == {
        "cifar10": False,
        "cifar10-jpeg": False,
        "cifar100": False,
        "emnist": False,
        "fmnist": True,
        "mnist": True,
        "synthetic": True,
        "synthetic-images": True,
    }
    assert not (root / "FashionMNIST").exists()  # checking places nothing


# ---- generated datasets and the Dataset object ------------------------------------------------


def test_synthetic_is_fedprox_shaped_balanced_and_seeded():
    ds = load_dataset("synthetic", num_samples=1003, seed=1)
    assert ds.inputs.shape == (1003, 60) and ds.inputs.dtype == torch.float32
    assert ds.input_shape == (60,) and ds.num_classes == 10 and not ds.is_image
    counts = torch.bincount(ds.labels, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003  # every class gets its share
    same = load_dataset("synthetic", num_samples=1003, seed=1)
    assert torch.equal(ds.inputs, same.inputs) and torch.equal(ds.labels, same.labels)
    assert ds.checksum == same.checksum
    other = load_dataset("synthetic", num_samples=1003, seed=2)
    assert not torch.equal(ds.inputs, other.inputs) and ds.checksum != other.checksum
    assert load_dataset("synthetic", num_samples=1003, seed=1, alpha=0.5).checksum != ds.checksum
    # Heterogeneous sources: the features' spread follows Sigma = diag(j^-1.2) plus the sources' offsets.
    assert ds.std[0] > ds.std[-1]


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_synthetic_images_are_seeded_uint8_images(channels, size):
    ds = load_dataset("synthetic-images", channels=channels, size=size, num_samples=200, seed=3)
    assert ds.inputs.shape == (200, channels, size, size) and ds.inputs.dtype == torch.uint8
    assert torch.bincount(ds.labels).tolist() == [20] * 10
    assert len(ds.mean) == channels and ds.is_image
    again = load_dataset("synthetic-images", channels=channels, size=size, num_samples=200, seed=3)
    assert torch.equal(ds.inputs, again.inputs) and torch.equal(ds.labels, again.labels)
    other = load_dataset("synthetic-images", channels=channels, size=size, num_samples=200, seed=4)
    assert not torch.equal(ds.inputs, other.inputs)


def test_synthetic_images_are_learnable_but_not_trivial():
    torch.manual_seed(0)
    ds = load_dataset("synthetic-images", num_samples=1000, seed=0)
    x, y = ds.normalized(), ds.labels
    train, test = slice(0, 700), slice(700, None)
    means = torch.stack([x[train][y[train] == c].mean(0) for c in range(10)]).flatten(1)
    nearest_mean = (torch.cdist(x[test].flatten(1), means).argmin(1) == y[test]).float().mean().item()
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(512, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _epoch in range(4):
        for batch in torch.randperm(700).split(50):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    assert accuracy > 0.4  # chance is 0.1
    assert nearest_mean < 0.95  # one template per class does not solve it


def test_normalized_standardises_per_channel():
    images = load_dataset("synthetic-images", channels=3, size=32, num_samples=100)
    x = images.normalized("cpu")
    assert x.dtype == torch.float32 and x.shape == images.inputs.shape
    torch.testing.assert_close(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(x.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-4, rtol=0)
    vectors = load_dataset("synthetic", num_samples=500).normalized()
    torch.testing.assert_close(vectors.mean(dim=0), torch.zeros(60), atol=1e-4, rtol=0)


def test_dataset_rejects_inconsistent_tensors():
    inputs = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="labels must lie in 0..1"):
        Dataset.build("x", inputs, torch.tensor([0, 1, 2, 0]), num_classes=2, checksum="-")
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        Dataset.build("x", inputs, torch.tensor([0, 1]), num_classes=2, checksum="-")
