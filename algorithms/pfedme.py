"""pFedMe (T. Dinh, N. Tran & T. D. Nguyen, NeurIPS 2020, "Personalized Federated Learning with
Moreau Envelopes").

What the paper says: each client i has a personalized model theta_i tied to its local copy w_i of the
global model by a Moreau envelope,
    F_i(w) = min_theta  f_i(theta) + lambda/2 * ||theta - w||^2,   theta_i(w) = its minimizer.
A selected client starts from the downloaded global model w and runs R local rounds; in each it
draws a batch D, solves the inner problem approximately with K gradient steps of size
`personal_lr` on f_i(theta; D) + lambda/2 ||theta - w||^2, and moves its local model toward the
solution, w <- w - eta * lambda * (w - theta_i) (eta: the local learning rate). The server mixes,
w <- (1 - beta) w + beta * mean of the clients' w (uniform over the sampled clients in Algorithm 1;
beta = 1 is plain averaging, beta > 1 extrapolates). The personalized model evaluated is theta_i.
Experimental settings of the paper and its official code (CharlieDinh/pFedMe): eta = 0.005,
lambda = 15, K = 5, personal_lr = 0.09, beta = 1 (beta = 2 also reported), R = 20, batch 20.

Where the paper is silent / what was chosen here:
- R is identified with the cell's local epochs: a round makes as many outer steps as plain local SGD
  would make batches (ceil(n / B) per epoch), with the engine's default batch order (salt 0) and the
  cell's batch size; eta is the cell's lr.
- Starting point of the inner solver: the paper does not say. `warm_start="global"` (default, as the
  official code) starts theta from the downloaded global model at the start of a round and from the
  previous step's theta within it; `warm_start="personal"` starts each round from the client's own
  theta_i of its last round, so that lambda = 0 is exactly local training of theta_i (with K = 1 and
  personal_lr = the cell's lr it is bit-for-bit `local`; the tests check this).
- The inner steps are plain gradient steps (no momentum or weight decay; the official optimizer has
  none); the outer update of w follows the formula above and, where the cell sets them, adds the
  cell's weight decay and momentum to its gradient lambda * (w - theta) through the engine's SGD rule.
- BatchNorm statistics: the forward passes run on theta, so theta carries the running statistics;
  w (what is uploaded) takes theta's statistics at the end of the round, as in the official code
  (whose local model holds parameters only). The server mixes statistics like parameters.
- Personalized model: theta_i from the client's last local step; clients not sampled keep theirs;
  before its first round a client's theta_i is the common initial model.
- Stability: the inner iteration needs personal_lr * lambda < 2 and the outer one lr * lambda < 2
  (both contract toward the anchor); outside that the run diverges and is recorded as diverged
  (non-finite loss or parameter -> `Diverged`). The official personal_lr 0.09 was tuned on MNIST
  MLPs: with the pFedHN CNN on fmnist (pathological k=4, 700 samples per client, lr 0.005) it
  diverged at round 5, while 0.01 trained stably (validation accuracy rising to 62% by round 6), so
  benchmarks/table{1,2}.yaml set `hp.personal_lr: 0.01`; the default stays the official value.
- Batched: yes; K inner steps on one batch then one outer step cannot be written as the engine's
  single-objective `fed.train`, so the module drives its own steps on the engine's batched model
  (or one client at a time where the engine loops), same results either way.
- Cost: K forward/backward passes per batch, so about K times `local`'s compute (measured on the
  demo's Fashion-MNIST cells, 300 samples per client, 10 clients, 5 rounds, shared 2-core CPU:
  about 31 s per cell, `local` about 8 s).
- Communication: FedAvg's (w down and up); theta_i never leaves the client.
"""
from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from pydantic import Field

from algorithms._stepwise import finite, loss_and_grads, per_client, rows_where, sgd_step, step_ids
from pflbench.algorithm import ALGORITHMS, Algorithm, Hyperparams
from pflbench.training import Diverged, weighted_mean


