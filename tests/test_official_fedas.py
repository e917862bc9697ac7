"""FedAS against its official code (github.com/xiyuanyang45/FedAS): one round of two clients (the alignment of
the received body to the client's prototypes, the local training, the Fisher traces) and the server's
Fisher-weighted average, on the fixed tensors of tests/fixtures/official/fedas/ (official.pt, written by
generate.py there from the official lines). The official alignment steps the server's one global model
client after client (serveras.py send_selected_models -> clientas.py set_parameters): tested that here a
client's alignment is its own (the order of the clients changes nothing) and equals the official lines run
on each client's own copy."""

from pathlib import Path

import pytest
import torch

from official_engine import OfficialEngine, round_of
from pflbench.algorithms.fedas import FISHER, FedAS

FIXTURE = torch.load(Path(__file__).parent / "fixtures/official/fedas/official.pt")
TOL = dict(rtol=1e-5, atol=1e-6)
BODY = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def _algorithm(batched):
    f = FIXTURE
    plans = {
        "default": f["plans"]["train"],
        str(FedAS.ALIGN_STREAM): f["plans"]["align"],
        str(FedAS.FISHER_STREAM): f["plans"]["fisher"],
    }
    engine = OfficialEngine(
        f["features"], f["labels"], f["sizes"], f["server"], plans, f["lr"], batched=batched, epochs=f["epochs"]
    )
    alg = FedAS(engine, FedAS.parse_hyperparams({}))
    alg.setup()
    for k, own in enumerate(f["own"]):  # each client's model from earlier rounds
        for n, t in own.items():
            alg.client_state[n][k] = t
    return engine, alg


def _round(alg, clients):
    rnd = round_of(clients)
    start = alg.receive(rnd, alg.configure(rnd))
    aligned = alg.align(rnd, start)
    upload = alg.send(rnd, alg.local_train(rnd, start))
    return rnd, aligned, upload


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "loop"])
def test_one_round_matches_the_official_lines_run_on_each_clients_copy(batched):
    f = FIXTURE
    assert f["commit"] == "1a4f5fdb0111a11e92559f6caaa1392e4c181ac1"
    expected = f["per_client"]
    engine, alg = _algorithm(batched)
    rnd, aligned, upload = _round(alg, [0, 1])
    for k in (0, 1):
        for n in BODY:
            torch.testing.assert_close(aligned[n][k], expected["aligned"][k][n], **TOL, msg=f"aligned {k} {n}")
        for n in engine.model.names:
            torch.testing.assert_close(alg.client_state[n][k], expected["trained"][k][n], **TOL, msg=f"trained {k} {n}")
    torch.testing.assert_close(upload.state[FISHER], expected["fisher"], **TOL)
    assert "fc3.weight" not in upload.state  # heads never leave the clients
    alg.aggregate(rnd, upload)
    for n in BODY:
        torch.testing.assert_close(alg.global_state[n][0], expected["aggregated"][n], **TOL, msg=n)
    assert alg.personalized() is alg.client_state  # each client is served its own model


def test_a_clients_alignment_does_not_depend_on_who_aligned_before_it():
    f = FIXTURE
    _, forward = _algorithm(True)
    _, aligned, _ = _round(forward, [0, 1])
    _, backward = _algorithm(True)
    _, reversed_aligned, _ = _round(backward, [1, 0])
    for n in BODY:
        torch.testing.assert_close(aligned[n][1], reversed_aligned[n][0], rtol=0, atol=1e-7)
    # the official code's second client starts from the body the first one aligned: another start
    first, second = f["official"]["aligned"][1], f["per_client"]["aligned"][1]
    assert max(float((first[n] - second[n]).abs().max()) for n in BODY) > 1e-4
    assert not torch.allclose(aligned["fc1.weight"][1], first["fc1.weight"], atol=1e-5)
