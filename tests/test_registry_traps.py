"""Three bugs copied from reference code to reference code, tested across the whole registry; each test
also fails on a planted method that has the bug, so it is known to catch it.

- BatchNorm statistics averaged with the weights (PFLlib#260: a FedAvg that averages parameters but
  not buffers keeps every client's own running statistics under the global weights, and so behaves as
  FedBN). Checked on every method's personalized models: wherever the clients share a BatchNorm
  layer's affine parameters they share its running statistics too; a method that personalizes the
  layer has per-client affine parameters as well.
- Per-FedAvg's second batch D' is a fresh batch of the client's training split, never its test split
  (pFedMe#8: the widely copied Per-FedAvg took its second step on a test batch).
- No method reads a test split while it trains: every test sample's inputs replaced by garbage and its
  label shuffled, the method's whole state after training, its validation scores and its bytes are
  the same to the bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pflbench.algorithm import ALGORITHMS, ClientRound, get_algorithm
from pflbench.config import CellConfig
from pflbench.data.dataset import Dataset
from pflbench.simulator.execution import ExecutionOptions
from pflbench.fedavg import FedAvg
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import build_cell, cell_global_rng, prepare_cell, run_rounds, with_server
from pflbench.simulator.training import State

get_algorithm("fedavg")  # registers the built-in algorithms
REGISTRY = sorted(ALGORITHMS.names())
# Methods that keep BatchNorm statistics on the clients by design, with where they say so. Their
# per-client aggregation weights coincide at the start (uniform), so the invariant below does not apply.
PERSONAL_STATISTICS = {
    "pfedla": "pfedla.py: 'BatchNorm statistics are never aggregated: they stay on the client' (layer-wise weights)",
    "heurpfedla": "pfedla.py, as pFedLA",
}


def _cell(name: str, **overrides) -> CellConfig:
    cls = get_algorithm(name)
    base = dict(
        algorithm=name,
        dataset="synthetic",
        dataset_options={"num_samples": 180},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=3,
        participation=1.0,
        rounds=2,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=3,
        eval_every=1,
        hp=dict(cls.quick_hp),
    )
    return CellConfig(**{**base, **overrides})


def _run(cell: CellConfig, cls: type | None = None, dataset: Dataset | None = None, splits=None):
    """The cell run to its end through `build_cell` (or with the class `cls` in its place): (algorithm, result)."""
    if dataset is None:
        dataset, splits = prepare_cell(cell, None)
    with cell_global_rng(cell.seed, torch.device("cpu")):
        if cls is None:
            fed, algorithm = build_cell(cell, dataset, splits, ExecutionOptions())
        else:
            fed = Federation(cell, dataset, splits)
            algorithm = cls(fed, cls.parse_hyperparams(cell.hp))
        result = run_rounds(fed, algorithm)
    assert result.status == "finished", result.error
    return algorithm, result


# ---- 1. BatchNorm statistics go with the weights they normalize ----------------------------------------

IMAGES = dict(
    dataset="synthetic-images",
    dataset_options={"num_samples": 120, "channels": 3, "size": 28},
    model="cnn-bn",
    rounds=1,
)


def _batchnorm_layers(names: set[str]) -> dict[str, list[str]]:
    layers: dict[str, list[str]] = {}
    for name in sorted(names):
        layers.setdefault(name.rpartition(".")[0], []).append(name)
    return layers


def _unshared_statistics(algorithm) -> tuple[list[str], int]:
    """(BatchNorm layers whose affine parameters are the same on every client but whose running
    statistics are not, how many layers had shared affine parameters) in the personalized models."""
    models: State = algorithm.personalized()
    if set(models) != set(algorithm.engine.model.names):  # not the clients' architecture (FedMN's routed pool)
        return [], -1
    same = lambda t: bool((t == t[:1]).all())  # noqa: E731
    broken, shared = [], 0
    for layer, names in _batchnorm_layers(algorithm.engine.model.batchnorm_names).items():
        affine = [n for n in names if n.endswith((".weight", ".bias"))]
        statistics = [n for n in names if n.endswith((".running_mean", ".running_var"))]
        if affine and all(same(models[n]) for n in affine):
            shared += 1
            if not all(same(models[n]) for n in statistics):
                broken.append(layer)
    return broken, shared


@pytest.mark.parametrize("name", REGISTRY)
def test_shared_batchnorm_weights_come_with_shared_statistics(name):
    if name in PERSONAL_STATISTICS:
        pytest.skip(PERSONAL_STATISTICS[name])
    algorithm, _ = _run(_cell(name, **IMAGES))
    broken, shared = _unshared_statistics(algorithm)
    if shared < 0:
        pytest.skip(f"{name}'s personalized models are not the clients' architecture (evaluated by its own `evaluate`)")
    assert broken == [], f"{name}: BatchNorm layers {broken} share their weights but not their statistics"


class AveragesOnlyParameters(FedAvg):
    """PFLlib#260 planted: the server averages `model.parameters()` only, so the running statistics
    never leave the clients while the weights they normalize are averaged."""

    def is_local(self, name: str) -> bool:
        return name.endswith((".running_mean", ".running_var", ".num_batches_tracked"))


def test_the_batchnorm_trap_catches_a_fedavg_that_averages_only_parameters():
    algorithm, _ = _run(_cell("fedavg", **IMAGES), AveragesOnlyParameters)
    broken, shared = _unshared_statistics(algorithm)
    assert broken == ["bn1", "bn2"] and shared == 2
    fedavg, _ = _run(_cell("fedavg", **IMAGES))
    assert _unshared_statistics(fedavg) == ([], 2)  # the real one shares both layers' weights and statistics
    fedbn, _ = _run(_cell("fedbn", **IMAGES))
    assert _unshared_statistics(fedbn) == ([], 0)  # personalized BatchNorm: its weights are per client too


# ---- 2. Per-FedAvg's second batch: fresh, from the training split -----------------------------------------


def _meta_step_problems(variant: str) -> list[str]:
    """What is wrong with the batches of Per-FedAvg's meta steps in one round (`variant`): every batch
    (D, D', D'' of the HF variant) must lie in the client's train split, D' must not be D."""
    from pflbench.kit import steps

    seen: list[torch.Tensor] = []
    original = steps.batch_losses

    def recording(fed, params, buffers, ids):
        seen.append(ids.clone())
        return original(fed, params, buffers, ids)

    cell = _cell("perfedavg", rounds=1, hp={"variant": variant}, eval_every=10)
    dataset, splits = prepare_cell(cell, None)
    with pytest.MonkeyPatch.context() as patch, cell_global_rng(cell.seed, torch.device("cpu")):
        patch.setattr(steps, "batch_losses", recording)
        fed, algorithm = build_cell(cell, dataset, splits, ExecutionOptions(client_batching="on"))
        algorithm.setup()
        clients = torch.arange(cell.clients)
        context = fed.round(1, clients)
        download = algorithm.configure(context)
        rnd: ClientRound = with_server(algorithm, fed, context.with_download(download))
        algorithm.local_train(rnd, algorithm.receive(rnd, download))
    per_step = 4 if variant == "hf" else 2  # HF: D'' twice, at w + delta g and at w - delta g
    assert seen and len(seen) % per_step == 0
    problems = []
    for row, client in enumerate(clients.tolist()):
        train = set(fed.sample_ids(client, "train").tolist())
        held_out = {*fed.sample_ids(client, "val").tolist(), *fed.sample_ids(client, "test").tolist()}
        for step in range(0, len(seen), per_step):
            batches = [seen[step + k][row] for k in range(per_step)]
            for k, ids in enumerate(batches):
                if not set(ids.tolist()) <= train or set(ids.tolist()) & held_out:
                    problems.append(f"client {client}, step {step // per_step}: batch {k} is not from its train split")
            if torch.equal(batches[0], batches[1]):
                problems.append(f"client {client}, step {step // per_step}: D' is D")
            if variant == "hf" and not torch.equal(batches[2], batches[3]):
                problems.append(f"client {client}, step {step // per_step}: the two D'' differ")
    return problems


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_second_step_uses_a_fresh_training_batch(variant):
    assert _meta_step_problems(variant) == []


def test_the_perfedavg_trap_catches_a_second_step_on_test_batches(monkeypatch):
    """pFedMe#8 planted: D' drawn from the client's test split (`get_next_test_batch`)."""
    from pflbench.algorithms import perfedavg

    original = perfedavg.step_plan

    def second_from_test(fed, rnd, clients, *, stream=None, **kw):
        plan = original(fed, rnd, clients, stream=stream, **kw)
        if stream is perfedavg.STREAMS[1]:  # as many steps, from the test split
            return original(fed, rnd, clients, stream=stream, split="test", steps=plan.ids.shape[1])
        return plan

    monkeypatch.setattr(perfedavg, "step_plan", second_from_test)
    problems = _meta_step_problems("fo")
    assert problems and all("batch 1 is not from its train split" in p for p in problems)


# ---- 3. No method reads a test split while it trains ---------------------------------------------------


def _poisoned(dataset: Dataset, splits) -> Dataset:
    """`dataset` with every test sample's input replaced by large noise and the test labels shuffled."""
    ids = torch.from_numpy(np.concatenate(splits.test))
    gen = torch.Generator().manual_seed(0)
    inputs, labels = dataset.inputs.clone(), dataset.labels.clone()
    if inputs.is_floating_point():
        inputs[ids] = 50.0 * torch.randn(inputs[ids].shape, generator=gen)
    else:
        inputs[ids] = torch.randint(0, 256, inputs[ids].shape, generator=gen, dtype=inputs.dtype)
    labels[ids] = labels[ids][torch.randperm(len(ids), generator=gen)]
    return Dataset.build(
        dataset.name,
        inputs,
        labels,
        num_classes=dataset.num_classes,
        checksum=dataset.checksum,
        source_split=dataset.source_split,
    )


def _trained(algorithm) -> dict:
    """Everything the method's checkpoint holds, flattened to (path, tensor or value)."""
    flat: dict = {}

    def walk(path: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{path}.{key}", item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{path}[{index}]", item)
        elif hasattr(value, "state_dict") and not isinstance(value, torch.Tensor):
            walk(path, value.state_dict())
        else:
            flat[path] = value

    for key, value in algorithm.state_dict().items():
        if (
            key != "_cached"
        ):  # Per-FedAvg's cache of the last evaluation's models (from train data: compared anyway below)
            walk(key, value)
    return flat


def _changed(clean: dict, dirty: dict) -> list[str]:
    assert clean.keys() == dirty.keys()
    out = []
    for key, a in clean.items():
        b = dirty[key]
        if isinstance(a, torch.Tensor):
            if not torch.equal(a, b) and not (
                a.is_floating_point()
                and torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(), b.nan_to_num())
            ):
                out.append(key)
        elif isinstance(a, np.ndarray):
            if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                out.append(key)
        elif a != b:
            out.append(key)
    return out


