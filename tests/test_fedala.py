"""FedALA (pflbench/algorithms/fedala.py): its adaptive local aggregation (the client's first, run to
convergence, and a later one-pass one) and the server's aggregation against the official code's lines
run on the same tensors (tests/fixtures/official/fedala/: the generator names the repository and
commit); and a cell, batched and looped alike, with W kept on the client."""

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from cells import assert_batched_matches_loop, small_cell
from pflbench.algorithms.fedala import FedALA
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import weighted_mean

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "official" / "fedala" / "fedala.pt")


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _client(fixture):
    """FedALA's `ala` on an engine that holds the fixture's 20 samples, its s% sample the fixture's
    batches in order (the official loader's, with s = 100)."""
    x, y, batch = fixture["x"], fixture["y"], fixture["batch"]
    engine = SimpleNamespace(model=ClientModel(Tiny()), device=torch.device("cpu"), data=lambda ids: (x[ids], y[ids]))
    alg = FedALA(engine, FedALA.parse_hyperparams({}))
    alg._higher = ["fc2.weight", "fc2.bias"]  # official layer_idx=2: the last layer's two tensors
    ids = torch.arange(len(y)).view(1, -1, batch)
    alg._sample = lambda round_number, clients: (ids, torch.tensor([ids.shape[1]]))
    return alg


def _stacked(state):
    return {k: v.unsqueeze(0) for k, v in state.items()}


def test_adaptive_local_aggregation_matches_the_official_code():
    f = FIXTURE
    alg = _client(f)
    weights = {"fc2.weight": torch.ones(1, 4, 8), "fc2.bias": torch.ones(1, 4)}
    model, weights, start = alg.ala(
        1, torch.tensor([0]), _stacked(f["global1"]), _stacked(f["start"]), weights, torch.tensor([True])
    )
    assert not bool(start[0])  # its first ALA ran
    for name, reference in f["after_first"].items():
        torch.testing.assert_close(model[name][0], reference, rtol=1e-5, atol=1e-6, msg=name)
    for name, reference in zip(alg._higher, f["weights_first"]):
        torch.testing.assert_close(weights[name][0], reference, rtol=1e-5, atol=1e-6, msg=name)
    model, weights, _ = alg.ala(
        2, torch.tensor([0]), _stacked(f["global2"]), _stacked(f["before_second"]), weights, start
    )
    for name, reference in f["after_second"].items():
        torch.testing.assert_close(model[name][0], reference, rtol=1e-5, atol=1e-6, msg=name)
    for name, reference in zip(alg._higher, f["weights_second"]):
        torch.testing.assert_close(weights[name][0], reference, rtol=1e-5, atol=1e-6, msg=name)


def test_the_first_round_keeps_the_local_model():
    f = FIXTURE
    alg = _client(f)
    weights = {"fc2.weight": torch.ones(1, 4, 8), "fc2.bias": torch.ones(1, 4)}
    same = _stacked(f["start"])
    model, kept, start = alg.ala(1, torch.tensor([0]), same, same, weights, torch.tensor([True]))
    assert bool(start[0]) and all(torch.equal(model[n], same[n]) for n in same)
    assert all(torch.equal(kept[n], weights[n]) for n in weights)


def test_one_aggregation_matches_the_official_code():
    f = FIXTURE
    sizes = torch.tensor(f["samples"], dtype=torch.float)
    for name, reference in f["aggregated"].items():
        stacked = torch.stack([u[name] for u in f["uploads"]])
        torch.testing.assert_close(weighted_mean(stacked, sizes / sizes.sum()), reference, rtol=1e-6, atol=1e-7)


def test_a_cell_runs_batched_as_looped_and_sends_fedavgs_bytes(tmp_path):
    cell = small_cell(algorithm="fedala", rounds=3, hp=FedALA.quick_hp)
    assert_batched_matches_loop(cell, tmp_path)
    fedala, fedavg = run_cell(cell, data_root=tmp_path), run_cell(small_cell(rounds=3), data_root=tmp_path)
    assert fedala.rounds["bytes_up"].equals(fedavg.rounds["bytes_up"])
    assert fedala.rounds["bytes_down"].equals(fedavg.rounds["bytes_down"])


def test_batchnorm_statistics_are_averaged_and_received_unlike_the_official_code(tmp_path):
    """The official server averages and sends `parameters()` only (serverALA.py:111-123, ALA.py:86-87):
    its clients keep their own BatchNorm statistics under averaged weights. Here they are averaged with
    the weights (and ALA takes them from the global model, with the lower layers)."""
    from pflbench.simulator.rounds import build_cell, prepare_cell, run_rounds
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.training import weighted_mean as mean

    cell = small_cell(
        algorithm="fedala",
        rounds=1,
        dataset="synthetic-images",
        model="cnn-bn",
        hp=FedALA.quick_hp,
        dataset_options={"num_samples": 200, "channels": 3, "size": 28},
    )
    dataset, splits = prepare_cell(cell, tmp_path)
    fed, alg = build_cell(cell, dataset, splits, ExecutionOptions())
    run_rounds(fed, alg)
    sizes = fed.train_sizes.float()
    for name in ("bn1.running_mean", "bn2.running_var"):
        torch.testing.assert_close(alg.global_state[name][0], mean(alg.client_state[name], sizes / sizes.sum()))
        assert not torch.equal(alg.client_state[name][0], alg.client_state[name][1])
