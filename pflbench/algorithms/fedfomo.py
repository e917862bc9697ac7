"""FedFomo (Zhang, Sapra, Fidler, Yeung & Alvarez, ICLR 2021, "Personalized Federated Learning with
First Order Model Optimization"; official code NVlabs/FedFomo).

What the paper says: there is no global model. The server keeps the latest model uploaded by every
client. In a round, each selected client i downloads M of those models, chosen epsilon-greedily
from an affinity matrix P (row i: how useful each other client's model has been to i), and weighs
each downloaded model n by the first-order estimate of how much moving toward it helps on i's own
validation data:
    w_n = (L_i(theta_i^{t-1}) - L_i(theta_n)) / ||theta_n - theta_i^{t-1}||.
Negative weights are dropped and the rest normalized to sum 1; the client updates
    theta_i^t = theta_i^{t-1} + sum_n w_n (theta_n - theta_i^{t-1})
(if no weight is positive it keeps its model), adds the weights to P[i, n], trains locally, and
uploads its model. Exploration: epsilon = 0.3, decreased by 0.05 each round; M = 8 models in the
paper's main settings (5 in re-implementations).

Where the paper is silent / what was chosen here:
- Candidates: models the server has received (clients that have trained at least once), excluding
  the client's own. In round 1 nobody has uploaded yet: nothing is downloaded and every client
  trains from its own (common initial) model. When fewer than M candidates exist, all are sent; the
  count is the same for all clients of a round (the smallest candidate count among them) so the
  download is one stacked tensor per model slot.
- epsilon-greedy per slot (as the official code): with probability epsilon_t a uniformly random
  remaining candidate, else the remaining candidate with the highest affinity (ties broken at
  random); epsilon_t = max(0, epsilon - decay * (round - 1)). Draws come from a generator seeded by
  the cell seed and the round, so runs are reproducible.
- Affinity: P starts at 0; P[i, n] += w_n with the raw (signed) weights, as the official code adds
  its loss deltas. The weights are computed on the client and uploaded with its model (M floats,
  counted in bytes up).
- Loss and distance: L_i is the mean cross-entropy on the client's validation split (its training
  split where a client has no validation samples, e.g. val_fraction = 0), BatchNorm in eval mode.
  A model at distance 0 (identical to the client's) gets weight 0. Non-finite weights count as 0.
- Distance: the L1 norm over all parameters (buffers excluded), `norm="l1"` (default), as the official
  code: NVlabs/FedFomo `federated/args.py` lines 180-181 (`--model_delta_norm` default 'l1'),
  `federated/utils.py` `compute_parameter_difference` lines 147-155 (sum over `model.parameters()`
  of `(w_a - w_b).norm(1)`), used by `federation.py` `compute_fomo_weights` lines 177-184 (loss
  deltas divided by it). The paper writes ||theta_n - theta_i|| without naming the norm.
  `norm="l2"` is the Euclidean norm (PFLlib's clientfomo.py `torch.norm` of the flattened difference;
  note the official 'l2' option returns the *squared* distance, which no option here reproduces).
  The L1 norm of a difference is larger than its L2 norm (by up to sqrt(#parameters)), so the raw
  weights and the affinity matrix are on a smaller scale with L1; the normalized weights differ
  only through the ratios between candidates. (The two measured, and why FedFomo is Local on the
  quick table's 10-client cells: docs/algorithms/fedfomo.md.)
- The update mixes parameters and floating BatchNorm statistics; integer counters stay the
  client's. The personalized model is the client's own model after local training; clients not
  sampled keep theirs.
- Communication: down = M full models per client (each a separate entry of `configure`'s dict, so
  the engine counts M models); up = the client's model plus its M weights.
- Batched: yes (plain local SGD via `fed.train`; the candidates' validation losses are evaluated
  for all sampled clients at once).
- Unseen clients: a newcomer does what a client does on its first download, with the common
  initial model as its own: it evaluates every uploaded model on its train split, downloads the M
  with the lowest loss (it has no affinity history to go on), and takes the first-order combination
  with its own weights. No local training follows (the model served is fitted on the newcomer's train
  data only, through its weights). Not its validation split, as a trained client's weights are: that
  split selects the newcomers' best-validation round (`bestval_accuracy_newcomers`), which a model
  fitted on it would bias. Its train split is free for
  this: neither the newcomer's initial model nor any uploaded model was trained on it.
- Artifacts: the affinity matrix P [N, N] and this round's normalized weights [N, N] (row i: the
  weights client i gave, zero where not downloaded or not sampled), for heatmaps.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Hyperparams, Payload, Round, Serving
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State

EXPLORE = streams.salted_round("fedfomo.explore", 0xF0F0)  # which models a client explores, per round

MODELS = "models"  # the download's header: [K, M] the clients whose models each client is sent
WEIGHTS = "fomo_weights"  # each client's raw weights of the models it was sent [K, M], uploaded


def fomo_weights(own_loss: torch.Tensor, cand_loss: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """The raw FedFomo weights [K, M]: (L(own) - L(candidate)) / ||candidate - own||; 0 where the
    distance is 0 or the value is not finite."""
    safe = torch.where(distance > 0, distance, torch.ones_like(distance))
    raw = (own_loss.unsqueeze(1) - cand_loss) / safe
    return torch.where((distance > 0) & torch.isfinite(raw), raw, torch.zeros_like(raw))


def normalize_weights(raw: torch.Tensor) -> torch.Tensor:
    """Negative weights dropped, the rest scaled to sum 1 per row; a row without a positive weight is
    all zeros (the client keeps its own model)."""
    positive = raw.clamp(min=0)
    total = positive.sum(1, keepdim=True)
    return torch.where(
        total > 0, positive / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(positive)
    )


class FedFomoHP(Hyperparams):
    models: int = Field(8, ge=1)  # M, models downloaded per client
    epsilon: float = Field(0.3, ge=0.0, le=1.0)  # initial exploration probability
    epsilon_decay: float = Field(0.05, ge=0.0)  # subtracted every round
    norm: Literal["l1", "l2"] = "l1"  # official --model_delta_norm


@ALGORITHMS.register(
    "fedfomo",
    card=Card(
        display_name="FedFomo",
        family="hypernetworks and layer-wise aggregation",
        row_order=7,
        paper="Zhang, Sapra, Fidler, Yeung & Alvarez, ICLR 2021",
        personalizes="the whole model: each client combines other clients' models by first-order weights on its own validation data",
        reduces_to={
            "local": (
                "FedFomo weights other clients' models by how much they lower a client's validation loss;"
                " here none did, so every client kept its own model: Local"
            )
        },
    ),
)
class FedFomo(FedAvg[FedFomoHP]):
    # Checkpoints: FedAvg's models, the server's copies of the uploads, which clients uploaded, the affinities
    # and the last weights; the split the weights are computed on is the cell's.
    state = (*FedAvg.state, "server_models", "uploaded", "affinity", "last_weights")
    state_rebuilt = ("eval_split",)
    capabilities = Capabilities(
        refused_knobs={
            "privacy": "its upload is the whole model plus first-order weights computed on the client's "
            "validation data, with no single downloaded model to form an update against"
        }
    )

    search_space = {"models": ("int", 1, 10), "epsilon": ("uniform", 0.0, 0.5), "epsilon_decay": ("uniform", 0.0, 0.1)}

    def setup(self) -> None:
        super().setup()
        n = self.engine.num_clients
        self.server_models = self.engine.init_state(n)  # latest upload of every client
        self.uploaded = torch.zeros(n, dtype=torch.bool)
        self.affinity = torch.zeros(n, n, dtype=torch.float64)
        self.last_weights = torch.zeros(n, n, dtype=torch.float64)
        has_val = bool((self.engine.split_sizes("val") > 0).all())
        self.eval_split = "val" if has_val else "train"

    def epsilon_at(self, rnd: int) -> float:
        return max(0.0, self.hp.epsilon - self.hp.epsilon_decay * (rnd - 1))

    def choose(self, rnd: int, clients: torch.Tensor) -> torch.Tensor:
        """The models each client downloads: [K, M'] client ids, epsilon-greedy on the affinity."""
        rng = self.engine.generator(EXPLORE, rnd, kind="numpy")
        uploaded = self.uploaded.numpy()
        candidates = [[n for n in np.flatnonzero(uploaded).tolist() if n != c] for c in clients.tolist()]
        count = min([self.hp.models, *map(len, candidates)])
        eps = self.epsilon_at(rnd)
        chosen = []
        for c, pool in zip(clients.tolist(), candidates):
            pool = list(pool)
            picks = []
            for _ in range(count):
                if rng.random() < eps:
                    pick = pool[rng.integers(len(pool))]
                else:
                    scores = self.affinity[c, pool].numpy()
                    order = np.lexsort((rng.random(len(pool)), -scores))  # best first, random ties
                    pick = pool[order[0]]
                picks.append(pick)
                pool.remove(pick)
            chosen.append(picks)
        return torch.tensor(chosen, dtype=torch.long).view(len(clients), count)

    def configure(self, rnd: Round) -> Payload:
        """Each client's M chosen models (`choose`); the download's header names whose they are."""
        chosen = self.choose(rnd.number, rnd.clients.cpu())
        device_ids = chosen.to(self.engine.device)
        return Payload.from_state(
            {
                f"model{m}.{n}": t[device_ids[:, m]]
                for m in range(chosen.shape[1])
                for n, t in self.server_models.items()
            },
            rnd.clients,
            header={MODELS: chosen},
        )

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        """The client's own model moved toward the downloaded ones by their first-order weights on its
        validation split; the raw weights ride along in the state, to be uploaded (`send`)."""
        clients = rnd.clients
        own = {n: t[clients].clone() for n, t in self.client_state.items()}
        count = download.header[MODELS].shape[1]
        sent = download.state
        if not sent or count == 0:
            return {**own, WEIGHTS: torch.zeros(len(clients), 0)}
        names = self.engine.model.names
        k = len(clients)
        # candidates stacked [K * M, ...]: row k * M + m is client k's m-th download
        stacked = {n: torch.stack([sent[f"model{m}.{n}"] for m in range(count)], 1).flatten(0, 1) for n in names}
        _, own_loss = self.engine.evaluate(own, self.eval_split, clients)
        _, cand_loss = self.engine.evaluate(stacked, self.eval_split, clients.repeat_interleave(count))
        cand_loss = cand_loss.view(k, count)
        distance = self.distance(own, stacked, k, count).to(own_loss.dtype)
        raw = fomo_weights(own_loss, cand_loss, distance)
        return {**self.combine(own, stacked, normalize_weights(raw)), WEIGHTS: raw.detach().cpu()}

    def local_train(self, rnd: ClientRound, state: State) -> State:
        """The combined model's local SGD; the weights are carried on to `send`."""
        model = {n: t for n, t in state.items() if n != WEIGHTS}
        return {**self.engine.train(rnd, rnd.clients, model).state, WEIGHTS: state[WEIGHTS]}

    def distance(self, own: State, stacked: State, k: int, count: int) -> torch.Tensor:
        total = torch.zeros(k, count, dtype=torch.float64, device=self.engine.device)
        for n in self.engine.model.param_names:
            diff = (stacked[n].view(k, count, -1) - own[n].view(k, 1, -1)).double()
            total += diff.abs().sum(-1) if self.hp.norm == "l1" else (diff**2).sum(-1)
        return total if self.hp.norm == "l1" else total.sqrt()

    def combine(self, own: State, stacked: State, weights: torch.Tensor) -> State:
        """theta_i + sum_m w_m (theta_m - theta_i), per client; integer buffers stay the client's."""
        k, count = weights.shape
        out: State = {}
        for n, t in own.items():
            if not t.is_floating_point():
                out[n] = t
                continue
            cand = stacked[n].view(k, count, *t.shape[1:])
            w = weights.to(t.dtype).view(k, count, *([1] * (t.dim() - 1)))
            out[n] = t + (w * (cand - t.unsqueeze(1))).sum(1)
        return out

    def newcomer_models(self, serving: Serving) -> State:
        newcomers = serving.clients
        count = newcomers.num_clients
        own = newcomers.init_state(count)
        pool = torch.nonzero(self.uploaded).flatten().to(newcomers.device)
        if not len(pool):
            return own
        split = "train"  # never "val": the newcomers' validation split selects their best round
        everyone = torch.arange(count, device=newcomers.device)
        _, own_loss = newcomers.evaluate(own, split)
        # every uploaded model on every newcomer's data: row k * P + p is newcomer k, model pool[p]
        every = {n: t[pool].repeat(count, *([1] * (t.dim() - 1))) for n, t in self.server_models.items()}
        _, loss = newcomers.evaluate(every, split, everyone.repeat_interleave(len(pool)))
        loss = loss.view(count, len(pool))
        best = min(self.hp.models, len(pool))
        picked = torch.argsort(loss, dim=1, stable=True)[:, :best]  # [K, M] positions in pool
        rows = (everyone.unsqueeze(1) * len(pool) + picked).flatten()
        stacked = {n: t[rows] for n, t in every.items()}
        distance = self.distance(own, stacked, count, best).to(own_loss.dtype)
        weights = normalize_weights(fomo_weights(own_loss, loss.gather(1, picked), distance))
        return self.combine(own, stacked, weights)

    def send(self, rnd: ClientRound, state: State) -> Payload:
        names = self.engine.model.names
        for n in names:
            self.client_state[n][rnd.clients] = state[n]
        return Payload.from_state(
            {**{n: state[n] for n in names}, WEIGHTS: state[WEIGHTS].to(torch.float32).to(self.engine.device)},
            rnd.clients,
        )

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """Keep each arrived client's model; add its raw weights to its affinity for the models it was
        sent (the round's download header, at the arrived clients' positions)."""
        clients, sent = upload.clients, upload.state
        for n in self.engine.model.names:
            self.server_models[n][clients] = sent[n]
        cpu_clients = clients.cpu()
        self.uploaded[cpu_clients] = True
        self.last_weights.zero_()
        chosen = rnd.download.header[MODELS][upload.positions.cpu()]
        if chosen.shape[1]:
            raw = sent[WEIGHTS].cpu().double()
            rows = cpu_clients.unsqueeze(1).expand_as(chosen)
            self.affinity.index_put_((rows, chosen), raw, accumulate=True)
            self.last_weights[rows, chosen] = normalize_weights(sent[WEIGHTS]).cpu().double()

    def personalized(self) -> State:
        return self.client_state

    def artifacts(self) -> dict[str, np.ndarray]:
        return {
            "affinity": self.affinity.numpy().astype(np.float32),
            "weights": self.last_weights.numpy().astype(np.float32),
        }
