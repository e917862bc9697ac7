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
  would make batches (ceil(n / B) per epoch), with the engine's default batch order (stream "batches") and the
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
  (non-finite loss or parameter -> `Diverged`, checked once after the round's steps so that they
  run without host synchronisation; the round recorded is the same). The official personal_lr 0.09 was tuned on MNIST
  MLPs and diverges with the pFedHN CNN on fmnist, so benchmarks/table{1,2}.yaml set
  `hp.personal_lr: 0.01`; the default stays the official value (docs/algorithms/pfedme.md).
- Batched: yes; K inner steps on one batch then one outer step cannot be written as the engine's
  single-objective `fed.train`, so the module drives its own steps on the engine's batched model
  (or one client at a time where the engine loops), same results either way. One outer step is one
  function (`_step`), which the engine runs eagerly or captured as a CUDA graph
  (`pflbench.kit.steps.run_steps`, the `cuda_graphs` option; the same bits on a CPU).
- Cost: K forward/backward passes per batch, so about K times `local`'s compute (measured:
  docs/algorithms/pfedme.md).
- Aggregation weights: uniform over the sampled clients (Algorithm 1); the official code weights by
  training-set size (`serverbase.py` `persionalized_aggregate_parameters`, the uniform line commented
  out). Equal for equal client sizes, as in pFedLA's tables.
- Communication: FedAvg's (w down and up); theta_i never leaves the client.

The official code's two departures from Algorithm 1, as options (both off by default):
- `train_all_clients`: CharlieDinh/pFedMe `FLAlgorithms/servers/serverpFedMe.py` (`train`, lines
  41-66) sends the global model to every client and has *every* client train every round ("do
  update for all users not only selected users"), then aggregates the selected clients' w only; the
  personalized models evaluated are every client's fresh theta_i. With `train_all_clients: true` this
  module does the same: the unsampled clients also download w (counted in bytes down: the round's
  download is one model per client, N in all, from a `configure` that returns one message per
  client; the engine attributes the extra N - K messages to the round, not to a client row), train
  from it like the sampled ones (same batch plan rule) and update their theta_i; their w is not
  uploaded (bytes up: the sampled clients' only, as the official code aggregates only those).
  Default off, for a fair comparison: every method of a matrix then follows the same sampling
  schedule and the same local compute per round (K clients); with the option, a 100-client, 10%
  cell trains 10x as many clients per round as every other method (and downloads 10x as much), so
  its personalized models get far more training than the other rows'. With full participation (the
  10-client cells) the option changes nothing.
- `mu`: the official inner optimizer (`FLAlgorithms/optimizers/fedoptimizer.py`, pFedMeOptimizer, line
  64: theta <- theta - lr * (grad + lambda (theta - w) + mu theta), mu = 0.001 by default; FL-bench
  `--mu` 1e-3) adds an L2 term mu/2 ||theta||^2 to the inner problem, which the paper does not have.
  Default 0 (the paper); `mu: 0.001` is the official code.
  Together, `{train_all_clients: true, mu: 0.001}` is the official code's behaviour.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from pflbench.kit.steps import (
    Active,
    Carry,
    LossCheck,
    finite,
    keep_inactive,
    loss_and_grads,
    per_client,
    restore_inactive,
)
from pflbench.kit.steps import rows_where, run_steps, sgd_step, step_plan
from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams, Payload, Round
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State, weighted_mean


class PFedMeHP(Hyperparams):
    lam: float = Field(15.0, ge=0.0)  # lambda, the Moreau-envelope regularization
    personal_lr: float = Field(0.09, gt=0.0)  # step size of the inner solve
    k: int = Field(5, ge=1)  # inner steps per batch
    beta: float = Field(1.0, gt=0.0)  # server mixing (1: plain averaging)
    warm_start: Literal["global", "personal"] = "global"
    train_all_clients: bool = False  # official code: every client trains every round
    mu: float = Field(0.0, ge=0.0)  # L2 term of the inner step (official code: 1e-3)


