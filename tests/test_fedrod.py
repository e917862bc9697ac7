"""FedRoD (pflbench/algorithms/fedrod.py): one client update and one aggregation of ours against PFLlib's
lines run on the same tensors (tests/fixtures/official/fedrod/: the generator names the repository and
commit), its personalized model as the sum of the two heads, and what it sends."""

from pathlib import Path

import torch
from torch import nn

from cells import small_cell
from pflbench.algorithms.fedrod import RoDNet, rod_loss
from pflbench.kit.representation import Split
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, train_clients, weighted_mean

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "official" / "fedrod" / "fedrod.pt")


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_one_client_update_matches_pfllib():
    f = FIXTURE
    split = Split.of(ClientModel(Tiny()))
    net = split.composite(RoDNet)
    start = {
        **split.to_composite({k: v.unsqueeze(0) for k, v in f["initial"].items()}),
        "personal.weight": f["initial"]["fc2.weight"].unsqueeze(0),  # PFLlib: a copy of the initial head
        "personal.bias": f["initial"]["fc2.bias"].unsqueeze(0),
    }
    counts = torch.bincount(f["y"], minlength=4).float()
    plan = torch.arange(len(f["y"])).view(-1, f["batch"])  # the fixture's batches, in order
    for batched in (True, False):
        trained, _ = train_clients(
            net,
            {k: v.clone() for k, v in start.items()},
            f["x"],
            f["y"],
            [torch.arange(len(f["y"]))],
            [plan],
            SGD(lr=f["lr"]),
            objective=rod_loss,
            aux={"log_counts": counts.log().unsqueeze(0)},
            batched=batched,
        )
        ours = split.from_composite(trained)
        for name, reference in f["trained"].items():
            torch.testing.assert_close(ours[name][0], reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(trained["personal.weight"][0], f["personal"]["weight"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(trained["personal.bias"][0], f["personal"]["bias"], rtol=1e-5, atol=1e-6)


def test_one_aggregation_matches_pfllib():
    f = FIXTURE
    sizes = torch.tensor(f["train_samples"], dtype=torch.float)
    for name, reference in f["aggregated"].items():
        stacked = torch.stack([f["trained"][name], f["other"][name]])
        torch.testing.assert_close(weighted_mean(stacked, sizes / sizes.sum()), reference, rtol=1e-6, atol=1e-7)


def test_the_personalized_model_is_the_sum_of_the_heads_and_the_personal_head_is_never_sent(tmp_path):
    fedrod = run_cell(small_cell(algorithm="fedrod", rounds=2), data_root=tmp_path)
    fedavg = run_cell(small_cell(algorithm="fedavg", rounds=2), data_root=tmp_path)
    assert fedrod.status == "finished"
    assert fedrod.rounds["bytes_up"].equals(fedavg.rounds["bytes_up"])  # phi and h_G: FedAvg's bytes
    assert fedrod.rounds["bytes_down"].equals(fedavg.rounds["bytes_down"])
    assert fedrod.metrics["accuracy"].mean() > fedavg.metrics["accuracy"].mean()  # pathological: personal heads help

    split = Split.of(ClientModel(Tiny()))
    net = split.composite(RoDNet)
    gen = torch.Generator().manual_seed(1)
    state = {n: torch.randn(2, *shape, generator=gen) for n, shape in net.shapes.items()}
    x = torch.randn(2, 5, 6, generator=gen)
    logits = net.forward(state, x, train=False)
    summed = split.from_composite(state)
    summed["fc2.weight"] = summed["fc2.weight"] + state["personal.weight"]
    summed["fc2.bias"] = summed["fc2.bias"] + state["personal.bias"]
    torch.testing.assert_close(split.model.forward(summed, x, train=False), logits[..., 4:], rtol=1e-5, atol=1e-6)
