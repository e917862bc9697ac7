"""Ditto, APFL and L2GD: their limiting cases, their communication, and that they learn."""

import numpy as np
import pytest
import torch

from pflbench.algorithms.apfl import APFL
from pflbench.algorithms.ditto import Ditto
from pflbench import streams
from pflbench.algorithms.l2gd import COINS, L2GD, coin_flips
from pflbench.fedavg import FedAvg
from pflbench.simulator.rounds import run_cell, run_round
from cells import assert_batched_matches_loop, federation as _federation, small_cell as _cell


def _run(alg_cls, fed, hp=None):
    alg = alg_cls(fed, alg_cls.parse_hyperparams(hp or {}))
    alg.setup()
    sent = []
    for rnd in range(1, fed.cell.rounds + 1):
        clients = torch.as_tensor(fed.schedule[rnd - 1])
        sent.append(run_round(alg, rnd, clients))
    return alg, sent


def _local_with_stream(fed, stream):
    """Pure local training of every client from the common initial model, with batch order `stream`."""
    state = fed.init_state(fed.num_clients)
    for rnd in range(1, fed.cell.rounds + 1):
        clients = torch.as_tensor(fed.schedule[rnd - 1])
        trained = fed.train(rnd, clients, {n: t[clients] for n, t in state.items()}, stream=stream).state
        for n, t in trained.items():
            state[n][clients] = t
    return state


def _distance(a, b, names):
    return torch.sqrt(sum(((a[n] - b[n]) ** 2).flatten(1).sum(1) for n in names))


# ---- Ditto -----------------------------------------------------------------------------------------
def test_ditto_lambda_zero_is_local_training_and_global_is_fedavg(tmp_path):
    fed = _federation(_cell(participation=0.6), tmp_path)  # partial participation: unsampled keep theirs
    ditto, _ = _run(Ditto, fed, {"lam": 0.0})
    reference = _local_with_stream(fed, Ditto.PERSONAL_STREAM)
    fedavg, _ = _run(FedAvg, fed)
    for n in fed.model.names:
        assert torch.equal(ditto.personalized()[n], reference[n]), n
        assert torch.equal(ditto.global_state[n], fedavg.global_state[n]), n
    first = fed.model.param_names[0]  # and it is not trivially the initial model
    assert not torch.equal(ditto.personal_state[first], fed.init_state(fed.num_clients)[first])


def test_ditto_large_lambda_keeps_personal_model_at_the_global_one(tmp_path):
    fed = _federation(_cell(), tmp_path)
    params = fed.model.param_names
    distances = {}
    for lam in (0.0, 30.0):  # lr * lam = 1.5 < 2: the proximal pull is stable
        alg, sent = _run(Ditto, fed, {"lam": lam})
        downloaded = sent[-1][0].state  # w-bar of the last round (all clients sampled)
        distances[lam] = _distance(alg.personal_state, downloaded, params)
    assert (distances[30.0] < 0.1 * distances[0.0]).all(), distances


def test_ditto_communicates_like_fedavg_and_learns(tmp_path):
    ditto = run_cell(_cell(algorithm="ditto"), data_root=tmp_path)
    fedavg = run_cell(_cell(), data_root=tmp_path)
    assert ditto.rounds["bytes_up"].equals(fedavg.rounds["bytes_up"])
    assert ditto.rounds["bytes_down"].equals(fedavg.rounds["bytes_down"])
    # measured 0.87 after 3 rounds (chance 0.1; FedAvg's global model 0.51 on this pathological split)
    assert ditto.summary["final_accuracy"] >= 0.7


# ---- APFL ------------------------------------------------------------------------------------------
def test_apfl_alpha_zero_evaluates_fedavgs_global_model(tmp_path):
    apfl = run_cell(_cell(algorithm="apfl", hp={"alpha": 0.0, "learn_alpha": False}), data_root=tmp_path)
    fedavg = run_cell(_cell(), data_root=tmp_path)
    for col in ("accuracy", "loss", "val_accuracy", "bytes_up", "bytes_down"):
        assert apfl.metrics[col].equals(fedavg.metrics[col]), col


def test_apfl_alpha_one_evaluates_the_local_model(tmp_path):
    fed = _federation(_cell(), tmp_path)
    apfl, _ = _run(APFL, fed, {"alpha": 1.0, "learn_alpha": False})
    personal = apfl.personalized()
    reference = _local_with_stream(fed, APFL.PERSONAL_STREAM)
    for n in fed.model.names:
        assert torch.equal(personal[n], apfl.local_state[n]), n  # evaluated model == v_i exactly
        torch.testing.assert_close(apfl.local_state[n], reference[n], atol=1e-5, rtol=1e-5, msg=n)
    assert not torch.equal(
        personal[fed.model.param_names[0]],
        apfl.global_state[fed.model.param_names[0]].expand_as(personal[fed.model.param_names[0]]),
    )


