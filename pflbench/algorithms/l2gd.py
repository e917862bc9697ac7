"""L2GD, Loopless Local Gradient Descent (Hanzely & Richtárik 2020, "Federated learning of a
mixture of global and local models").

What the paper says: the objective mixes local and global models,
    min_{x_1..x_n}  f(x) + lambda * psi(x),   f(x) = 1/n sum_i f_i(x_i),
    psi(x) = 1/(2n) sum_i ||x_i - xbar||^2,   xbar = 1/n sum_i x_i,
(lambda = 0: pure local models; lambda -> infinity: one global model). L2GD is SGD on it with a
random choice of term: at every iteration a coin xi ~ Bernoulli(p) is tossed;
- xi = 0 (probability 1 - p): local step on every device, x_i <- x_i - alpha / (n (1 - p)) grad f_i(x_i),
  no communication;
- xi = 1 (probability p): aggregation step, x_i <- x_i - alpha lambda / (n p) (x_i - xbar), which
  needs the devices' models averaged (communication); alpha lambda / (n p) = 1 is full averaging,
  values in (0, 1) only pull the local models toward the average. Communication only on the
  probability-p iterations; expected local steps between them (1 - p) / p.

How it maps onto the engine's rounds (the adaptation):
- One round = one coin toss of the paper's loop. A local round runs the cell's `local_epochs` of
  local SGD on each sampled client (instead of a single gradient step), at the cell's lr; the
  paper's local step size alpha / (n (1 - p)) is identified with the cell's lr, i.e. the paper's
  alpha = lr * n (1 - p). A communicating round makes no gradient step: it is the paper's
  aggregation step x_i <- x_i - theta (x_i - xbar) with
      theta = alpha lambda / (n p) = lr * lambda * (1 - p) / p,
  clipped to 1 (full averaging; the paper requires theta <= 1).
- Coins come from a generator seeded by the cell seed (`coin_flips`), drawn once for all rounds:
  runs are reproducible and every sweep point with the same seed and p sees the same coins.
- Communication: local rounds send and receive nothing (configure/send return {}). On a
  communicating round each sampled client uploads its model and downloads xbar: one model each
  way. The engine calls `configure` (download) before `send` (upload); in this simulation the
  server computes xbar from the clients' current models in `configure`, and `send` returns exactly
  those pre-pull models, so both directions are counted in that round.
- xbar is the plain mean over the sampled clients (the paper's 1/n, not FedAvg's sample weights);
  with partial participation only the sampled clients average and are pulled, and only sampled
  clients train in local rounds. Integer buffers (BatchNorm counters) take the maximum.
- The personalized model of each client is its own x_i (evaluated every round); the server's
  global_state holds the last xbar (for inspection only).
- Defaults (the paper sweeps p and lambda; no single recommended value): p = 0.2 (a communication
  every fifth round in expectation, a typical point of its sweep), lambda = 10 (theta = 0.4 at
  lr = 0.01: a real pull without full averaging). Search space: p uniform [0.05, 0.9], lambda
  log-uniform [0.1, 1000].
"""

from __future__ import annotations

import numpy as np
import torch

from pydantic import Field

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Hyperparams, Payload, Round
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State

COINS = streams.salted_cell("l2gd.coins", 0x1260)  # the coin flips of every round, drawn once per cell


def coin_flips(rng: np.random.Generator, rounds: int, p: float) -> np.ndarray:
    """The communication coin of every round (index rnd - 1), drawn from `rng` (the cell's stream
    `COINS`): True with probability p."""
    return rng.random(rounds) < p


class L2GDHP(Hyperparams):
    lam: float = Field(10.0, ge=0.0)  # lambda, weight of the distance-to-average penalty
    p: float = Field(0.2, gt=0.0, lt=1.0)  # probability that a round communicates (aggregation step)


@ALGORITHMS.register(
    "l2gd",
    card=Card(
        display_name="L2GD",
        family="regularized and meta-learned",
        paper="Hanzely & Richtárik, arXiv 2020 (Federated Learning of a Mixture of Global and Local Models)",
        personalizes="a whole local model per client, pulled toward the average on randomly chosen communication rounds",
    ),
)
class L2GD(FedAvg[L2GDHP]):
    state_rebuilt = ("coins",)  # every round's coin flip, drawn in setup() from the cell's stream
    capabilities = Capabilities(
        refused_knobs={
            "system.dropout": "the server averages the sampled clients' models when it configures an aggregation "
            "round (before they train), so an upload lost at the end of the round cannot be left out",
            "privacy": "its upload is the client's whole model, averaged before the round's step, not an update of "
            "what it downloaded",
        }
    )

    search_space = {"lam": ("loguniform", 0.1, 1000.0), "p": ("uniform", 0.05, 0.9)}

    def setup(self) -> None:
        super().setup()
        self.coins = coin_flips(self.engine.generator(COINS, kind="numpy"), self.engine.budget.rounds, self.hp.p)

    @property
    def theta(self) -> float:
        """The aggregation step's pull toward the average, alpha lambda / (n p), at most 1."""
        p = self.hp.p
        return min(1.0, self.engine.sgd.lr * self.hp.lam * (1.0 - p) / p)

    def communicates(self, rnd: int) -> bool:
        return bool(self.coins[rnd - 1])

    def configure(self, rnd: Round) -> Payload:
        if not self.communicates(rnd.number):
            return Payload.empty(rnd.clients)
        # The mean of the sampled clients' current models (what they upload, see `send`).
        self.global_state = {
            n: (t.mean(0, keepdim=True) if t.is_floating_point() else t.max(0, keepdim=True).values)
            for n, t in self._current(rnd.clients).items()
        }
        return Payload.broadcast(self.global_state, rnd.clients)

    def _current(self, clients: torch.Tensor) -> State:
        """The clients' models as they stand (a communicating round's upload, averaged when it begins)."""
        return {n: t[clients].clone() for n, t in self.client_state.items()}

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        own = {n: t[rnd.clients] for n, t in self.client_state.items()}
        sent = download.state
        if not sent:
            return own
        theta = self.theta
        return {n: (x - theta * (x - sent[n]) if x.is_floating_point() else sent[n].clone()) for n, x in own.items()}

    def local_train(self, rnd: ClientRound, state: State) -> State:
        if self.communicates(rnd.number):
            return state  # the aggregation step makes no gradient step
        return self.engine.train(rnd, rnd.clients, state).state

    def send(self, rnd: ClientRound, state: State) -> Payload:
        communicates = self.communicates(rnd.number)
        uploaded = self._current(rnd.clients) if communicates else {}  # the models the round began with
        for n, t in state.items():
            self.client_state[n][rnd.clients] = t
        return Payload.from_state(uploaded, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        pass  # the average was formed in `configure`; nothing else to do

    def personalized(self) -> State:
        return self.client_state

    def artifacts(self) -> dict[str, np.ndarray]:
        return {"communicated": self.coins.astype(np.int8)}
