"""A minimal engine (the few members of pflbench.engine.Engine a method's local update and aggregation read)
over fixed tensors, for the checks against official code (tests/fixtures/official/<method>/): the clients'
samples, fixed batch plans per stream, the fixture's initial model, plain SGD."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from pflbench.engine import Budget, TrainResult
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, train_clients


class TinyNet(nn.Module):
    """fc1, ReLU, fc2, ReLU, fc3: the fixtures' model (the official base/head split: base fc1..fc2, head fc3)."""

    def __init__(self, sizes=(6, 5, 4, 3)):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (
            nn.Linear(sizes[0], sizes[1]),
            nn.Linear(sizes[1], sizes[2]),
            nn.Linear(sizes[2], sizes[3]),
        )

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@dataclass
class OfficialEngine:
    """`plans[stream name or "default"][client]`: positions into the client's samples, [steps, batch]."""

    features: torch.Tensor
    labels: torch.Tensor
    sizes: list[int]
    initial: dict
    plans: dict
    lr: float
    batched: bool = True
    epochs: int = 1

    def __post_init__(self):
        self.model = ClientModel(TinyNet())
        starts = [0, *torch.tensor(self.sizes).cumsum(0).tolist()]
        self._owned = [torch.arange(starts[k], starts[k + 1]) for k in range(len(self.sizes))]
        self.device = torch.device("cpu")
        self.kept_local = frozenset()
        self.sgd = SGD(self.lr)
        first = next(iter(self.plans.values()))[0]
        self.budget = Budget(
            rounds=1, clients_per_round=len(self.sizes), local_epochs=self.epochs, batch_size=first.shape[1]
        )

    @property
    def num_clients(self):
        return len(self.sizes)

    @property
    def train_sizes(self):
        return torch.tensor(self.sizes)

    def init_state(self, num, group=None, model=None):
        return {n: self.initial[n].unsqueeze(0).repeat(num, *([1] * self.initial[n].dim())) for n in self.model.names}

    @property
    def num_classes(self):
        return int(self.labels.max()) + 1

    def torch_global(self, stream, round=None, client=None):
        return contextlib.nullcontext()  # the fixture sets every value that would be drawn

    def sample_ids(self, client, split="train"):
        return self._owned[client]

    def local_plans(self, rnd, clients, *, epochs=None, steps=None, split="train", stream=None):
        table = self.plans.get(str(stream) if stream is not None else "default", self.plans["default"])
        return [table[int(c)] for c in clients]

    def train(self, rnd, clients, state, *, epochs=None, stream=None, **unused):
        """The engine's local SGD (cross-entropy on every parameter) on the fixed plans."""
        assert not unused, unused
        clients = [int(c) for c in clients]
        plans = self.local_plans(rnd, clients, stream=stream)
        new, loss = train_clients(
            self.model,
            state,
            self.features,
            self.labels,
            [self._owned[c] for c in clients],
            plans,
            self.sgd,
            batched=self.batched,
        )
        return TrainResult(new, loss, torch.tensor([len(plan) for plan in plans], dtype=torch.int64))

    def data(self, ids):
        return self.features[ids], self.labels[ids]


def round_of(clients, number=1):
    """What a round's hooks read of its context: its clients and number."""
    return SimpleNamespace(clients=torch.as_tensor(clients), number=number)
