"""FedDBE against its official code (github.com/TsingZ0/DBE): one client update (the initialization period's
global mean, then a round's local training of the model and the PRBM) and one aggregation, on the fixed
tensors of tests/fixtures/official/feddbe/ (official.pt, written by generate.py there from the official
lines); and the official server's BatchNorm bug, tested absent."""

from pathlib import Path

import pytest
import torch

from cells import federation, small_cell
from official_engine import OfficialEngine, round_of
from pflbench.algorithms.feddbe import FedDBE
from pflbench.payload import Payload
from pflbench.simulator.rounds import run_round

FIXTURE = torch.load(Path(__file__).parent / "fixtures/official/feddbe/official.pt")
TOL = dict(rtol=1e-5, atol=1e-6)


def _engine(batched):
    f = FIXTURE
    plans = {"default": f["plans"]["round"], str(FedDBE.INIT_STREAM): f["plans"]["init"]}
    return OfficialEngine(
        f["features"], f["labels"], f["sizes"], f["initial"], plans, f["lr"], batched=batched, epochs=f["epochs"]
    )


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "loop"])
def test_one_client_update_and_one_aggregation_match_the_official_code(batched):
    f = FIXTURE
    assert f["commit"] == "193f4355214004099b4305e0052745960b2660c2"
    engine = _engine(batched)
    alg = FedDBE(engine, FedDBE.parse_hyperparams({"kappa": f["kappa"], "momentum": f["momentum"]}))
    alg.setup()  # the initialization period
    torch.testing.assert_close(alg.global_mean, f["global_mean"], **TOL)

    alg.prbm.copy_(f["prbm_start"])
    clients = [0, 1]
    rnd = round_of(clients)
    start = engine.init_state(2)  # the downloaded global model: the initial one
    trained = alg.local_train(rnd, start)
    for k in clients:
        for n in engine.model.names:
            torch.testing.assert_close(trained[n][k], f["trained"][k][n], **TOL, msg=f"client {k} {n}")
    torch.testing.assert_close(alg.prbm, f["prbm"], **TOL)

    alg.aggregate(rnd, Payload.from_state(trained, torch.tensor(clients)))
    for n in engine.model.names:
        torch.testing.assert_close(alg.global_state[n][0], f["aggregated"][n], **TOL, msg=n)
    # the personalized model scores what the official test_metrics scores: head(base(x) + client_mean)
    x = f["features"][: f["sizes"][0]]
    logits = engine.model.forward({n: t[:1] for n, t in alg.personalized().items()}, x.unsqueeze(0), train=False)[0]
    torch.testing.assert_close(logits, f["test_logits_client0"], **TOL)


def test_batchnorm_statistics_are_averaged_unlike_the_official_server(tmp_path):
    """The official server averages parameters only (DBE serverbase.py lines 141-150): its global BatchNorm
    statistics are the first uploaded client's. Here they are the uploads' sample-weighted mean."""
    cell = small_cell(
        algorithm="feddbe",
        model="cnn-bn",
        dataset="synthetic-images",
        rounds=1,
        dataset_options={"num_samples": 200, "channels": 3, "size": 32},
    )
    fed = federation(cell, tmp_path)
    alg = FedDBE(fed, FedDBE.parse_hyperparams({}))
    alg.setup()
    clients = torch.as_tensor(fed.schedule[0])
    run_round(alg, 1, clients)
    weights = fed.train_sizes[clients].float() / fed.train_sizes[clients].sum()
    name = "bn1.running_mean"
    uploaded = alg.client_state[name][clients]
    assert not torch.allclose(uploaded[0], uploaded[1])
    torch.testing.assert_close(alg.global_state[name][0], torch.tensordot(weights, uploaded, dims=1))
    assert not torch.allclose(alg.global_state[name][0], uploaded[0])
