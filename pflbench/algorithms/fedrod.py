"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification").

What the paper says: the model is a body phi and a generic head h_G, trained by FedAvg, plus a personal
head h_P per client that never leaves it. Two losses, two predictors: the generic model minimizes a
class-balanced risk (balanced softmax, BSM: the logits shifted by the log of the client's class counts
before the cross-entropy), so that every client optimizes a consistent, label-shift-robust objective;
the personal head minimizes the client's empirical risk of the personalized prediction
h_G(z) + h_P(z) on the same representation z = phi(x), with the generic model fixed (the gradient of
the personal loss stops at z and at h_G(z)). The server averages phi and h_G (FedAvg). The
personalized model of a client is phi with h_G + h_P; the generic model is phi with h_G.

The official repository (github.com/hongyouc/Fed-RoD, commit b5050f4) holds only its README, so the
reference code is PFLlib's (github.com/TsingZ0/PFLlib, commit d832e76,
system/flcore/clients/clientrod.py), the one users run: per batch one SGD step of the whole model on
BSM(h_G(z)), then one step of h_P on CE(h_G(z).detach() + h_P(z.detach())) with z and h_G(z) from the
same forward pass before the first step; h_P starts as a copy of the initial h_G; its optimizer is SGD
at the client's learning rate.

Here:
- One forward pass computes both logits and one SGD step takes both losses' sum: the personal loss
  reaches only h_P (z and h_G(z) detached) and the generic loss never reaches h_P, so this is exactly
  PFLlib's two steps (checked against its lines on the same tensors: tests/test_fedrod.py).
- Class counts: of the client's train split (PFLlib: its train loader). A class the client lacks gets
  log 0 = -inf, as in PFLlib: it drops out of the balanced softmax.
- h_P starts as the initial h_G (PFLlib; the paper is silent). With the cell's momentum or weight decay
  h_P gets the same rule as the rest (PFLlib's head optimizer is plain SGD; with the defaults of
  our tables, momentum 0 and no weight decay, the two agree).
- Personalized model = the clients' architecture with head weight W_G + W_P and bias b_G + b_P: the same
  logits as h_G(z) + h_P(z), so the engine evaluates and adapts it as it does any model.
- BatchNorm statistics of phi are averaged with its weights (FedAvg's `weighted_mean`). PFLlib's
  server averages `model.parameters()` only (serverbase.py:138-150, clientbase.py:67-69), so there
  every client keeps its own statistics under the averaged weights (PFLlib#260): not followed.
- `generic_loss: ce` trains h_G on the plain cross-entropy (the paper's ablation, FedAvg's objective).
- Newcomers: the global phi and h_G, with h_P fitted on the newcomer's train split for the cell's
  local epochs, everything else frozen.
- Batched and groupable: one `engine.train` call on a composite model (pflbench.kit.representation), with a
  module-level objective whose per-client data (the log class counts) ride in `aux`.
- Communication: FedAvg's (phi and h_G down and up); h_P is never sent.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams, Serving
from pflbench.engine import Engine
from pflbench.fedavg import FedAvg
from pflbench.kit.representation import Split
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import State

PERSONAL = "personal"  # the composite's personal head


class FedRoDHP(Hyperparams):
    generic_loss: Literal["bsm", "ce"] = "bsm"  # the generic head's loss: balanced softmax (paper) or plain CE


class RoDNet(nn.Module):
    """phi, h_G and h_P: the logits [B, 2C] are h_G(z) and h_G(z).detach() + h_P(z.detach())."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body, self.head = body, head
        self.personal = nn.Linear(head.in_features, head.out_features, device="meta")

    def forward(self, x: Tensor) -> Tensor:
        z = self.body(x)
        generic = self.head(z)
        return torch.cat([generic, generic.detach() + self.personal(z.detach())], dim=-1)


def balanced_softmax(logits: Tensor, labels: Tensor, log_counts: Tensor) -> Tensor:
    """Mean balanced-softmax loss of each client's batch: the cross-entropy of logits + log(class
    counts) ([K, B, C], [K, B], [K, C]) -> [K]."""
    shifted = logits + log_counts.unsqueeze(1)
    per_sample = F.cross_entropy(shifted.flatten(0, 1), labels.flatten(), reduction="none")
    return per_sample.view(labels.shape).mean(dim=1)


def _mean_ce(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(dim=1)


def rod_loss(logits: Tensor, labels: Tensor, state: State, aux: State) -> Tensor:
    """FedRoD's two losses on RoDNet's logits: the generic head's (BSM, or CE where the log counts are
    zeros) plus the personalized prediction's cross-entropy."""
    classes = logits.shape[-1] // 2
    return balanced_softmax(logits[..., :classes], labels, aux["log_counts"]) + _mean_ce(logits[..., classes:], labels)


