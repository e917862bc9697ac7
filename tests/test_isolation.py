"""Evaluation and newcomers never touch training (issue 29, items 1 and 7).

- Every registered algorithm gives bit-identical metrics and bytes at the rounds both runs evaluate,
  whether it is evaluated every round or every third one: evaluating (`personalized`, `evaluate`,
  local adaptation, artifacts, serving newcomers) writes nothing that training reads.
- Newcomers' raw inputs (before normalisation) and labels can be replaced by garbage without
  changing one bit of training, for algorithms of every family.
"""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from pflbench.algorithm import ALGORITHMS, get_algorithm
from pflbench.config import CellConfig, cell_hash
from pflbench.data.dataset import Dataset
from pflbench.data.normalization import normalized_for_cell
from pflbench.simulator.federation import Federation
from pflbench.simulator.metrics import trained_rows
from pflbench.newcomers import newcomer_ids
from pflbench.simulator.rounds import prepare_cell, run_cell, run_rounds
from pflbench.serving import Serving

get_algorithm("fedavg")  # registers the built-in algorithms
REGISTRY = sorted(ALGORITHMS.names())
MH = {"hidden_dim": 4, "embedding_dim": 8, "server_updates": "per_round"}
# Small local work and models for the slow methods, so the registry runs in well under a minute.
# FedMN: gates start near 0 (gate_bias_init 0), so a routing fixed by evaluation is not "every
# module" and decides what `configure` sends (with the default bias 2 every early routing is every
# module, and the defect of issue 29 item 1 does not show in bytes or metrics).
QUICK_HP = {
    "pfedhn": {"inner_steps": 2},
    "pfedhn-pc": {"inner_steps": 2},
    "fedrep": {"head_epochs": 1},
    "fedbabu": {"finetune_epochs": 1},
    "mh-pfedhn": MH,
    "mh-pfedhngd": MH,
    "fedmn": {
        "dims": [16, 8],
        "encoder_hidden": 16,
        "router_x_dim": 8,
        "router_y_dim": 8,
        "router_samples": 16,
        "gate_bias_init": 0.0,
    },
}
ROUNDS, EVERY = 6, 3
SCORES = [
    "accuracy",
    "loss",
    "val_accuracy",
    "val_loss",
    "accuracy_adapted",
    "loss_adapted",
    "val_accuracy_adapted",
    "val_loss_adapted",
    "test_samples",
    "val_samples",
    "bytes_down",
    "bytes_up",
]


def _setting(name: str) -> tuple[CellConfig, str]:
    """The cell every algorithm runs here, and what it leaves out of the setting and why ("" if nothing).
    Participation 0.5 of the trained clients, newcomers held out, local adaptation at every evaluation."""
    cls = get_algorithm(name)
    cell = CellConfig(
        algorithm=name,
        dataset="synthetic",
        dataset_options={"num_samples": 600},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=8,
        participation=0.5,
        unseen_fraction=0.25,
        finetune_epochs=1,
        rounds=ROUNDS,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=1,
        eval_every=1,
        hp=QUICK_HP.get(name, {}),
    )
    if cls.capabilities.newcomers:  # said, not skipped: the rest of the setting still runs
        return cell.model_copy(update={"unseen_fraction": 0.0}), f"no newcomers: {cls.capabilities.newcomers}"
    return cell, ""


def test_the_setting_covers_the_whole_registry():
    """Nothing is left out silently: every registered algorithm is a case below, and each one that
    cannot run part of the setting says why."""
    assert sorted(ALGORITHMS.names()) == REGISTRY and len(REGISTRY) >= 20
    for name in REGISTRY:
        cell, left_out = _setting(name)
        assert bool(left_out) == (cell.unseen_fraction == 0.0)


