"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma & Guan, AAAI 2023, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning").

What the paper says (Algorithm 1): FedAvg's server, and a client that does not overwrite its local model
theta_i with the global model Theta but aggregates the two: the lower layers take Theta; the higher p
layers become theta_hat = theta_i + (Theta - theta_i) * W_i, with element-wise weights W_i in [0, 1]
learned on a random s% of the client's training data by SGD on the local loss, clipped to [0, 1]
(W <- clip(W - eta * grad_theta_hat L * (Theta - theta_i), 0, 1)). W_i starts at ones and is kept from
round to round; in the client's first ALA it is trained until the loss converges, in later rounds for
one pass. ALA is skipped at the first round (theta_i = Theta). The client then trains theta_hat by local
SGD and uploads it; the server averages the uploads weighted by training samples.

Checked against the official code (github.com/TsingZ0/FedALA, commit a7a9b21, system/utils/ALA.py and
system/flcore/{clients/clientALA.py,servers/serverALA.py}; the lines run on the same tensors:
tests/test_fedala.py). Defaults are its run_me.sh's and main.py's (the paper's text says p and s per
experiment): eta 1.0 (`-et 1`), s 80 (`-s 80`), p = the last layer (`-p 2`: its weight and bias, the
official count is of parameter tensors; here `layers` counts layers as the engine does, 1 = the
classifier), the convergence test of the first ALA: the population std of the last 10 per-pass losses
(the loss of each pass's last batch) below 0.1, after more than 10 passes.

Departures, each for a reason:
- The s% sample: the first ceil(s% n / B) batches of a fresh shuffle of the client's train split (stream
  `ALA_STREAM`, per round and client), full batches as every engine plan; the official code takes a
  contiguous slice of s% of the samples from a random start, batches in order, the last one short.
- The first ALA stops after at most `max_start_passes` passes (official: no bound; a loss that never
  settles loops forever).
- ALA runs for the round's sampled clients when they receive the model (the paper's Algorithm 1); the
  official server runs it for every client every round (serverALA.send_models), so that its evaluation
  (after send_models) scores every client's post-ALA model. Here a client's personalized model is its
  latest local model, after its last local training.