@ALGORITHMS.register(
    "pfedme",
    card=Card(
        display_name="pFedMe",
        family="regularized and meta-learned",
        row_order=3,
        paper="T. Dinh, Tran & Nguyen, NeurIPS 2020",
        personalizes="a whole personal model per client, the Moreau-envelope solution regularized toward the local copy of the global model",
    ),
)
class PFedMe(FedAvg[PFedMeHP]):
    state = (*FedAvg.state, "personal_state")  # checkpoints: and every client's theta_i

    search_space = {
        "lam": ("loguniform", 0.1, 20.0),
        "personal_lr": ("loguniform", 1e-3, 0.1),
        "k": ("int", 1, 10),
        "beta": ("uniform", 1.0, 2.0),
    }  # train_all_clients, mu: protocol choices, not tuned

    def setup(self) -> None:
        super().setup()
        self.personal_state = self.engine.init_state(self.engine.num_clients)  # theta_i, never sent

    def configure(self, rnd: Round) -> Payload:
        """The global model for each sampled client; with `train_all_clients`, one message per client
        (the sampled ones first, in order, then the others), so the bytes of the N downloads are
        counted."""
        download = super().configure(rnd)
        if not self.hp.train_all_clients:
            return download
        everyone = torch.cat([rnd.clients, self._others(rnd.clients)])
        names = self.engine.model.names
        return Payload.from_rows([{n: self.global_state[n][0] for n in names} for _ in range(len(everyone))], everyone)

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        if len(download) > len(rnd.clients):  # train_all_clients: the sampled clients' messages come first
            rows = download.rows[: len(rnd.clients)]
            download = Payload.from_state({n: torch.stack([m[n] for m in rows]) for n in rows[0]}, rnd.clients)
        return super().receive(rnd, download)

    def _others(self, clients: Tensor) -> Tensor:
        """The clients not sampled this round (ascending)."""
        mask = torch.ones(self.engine.num_clients, dtype=torch.bool, device=clients.device)
        mask[clients] = False
        return torch.nonzero(mask).flatten()

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        k = len(clients)
        if self.hp.train_all_clients:  # the unsampled clients train too, from the same global model
            others = self._others(clients)
            clients = torch.cat([clients, others])
            state = {
                n: torch.cat([t, self.global_state[n].expand(len(others), *t.shape[1:])]) for n, t in state.items()
            }
        theta = (
            {n: t[clients] for n, t in self.personal_state.items()}
            if self.hp.warm_start == "personal"
            else {n: t.clone() for n, t in state.items()}
        )
        local, theta = per_client(self.engine, clients, partial(self._train, rnd), state, theta)
        for n, t in theta.items():
            self.personal_state[n][clients] = t
        return {n: t[:k] for n, t in local.items()}  # only the sampled clients' w is uploaded

    def _train(self, rnd: ClientRound, clients: Tensor, state: State, theta_start: State) -> tuple[State, State]:
        """The round's local training of `clients`: (w, theta), each with theta's statistics. Free
        of host synchronisation between its first and its last step (`pflbench.kit.steps`); over static
        buffers (a CUDA graph) where the engine runs its steps so (`run_steps`)."""
        fed, hp = self.engine, self.hp
        names, buffer_names = fed.model.param_names, fed.model.buffer_names
        carry = {
            "w": {n: state[n].detach().clone() for n in names},
            "theta": {n: theta_start[n].detach().clone() for n in names},
            "buffers": {n: theta_start[n].detach().clone() for n in buffer_names},  # theta's statistics
            "momenta": {n: torch.zeros_like(state[n]) for n in names} if fed.sgd.momentum else {},
        }
        carry, losses = run_steps(
            fed, [step_plan(fed, rnd, clients)], carry, self._step, key=(hp.lam, hp.personal_lr, hp.k, hp.mu, fed.sgd)
        )
        local, personal = {**carry["w"], **carry["buffers"]}, {**carry["theta"], **carry["buffers"]}
        losses.raise_if_diverged(finite(local) & finite(personal), clients, "pFedMe")
        return local, personal

    def _step(self, carry: Carry, ids: list[Tensor], active: Active, losses: LossCheck) -> Carry:
        """One outer step on one batch (`ids[0]`, [K, B]) of the `active` clients: K inner steps on
        f(theta; D) + lam/2 ||theta - w||^2 (+ mu/2 ||theta||^2), then w's step toward theta."""
        fed, hp = self.engine, self.hp
        names = fed.model.param_names
        w, theta, buffers, momenta = carry["w"], carry["theta"], carry["buffers"], carry["momenta"]
        kept = keep_inactive(buffers, active)
        start = theta  # the inner steps make new tensors: these stay as they are
        for _ in range(hp.k):  # the same batch each time
            loss, grads = loss_and_grads(fed, theta, buffers, ids[0])
            losses.add(active, loss)
            theta = dict(
                zip(
                    names,
                    inner_step(
                        [theta[n] for n in names],
                        [grads[n] for n in names],
                        [w[n] for n in names],
                        hp.lam,
                        hp.personal_lr,
                        hp.mu,
                    ),
                )
            )
        theta = {n: rows_where(active, theta[n], start[n]) for n in names}
        sgd_step(
            w,
            dict(zip(names, pull([w[n] for n in names], [theta[n] for n in names], hp.lam))),
            momenta,
            fed.sgd,
            fed.sgd.lr,
            active,
        )  # eta * pull = eta * lam * (w - theta)
        restore_inactive(buffers, kept, active)
        return {"w": w, "theta": theta, "buffers": buffers, "momenta": momenta}

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """w <- (1 - beta) w + beta * (uniform mean of the sampled clients' w)."""
        weights = torch.full((len(upload),), 1.0 / len(upload), device=self.engine.device)
        beta = self.hp.beta
        for n, t in upload.state.items():
            mean = weighted_mean(t, weights).unsqueeze(0)
            old = self.global_state[n]
            self.global_state[n] = (1 - beta) * old + beta * mean if t.is_floating_point() else mean

    def personalized(self) -> State:
        return self.personal_state


def inner_step(
    theta: list[Tensor], grads: list[Tensor], w: list[Tensor], lam: float, lr: float, mu: float
) -> list[Tensor]:
    """One inner gradient step, new tensors: theta - lr * (grads + lam * (theta - w) + mu * theta),
    each operation as the per-tensor expression computes it, in its order, with foreach kernels (a
    few launches for all tensors, where the per-tensor form makes seven per tensor). The mu term is
    computed even at mu = 0, as the expression does (0 * theta adds -0.0 or NaN where theta is
    negative or not finite)."""
    with torch.no_grad():
        step = torch._foreach_sub(theta, w)
        torch._foreach_mul_(step, lam)
        step = torch._foreach_add(grads, step)
        torch._foreach_add_(step, torch._foreach_mul(theta, mu))
        torch._foreach_mul_(step, lr)
        return list(torch._foreach_sub(theta, step))


def pull(w: list[Tensor], theta: list[Tensor], lam: float) -> list[Tensor]:
    """lam * (w - theta), new tensors (foreach kernels; the per-tensor expression's values)."""
    with torch.no_grad():
        difference = torch._foreach_sub(w, theta)
        torch._foreach_mul_(difference, lam)
        return list(difference)