@pytest.mark.parametrize("name", REGISTRY)
def test_evaluating_more_often_changes_nothing_of_training(name, tmp_path):
    cell, _ = _setting(name)
    often = run_cell(cell, data_root=tmp_path)
    rarely = run_cell(cell.model_copy(update={"eval_every": EVERY}), data_root=tmp_path)
    assert often.status == rarely.status == "finished", (often.error, rarely.error)
    both = list(range(EVERY, ROUNDS + 1, EVERY))
    assert sorted(set(rarely.metrics["round"])) == both and sorted(set(often.metrics["round"])) == list(
        range(1, ROUNDS + 1)
    )
    keys = ["round", "client"] + (["newcomer"] if "newcomer" in often.metrics else [])

    def at_common_rounds(metrics: pd.DataFrame) -> pd.DataFrame:
        rows = metrics[metrics["round"].isin(both)]
        return rows.sort_values(keys).reset_index(drop=True)[keys + SCORES]

    pd.testing.assert_frame_equal(at_common_rounds(often.metrics), at_common_rounds(rarely.metrics), check_exact=True)
    pd.testing.assert_frame_equal(
        often.rounds[["round", "clients", "bytes_down", "bytes_up"]],
        rarely.rounds[["round", "clients", "bytes_down", "bytes_up"]],
        check_exact=True,
    )
    assert not often.metrics[SCORES[:4]].isna().any().any()


# ---- item 7: newcomers see nothing of training, and training nothing of them --------------------------


def _images_cell(**overrides) -> CellConfig:
    """3-channel 32-pixel generated images: the default model is the BatchNorm CNN (cnn-bn)."""
    base = dict(
        algorithm="fedavg",
        dataset="synthetic-images",
        dataset_options={"num_samples": 480, "channels": 3, "size": 32},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=6,
        unseen_fraction=0.34,
        participation=1.0,
        rounds=2,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=2,
        finetune_epochs=1,
        hp=QUICK_HP.get(overrides.get("algorithm"), {}),
    )
    return CellConfig(**{**base, **overrides})


def _with_garbage_newcomers(dataset, splits, held) -> "Dataset":
    """The pool with every raw input (uint8 pixels, before normalisation) and label of the newcomers
    replaced by noise, built anew so that its pool statistics are those of the corrupted pool."""
    from pflbench.data.dataset import Dataset

    ids = torch.from_numpy(np.concatenate([getattr(splits, s)[c] for c in held for s in ("train", "val", "test")]))
    gen = torch.Generator().manual_seed(0)
    inputs, labels = dataset.inputs.clone(), dataset.labels.clone()
    inputs[ids] = torch.randint(200, 256, inputs[ids].shape, generator=gen, dtype=torch.uint8)  # bright garbage
    labels[ids] = torch.randint(0, dataset.num_classes, (len(ids),), generator=gen)
    return Dataset.build(
        dataset.name,
        inputs,
        labels,
        num_classes=dataset.num_classes,
        checksum=dataset.checksum,
        source_split=dataset.source_split,
    )


def _run_with(cell, dataset, splits):
    fed = Federation(cell, dataset, splits)
    cls = get_algorithm(cell.algorithm)
    return run_rounds(fed, cls(fed, cls.parse_hyperparams(cell.hp)))


FAMILIES = ["fedavg", "fedbn", "fedper", "pfedhn", "fedfomo", "pfedla", "local"]  # global, partial, hypernetwork, ...
TRAINED_COLUMNS = ["round", "client", *SCORES]


@pytest.mark.parametrize("name", FAMILIES)
def test_newcomers_raw_inputs_cannot_change_training(name, tmp_path):
    """Every newcomer pixel and label replaced by garbage before normalisation: the trained clients'
    run is the same to the bit (metrics, adapted metrics, bytes); only the newcomers' scores move."""
    cell = _images_cell(algorithm=name)
    dataset, splits = prepare_cell(cell, tmp_path)
    held = newcomer_ids(cell.unseen_fraction, cell.clients, cell.seed)
    clean = _run_with(cell, dataset, splits)
    dirty = _run_with(cell, _with_garbage_newcomers(dataset, splits, held), splits)
    assert clean.status == dirty.status == "finished"
    pd.testing.assert_frame_equal(
        trained_rows(clean.metrics)[TRAINED_COLUMNS], trained_rows(dirty.metrics)[TRAINED_COLUMNS], check_exact=True
    )
    pd.testing.assert_frame_equal(clean.rounds[["bytes_down", "bytes_up"]], dirty.rounds[["bytes_down", "bytes_up"]])
    newcomers = lambda r: r.metrics[r.metrics["newcomer"]]["loss"].to_numpy()
    assert not np.array_equal(newcomers(clean), newcomers(dirty))


