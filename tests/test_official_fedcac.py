"""FedCAC against its authors' code (github.com/kxzxvbk/Fling): one round of three clients (local training,
critical masks), the server's global and customized models and each client's next model, on the fixed
tensors of tests/fixtures/official/fedcac/ (official.pt, written by generate.py there from the authors'
lines); the masks' edge cases and the collaborators' rule, checked by hand."""

from pathlib import Path

import pytest
import torch

from official_engine import OfficialEngine, round_of
from pflbench.algorithms.fedcac import FedCAC, collaborators, critical_mask

FIXTURE = torch.load(Path(__file__).parent / "fixtures/official/fedcac/official.pt")
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "loop"])
def test_one_round_matches_the_authors_code(batched):
    f = FIXTURE
    assert f["commit"] == "f6c6f1e7c49f9341587bee2c95f1a31e63176bee"
    engine = OfficialEngine(
        f["features"],
        f["labels"],
        f["sizes"],
        f["initial"],
        {"default": f["plans"]},
        f["lr"],
        batched=batched,
        epochs=f["epochs"],
    )
    alg = FedCAC(engine, FedCAC.parse_hyperparams({"tau": f["tau"], "beta": f["beta"]}))
    alg.setup()
    clients = [0, 1, 2]
    rnd = round_of(clients, number=1)  # the authors' first aggregation: epoch 0, (epoch + 1) / beta
    download = alg.configure(rnd)
    trained = alg.local_train(rnd, alg.receive(rnd, download))
    upload = alg.send(rnd, trained)
    for k in clients:
        for n in engine.model.names:
            torch.testing.assert_close(trained[n][k], f["trained"][k][n], **TOL, msg=f"client {k} {n}")
            assert torch.equal(upload.state["critical." + n][k].bool(), f["masks"][k][n]), (k, n)
    alg.aggregate(rnd, upload)
    for n in engine.model.names:
        torch.testing.assert_close(alg.global_state[n][0], f["global"][n], **TOL, msg=n)
        for k in clients:
            torch.testing.assert_close(alg.customized[n][k], f["customized"][k][n], **TOL, msg=f"{k} {n}")
    following = alg.configure(round_of(clients, number=2)).state  # what each client starts the next round from
    served = alg.personalized()
    for k in clients:
        for n in engine.model.names:
            torch.testing.assert_close(following[n][k], f["next"][k][n], **TOL, msg=f"client {k} {n}")
            torch.testing.assert_close(served[n][k], f["next"][k][n], **TOL)


def test_collaborators_are_the_authors_and_their_rule_by_hand():
    f = FIXTURE
    flat = torch.stack([torch.cat([m[n].flatten() for n in m]) for m in f["masks"]])
    together = collaborators(flat, 1, f["beta"])
    assert [sorted(torch.nonzero(row).flatten().tolist()) for row in together] == f["collaborators"]
    m = flat.float()
    overlap = [[1 - (m[i] - m[j]).abs().sum() / (2 * m[i].sum()) for j in range(3) if j != i] for i in range(3)]
    values = torch.tensor(overlap)
    threshold = values.mean() + 1 / f["beta"] * (values.max() - values.mean())
    for i in range(3):
        others = [j for j in range(3) if j != i]
        assert {j for j, o in zip(others, overlap[i]) if o >= threshold} | {i} == set(f["collaborators"][i])
    assert collaborators(flat[:1], 5, 100).tolist() == [[True]]  # one upload: its own model


def test_mask_edge_cases_are_the_authors():
    before = torch.zeros(1, 4)
    after = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert critical_mask(before, after, 0.5).tolist() == [[False, False, True, True]]  # the top half
    assert critical_mask(before, after, 0.1).tolist() == [[False] * 4]  # int(0.4) = 0: none critical
    sparse = torch.tensor([[0.0, 0.0, 0.0, 2.0]])  # the top-half threshold is 0: the smallest non-zero score instead
    assert critical_mask(before, sparse, 0.5).tolist() == [[False, False, False, True]]
    assert critical_mask(before, torch.zeros(1, 4), 0.5).tolist() == [[True] * 4]  # every score zero: all critical