@ALGORITHMS.register("pfedme")
class PFedMe(Algorithm):
    name = "pfedme"
    paper = "T. Dinh, Tran & Nguyen, NeurIPS 2020"
    personalizes = "a whole personal model per client, the Moreau-envelope solution regularized toward the local copy of the global model"

    class Hyperparams(Hyperparams):
        lam: float = Field(15.0, ge=0.0)                 # lambda, the Moreau-envelope regularization
        personal_lr: float = Field(0.09, gt=0.0)         # step size of the inner solve
        k: int = Field(5, ge=1)                          # inner steps per batch
        beta: float = Field(1.0, gt=0.0)                 # server mixing (1: plain averaging)
        warm_start: Literal["global", "personal"] = "global"

    search_space = {"lam": ("loguniform", 0.1, 20.0), "personal_lr": ("loguniform", 1e-3, 0.1),
                    "k": ("int", 1, 10), "beta": ("uniform", 1.0, 2.0)}

    def setup(self) -> None:
        super().setup()
        self.personal_state = self.fed.init_state(self.fed.num_clients)  # theta_i, never sent

    def local_train(self, rnd, clients, state):
        theta = ({n: t[clients] for n, t in self.personal_state.items()} if self.hp.warm_start == "personal"
                 else {n: t.clone() for n, t in state.items()})
        local, theta = per_client(self.fed, clients, partial(self._train, rnd), state, theta)
        for n, t in theta.items():
            self.personal_state[n][clients] = t
        return local

    def _train(self, rnd, clients, state, theta_start):
        fed, hp = self.fed, self.hp
        names, buffer_names = fed.model.param_names, fed.model.buffer_names
        w = {n: state[n].detach().clone() for n in names}
        theta = {n: theta_start[n].detach().clone() for n in names}
        buffers = {n: theta_start[n].detach().clone() for n in buffer_names}  # theta's statistics
        ids, counts = step_ids(fed, rnd, clients, salt=0)
        momenta = {n: torch.zeros_like(p) for n, p in w.items()} if fed.sgd.momentum else {}
        for step in range(int(counts.max()) if len(counts) else 0):
            active = counts > step
            kept = {n: b.clone() for n, b in buffers.items()} if not active.all() else None
            start = {n: t.clone() for n, t in theta.items()}
            for _ in range(hp.k):  # K gradient steps on f(theta; D) + lam/2 ||theta - w||^2, same batch
                loss, grads = loss_and_grads(fed, theta, buffers, ids[:, step])
                if (active & ~torch.isfinite(loss)).any():
                    raise Diverged(f"non-finite pFedMe loss for clients {clients[active & ~torch.isfinite(loss)].tolist()}")
                with torch.no_grad():
                    theta = {n: theta[n] - hp.personal_lr * (grads[n] + hp.lam * (theta[n] - w[n])) for n in names}
            with torch.no_grad():
                theta = {n: rows_where(active, theta[n], start[n]) for n in names}
                pull = {n: hp.lam * (w[n] - theta[n]) for n in names}  # eta * pull = eta * lam * (w - theta)
            sgd_step(w, pull, momenta, fed.sgd, fed.cell.lr, active)
            if kept is not None:
                for n in buffers:
                    buffers[n] = rows_where(active, buffers[n], kept[n])
        local, personal = {**w, **buffers}, {**theta, **buffers}
        if not (finite(local).all() and finite(personal).all()):
            raise Diverged(f"non-finite pFedMe parameters for clients {clients.tolist()}")
        return local, personal

    def aggregate(self, rnd, clients, upload):
        """w <- (1 - beta) w + beta * (uniform mean of the sampled clients' w)."""
        weights = torch.full((len(clients),), 1.0 / len(clients), device=self.fed.device)
        beta = self.hp.beta
        for n, t in upload.items():
            mean = weighted_mean(t, weights).unsqueeze(0)
            old = self.global_state[n]
            self.global_state[n] = (1 - beta) * old + beta * mean if t.is_floating_point() else mean

    def personalized(self):
        return self.personal_state
