"""pFedHN and pFedHN-PC (Shamsian, Navon, Fetaya, Chechik; ICML 2021): one hypernetwork on the
server generates every client's model from a learned client embedding.

What the paper and its official code (AvivSham/pFedHN) say:
- Hypernetwork: client embedding table (N x d, d = int(1 + N/4)) -> Linear(d, 100) -> n_hidden x
  [ReLU, Linear(100, 100)] (n_hidden = 3) -> one Linear(100, numel) head per target tensor, no
  final activation. Optimizer: SGD lr 1e-2, momentum 0.9, weight decay 1e-3; gradient-norm clip 50.
- A step: generate theta_i = h(v_i; phi), the client trains it (50 inner SGD steps of batch 64,
  lr 5e-3, momentum 0.9, weight decay 5e-5, clip 50) and returns delta_i = theta_after - theta_i;
  the server's gradient is the vector-Jacobian product (d theta_i / d (phi, v_i))^T (theta_i -
  theta_after), then one optimizer step.
- pFedHN-PC: the hypernetwork generates the feature extractor only; each client keeps a personal
  classifier (the last layer) that it trains with the generated body and never sends.
- Schedule: 5000 steps, one random client per step.

Adapted to rounds of sampled clients (what this module chooses):
- Every sampled client trains the model generated at the start of the round, as in the paper's
  steps; then the server applies one hypernetwork step per sampled client, in the order of the
  round's client list, each computed at the current hypernetwork. With one client per round this
  is exactly the official loop; with K clients a round is K official steps.
- Local training: `inner_steps` SGD steps (default 50, the paper's) at the cell's batch size,
  learning rate, momentum and weight decay, so every method of a matrix shares one local optimizer;
  `inner_steps: null` trains the cell's local epochs instead.
- The embedding's momentum and weight decay touch only the sampled client's row (its issue tracker
  notes that momentum on the whole table moves every client's embedding, also the unsampled ones).
- BatchNorm statistics (the CIFAR model's) are not generated: they stay on the client.
- The personalized model of a client is the one the hypernetwork generates for it now (with its own
  classifier for pFedHN-PC): a client never sampled still gets one.

Artifacts: `embeddings` [N, d], every evaluation round.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

from pflbench.algorithm import ALGORITHMS, Algorithm, Hyperparams


class HyperNetwork(nn.Module):
    """Embedding -> MLP -> one linear head per generated tensor."""

    def __init__(self, num_clients: int, shapes: dict[str, torch.Size], embed_dim: int, hidden_dim: int,
                 hidden_layers: int):
        super().__init__()
        self.shapes = shapes
        self.embedding = nn.Parameter(torch.randn(num_clients, embed_dim))  # nn.Embedding's init
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden_dim)]
        for _ in range(hidden_layers):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden_dim, math.prod(s)) for s in shapes.values())

    def body(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if name != "embedding"]

    def forward(self, rows: Tensor) -> dict[str, Tensor]:
        features = self.mlp(self.embedding[rows])
        return {name: head(features).view(len(rows), *shape)
                for (name, shape), head in zip(self.shapes.items(), self.heads)}


@ALGORITHMS.register("pfedhn")
class PFedHN(Algorithm):
    name = "pfedhn"
    personal_classifier = False

    class Hyperparams(Hyperparams):
        hn_lr: float = Field(1e-2, gt=0)
        hn_momentum: float = Field(0.9, ge=0, lt=1)
        hn_weight_decay: float = Field(1e-3, ge=0)
        embed_dim: int | None = Field(None, ge=1)   # None: int(1 + N / 4), the official rule
        hidden_dim: int = Field(100, ge=1)
        hidden_layers: int = Field(3, ge=0)
        inner_steps: int | None = Field(50, ge=1)   # None: the cell's local epochs
        clip: float = Field(50.0, gt=0)

    search_space = {"hn_lr": ("loguniform", 1e-3, 1e-1), "inner_steps": ("choice", [25, 50, 100]),
                    "embed_dim": ("int", 2, 64)}

    def setup(self) -> None:
        fed, hp = self.fed, self.hp
        n = fed.num_clients
        self.client_state = fed.init_state(n)   # buffers, and pFedHN-PC's personal classifiers
        params = fed.model.param_names
        if self.personal_classifier:
            _, head = fed.model.split_layers(1)
            self.generated = [p for p in params if p not in head]
        else:
            self.generated = list(params)
        shapes = {p: self.client_state[p].shape[1:] for p in self.generated}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(fed.cell.seed * 7919 + 29)
            self.hypernet = HyperNetwork(n, shapes, hp.embed_dim or int(1 + n / 4), hp.hidden_dim,
                                         hp.hidden_layers).to(fed.device)
        self.optimizer = torch.optim.SGD(self.hypernet.body(), lr=hp.hn_lr, momentum=hp.hn_momentum,
                                         weight_decay=hp.hn_weight_decay)
        self.embedding_momentum = torch.zeros_like(self.hypernet.embedding)

    def configure(self, rnd, clients):
        with torch.no_grad():
            self._generated = self.hypernet(clients)
        return dict(self._generated)

    def receive(self, rnd, clients, download):
        return {n: download[n] if n in download else self.client_state[n][clients] for n in self.fed.model.names}

    def local_train(self, rnd, clients, state):
        return self.fed.train(rnd, clients, state, steps=self.hp.inner_steps).state

    def send(self, rnd, clients, state):
        for n, t in state.items():
            if n not in self._generated:
                self.client_state[n][clients] = t
        return {n: state[n] - self._generated[n] for n in self.generated}

    def aggregate(self, rnd, clients, upload):
        for k, client in enumerate(clients.tolist()):
            self.hypernetwork_step(client, {n: -t[k] for n, t in upload.items()})
        self._generated = None

    def hypernetwork_step(self, client: int, grad_theta: dict[str, Tensor]) -> None:
        """One optimizer step on <h(v_client; phi), grad_theta> (grad_theta = theta_before - theta_after)."""
        hp = self.hp
        row = torch.tensor([client], device=self.fed.device)
        generated = self.hypernet(row)
        params = [self.hypernet.embedding, *self.hypernet.body()]
        grads = torch.autograd.grad(list(generated.values()), params,
                                    grad_outputs=[grad_theta[n].unsqueeze(0) for n in generated])
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = min(1.0, hp.clip / (float(norm) + 1e-6))  # clip_grad_norm_ over the step's gradients
        for p, g in zip(params[1:], grads[1:]):
            p.grad = g * scale
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():  # SGD with momentum and weight decay on the client's embedding row only
            v = self.hypernet.embedding[client]
            g = grads[0][client] * scale + hp.hn_weight_decay * v
            self.embedding_momentum[client] = hp.hn_momentum * self.embedding_momentum[client] + g
            v -= hp.hn_lr * self.embedding_momentum[client]

    def personalized(self):
        with torch.no_grad():
            generated = self.hypernet(torch.arange(self.fed.num_clients, device=self.fed.device))
        return {n: generated.get(n, self.client_state[n]) for n in self.fed.model.names}

    def artifacts(self):
        return {"embeddings": self.hypernet.embedding.detach().cpu().numpy().astype(np.float32)}


@ALGORITHMS.register("pfedhn-pc")
class PFedHNPC(PFedHN):
    """pFedHN-PC: the hypernetwork generates the body; each client's classifier is its own."""

    name = "pfedhn-pc"
    personal_classifier = True