def personal_loss(logits: Tensor, labels: Tensor, state: State, aux: State) -> Tensor:
    """The personalized prediction's cross-entropy alone (fitting h_P with the rest frozen)."""
    return _mean_ce(logits[..., logits.shape[-1] // 2 :], labels)


@ALGORITHMS.register(
    "fedrod",
    card=Card(
        display_name="FedRoD",
        family="personal layers",
        paper="Chen & Chao, ICLR 2022",
        personalizes="a personal linear head added to the generic one; the generic model is trained with a "
        "class-balanced (balanced softmax) loss",
    ),
)
class FedRoD(FedAvg[FedRoDHP]):
    state = (*FedAvg.state, "personal_head")
    state_rebuilt = ("_split", "_net", "_log_counts")
    personal_head: State  # "weight" [N, C, d], "bias" [N, C]

    search_space = {"generic_loss": ("choice", ["bsm", "ce"])}

    def setup(self) -> None:
        super().setup()
        self._split = Split.of(self.engine.model)
        self._net: ClientModel = self._split.composite(RoDNet)
        initial = self.engine.init_state(self.engine.num_clients)
        self.personal_head = {self._split.head_key(n): initial[n] for n in self._split.head_names}
        self._log_counts = log_class_counts(self.engine, self.hp.generic_loss == "bsm")

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        start = {
            **self._split.to_composite(state),
            **{f"{PERSONAL}.{k}": t[clients] for k, t in self.personal_head.items()},
        }
        trained = self.engine.train(
            rnd, clients, start, objective=rod_loss, model=self._net, aux={"log_counts": self._log_counts[clients]}
        ).state
        for k in self.personal_head:
            self.personal_head[k][clients] = trained[f"{PERSONAL}.{k}"]
        return self._split.from_composite(trained)

    def personalized(self) -> State:
        models = dict(self.global_with_local())
        for k, t in self.personal_head.items():
            name = f"{self._split.head}.{k}"
            models[name] = models[name] + t
        return models

    def newcomer_models(self, serving: Serving) -> State:
        newcomers = serving.clients
        count = newcomers.num_clients
        start = {n: t.expand(count, *t.shape[1:]).clone() for n, t in self.global_state.items()}
        fresh = newcomers.init_state(count)
        start = {
            **self._split.to_composite(start),
            **{f"{PERSONAL}.{self._split.head_key(n)}": fresh[n] for n in self._split.head_names},
        }
        everyone = torch.arange(count, device=newcomers.device)
        trainable = [n for n in self._net.param_names if n.startswith(f"{PERSONAL}.")]
        fitted = newcomers.train(
            serving.round,
            everyone,
            start,
            objective=personal_loss,
            model=self._net,
            trainable=trainable,
            stream="batches.newcomer-fit",
        ).state
        models = self._split.from_composite(fitted)
        for n in self._split.head_names:
            models[n] = models[n] + fitted[f"{PERSONAL}.{self._split.head_key(n)}"]
        return models


def log_class_counts(engine: Engine, balanced: bool = True) -> Tensor:
    """[N, C]: the log of each client's class counts in its train split (zeros where not `balanced`:
    the balanced softmax is then the plain cross-entropy)."""
    counts = torch.zeros(engine.num_clients, engine.num_classes, device=engine.device)
    if not balanced:
        return counts
    for c in range(engine.num_clients):
        _, labels = engine.data(engine.sample_ids(c, "train"))
        counts[c] = torch.bincount(labels, minlength=engine.num_classes).float()
    return counts.log()
