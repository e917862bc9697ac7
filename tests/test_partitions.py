"""Partition schemes and the per-client train/val/test splits (pflbench.data.partitioning, pflbench/partitions/)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from budgets import scaled

import pflbench.partitions  # noqa: F401  (registers the schemes)
from pflbench.data.partitioning import (
    PARTITIONS,
    ClientSplits,
    PartitionError,
    format_label_counts,
    make_partitioner,
    make_splits,
)
from pflbench.registry import UnknownNameError
from pflbench.reports.figures import plot_label_counts

NUM_CLASSES = 10
LABELS = np.repeat(np.arange(NUM_CLASSES), 700)  # 10 classes x 700, shuffled below
LABELS = np.random.default_rng(123).permutation(LABELS)
FMNIST_LIKE = np.random.default_rng(7).permutation(np.repeat(np.arange(NUM_CLASSES), 7000))
SCHEMES = ["iid", "pathological", "dominant", "dirichlet"]


def split(scheme, params=None, num_clients=10, seed=0, labels=LABELS, **kwargs) -> ClientSplits:
    return make_splits(
        labels, NUM_CLASSES, scheme=scheme, params=params or {}, num_clients=num_clients, seed=seed, **kwargs
    )


def all_indices(splits: ClientSplits) -> np.ndarray:
    return np.concatenate(splits.train + splits.val + splits.test)


def test_builtin_schemes_are_registered():
    assert set(SCHEMES) <= set(PARTITIONS.names())


@pytest.mark.parametrize("num_clients", [10, 100])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_splits_are_disjoint_nonempty_and_int64(scheme, num_clients):
    splits = split(scheme, num_clients=num_clients)
    assert splits.num_clients == num_clients
    indices = all_indices(splits)
    assert indices.dtype == np.int64
    assert len(np.unique(indices)) == len(indices)  # disjoint across clients and across splits
    assert indices.min() >= 0 and indices.max() < len(LABELS)
    for client in range(num_clients):
        assert len(splits.train[client]) > 0 and len(splits.test[client]) > 0
        assert len(splits.val[client]) > 0  # val_fraction=0.1 and every client has >= 2 train samples here


@pytest.mark.parametrize("num_clients", [10, 100])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_sample_is_used(scheme, num_clients):
    # iid and dirichlet always use every sample; pathological and dominant do when no size cap is set
    # and every class divides evenly among its holders, as with FashionMNIST's 10 x 7000 labels and
    # 10 or 100 clients (with 10 x 700 and 100 clients they leave a remainder to keep amounts equal).
    used = all_indices(split(scheme, num_clients=num_clients, labels=FMNIST_LIKE))
    assert np.array_equal(np.sort(used), np.arange(len(FMNIST_LIKE)))


def test_iid_shares_are_equal():
    sizes = split("iid", num_clients=7).label_counts(LABELS, NUM_CLASSES).sum(axis=1)
    assert sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("num_clients,k", [(10, 4), (100, 4), (7, 3), (30, 1)])
def test_pathological_gives_k_classes_in_equal_amounts(num_clients, k):
    counts = split("pathological", {"classes_per_client": k}, num_clients=num_clients).label_counts(LABELS, NUM_CLASSES)
    held = counts > 0
    assert (held.sum(axis=1) == k).all()
    amounts = counts[held].reshape(num_clients, k)
    assert (amounts == amounts[0, 0]).all()  # one amount for every (client, class), hence equal client sizes
    holders = held.sum(axis=0)
    assert holders.max() - holders.min() <= 1  # every class is held by about the same number of clients


@pytest.mark.parametrize("seed", [0, 1])
def test_random_classes_draws_k_classes_per_client_independently(seed):
    counts = split(
        "random-classes",
        {"classes_per_client": 4, "samples_per_client": 700},
        num_clients=10,
        seed=seed,
        labels=FMNIST_LIKE,
    ).label_counts(FMNIST_LIKE, NUM_CLASSES)
    held = counts > 0
    assert (held.sum(axis=1) == 4).all() and (counts[held] == 175).all()
    balanced = (
        split(
            "pathological",
            {"classes_per_client": 4, "samples_per_client": 700},
            num_clients=10,
            seed=seed,
            labels=FMNIST_LIKE,
        ).label_counts(FMNIST_LIKE, NUM_CLASSES)
        > 0
    )
    assert (balanced.sum(axis=0) == 4).all()  # balanced: every class held by 4 of the 10 clients
    assert (held.sum(axis=0) != 4).any()  # independent draws: some class by more, some by fewer
    shared = (held[:, None, :] & held[None, :, :]).sum(-1)[np.triu_indices(10, 1)]
    assert shared.max() >= 3


def test_pathological_samples_per_client_fixes_the_size():
    counts = split("pathological", {"samples_per_client": 302}, num_clients=20).label_counts(LABELS, NUM_CLASSES)
    assert (counts.sum(axis=1) == 302).all()
    amounts = np.sort(counts, axis=1)[:, -4:]
    assert (amounts.min(axis=1) > 0).all() and (amounts.max(axis=1) - amounts.min(axis=1) <= 1).all()


@pytest.mark.parametrize("num_clients,d,share", [(10, 2, 0.6), (100, 2, 0.6), (13, 3, 0.8)])
def test_dominant_classes_carry_the_share(num_clients, d, share):
    params = {"dominant_classes": d, "dominant_share": share}
    counts = split("dominant", params, num_clients=num_clients).label_counts(LABELS, NUM_CLASSES)
    assert (counts > 0).all()  # every client holds every class
    ordered = np.sort(counts, axis=1)[:, ::-1]
    dominant, others = ordered[:, :d], ordered[:, d:]
    assert (dominant.min(axis=1) > others.max(axis=1)).all()
    sizes = counts.sum(axis=1)
    assert (sizes == sizes[0]).all()
    assert np.abs(dominant.sum(axis=1) - share * sizes).max() <= 0.5  # round(share * size)
    is_dominant = counts >= dominant.min(axis=1, keepdims=True)
    per_class = is_dominant.sum(axis=0)
    assert per_class.max() - per_class.min() <= 1  # dominant classes rotate evenly


def test_dominant_samples_per_client_fixes_the_size():
    counts = split("dominant", {"samples_per_client": 250}, num_clients=20).label_counts(LABELS, NUM_CLASSES)
    assert (counts.sum(axis=1) == 250).all()
    assert (np.sort(counts, axis=1)[:, -2:].sum(axis=1) == 150).all()  # 0.6 * 250


def test_dirichlet_respects_min_samples_and_skews_with_alpha():
    skewed = split("dirichlet", {"alpha": 0.1, "min_samples": 50}, num_clients=20).label_counts(LABELS, NUM_CLASSES)
    assert skewed.sum(axis=1).min() >= 50
    mild = split("dirichlet", {"alpha": 100.0}, num_clients=20).label_counts(LABELS, NUM_CLASSES)

    def mean_distance_from_uniform(counts):
        shares = counts / counts.sum(axis=1, keepdims=True)
        return np.abs(shares - 1 / NUM_CLASSES).sum(axis=1).mean()

    assert mean_distance_from_uniform(skewed) > 3 * mean_distance_from_uniform(mild)


def test_dirichlet_mean_samples_per_client_shrinks_every_class_alike():
    splits = split("dirichlet", {"mean_samples_per_client": 100}, num_clients=20)
    counts = splits.label_counts(LABELS, NUM_CLASSES)
    assert counts.sum() == 2000  # 20 clients x 100 on average: 200 of each class's 700
    assert (counts.sum(axis=0) == 200).all()
    assert len(np.unique(all_indices(splits))) == 2000
    with pytest.raises(PartitionError, match="mean_samples_per_client=400"):
        split("dirichlet", {"mean_samples_per_client": 400}, num_clients=20)
    with pytest.raises(PartitionError, match="mean_samples_per_client=5.*min_samples=10"):
        split("dirichlet", {"mean_samples_per_client": 5}, num_clients=20)


def test_dirichlet_small_alpha_many_clients_never_hangs():
    start = time.perf_counter()
    try:
        split("dirichlet", {"alpha": 0.01}, num_clients=100)
    except PartitionError as exc:
        assert "alpha" in str(exc) and "min_samples" in str(exc)
    assert time.perf_counter() - start < scaled(5)  # a hang is caught; a loaded machine's slowness is not one


def test_dirichlet_gives_up_with_advice():
    start = time.perf_counter()
    with pytest.raises(PartitionError, match=r"alpha=0\.001.*larger alpha or a smaller min_samples"):
        split("dirichlet", {"alpha": 0.001, "min_samples": 500}, num_clients=10)
    assert time.perf_counter() - start < scaled(5)  # a hang is caught; a loaded machine's slowness is not one


@pytest.mark.parametrize("scheme", SCHEMES)
def test_train_test_and_val_share_the_label_distribution(scheme):
    splits = split(scheme, num_clients=20, train_fraction=0.7, val_fraction=0.1)
    client = splits.label_counts(LABELS, NUM_CLASSES)
    train_and_val = splits.label_counts(LABELS, NUM_CLASSES, "train") + splits.label_counts(LABELS, NUM_CLASSES, "val")
    # round(0.7 * n) shared by largest remainder: each class within 1.5 samples of 70%
    assert np.abs(train_and_val - 0.7 * client).max() <= 1.5
    val = splits.label_counts(LABELS, NUM_CLASSES, "val")
    assert np.abs(val - 0.1 * train_and_val).max() <= 1.5
    assert np.array_equal(splits.label_counts(LABELS, NUM_CLASSES, "test") + train_and_val, client)


def test_tiny_clients_still_get_train_and_test():
    labels = np.arange(6) % 3
    splits = make_splits(labels, 3, scheme="iid", params={}, num_clients=3, seed=0)
    assert all(len(t) == 1 for t in splits.train) and all(len(t) == 1 for t in splits.test)
    assert all(len(v) == 0 for v in splits.val)  # nothing left to carve from a single train sample


def test_zero_val_fraction_gives_empty_val():
    splits = split("iid", val_fraction=0.0)
    assert all(len(v) == 0 for v in splits.val)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_seed_same_splits_other_seed_other_splits(scheme):
    first, again, other = split(scheme, seed=1), split(scheme, seed=1), split(scheme, seed=2)
    for name in ("train", "val", "test"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(first, name), getattr(again, name)))
    assert not all(np.array_equal(a, b) for a, b in zip(first.train, other.train))


def test_split_fractions_do_not_change_the_assignment():
    a, b = split("dirichlet", train_fraction=0.7), split("dirichlet", train_fraction=0.5)
    assert np.array_equal(a.label_counts(LABELS, NUM_CLASSES), b.label_counts(LABELS, NUM_CLASSES))


def test_cache_round_trip(tmp_path, monkeypatch):
    first = split("pathological", {"classes_per_client": 4}, cache_dir=tmp_path, dataset_key="fmnist")
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))

    # The explicit default and the omitted param are the same request, so this must load the file.
    monkeypatch.setattr(type(make_partitioner("pathological", {})), "assign", lambda *a: pytest.fail("not cached"))
    again = split("pathological", {}, cache_dir=tmp_path, dataset_key="fmnist")
    for name in ("train", "val", "test"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(first, name), getattr(again, name)))
    monkeypatch.undo()

    split("pathological", {}, cache_dir=tmp_path, dataset_key="fmnist", seed=1)
    split("pathological", {}, cache_dir=tmp_path, dataset_key="cifar10")
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_save_load_keeps_empty_splits(tmp_path):
    splits = ClientSplits(
        train=[np.array([3, 1]), np.array([0])],
        val=[np.array([], dtype=np.int64)] * 2,
        test=[np.array([2]), np.array([4, 5])],
    )
    splits.save(tmp_path / "s.npz")
    loaded = ClientSplits.load(tmp_path / "s.npz")
    for name in ("train", "val", "test"):
        assert [a.tolist() for a in getattr(loaded, name)] == [a.tolist() for a in getattr(splits, name)]


@pytest.mark.parametrize(
    "scheme,params,num_clients,labels,words",
    [
        ("pathological", {"classes_per_client": 12}, 10, LABELS, ["classes_per_client=12", "1..10"]),
        ("pathological", {"samples_per_client": 5000}, 10, LABELS, ["samples_per_client=5000", "4..700"]),
        ("pathological", {}, 30, np.arange(100) % 10, ["num_clients=30", "at most 25"]),
        ("random-classes", {}, 30, np.arange(100) % 10, ["num_clients=30", "at most 10"]),
        ("random-classes", {"samples_per_client": 300}, 10, LABELS, ["samples_per_client=300", "4..280"]),
        ("dominant", {"dominant_classes": 10}, 10, LABELS, ["dominant_classes=10", "1..9"]),
        ("dominant", {"dominant_share": 0.2}, 10, LABELS, ["dominant_share=0.2", "0.2 < dominant_share < 1"]),
        ("dominant", {"samples_per_client": 5000}, 10, LABELS, ["samples_per_client=5000", "at most 700"]),
        ("dominant", {"samples_per_client": 12}, 10, LABELS, ["samples_per_client=12"]),
        ("dirichlet", {"min_samples": 500}, 100, LABELS, ["min_samples=500", "at most 70"]),
    ]
    + [(scheme, {}, 1000, np.arange(100) % 10, ["num_clients=1000", "at most 50"]) for scheme in SCHEMES],
)
def test_impossible_requests_name_the_parameter(scheme, params, num_clients, labels, words):
    with pytest.raises(PartitionError) as info:
        split(scheme, params, num_clients=num_clients, labels=labels)
    message = str(info.value)
    assert repr(scheme) in message
    for word in words:
        assert word in message


def test_invalid_param_values_and_fractions():
    with pytest.raises(PartitionError, match=r"'dirichlet'.*alpha=-1 .*greater than 0"):
        make_partitioner("dirichlet", {"alpha": -1})
    with pytest.raises(PartitionError, match="train_fraction=1.0"):
        split("iid", train_fraction=1.0)
    with pytest.raises(PartitionError, match="labels"):
        split("iid", labels=np.full(100, NUM_CLASSES))


def test_unknown_scheme_lists_the_registered_names():
    with pytest.raises(
        UnknownNameError,
        match=r"'patho'.*allowed: dirichlet, dominant, flwr, iid, imported, pathological, random-classes",
    ):
        make_partitioner("patho", {})


def test_unknown_param_lists_the_allowed_params():
    with pytest.raises(PartitionError) as info:
        make_partitioner("pathological", {"k": 4})
    message = str(info.value)
    assert "unknown parameter 'k'" in message
    assert "classes_per_client (default 4)" in message and "samples_per_client (default None)" in message
    with pytest.raises(PartitionError, match="allowed parameters: none"):
        make_partitioner("iid", {"alpha": 1})


def test_label_count_table_and_plot(tmp_path):
    counts = split("pathological", num_clients=10).label_counts(LABELS, NUM_CLASSES)
    table = format_label_counts(counts, class_names=[f"c{i}" for i in range(NUM_CLASSES)])
    lines = table.splitlines()
    assert lines[0].split() == ["client", *[f"c{i}" for i in range(NUM_CLASSES)], "total"]
    assert len(lines) == 1 + 1 + 10 + 1 + 1  # header, rule, clients, rule, totals
    assert lines[2].split()[-1] == "700" and lines[-1].split()[-1] == str(len(LABELS))
    assert lines[2].count(".") == NUM_CLASSES - 4  # the classes a client does not hold
    for suffix in (".png", ".svg"):
        plot_label_counts(counts, tmp_path / f"counts{suffix}")
        assert (tmp_path / f"counts{suffix}").stat().st_size > 1000
    with pytest.raises(ValueError, match="png or .svg"):
        plot_label_counts(counts, tmp_path / "counts.pdf")
