"""The types a method names, defined with the method API (which imports only its own modules): a model's
state (`State`), the objective a method trains with (`Objective`, default `cross_entropy`), the one SGD
rule (`SGD`), what the engine raises on a non-finite loss (`Diverged`), the uploads' `weighted_mean` and what
a cell's run returns (`CellResult`). Each is importable from where it was before
(pflbench.simulator.training, pflbench.simulator.rounds)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    import pandas as pd  # the result records' tables; imported by whoever builds them

State = dict[str, Tensor]  # name -> tensor with a leading client dimension
# (logits [K, B, C], labels [K, B], model state [K, ...], aux [K, ...]) -> per-client loss [K]
Objective = Callable[[Tensor, Tensor, State, State], Tensor]


class Diverged(RuntimeError):
    """Local training produced a non-finite loss or parameter."""


@dataclass(frozen=True)
class SGD:
    """PyTorch's SGD rule (weight decay added to the gradient, momentum without dampening): the one
    update rule of the engine. Every trainer applies it through `apply` or `apply_rows`: the
    per-batch-objective path (eager and compiled), the custom steps of `pflbench.kit.steps`, and
    algorithms with their own modules (FedMN)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def momenta(self, params: list[Tensor]) -> list[Tensor] | None:
        """Fresh momentum buffers for `params` (zeros), or None when the rule has no momentum."""
        return [torch.zeros_like(p) for p in params] if self.momentum else None

    def apply(
        self,
        params: list[Tensor],
        grads: list[Tensor] | tuple[Tensor, ...],
        momenta: list[Tensor] | None,
        lr: float | None = None,
    ) -> None:
        """One step in place: d = g + weight_decay * p; with momentum m = momentum * m + d and d = m;
        p = p - lr * d. `momenta` (from `momenta`, zeros before the first step: torch.optim's copy of
        the first gradient gives the same numbers) is updated in place; `lr` replaces the rule's step
        size (Per-FedAvg's beta, pFedMe's outer step). Runs under no_grad.
        The operations are torch.optim.SGD's, in its order (`g.add(p, alpha=wd)`,
        `m.mul_(momentum).add_(d)`, `p.add_(d, alpha=-lr)`), with torch's foreach kernels (a few
        launches for all tensors): on a CPU the result is torch.optim.SGD's to the bit. Written as
        `g + wd * p` and `p - lr * d` instead, it differs in the last bit (a fused multiply-add
        rounds once)."""
        if not params:
            return
        with torch.no_grad():
            if self.weight_decay:
                grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
            if self.momentum:
                assert momenta is not None  # the rule has momentum: `momenta` gave the buffers
                torch._foreach_mul_(momenta, self.momentum)
                torch._foreach_add_(momenta, grads)
                grads = momenta
            torch._foreach_add_(params, grads, alpha=-(self.lr if lr is None else lr))

    def apply_rows(
        self,
        params: list[Tensor],
        grads: list[Tensor] | tuple[Tensor, ...],
        momenta: list[Tensor] | None,
        rows: Tensor,
        lr: float | None = None,
    ) -> None:
        """`apply` to the clients `rows` (indices into the leading client dimension) of stacked
        tensors; the other clients keep their parameters and momentum. The gathers and scatters
        around the fused update stay one per tensor: torch has no foreach form of indexing."""
        with torch.no_grad():
            chosen = [p[rows] for p in params]
            chosen_momenta = None if momenta is None else [m[rows] for m in momenta]
            self.apply(chosen, [g[rows] for g in grads], chosen_momenta, lr)
            for p, new in zip(params, chosen):
                p.index_copy_(0, rows, new)
            for m, new in zip(momenta or [], chosen_momenta or []):
                m.index_copy_(0, rows, new)


def cross_entropy(logits: Tensor, labels: Tensor, state: State, aux: State) -> Tensor:
    """Mean cross-entropy of each client's batch: [K]."""
    per_sample = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    return per_sample.view(labels.shape).mean(dim=1)


def proximal(anchor: State, names: Sequence[str], weight: float) -> tuple[State, Objective]:
    """A proximal objective and the `aux` it reads: cross_entropy + weight/2 * ||w - w_a||^2 per client,
    over the tensors `names`, w_a being `anchor`'s rows (e.g. the downloaded model; detached copies, under
    "global.<name>", that ride along as `aux`). FedProx's local objective, Ditto's personal one."""
    aux = {f"global.{n}": anchor[n].detach().clone() for n in names}

    def objective(logits: Tensor, labels: Tensor, params: State, aux: State) -> Tensor:
        prox = sum(((params[n] - aux[f"global.{n}"]) ** 2).flatten(1).sum(1) for n in names)
        return cross_entropy(logits, labels, params, aux) + 0.5 * weight * prox

    return aux, objective


def weighted_mean(stacked: Tensor, weights: Tensor) -> Tensor:
    """Average over the leading client dimension with weights summing to 1. Integer tensors
    (BatchNorm's batch counters) take the maximum, as there is no meaningful mean of a count."""
    if not stacked.is_floating_point():
        return stacked.max(dim=0).values
    return torch.tensordot(weights.to(stacked.dtype), stacked, dims=1)


@dataclass
class CellResult:
    status: str  # "finished" | "diverged" | "failed"
    metrics: pd.DataFrame  # per eval round and client: accuracy, loss, val_accuracy, bytes, ...
    rounds: pd.DataFrame  # per round: bytes_up, bytes_down, train_loss, wall_time
    summary: dict
    artifacts: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None
    card: dict | None = None  # the algorithm's card (pflbench.card), stored with the result
