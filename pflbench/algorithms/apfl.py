"""APFL, Adaptive Personalized Federated Learning (Deng, Kamani, Mahdavi, 2020).

What the paper says: every client keeps a local model v_i and a mixing weight alpha_i in [0, 1]
besides its copy of the global model w. Its personalized model is the mixture
    vbar_i = alpha_i * v_i + (1 - alpha_i) * w.
Each local step updates w on the client loss f_i(w) (the global part is FedAvg: clients upload w,
the server averages), v_i on the loss of the mixture, f_i(vbar_i) (so v_i moves by
alpha_i * grad f_i(vbar_i)), and, in the adaptive variant, alpha_i by its own gradient
<v_i - w, grad f_i(vbar_i)>, projected onto [0, 1]. The paper's experiments use fixed
alpha in {0.25, 0.5, 0.75} and the adaptive variant; v_i and alpha_i never leave the client.

How this implementation maps it onto the engine (and where the paper is silent):
- Mixture anchor: the mixture uses the global model w-bar the client *downloaded* this round
  (fixed during the round), as in the issue's definition w_i = alpha_i v_i + (1 - alpha_i) w-bar;
  the paper mixes with the client's concurrently-updated copy. The personalized model evaluated is
  alpha_i v_i + (1 - alpha_i) w_global with the current global model, so alpha = 0 evaluates
  exactly FedAvg's global model and alpha = 1 exactly v_i.
- Batched training of v_i: with w-bar fixed, an SGD step of v_i on f_i(alpha v_i + (1 - alpha) w-bar)
  moves the mixture m_i by -lr * alpha_i^2 * grad f_i(m_i). So the engine trains m_i directly with
  the objective alpha_i^2 * CE (one batched `fed.train` call; momentum scales the same way) and
  v_i is recovered as v_i + (m_new - m_old) / alpha_i (unchanged where alpha_i = 0, where its
  gradient is 0). Weight decay, if the cell sets any, then acts on the mixture, not on v_i.
- The global copy w trains with the engine's default batch order (stream "batches"), so APFL's global model
  is bit-identical to FedAvg's; v_i uses its own order (stream `PERSONAL_STREAM`), alpha_i a third (`ALPHA_STREAM`).
- alpha_i update (`learn_alpha`): the paper takes one alpha step per local step with the models'
  learning rate. Here, after the round's v_i steps, alpha_i takes as many SGD steps (one mini-batch
  each, same batch size) as v_i took, with rate `alpha_lr` (default None = the cell's lr), on the
  gradient of the mixture's CE with respect to alpha_i (autograd, v_i and w-bar fixed, BatchNorm in
  eval mode), then is clipped to [0, 1].
- Defaults: alpha = 0.5 initial value and learn_alpha = True (the paper's adaptive method). The paper
  reports fixed alpha from the grid {0.25, 0.5, 0.75} and the adaptive variant; its authors' code
  (MLOPTPSU/FedTorch, `fedtorch/parameters.py`: `--fed_personal_alpha` default 0.5, adaptive off by
  default) and FL-bench (`src/server/apfl.py`: `--alpha` 0.5, `--adaptive_alpha` 1) both start at
  0.5, the middle of the grid, so neither the global model nor v_i is favoured before alpha has
  learned anything. (FedRep's repository runs a fixed alpha 0.75, `utils/options.py` line 43.) Note: FedTorch takes the
  alpha step once per round (at the first local step), not once per local step as the paper and
  this module do. Each v_i starts from the common initial model. (Measured against 0.25, the
  smallest grid value: docs/algorithms/apfl.md.)
- Communication: exactly FedAvg's; v_i and alpha_i stay on the client.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pydantic import Field

from pflbench import streams
from torch import Tensor

from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams
from pflbench.fedavg import FedAvg
from pflbench.kit.steps import step_ids
from pflbench.simulator.training import State, cross_entropy


def _scale(alpha: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return alpha.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


class APFLHP(Hyperparams):
    alpha: float = Field(0.5, ge=0.0, le=1.0)  # initial (or, with learn_alpha=False, fixed) mixing weight
    learn_alpha: bool = True  # the paper's adaptive alpha
    alpha_lr: float | None = Field(None, gt=0.0)  # None: the cell's lr


@ALGORITHMS.register(
    "apfl",
    card=Card(
        display_name="APFL",
        family="regularized and meta-learned",
        paper="Deng, Kamani & Mahdavi, arXiv 2020 (Adaptive Personalized Federated Learning)",
        personalizes="a local model per client, mixed with the global one by a learned per-client weight alpha_i",
    ),
)
class APFL(FedAvg[APFLHP]):
    state = (*FedAvg.state, "local_state", "alpha")  # checkpoints: and the local models v_i, their weights
    PERSONAL_STREAM = streams.salted_batches("apfl.personal", 0xA9F1)
    ALPHA_STREAM = streams.salted_batches("apfl.alpha", 0xA9F2)

    search_space = {"alpha": ("uniform", 0.0, 1.0), "learn_alpha": ("choice", [True, False])}

    def setup(self) -> None:
        super().setup()
        n = self.engine.num_clients
        self.local_state = self.engine.init_state(n)  # v_i
        self.alpha = torch.full((n,), float(self.hp.alpha), device=self.engine.device)

    def mix(self, alpha: Tensor, local: State, glob: State) -> State:
        """alpha * v + (1 - alpha) * w for floating tensors; integer buffers (BatchNorm counters)
        taken from the global model."""
        return {
            n: (
                _scale(alpha, local[n]) * local[n] + (1 - _scale(alpha, local[n])) * glob[n]
                if local[n].is_floating_point()
                else glob[n].clone()
            )
            for n in local
        }

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        anchor = {n: t.detach().clone() for n, t in state.items()}  # w-bar, as downloaded
        global_update = self.engine.train(rnd, clients, state).state

        alpha = self.alpha[clients]
        local = {n: t[clients] for n, t in self.local_state.items()}
        mixed = self.mix(alpha, local, anchor)
        weight = alpha**2

        def objective(logits: Tensor, labels: Tensor, model_state: State, aux: State) -> Tensor:
            return aux["alpha2"] * cross_entropy(logits, labels, model_state, aux)

        trained = self.engine.train(
            rnd, clients, mixed, objective=objective, aux={"alpha2": weight}, stream=self.PERSONAL_STREAM
        ).state
        params = set(self.engine.model.param_names)
        for n in local:
            if n in params:
                a = _scale(alpha, local[n])
                step = torch.where(
                    a > 0, (trained[n] - mixed[n]) / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(a)
                )
                self.local_state[n][clients] = local[n] + step
            else:  # BatchNorm statistics: those the mixture accumulated on the client's data
                self.local_state[n][clients] = trained[n]
        if self.hp.learn_alpha:
            self.alpha[clients] = self._update_alpha(rnd, clients, alpha, anchor)
        return global_update

    def _update_alpha(self, rnd: ClientRound, clients: Tensor, alpha: Tensor, glob: State) -> Tensor:
        """SGD on alpha_i of CE(alpha_i v_i + (1 - alpha_i) w-bar), v_i and w-bar fixed; one step per
        local step of the round, projected onto [0, 1]."""
        fed = self.engine
        lr = self.hp.alpha_lr if self.hp.alpha_lr is not None else fed.sgd.lr
        local = {n: t[clients] for n, t in self.local_state.items()}
        ids, counts = step_ids(fed, rnd, clients, stream=self.ALPHA_STREAM)  # a straggler's share of the round's work
        alpha = alpha.clone()
        for step in range(ids.shape[1]):
            active = counts > step
            batch = ids[:, step]
            leaf = alpha.detach().clone().requires_grad_(True)
            mixed = self.mix(leaf, local, glob)
            # alpha's gradient flows through the parameters only: BatchNorm's running statistics are
            # inputs of the evaluation-mode forward, which autograd cannot differentiate through
            for name in fed.model.buffer_names:
                mixed[name] = mixed[name].detach()
            x, y = fed.data(batch)
            logits = fed.model.forward(mixed, x, train=False)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
            (grad,) = torch.autograd.grad(loss.sum(), leaf)
            with torch.no_grad():
                alpha = torch.where(active, (alpha - lr * grad).clamp(0.0, 1.0), alpha)
        return alpha.detach()

    def personalized(self) -> State:
        glob = self.global_with_local()  # the global model (with the statistics that stay on a client)
        return self.mix(self.alpha, self.local_state, glob)

    def artifacts(self) -> dict[str, np.ndarray]:
        return {"alpha": self.alpha.detach().cpu().numpy().astype(np.float32)}