def test_the_old_pool_statistics_let_newcomers_change_training(tmp_path):
    """What the test above guards against: with `normalization: pool` (the rule before issue 29) the
    same garbage moves the statistics, and with them every trained client's inputs and scores."""
    cell = _images_cell(normalization="pool")
    dataset, splits = prepare_cell(cell, tmp_path)
    dirty = _with_garbage_newcomers(dataset, splits, newcomer_ids(cell.unseen_fraction, cell.clients, cell.seed))
    assert dirty.mean != dataset.mean
    clean, dirty = _run_with(cell, dataset, splits), _run_with(cell, dirty, splits)
    assert not np.array_equal(trained_rows(clean.metrics)["loss"], trained_rows(dirty.metrics)["loss"])


def test_train_statistics_come_from_the_trained_clients_train_splits_only(tmp_path):
    cell = _images_cell()
    dataset, splits = prepare_cell(cell, tmp_path)
    fed = Federation(cell, dataset, splits)
    trained = fed.client_ids
    pixels = torch.cat([dataset.inputs[torch.from_numpy(splits.train[c])] for c in trained]).double() / 255
    expected_mean = pixels.mean(dim=(0, 2, 3))
    expected_std = pixels.permute(1, 0, 2, 3).flatten(1).std(dim=1, unbiased=False)
    x = fed.features[torch.cat([fed.splits["train"][k] for k in range(fed.num_clients)])].double()
    # the trained clients' train inputs, as training sees them, are standardised: mean 0, std 1
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3, dtype=torch.double), atol=1e-5)
    assert torch.allclose(
        x.permute(1, 0, 2, 3).flatten(1).std(dim=1, unbiased=False), torch.ones(3, dtype=torch.double), atol=1e-5
    )
    stats = normalized_for_cell(dataset, "train", splits, trained)
    assert np.allclose(stats.mean, expected_mean.numpy()) and np.allclose(stats.std, expected_std.numpy())
    assert stats.mean != dataset.mean  # not the pool's, which the cache keeps
    assert normalized_for_cell(dataset, "pool", splits, trained) is dataset


def test_normalization_is_in_the_cell_id_and_old_stores_read_as_pool(tmp_path):
    from pflbench.storage.store import Store, check_folder

    new, old = _images_cell(), _images_cell(normalization="pool")
    assert '"normalization":"train"' in new.canonical_json() and "normalization" not in old.canonical_json()
    assert cell_hash(new) != cell_hash(old)
    recorded = old.model_dump(mode="json")
    del recorded["normalization"]  # a configuration stored before the field existed
    assert CellConfig.stored(recorded) == old and cell_hash(CellConfig.stored(recorded)) == cell_hash(old)
    store = Store(tmp_path / "results")
    folder = store.write(old, run_cell(old.model_copy(update={"rounds": 1}), data_root=tmp_path))
    # a store written before the field: the folder's config lacks it, and it is still read as the pool cell
    config = json.loads((folder / "config.json").read_text())
    config["cell"]["rounds"] = 2  # (the cell written above; rewrite its config as an old store had it)
    del config["cell"]["normalization"]
    (folder / "config.json").write_text(json.dumps(config))
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("files", None)
    (folder / "summary.json").write_text(json.dumps(summary))
    assert check_folder(folder) == []
    with pytest.raises(ValidationError):
        _images_cell(normalization="newcomers")