- BatchNorm statistics: averaged with the weights (FedAvg) and taken from the global model with the
  lower layers. The official code aggregates and overwrites `parameters()` only (serverALA.py:111-123,
  ALA.py:86-87), so its clients keep their own statistics under averaged weights (as PFLlib#260).
- The "first round" test is the official one, per client: sum(Theta_0 - theta_i,0) == 0 on the model's
  first parameter tensor (ALA.py:82); such a client keeps its local model and trains it.
- Newcomers get the global model (a newcomer has no local model to aggregate with).
- Batched: the weight learning is one batched step over the sampled clients (`pflbench.kit.steps`), each
  client stopping at its own convergence; the same on the client loop.
- Communication: FedAvg's (the whole model down and up); W_i stays on the client.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams, Serving
from pflbench.fedavg import FedAvg
from pflbench.kit.steps import clone_state, loss_and_grads, per_client
from pflbench.simulator.training import State

ALA_STREAM = "batches.fedala-ala"  # the s% sample of each ALA, per round and client (a stream of its own)


class FedALAHP(Hyperparams):
    eta: float = Field(1.0, gt=0.0)  # the weights' learning rate (official -et 1)
    rand_percent: int = Field(80, ge=1, le=100)  # s: percent of the train split ALA learns on (official -s 80)
    layers: int = Field(1, ge=1)  # p: the higher layers ALA aggregates (official -p 2 tensors: the classifier)
    threshold: float = Field(0.1, gt=0.0)  # the first ALA stops when the std of the last losses is below it
    num_pre_loss: int = Field(10, ge=2)  # ... of the last num_pre_loss passes (official 10)
    max_start_passes: int = Field(100, ge=1)  # a bound on the first ALA's passes (official: none)


@ALGORITHMS.register(
    "fedala",
    card=Card(
        display_name="FedALA",
        family="hypernetworks and layer-wise aggregation",
        paper="Zhang, Hua, Wang, Song, Xue, Ma & Guan, AAAI 2023",
        personalizes="each client's model: its higher layers aggregate the global model element-wise with "
        "weights learned on local data (adaptive local aggregation)",
    ),
)
class FedALA(FedAvg[FedALAHP]):
    state = (*FedAvg.state, "ala_weights", "start_phase")
    state_rebuilt = ("_higher",)
    ala_weights: State  # W_i of the higher layers' parameters, [N, ...], in [0, 1]
    start_phase: Tensor  # [N] bool: the client's ALA has not run yet (its first trains to convergence)

    quick_hp = {"max_start_passes": 12}  # small smoke cells (tests)
    search_space = {"eta": ("loguniform", 0.01, 10.0), "rand_percent": ("int", 5, 100), "layers": ("choice", [1, 2, 3])}

    def setup(self) -> None:
        super().setup()
        _, higher = self.engine.model.split_layers(self.hp.layers)
        self._higher = [n for n in self.engine.model.param_names if n in higher]
        n = self.engine.num_clients
        self.ala_weights = {k: torch.ones_like(self.client_state[k]) for k in self._higher}
        self.start_phase = torch.ones(n, dtype=torch.bool, device=self.engine.device)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        local = {n: t[clients] for n, t in self.client_state.items()}
        weights = {n: t[clients] for n, t in self.ala_weights.items()}
        start = self.start_phase[clients]
        model, weights, start = per_client(
            self.engine, clients, lambda c, *s: self.ala(rnd.number, c, *s), state, local, weights, start
        )
        for n, t in weights.items():
            self.ala_weights[n][clients] = t
        self.start_phase[clients] = start
        return self.engine.train(rnd, clients, model).state

    def ala(
        self, round_number: int, clients: Tensor, received: State, local: State, weights: State, start: Tensor
    ) -> tuple[State, State, Tensor]:
        """Adaptive local aggregation of `clients` ([K] each): (the model each starts local training
        from, its weights W, whether it is still before its first ALA)."""
        fed, hp = self.engine, self.hp
        first = fed.model.param_names[0]
        skip = (received[first] - local[first]).flatten(1).sum(1) == 0  # ALA.py: the first round
        delta = {n: received[n] - local[n] for n in self._higher}
        weights = {n: w.clone() for n, w in weights.items()}
        fixed = {n: t for n, t in received.items() if n not in self._higher}  # lower layers, statistics
        theta = {n: local[n] + delta[n] * weights[n] for n in self._higher}

        ids, counts = self._sample(round_number, clients)
        done = skip.clone()
        history: list[Tensor] = []
        last = torch.zeros(len(clients), device=fed.device)
        for _ in range(hp.max_start_passes):
            for s in range(ids.shape[1]):
                active = ~done & (counts > s)
                if not bool(active.any()):
                    continue
                loss, grads = loss_and_grads(fed, theta, clone_state(fixed), ids[:, s])
                with torch.no_grad():
                    for n in self._higher:
                        moved = torch.clamp(weights[n] - hp.eta * (grads[n] * delta[n]), 0, 1)
                        weights[n] = torch.where(_rows(active, moved), moved, weights[n])
                        theta[n] = local[n] + delta[n] * weights[n]
                last = torch.where(active, loss, last)
            history.append(last.clone())
            recent = torch.stack(history[-hp.num_pre_loss :], dim=1)
            settled = (len(history) > hp.num_pre_loss) & (recent.std(dim=1, unbiased=False) < hp.threshold)
            done = done | ~start | settled
            if bool(done.all()):
                break
        model = {
            n: torch.where(_rows(skip, local[n]), local[n], theta[n] if n in theta else fixed[n])
            for n in fed.model.names
        }
        return model, weights, start & skip

    def _sample(self, round_number: int, clients: Tensor) -> tuple[Tensor, Tensor]:
        """Each client's s% sample as sample ids [K, S, B] (the first ceil(s% n / B) batches of a shuffle
        of its train split) and its number of batches [K]."""
        fed = self.engine
        batch = fed.budget.batch_size
        plans = fed.local_plans(round_number, clients, epochs=1, stream=ALA_STREAM)
        sizes = [len(fed.sample_ids(int(c))) for c in clients.tolist()]
        cut = [p[: math.ceil(int(self.hp.rand_percent / 100 * n) / batch)] for p, n in zip(plans, sizes)]
        counts = torch.tensor([len(p) for p in cut], device=fed.device)
        ids = torch.zeros(len(clients), max(1, int(counts.max())), batch, dtype=torch.long, device=fed.device)
        for k, (c, p) in enumerate(zip(clients.tolist(), cut)):
            if len(p):
                ids[k, : len(p)] = fed.sample_ids(c)[p.to(fed.device)]
        return ids, counts

    def personalized(self) -> State:
        return self.client_state

    def newcomer_models(self, serving: Serving) -> State:
        count = serving.clients.num_clients
        return {n: t.expand(count, *t.shape[1:]).clone() for n, t in self.global_state.items()}


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """A [K] mask broadcast against a stacked tensor [K, ...]."""
    return mask.view(-1, *([1] * (like.dim() - 1)))
