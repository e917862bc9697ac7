"""FedPAC (pflbench/algorithms/fedpac.py) against the official code's lines run on the same tensors
(tests/fixtures/official/fedpac/: the generator names the repository and commit): each client's feature
statistics, its local update (head epoch, then the body with feature alignment) and prototypes; the
server's body average, prototype average and classifier collaboration (the QP's weights and the combined
heads). And a cell: what it sends, and that it refuses the privacy knob."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cells import small_cell
from pflbench.algorithms.fedpac import (
    FedPAC,
    FeaturesAndLogits,
    aligned_loss,
    combination_weights,
    feature_statistics,
    head_loss,
)
from pflbench.payload import Payload
from pflbench.kit.representation import Split
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, train_clients

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "official" / "fedpac" / "fedpac.pt", weights_only=False)
CLOSE = dict(rtol=1e-5, atol=1e-6)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


SPLIT = Split.of(ClientModel(Tiny()))
FEATURES = SPLIT.features_model()


def _statistics(state, x, y):
    z = FEATURES.forward({n: state[n].unsqueeze(0) for n in SPLIT.body_names}, x.unsqueeze(0), train=False)[0]
    return feature_statistics(z, y, 4)


def _local_update(f, i):
    """Client i's head epoch and body epoch, as FedPAC.local_train runs them, on the fixture's batches."""
    net = SPLIT.composite(FeaturesAndLogits)
    x, y = f["xs"][i], f["ys"][i]
    plan = [torch.arange(len(y)).view(-1, f["batch"])]
    sgd = SGD(lr=f["lr"], momentum=f["momentum"], weight_decay=f["weight_decay"])
    state = SPLIT.to_composite({k: v.unsqueeze(0).clone() for k, v in f["starts"][i].items()})
    _, _, before, _ = _statistics(f["starts"][i], x, y)
    state, _ = train_clients(
        net,
        state,
        x,
        y,
        [torch.arange(len(y))],
        plan,
        sgd,
        objective=head_loss,
        aux={"classes": torch.zeros(1, 4)},
        trainable=["head.weight", "head.bias"],
    )
    has = torch.tensor([k in f["global_protos"] for k in range(4)])
    protos = torch.stack([f["global_protos"].get(k, torch.zeros(8)) for k in range(4)])
    targets = torch.where(has.unsqueeze(-1), protos, before).unsqueeze(0)
    state, _ = train_clients(
        net,
        state,
        x,
        y,
        [torch.arange(len(y))],
        plan,
        sgd,
        objective=aligned_loss,
        aux={"targets": targets, "lam": torch.ones(1)},
        trainable=["body.fc1.weight", "body.fc1.bias"],
    )
    return {k: v[0] for k, v in SPLIT.from_composite(state).items()}


@pytest.mark.parametrize("i", [0, 1, 2])
def test_statistics_and_one_client_update_match_the_official_code(i):
    f = FIXTURE
    v, h, _, counts = _statistics(f["starts"][i], f["xs"][i], f["ys"][i])
    torch.testing.assert_close(v, f["vars"][i].float(), **CLOSE)
    torch.testing.assert_close(h, f["hs"][i], **CLOSE)
    trained = _local_update(f, i)
    for name, reference in f["trained"][i].items():
        torch.testing.assert_close(trained[name], reference, **CLOSE, msg=name)
    _, _, after, _ = _statistics(trained, f["xs"][i], f["ys"][i])
    for k, reference in f["local_protos"][i].items():
        torch.testing.assert_close(after[k], reference, **CLOSE)
    assert set(f["local_protos"][i]) == set(torch.nonzero(counts).flatten().tolist())


def test_one_aggregation_matches_the_official_code():
    f = FIXTURE
    engine = SimpleNamespace(
        model=SPLIT.model,
        kept_local=frozenset(),
        train_sizes=torch.tensor([20, 20, 20]),
        num_classes=4,
        device=torch.device("cpu"),
    )
    alg = FedPAC(engine, FedPAC.parse_hyperparams({}))
    alg._split = SPLIT
    alg.global_state = {k: v.unsqueeze(0).clone() for k, v in f["starts"][0].items()}
    alg.client_state = {k: torch.stack([s[k] for s in f["starts"]]) for k in f["starts"][0]}
    stats = [_statistics(f["trained"][i], f["xs"][i], f["ys"][i]) for i in range(3)]
    upload = {k: torch.stack([t[k] for t in f["trained"]]) for k in f["trained"][0]}
    upload.update(
        {
            "fedpac.v": f["vars"].float(),
            "fedpac.h": f["hs"],
            "fedpac.protos": torch.stack([s[2] for s in stats]),
            "fedpac.counts": torch.stack([s[3] for s in stats]),
        }
    )
    alg.aggregate(None, Payload.from_state(upload, torch.arange(3)))
    for name in ("fc1.weight", "fc1.bias"):
        torch.testing.assert_close(alg.global_state[name][0], f["global_body"][name], **CLOSE)
    for k, reference in f["new_global_protos"].items():
        torch.testing.assert_close(alg.global_protos[k], reference, **CLOSE)
    assert alg.has_proto.tolist() == [k in f["new_global_protos"] for k in range(4)]
    alphas = combination_weights(f["vars"].float(), f["hs"], 1e-3, 0.01)
    for i in range(3):
        torch.testing.assert_close(torch.as_tensor(alphas[i]).float(), f["alphas"][i].float(), rtol=0, atol=2e-4)
        for name, reference in f["new_heads"][i].items():
            torch.testing.assert_close(alg.client_state[name][i], reference, rtol=0, atol=2e-4)


def test_a_cell_uploads_the_head_and_statistics_and_refuses_privacy(tmp_path):
    fedpac = run_cell(small_cell(algorithm="fedpac", rounds=2), data_root=tmp_path)
    fedavg = run_cell(small_cell(rounds=2), data_root=tmp_path)
    assert fedpac.status == "finished"
    assert (fedpac.rounds["bytes_up"] > fedavg.rounds["bytes_up"]).all()  # + prototypes and statistics
    with pytest.raises(ValueError, match="algorithm 'fedpac' cannot run with privacy: FedPAC uploads feature"):
        FedPAC.check_cell(small_cell(algorithm="fedpac", privacy={"epsilon": 8.0}))


def test_a_class_no_client_reported_has_no_global_prototype_and_no_error():
    """The official `update_global_protos` (methods/fedpac.py:101-109) indexes every class of the
    aggregated prototypes and raises KeyError when no uploading client holds one; here such a class has no
    global prototype and a client aligns to its own for it."""
    f = FIXTURE
    engine = SimpleNamespace(
        model=SPLIT.model,
        kept_local=frozenset(),
        train_sizes=torch.tensor([20, 20, 20]),
        num_classes=4,
        device=torch.device("cpu"),
    )
    alg = FedPAC(engine, FedPAC.parse_hyperparams({"collaborate": False}))
    alg._split = SPLIT
    alg.global_state = {k: v.unsqueeze(0).clone() for k, v in f["starts"][0].items()}
    alg.client_state = {k: torch.stack([s[k] for s in f["starts"]]) for k in f["starts"][0]}
    counts = torch.tensor([[8.0, 8, 4, 0], [0, 10, 0, 0], [5, 5, 5, 0]])  # class 3: nobody
    upload = {k: torch.stack([t[k] for t in f["trained"]]) for k in f["trained"][0]}
    upload.update(
        {
            "fedpac.v": f["vars"].float(),
            "fedpac.h": f["hs"],
            "fedpac.protos": torch.rand(3, 4, 8),
            "fedpac.counts": counts,
        }
    )
    alg.aggregate(None, Payload.from_state(upload, torch.arange(3)))
    assert alg.has_proto.tolist() == [True, True, True, False]
    assert torch.equal(alg.global_protos[3], torch.zeros(8)) and alg.global_protos[:3].abs().sum() > 0