def test_pfedla_newcomer_batchnorm_statistics_are_its_own(tmp_path):
    """pFedLA's clients never upload BatchNorm statistics: a newcomer's come from its own train split
    (whatever the trained clients hold), its parameters from the server's copies."""
    cell = _images_cell(algorithm="pfedla")
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("pfedla")(fed, get_algorithm("pfedla").parse_hyperparams({}))
    run_rounds(fed, algorithm)
    buffers = [n for n in fed.model.buffer_names if "running" in n]
    assert buffers  # cnn-bn
    served = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
    for n in buffers:  # the clients' statistics, whatever they are, do not reach the newcomer
        algorithm.client_state[n].mul_(3.0).add_(1.0)
    again = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
    assert all(torch.equal(served[n], again[n]) for n in served)
    for p in fed.model.param_names:
        assert torch.equal(served[p][0], algorithm.server_params[p].mean(0))
    # the statistics are the newcomer's: the first BatchNorm's running mean is the mean of the first
    # convolution's outputs over its train split (one chunk here, so exactly that mean)
    x = fed.newcomers.features[fed.newcomers.splits["train"][0]].contiguous()
    assert len(x) <= 256
    out = torch.nn.functional.conv2d(x, served["conv1.weight"][0], served["conv1.bias"][0])
    assert torch.allclose(served["bn1.running_mean"][0], out.mean(dim=(0, 2, 3)), atol=1e-5)
    assert not torch.allclose(served["bn1.running_mean"][0], algorithm.client_state["bn1.running_mean"].mean(0))


def test_fedfomo_newcomer_weights_are_fitted_on_train_never_on_validation(tmp_path):
    """The newcomers' validation split selects their best round: garbage labels there leave the
    FedFomo model served to a newcomer unchanged (garbage on its train split does change it)."""
    cell = _images_cell(algorithm="fedfomo", rounds=2)
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("fedfomo")(fed, get_algorithm("fedfomo").parse_hyperparams({}))
    run_rounds(fed, algorithm)
    served = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
    labels = fed.newcomers.labels.clone()
    for split, changes in (("val", False), ("train", True)):
        garbled = labels.clone()
        ids = torch.cat(fed.newcomers.splits[split])
        garbled[ids] = (garbled[ids] + 1 + torch.arange(len(ids)) % (fed.num_classes - 1)) % fed.num_classes
        fed.newcomers.labels = garbled
        other = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
        fed.newcomers.labels = labels
        assert changes == any(not torch.equal(served[n], other[n]) for n in served), split


def test_pfedhn_newcomer_fit_names_the_newcomer_whose_loss_is_not_finite(tmp_path):
    """A newcomer whose training inputs are NaN: the fit of the newcomers' embeddings raises Diverged
    naming that newcomer (its losses are checked once, after the fit's steps), and only that one."""
    from pflbench.simulator.training import Diverged

    cell = _images_cell(algorithm="pfedhn")
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("pfedhn")(fed, get_algorithm("pfedhn").parse_hyperparams(cell.hp))  # 2 inner steps
    run_rounds(fed, algorithm)
    assert fed.newcomers.num_clients >= 2
    fed.newcomers.features = fed.newcomers.features.clone()
    fed.newcomers.features[fed.newcomers.splits["train"][1]] = float("nan")
    with pytest.raises(Diverged, match=r"^non-finite pFedHN newcomer loss for newcomers \[1\]$"):
        algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))


def test_pfedhn_newcomer_fit_reads_the_device_as_often_however_many_steps_it_makes(tmp_path, monkeypatch):
    from test_fused_steps import Reads

    cell = _images_cell(algorithm="pfedhn")
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("pfedhn")(fed, get_algorithm("pfedhn").parse_hyperparams(cell.hp))  # 2 inner steps
    run_rounds(fed, algorithm)
    reads = {}
    for epochs in (1, 3):
        monkeypatch.setattr(type(algorithm), "NEWCOMER_EPOCHS", epochs)
        with Reads() as counter:
            algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
        reads[epochs] = counter.count
    assert reads[1] == reads[3], reads
