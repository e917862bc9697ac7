"""Model heterogeneity: MH-pFedHN's architectures, groups of clients per architecture, per-client
communication, and homogeneous-only algorithms refusing heterogeneous cells before any work."""

import math

import pytest
import torch

import pflbench.simulator.rounds as rounds
from pflbench.config import CellConfig
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import prepare_cell, run_cell
from pflbench.simulator.models import MODEL_GROUPS, build_model, check_model_spec, client_groups, is_heterogeneous
from pflbench.run.spec import parse_spec
from pflbench.run.spec_problems import SpecError
from pflbench.payload import Payload


def _cell(**overrides):
    base = dict(
        algorithm="local",
        dataset="synthetic-images",
        dataset_options={"num_samples": 240, "channels": 3, "size": 32},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=4,
        rounds=1,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=0,
        model="mh-cnn,resnet10",
    )
    return CellConfig(**{**base, **overrides})


# Trainable parameter counts of the official code's models on CIFAR-10 (spec B4).
OFFICIAL_K = {"mh-cnn": 234_006, "vgg8": 268_814, "resnet10": 347_178, "resnet12": 523_242, "resnet18": 565_386}


def test_mh_pfedhn_architectures_have_the_official_parameter_counts():
    for name, k in OFFICIAL_K.items():
        model = build_model(name, (3, 32, 32), 10)
        assert sum(p.numel() for p in model.parameters()) == k, name
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
        assert build_model(name, (1, 28, 28), 10)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)  # MNIST-like
    assert MODEL_GROUPS["hetero5"] == tuple(OFFICIAL_K)


def test_groups_are_contiguous_and_equal_with_the_remainder_first():
    groups = client_groups("hetero5", 12)
    assert [name for name, _ in groups] == list(OFFICIAL_K)
    assert [ids for _, ids in groups] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]
    assert client_groups("mlp,cnn", 5) == [("mlp", [0, 1, 2]), ("cnn", [3, 4])]
    assert client_groups("cnn", 3) == [("cnn", [0, 1, 2])]
    assert is_heterogeneous("hetero5") and is_heterogeneous("cnn,vgg8")
    assert not is_heterogeneous("cnn") and not is_heterogeneous("auto")
    with pytest.raises(ValueError, match="unknown model 'resnet11'.*did you mean"):
        check_model_spec("mh-cnn,resnet11")


def test_homogeneous_only_algorithm_rejects_a_heterogeneous_cell_at_spec_validation():
    spec = {
        "matrix": {"algorithm": ["fedavg", "local"], "dataset": "synthetic-images"},
        "defaults": {"model": "hetero5"},
    }
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    message = str(error.value)
    assert "algorithm 'fedavg' needs one architecture shared by all clients" in message
    assert "'hetero5'" in message and "local" in message.split("heterogeneous models:")[1]
    assert "'local'" not in message  # local supports heterogeneous models: only fedavg is refused
    plan = parse_spec({**spec, "matrix": {"algorithm": ["local"], "dataset": "synthetic-images"}})
    assert plan.cells[0].model == "hetero5"
    with pytest.raises(SpecError, match="unknown model 'vgg9'"):
        parse_spec({**spec, "defaults": {"model": "mh-cnn,vgg9"}})


def test_homogeneous_only_algorithm_rejects_a_heterogeneous_cell_in_run_cell_before_any_work(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the cell started loading data")

    monkeypatch.setattr(rounds, "prepare_cell", no_work)
    with pytest.raises(ValueError, match="algorithm 'fedavg' needs one architecture shared by all clients"):
        run_cell(_cell(algorithm="fedavg"))


def test_federation_groups_clients_by_architecture(tmp_path):
    cell = _cell(clients=5)
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    assert fed.heterogeneous and fed.group_names == ["mh-cnn", "resnet10"]
    assert fed.group_of.tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(RuntimeError, match="different architectures"):
        fed.model  # noqa: B018  (no single model to hand out)
    with pytest.raises(ValueError, match="different architectures"):
        fed.model_of(torch.tensor([1, 3]))
    assert fed.model_of(torch.tensor([3, 4])) is fed.models[1]
    assert [(g, p.tolist()) for g, p in fed.by_group(torch.tensor([0, 3, 4]))] == [(0, [0]), (1, [1, 2])]
    state = fed.init_state(2, group=1)
    assert set(state) == set(fed.models[1].names) and state["final.weight"].shape == (2, 10, 64)
    # A group trains batched like any homogeneous set of clients.
    trained = fed.train(1, torch.tensor([3, 4]), state, steps=2).state
    assert not torch.equal(trained["final.weight"], state["final.weight"])
    homogeneous = Federation(_cell(model="cnn"), *prepare_cell(_cell(model="cnn"), tmp_path))
    assert not homogeneous.heterogeneous and homogeneous.models == [homogeneous.model]


def test_bytes_are_each_clients_own_tensors():
    small, large = torch.zeros(3), torch.zeros(5, 2, dtype=torch.float64)
    rows = [{"a": small}, {"a": small, "b": large}, {}]
    assert Payload.from_rows(rows, torch.arange(3)).nbytes.tolist() == [12, 12 + 80, 0]
    assert Payload.from_state({"a": torch.zeros(4, 3)}, torch.arange(4)).nbytes.tolist() == [12] * 4  # stacked


def test_local_runs_a_heterogeneous_cell(tmp_path):
    result = run_cell(_cell(rounds=2), data_root=tmp_path)
    assert result.status == "finished"
    last = result.metrics[result.metrics["round"] == 2]
    assert len(last) == 4 and last["accuracy"].notna().all()
    assert result.rounds["bytes_up"].sum() == 0 and result.summary["model"] == "mh-cnn,resnet10"
    assert math.isfinite(result.summary["final_accuracy"])