def test_apfl_learned_alpha_moves_within_bounds_and_learns(tmp_path):
    result = run_cell(_cell(algorithm="apfl", rounds=4), data_root=tmp_path)
    alphas = result.artifacts["alpha_round00004"]
    assert ((alphas >= 0) & (alphas <= 1)).all() and not np.allclose(alphas, APFL.Hyperparams().alpha)
    # measured 0.84 after 4 rounds (chance 0.1)
    assert result.summary["final_accuracy"] >= 0.65


def test_apfl_learns_alpha_on_a_model_with_batchnorm(tmp_path):
    # alpha's step once differentiated through BatchNorm's running statistics and crashed (CIFAR's CNN)
    from pflbench.config import CellConfig

    cell = CellConfig(
        algorithm="apfl",
        dataset="synthetic-images",
        model="cnn-bn",
        clients=4,
        rounds=2,
        lr=0.05,
        dataset_options={"num_samples": 240, "channels": 3, "size": 32},
        partition="pathological",
        partition_params={"classes_per_client": 3},
    )
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished", result.error
    alphas = result.artifacts["alpha_round00002"]
    assert ((alphas >= 0) & (alphas <= 1)).all() and not np.allclose(alphas, APFL.Hyperparams().alpha)


# ---- L2GD ------------------------------------------------------------------------------------------
def test_l2gd_sends_nothing_on_local_rounds_and_the_model_on_communicating_rounds(tmp_path):
    cell = _cell(algorithm="l2gd", rounds=4, hp={"p": 0.5})
    coins = coin_flips(streams.generator(cell.seed, COINS, kind="numpy"), cell.rounds, 0.5)
    assert coins.any() and not coins.all()  # this seed gives both kinds of round
    result = run_cell(cell, data_root=tmp_path)
    fedavg = run_cell(_cell(rounds=4), data_root=tmp_path)
    model_bytes = int(fedavg.rounds["bytes_up"].iloc[0])
    assert model_bytes > 0
    expected = np.where(coins, model_bytes, 0)
    np.testing.assert_array_equal(result.rounds["bytes_up"].to_numpy(), expected)
    np.testing.assert_array_equal(result.rounds["bytes_down"].to_numpy(), expected)
    np.testing.assert_array_equal(result.artifacts["communicated_round00004"], coins.astype(np.int8))
    # measured 0.85 after 4 rounds (chance 0.1)
    assert result.summary["final_accuracy"] >= 0.65


def test_l2gd_aggregation_step_pulls_toward_the_average(tmp_path):
    fed = _federation(_cell(rounds=4), tmp_path)
    for lam, theta in ((2.0, 0.05 * 2.0 * 0.75 / 0.25), (1e6, 1.0)):  # theta = lr * lam * (1 - p) / p, at most 1
        alg = L2GD(fed, L2GD.parse_hyperparams({"lam": lam, "p": 0.25}))
        alg.setup()
        assert alg.theta == pytest.approx(theta)
        alg.coins[:] = [False, False, True, False]  # two local rounds, then an aggregation step
        clients = torch.arange(fed.num_clients)
        for rnd in (1, 2):
            run_round(alg, rnd, clients)
        before = {n: t.clone() for n, t in alg.client_state.items()}
        download, upload = (p.state for p in run_round(alg, 3, clients))
        for n in fed.model.param_names:
            mean = before[n].mean(0, keepdim=True)
            torch.testing.assert_close(download[n], mean.expand_as(before[n]))
            assert torch.equal(upload[n], before[n])
            torch.testing.assert_close(alg.client_state[n], before[n] - theta * (before[n] - mean))
        spread = _distance(alg.client_state, alg.global_state, fed.model.param_names)
        if theta == 1.0:
            assert (spread < 1e-5).all()  # full averaging
        else:
            assert (spread > 1e-3).all()


# ---- all three -------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm,hp", [("ditto", {"lam": 1.0}), ("apfl", {}), ("l2gd", {"p": 0.5})])
def test_batched_path_matches_client_loop(tmp_path, algorithm, hp):
    assert_batched_matches_loop(_cell(algorithm=algorithm, hp=hp, rounds=2, participation=0.6), tmp_path)