TRAINING_COLUMNS = ["round", "client", "val_accuracy", "val_loss", "bytes_down", "bytes_up"]


def _test_split_reads(name: str | None, cls: type | None = None) -> list[str]:
    """What of training (state, validation scores, bytes) moves when the test split is poisoned."""
    cell = _cell(name or "fedavg")
    dataset, splits = prepare_cell(cell, None)
    clean, clean_result = _run(cell, cls, dataset, splits)
    dirty, dirty_result = _run(cell, cls, _poisoned(dataset, splits), splits)
    # the poison reached the test scores (the test is not vacuous)
    assert not clean_result.metrics["loss"].equals(dirty_result.metrics["loss"])
    moved = _changed(_trained(clean), _trained(dirty))
    try:
        pd.testing.assert_frame_equal(
            clean_result.metrics[TRAINING_COLUMNS], dirty_result.metrics[TRAINING_COLUMNS], check_exact=True
        )
    except AssertionError:
        moved.append("validation scores or bytes")
    return moved


@pytest.mark.parametrize("name", REGISTRY)
def test_no_method_reads_a_test_split_while_training(name):
    assert _test_split_reads(name) == []


class TrainsOnTest(FedAvg):
    """A planted reader of the test split: local SGD on the client's test samples."""

    def local_train(self, rnd: ClientRound, state: State) -> State:
        return self.engine.train(rnd, rnd.clients, state, split="test").state


def test_the_test_split_trap_catches_a_method_that_trains_on_it():
    assert "attributes.global_state.fc1.weight" in _test_split_reads(None, TrainsOnTest)
