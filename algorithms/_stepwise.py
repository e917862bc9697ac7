"""Building blocks for algorithms whose local update is not SGD on a single per-batch objective
(Per-FedAvg's meta step on two or three batches, pFedMe's inner solve on one batch): per-client
batch plans as one padded id tensor, per-client gradients of a stacked state, the engine's SGD rule
with a mask for the clients that have finished, and the engine's choice between one batched call
and a loop over clients.

Everything here works on stacked states ([K, ...], row k = client k), so one call serves the batched
path (all sampled clients at once) and the loop path (K = 1) alike. Not an algorithm: the leading
underscore keeps it out of the registry.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pflbench.training import SGD, State, batch_plan


def step_ids(fed, rnd: int, clients: Tensor, *, salt: int, epochs: int | None = None,
             steps: int | None = None, split: str = "train") -> tuple[Tensor, Tensor]:
    """The engine's batch plan for `clients` as sample ids [K, S, B] (S = the longest plan) and the
    number of real steps per client [K]. Past its last step a client repeats its last batch (the
    caller masks those steps out); a client without samples gets sample 0 and 0 steps."""
    indices = [fed.splits[split][c] for c in clients.tolist()]
    plans = batch_plan([len(i) for i in indices], fed.cell.batch_size, epochs or fed.cell.local_epochs,
                       steps, fed.batch_generators(rnd, clients, salt))
    plans = fed.local_plans(rnd, clients.tolist(), plans)  # a straggler's share of the round's work
    counts = torch.tensor([len(p) for p in plans], device=fed.device)
    longest = int(counts.max()) if len(plans) else 0
    ids = torch.zeros(len(plans), longest, fed.cell.batch_size, dtype=torch.long, device=fed.device)
    for k, (plan, idx) in enumerate(zip(plans, indices)):
        if len(plan):
            ids[k, : len(plan)] = idx[plan.to(idx.device)]
            ids[k, len(plan):] = ids[k, len(plan) - 1]
    return ids, counts


def loss_and_grads(fed, params: State, buffers: State, ids: Tensor) -> tuple[Tensor, State]:
    """Mean cross-entropy of each client's batch `ids` [K, B] and its gradient with respect to
    `params` ([K, ...] each). The forward runs in training mode, so BatchNorm statistics in
    `buffers` are updated in place (pass clones to discard them)."""
    leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
    logits = fed.model.forward({**leaves, **buffers}, fed.features[ids], train=True)
    labels = fed.labels[ids]
    losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
    return losses.detach(), {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), grads)}


def rows_where(active: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """`new` for the clients in `active` ([K] bool), `old` for the others."""
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)


def sgd_step(params: State, grads: State, momenta: State, sgd: SGD, lr: float, active: Tensor) -> None:
    """The engine's SGD rule (weight decay added to the gradient, momentum without dampening) with
    step size `lr`, applied in place to the active clients only."""
    with torch.no_grad():
        for n, p in params.items():
            g = grads[n] + sgd.weight_decay * p if sgd.weight_decay else grads[n]
            if sgd.momentum:
                m = momenta[n] * sgd.momentum + g
                momenta[n].copy_(rows_where(active, m, momenta[n]))
                g = m
            p.copy_(rows_where(active, p - lr * g, p))


def per_client(fed, clients: Tensor, fn: Callable, *stacked):
    """`fn(clients, *stacked)` once for all clients where the engine batches, else once per client
    (rows k:k+1 of every stacked argument), outputs concatenated along the client dimension. `fn`
    returns a State, a Tensor or a tuple of them."""
    if fed.batched or len(clients) <= 1:
        return fn(clients, *stacked)
    outputs = [fn(clients[k:k + 1], *[_rows(s, k) for s in stacked]) for k in range(len(clients))]
    return _concat(outputs)


def _rows(value, k: int):
    if isinstance(value, dict):
        return {n: t[k:k + 1] for n, t in value.items()}
    return value[k:k + 1]


def _concat(outputs: list):
    first = outputs[0]
    if isinstance(first, tuple):
        return tuple(_concat([o[i] for o in outputs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {n: torch.cat([o[n] for o in outputs]) for n in first}
    return torch.cat(outputs)


def finite(state: State) -> Tensor:
    """Per client [K]: whether every floating tensor of its row is finite."""
    ok = None
    for t in state.values():
        if t.is_floating_point():
            row = torch.isfinite(t.flatten(1)).all(1)
            ok = row if ok is None else ok & row
    return ok
