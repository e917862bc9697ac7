"""GPFL against its official code (github.com/TsingZ0/GPFL): one round of two clients (configure, receive,
local training of the body, head, CoV and GCE, send) and the server's averages of the feature extractor,
GCE and CoV, with the conditions that follow, on the fixed tensors of tests/fixtures/official/gpfl/
(official.pt, written by generate.py there from the official lines); the official server's BatchNorm bug,
tested absent."""

from pathlib import Path

import pytest
import torch

from cells import federation, small_cell
from official_engine import OfficialEngine, round_of
from pflbench.algorithms.gpfl import GPFL
from pflbench.algorithms.gpfl import class_shares, valve
from pflbench.kit.feature_training import forward_with_features
from pflbench.simulator.rounds import run_round
from pflbench.serving import Serving

FIXTURE = torch.load(Path(__file__).parent / "fixtures/official/gpfl/official.pt")
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "loop"])
def test_one_round_and_the_server_averages_match_the_official_code(batched):
    f = FIXTURE
    assert f["commit"] == "ed7a7fe1c0fead0f04b7d0408885610d91b363d8"
    engine = OfficialEngine(
        f["features"],
        f["labels"],
        f["sizes"],
        f["server"],
        {"default": f["plans"]},
        f["lr"],
        batched=batched,
        epochs=f["epochs"],
    )
    alg = GPFL(engine, GPFL.parse_hyperparams({"lam": f["lam"], "mu": f["mu"]}))
    alg.setup()
    for n, t in f["server"].items():  # the server's body, CoV and GCE
        alg.global_state[n] = t.unsqueeze(0).clone()
    for k, heads in enumerate(f["start_heads"]):  # each client's own head
        for n in ("fc3.weight", "fc3.bias"):
            alg.client_state[n][k] = heads[n]
    alg.generic = torch.stack([g for g, _ in f["start_conditions"]])
    alg.personal = torch.stack([p for _, p in f["start_conditions"]])

    clients = [0, 1]
    rnd = round_of(clients)
    download = alg.configure(rnd)
    assert "fc3.weight" not in download.state  # heads never leave the clients
    upload = alg.send(rnd, alg.local_train(rnd, alg.receive(rnd, download)))
    for k in clients:
        for n, expected in f["trained"][k].items():
            got = alg.client_state[n][k] if n in engine.model.names else upload.state[n][k]
            torch.testing.assert_close(got, expected, **TOL, msg=f"client {k} {n}")
    alg.aggregate(rnd, upload)
    for n, expected in f["aggregated"].items():
        torch.testing.assert_close(alg.global_state[n][0], expected, **TOL, msg=n)
    for k, (generic, personal) in enumerate(f["conditions"]):  # every client took part: the official conditions
        torch.testing.assert_close(alg.generic[k], generic, **TOL)
        torch.testing.assert_close(alg.personal[k], personal, **TOL)
    x = f["features"][: f["sizes"][0]]  # the official test_metrics' logits for client 0: head(CoV(f, p_0))
    models = alg.personalized()
    row = {n: t[:1] for n, t in models.items()}
    _, feats = forward_with_features(engine.model, {n: row[n] for n in engine.model.names}, x.unsqueeze(0), False)
    logits = alg._head.logits(row, valve(row, feats, row["condition"]))[0]
    torch.testing.assert_close(logits, f["test_logits_client0"], **TOL)


def test_batchnorm_statistics_of_the_body_are_averaged_unlike_the_official_server(tmp_path):
    """The official server averages the feature extractor's parameters only (GPFL servergp.py lines 72-83):
    each client keeps its own BatchNorm statistics. Here they are the uploads' sample-weighted mean."""
    cell = small_cell(
        algorithm="gpfl",
        model="cnn-bn",
        dataset="synthetic-images",
        rounds=1,
        dataset_options={"num_samples": 200, "channels": 3, "size": 32},
    )
    fed = federation(cell, tmp_path)
    alg = GPFL(fed, GPFL.parse_hyperparams({}))
    alg.setup()
    clients = torch.as_tensor(fed.schedule[0])
    run_round(alg, 1, clients)
    weights = fed.train_sizes[clients].float() / fed.train_sizes[clients].sum()
    uploaded = alg.client_state["bn2.running_var"][clients]
    assert not torch.allclose(uploaded[0], uploaded[1])
    torch.testing.assert_close(alg.global_state["bn2.running_var"][0], torch.tensordot(weights, uploaded, dims=1))


def test_the_personalized_model_is_scored_through_the_valve(tmp_path):
    """evaluate scores head(CoV(body(x), p_i)); the engine's plain model (no valve) scores differently."""
    fed = federation(small_cell(algorithm="gpfl", rounds=1), tmp_path)
    alg = GPFL(fed, GPFL.parse_hyperparams({}))
    alg.setup()
    run_round(alg, 1, torch.as_tensor(fed.schedule[0]))
    models = alg.personalized()
    ours = alg.evaluate(Serving(round=1, clients=fed), models, ("test",))["test"]
    plain = fed.evaluate({n: models[n] for n in fed.model.names}, "test")
    assert not torch.allclose(ours[1], plain[1])
    c = 0
    ids = fed.sample_ids(c, "test")
    x, y = fed.data(ids.unsqueeze(0))
    row = {n: t[c : c + 1] for n, t in models.items()}
    _, feats = forward_with_features(fed.model, {n: row[n] for n in fed.model.names}, x, False)
    logits = alg._head.logits(row, valve(row, feats, row["condition"]))[0]
    torch.testing.assert_close(ours[0][c], (logits.argmax(-1) == y[0]).float().mean())


def test_a_newcomer_gets_the_global_valve_its_own_condition_and_a_fitted_head(tmp_path):
    fed = federation(small_cell(algorithm="gpfl", rounds=1), tmp_path)
    alg = GPFL(fed, GPFL.parse_hyperparams({}))
    alg.setup()
    run_round(alg, 1, torch.as_tensor(fed.schedule[0]))
    models = alg.newcomer_models(Serving(round=1, clients=fed, newcomers=True))
    shares = class_shares(fed)
    torch.testing.assert_close(models["condition"], shares @ alg.global_state["gce.embedding"][0])
    for n in ("fc1.weight", "cov.gamma.weight", "gce.embedding"):
        torch.testing.assert_close(models[n], alg.global_state[n].expand_as(models[n]))
    assert not torch.allclose(models["fc3.weight"], fed.init_state(1)["fc3.weight"].expand_as(models["fc3.weight"]))
