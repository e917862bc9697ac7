"""Interop: imported partition files (FL-bench, JSON), `data export`, and Flower Datasets' partitioners."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import pflbench.partitions  # noqa: F401  (registers the schemes)
from pflbench.config import cell_hash
from pflbench.data.interop import read_partition, write_partition
from pflbench.data.partitioning import SPLITS, ClientSplits, PartitionError, make_partitioner, make_splits
from pflbench.run.spec import load_spec

SHARED = Path(__file__).resolve().parents[2] / "shared"
FLBENCH_DIR = SHARED / "crosscheck" / "flbench-fmnist-10c-4cls"
FMNIST_MIRROR = SHARED / "data" / "fashion-mnist"
# From ../shared/crosscheck/README.md: FL-bench's per-client train sizes of that split.
FLBENCH_TRAIN_SIZES = [5472, 4410, 4002, 4002, 4247, 8085, 5472, 4655, 4249, 4410]

NUM_CLASSES = 10
LABELS = np.random.default_rng(3).permutation(np.repeat(np.arange(NUM_CLASSES), 300))  # 3,000 samples


def splits_of(scheme, params, clients=5, seed=0, labels=LABELS, **kwargs) -> ClientSplits:
    return make_splits(labels, NUM_CLASSES, scheme=scheme, params=params, num_clients=clients, seed=seed, **kwargs)


def assert_same_splits(a: ClientSplits, b: ClientSplits) -> None:
    assert a.num_clients == b.num_clients
    for name in SPLITS:
        for x, y in zip(getattr(a, name), getattr(b, name)):
            np.testing.assert_array_equal(np.sort(x), np.sort(y))


# ---- FL-bench's own file, on Fashion-MNIST as pflbench loads it --------------------------------------


@pytest.fixture(scope="module")
def fmnist_labels(tmp_path_factory):
    if not (FLBENCH_DIR / "partition.pkl").is_file() or not FMNIST_MIRROR.is_dir():
        pytest.skip("the shared FL-bench split or the Fashion-MNIST mirror is not on this machine")
    from pflbench.data import load_dataset

    dataset = load_dataset("fmnist", root=tmp_path_factory.mktemp("data"), mirror=SHARED / "data")
    return dataset.labels.numpy()


def idx_labels(path: Path) -> np.ndarray:
    with gzip.open(path) as file:
        return np.frombuffer(file.read(), dtype=np.uint8, offset=8).astype(np.int64)


def test_fmnist_pool_is_torchvision_train_then_test(fmnist_labels):
    # The index order FL-bench's files use: train set (60,000) then test set (10,000), each in file order.
    expected = np.concatenate(
        [
            idx_labels(FMNIST_MIRROR / "train-labels-idx1-ubyte.gz"),
            idx_labels(FMNIST_MIRROR / "t10k-labels-idx1-ubyte.gz"),
        ]
    )
    np.testing.assert_array_equal(fmnist_labels, expected)


def test_flbench_file_imports_exactly(fmnist_labels):
    with open(FLBENCH_DIR / "partition.pkl", "rb") as file:  # a trusted file: plain pickle for the reference
        raw = pickle.load(file)["data_indices"]
    splits = make_splits(
        fmnist_labels,
        NUM_CLASSES,
        scheme="imported",
        num_clients=10,
        seed=0,
        val_fraction=0.0,
        params={"path": str(FLBENCH_DIR / "partition.pkl"), "format": "flbench"},
    )
    for client, entry in enumerate(raw):
        for name in SPLITS:
            assert set(getattr(splits, name)[client].tolist()) == set(entry[name].tolist())
    assert [len(t) for t in splits.train] == FLBENCH_TRAIN_SIZES
    counts = splits.label_counts(fmnist_labels, NUM_CLASSES)
    assert counts.sum() == 70_000 and ((counts > 0).sum(axis=1) == 4).all()  # every sample; 4 classes each
    train_counts = splits.label_counts(fmnist_labels, NUM_CLASSES, split="train")
    assert train_counts[5, 7] == train_counts.max() == 4916  # README: "one client holds 4,916 samples of class 7"
    for client, entry in enumerate(raw):  # label counts as FL-bench's indices give them
        every = np.concatenate([entry[name] for name in SPLITS])
        np.testing.assert_array_equal(counts[client], np.bincount(fmnist_labels[every], minlength=NUM_CLASSES))

    # val_fraction > 0: val carved from the file's train, stratified; train + val is the file's train.
    carved = make_splits(
        fmnist_labels,
        NUM_CLASSES,
        scheme="imported",
        num_clients=10,
        seed=0,
        val_fraction=0.1,
        params={"path": str(FLBENCH_DIR / "partition.pkl"), "format": "flbench"},
    )
    for client, entry in enumerate(raw):
        assert abs(len(carved.val[client]) - round(0.1 * len(entry["train"]))) <= 1
        assert set(np.concatenate([carved.train[client], carved.val[client]]).tolist()) == set(entry["train"].tolist())


def test_fraction_keeps_the_first_part_of_each_split(fmnist_labels):
    with open(FLBENCH_DIR / "partition.pkl", "rb") as file:
        raw = pickle.load(file)["data_indices"]
    splits = make_splits(
        fmnist_labels,
        NUM_CLASSES,
        scheme="imported",
        num_clients=10,
        seed=0,
        val_fraction=0.0,
        params={"path": str(FLBENCH_DIR / "partition.pkl"), "format": "flbench", "fraction": 0.25},
    )
    for client, entry in enumerate(raw):
        for name in ("train", "test"):
            kept = entry[name][: len(entry[name]) // 4]
            np.testing.assert_array_equal(getattr(splits, name)[client], np.sort(kept))


def test_crosscheck_spec_resolves_the_shared_file():
    if not (FLBENCH_DIR / "partition.pkl").is_file():
        pytest.skip("the shared FL-bench split is not on this machine")
    spec = Path(__file__).resolve().parents[1] / "benchmarks" / "crosscheck-flbench.yaml"
    plan = load_spec(spec)
    params = plan.cells[0].partition_params
    assert Path(params["path"]) == (FLBENCH_DIR / "partition.pkl").resolve()
    assert params["sha256"] == __import__("hashlib").sha256((FLBENCH_DIR / "partition.pkl").read_bytes()).hexdigest()
    assert {c.algorithm for c in plan.cells} == {"fedavg", "local", "fedper", "ditto"}


# ---- export -> import, our JSON format, cell identity -------------------------------------------------


@pytest.mark.parametrize("fmt", ["flbench", "json"])
def test_export_then_import_is_the_identity(tmp_path, fmt):
    original = splits_of("dirichlet", {"alpha": 0.3})
    path = write_partition(
        original, tmp_path / f"partition.{fmt}", fmt, labels=LABELS, num_classes=NUM_CLASSES, dataset="test"
    )
    back = splits_of("imported", {"path": str(path), "format": fmt}, seed=5)  # seed: no effect, val is given
    assert_same_splits(original, back)


def test_export_command_writes_both_formats(tmp_path):
    from pflbench.cli import main

    assert (
        main(
            [
                "data",
                "export",
                "synthetic",
                "--partition",
                "iid",
                "--clients",
                "4",
                "--out",
                str(tmp_path),
                "--root",
                str(tmp_path / "data"),
            ]
        )
        == 0
    )
    assert {p.name for p in tmp_path.iterdir()} >= {"partition.pkl", "all_stats.json", "partition.json"}
    a = read_partition(tmp_path / "partition.pkl", "flbench").splits
    b = read_partition(tmp_path / "partition.json", "json").splits
    assert_same_splits(a, b)
    document = json.loads((tmp_path / "partition.json").read_text())
    assert document["format"] == "pflbench-partition" and len(document["clients"]) == 4


def test_json_without_val_carves_it_and_relative_paths_follow_the_spec(tmp_path):
    clients = [
        {"train": list(range(i * 600, i * 600 + 400)), "test": list(range(i * 600 + 400, i * 600 + 600))}
        for i in range(5)
    ]
    (tmp_path / "split.json").write_text(json.dumps({"clients": clients}))
    splits = splits_of("imported", {"path": str(tmp_path / "split.json"), "format": "json"}, val_fraction=0.1)
    assert [len(v) for v in splits.val] == [40] * 5 and [len(t) for t in splits.train] == [360] * 5

    spec = tmp_path / "specs" / "s.yaml"
    spec.parent.mkdir()
    spec.write_text(
        "matrix: {algorithm: [fedavg], dataset: [synthetic], clients: [5],\n"
        "  partition: [{scheme: imported, params: {path: ../split.json, format: json}}]}\n"
    )
    first = load_spec(spec).cells[0]
    assert first.partition_params["path"] == str((tmp_path / "split.json").resolve())
    clients[0]["train"].pop()  # another file content: another cell
    (tmp_path / "split.json").write_text(json.dumps({"clients": clients}))
    second = load_spec(spec).cells[0]
    assert cell_hash(first) != cell_hash(second)
    with pytest.raises(PartitionError, match="changed since the cell was made"):  # the first cell's file is gone
        splits_of("imported", first.partition_params)

    # The same content elsewhere (another checkout, another folder) is the same cell: the id is the content's.
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "split.json").write_text((tmp_path / "split.json").read_text())
    spec.write_text(spec.read_text().replace("../split.json", "../elsewhere/split.json"))
    third = load_spec(spec).cells[0]
    assert third.partition_params["path"] != second.partition_params["path"]
    assert cell_hash(third) == cell_hash(second)


# ---- bad files: one clear error each ---------------------------------------------------------------


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch SHOULD_NOT_EXIST",))


def write_pickle(path: Path, obj) -> Path:
    path.write_bytes(pickle.dumps(obj))
    return path


def client(train, test, val=()):
    return {
        "train": np.asarray(train, dtype=np.int32),
        "val": np.asarray(val, dtype=np.int32),
        "test": np.asarray(test, dtype=np.int32),
    }


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x80\x04not a pickle at all", "not a readable FL-bench partition.pkl"),
        (pickle.dumps([1, 2, 3]), "expected a dict with 'data_indices'"),
        (
            pickle.dumps({"data_indices": [client([0, 1], [2]), client([2, 3], [4])]}),
            "sample 2 is in client 0's test and in client 1's train",
        ),
        (pickle.dumps({"data_indices": [client([0, 1], [2]), client([3], [])]}), "client 1 has no test samples"),
        (
            pickle.dumps({"data_indices": [client([0, 1], [2]), client([3], [5000])]}),
            "index 5000 is out of range: the dataset has 3000",
        ),
        (pickle.dumps({"data_indices": [client([0, 1], [-2]), client([3], [4])]}), "negative index -2"),
        (
            pickle.dumps({"data_indices": [{"train": np.array([0.5, 1.0]), "test": np.array([2])}]}),
            "client 0's 'train' must be a flat list of integer sample indices",
        ),
    ],
)
def test_bad_flbench_files_are_clear_errors(tmp_path, content, message):
    (tmp_path / "partition.pkl").write_bytes(content)
    with pytest.raises(PartitionError, match=message):
        splits_of("imported", {"path": str(tmp_path / "partition.pkl"), "format": "flbench"}, clients=2)


def test_a_pickle_that_runs_code_is_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_pickle(tmp_path / "partition.pkl", {"data_indices": [RunsCode()]})
    with pytest.raises(PartitionError, match=r"names posix\.system.*can run code"):
        make_partitioner("imported", {"path": "partition.pkl", "format": "flbench"}).resolved()
    assert not (tmp_path / "SHOULD_NOT_EXIST").exists()


def test_wrong_dataset_path_and_client_count_are_clear_errors(tmp_path):
    good = splits_of("iid", {}, clients=2)
    path = write_partition(good, tmp_path / "p.json", "json", labels=LABELS, num_classes=NUM_CLASSES)
    with pytest.raises(PartitionError, match="declares num_samples=3000 but the dataset has 2999"):
        splits_of("imported", {"path": str(path), "format": "json"}, clients=2, labels=LABELS[:2999])
    relabelled = (LABELS + 1) % NUM_CLASSES  # same size, other labels: the declared counts catch it
    with pytest.raises(PartitionError, match="label counts do not match the dataset's labels"):
        splits_of("imported", {"path": str(path), "format": "json"}, clients=2, labels=relabelled)
    flbench = write_partition(
        good, tmp_path / "fl" / "partition.pkl", "flbench", labels=LABELS, num_classes=NUM_CLASSES
    )
    with pytest.raises(PartitionError, match="label counts do not match"):  # FL-bench's all_stats.json beside it
        splits_of("imported", {"path": str(flbench), "format": "flbench"}, clients=2, labels=relabelled)
    with pytest.raises(PartitionError, match="holds 2 clients; set clients: 2"):
        splits_of("imported", {"path": str(path), "format": "json"}, clients=3)
    with pytest.raises(PartitionError, match="no such file"):
        splits_of("imported", {"path": str(tmp_path / "missing.pkl"), "format": "flbench"}, clients=2)
    with pytest.raises(PartitionError, match="format"):
        make_partitioner("imported", {"path": str(path), "format": "csv"})
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(PartitionError, match="not valid JSON"):
        splits_of("imported", {"path": str(tmp_path / "broken.json"), "format": "json"}, clients=2)


# ---- Flower Datasets' partitioners -----------------------------------------------------------------

FLOWER_CASES = [
    ("IidPartitioner", {}),
    ("DirichletPartitioner", {"alpha": 0.3, "seed": 7}),
    ("PathologicalPartitioner", {"num_classes_per_partition": 2}),
    ("ShardPartitioner", {"num_shards_per_partition": 3}),
]


@pytest.fixture(scope="module")
def flower():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # prove that nothing is fetched from the hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return pytest.importorskip("flwr_datasets.partitioner")


@pytest.mark.filterwarnings(
    "ignore:Classes:UserWarning"
)  # the library's note that 2 classes x 5 clients leave some out
def test_flower_partitioners_match_the_library(flower):
    from datasets import Dataset

    for name, kwargs in FLOWER_CASES:
        ours = [
            make_partitioner("flwr", {"partitioner": name, **kwargs}).resolved().assign(LABELS, NUM_CLASSES, 5, None)
            for _ in range(2)
        ]
        extra = {"partition_by": "label"} if name != "IidPartitioner" else {}
        direct = getattr(flower, name)(num_partitions=5, **extra, **kwargs)
        direct.dataset = Dataset.from_dict({"label": LABELS, "row": np.arange(len(LABELS))})
        for i in range(5):
            expected = np.asarray(direct.load_partition(i)["row"])
            np.testing.assert_array_equal(ours[0][i], expected, err_msg=f"{name}, client {i}")
            np.testing.assert_array_equal(ours[1][i], expected, err_msg=f"{name}, client {i}, second call")
    dirichlet = {"partitioner": "DirichletPartitioner", "alpha": 0.3, "seed": 7}
    clients = make_partitioner("flwr", dirichlet).resolved().assign(LABELS, NUM_CLASSES, 5, None)
    splits = splits_of("flwr", dirichlet)
    union = [np.sort(np.concatenate(parts)) for parts in zip(splits.train, splits.val, splits.test)]
    for i in range(5):  # our stratified train/val/test split of each of Flower's clients
        np.testing.assert_array_equal(union[i], np.sort(clients[i]))
        assert abs(len(splits.test[i]) - 0.3 * len(clients[i])) <= 1


def test_flower_mistakes_are_clear_errors(flower):
    with pytest.raises(PartitionError, match="unknown Flower Datasets partitioner 'Dirichlet'"):
        make_partitioner("flwr", {"partitioner": "Dirichlet"})
    with pytest.raises(PartitionError, match="unknown keyword argument of DirichletPartitioner 'alpa'.*alpha"):
        make_partitioner("flwr", {"partitioner": "DirichletPartitioner", "alpa": 0.3}).resolved()
    with pytest.raises(PartitionError, match="missing a required argument: 'alpha'"):
        make_partitioner("flwr", {"partitioner": "DirichletPartitioner"}).resolved()
    with pytest.raises(PartitionError, match="num_partitions.*set by pflbench"):
        make_partitioner("flwr", {"partitioner": "IidPartitioner", "num_partitions": 3})
    with pytest.raises(PartitionError, match="refused by flwr-datasets"):
        splits_of("flwr", {"partitioner": "DirichletPartitioner", "alpha": -1.0})
    with pytest.raises(PartitionError, match="a client got 0 samples"):  # what Flower allows and we cannot run
        splits_of("flwr", {"partitioner": "PathologicalPartitioner", "num_classes_per_partition": 0})
    with pytest.raises(PartitionError, match="made with flwr-datasets 0.0.1"):
        make_partitioner("flwr", {"partitioner": "IidPartitioner", "version": "0.0.1"}).resolved()
