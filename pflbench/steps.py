"""Custom local steps: the engine's pieces for algorithms whose local update is not SGD on a single
per-batch objective (Per-FedAvg's meta step on two or three batches, pFedMe's inner solve on one
batch, pFedHN's official inner optimizer and newcomer fits): per-client batch plans as one padded id
tensor (`step_ids`, from the engine's plan), per-client gradients of a stacked state, the engine's
SGD rule for the clients still active (`sgd_step`), and the engine's choice between one batched call
and a loop over clients (`per_client`).

Everything here works on stacked states ([K, ...], row k = client k), so one call serves the batched
path (all sampled clients at once) and the loop path (K = 1) alike.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pflbench import streams
from pflbench.round_context import Round
from pflbench.training import SGD, State


def step_ids(fed, rnd: int | Round, clients: Tensor, *, stream: str | None = None, epochs: int | None = None,
             steps: int | None = None, split: str = "train", salt: int | None = None) -> tuple[Tensor, Tensor]:
    """The engine's batch plan for `clients` (`Federation.local_plans`: for the round's context `rnd`,
    stragglers already cut) as sample ids [K, S, B] (S = the longest plan) and the number of real
    steps per client [K]. Past its last step a client repeats its last batch (the caller masks those steps out); a client
    without samples gets sample 0 and 0 steps. `stream`: the batch order's random stream (default
    "batches", the engine's; `salt` is its deprecated form)."""
    indices = [fed.splits[split][c] for c in clients.tolist()]
    plans = fed.local_plans(rnd, clients, epochs=epochs, steps=steps, split=split,
                            stream=streams.batch_stream(stream, salt))
    counts = torch.tensor([len(p) for p in plans], device=fed.device)
    longest = int(counts.max()) if len(plans) else 0
    ids = torch.zeros(len(plans), longest, fed.cell.batch_size, dtype=torch.long, device=fed.device)
    for k, (plan, idx) in enumerate(zip(plans, indices)):
        if len(plan):
            ids[k, : len(plan)] = idx[plan.to(idx.device)]
            ids[k, len(plan):] = ids[k, len(plan) - 1]
    return ids, counts


def batch_losses(fed, params: State, buffers: State, ids: Tensor) -> Tensor:
    """Mean cross-entropy of each client's batch `ids` [K, B] under `params` ([K, ...] each), [K],
    differentiable with respect to `params`. The forward runs in training mode, so BatchNorm
    statistics in `buffers` are updated in place (pass clones to discard them)."""
    logits = fed.model.forward({**params, **buffers}, fed.features[ids], train=True)
    labels = fed.labels[ids]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)


def loss_and_grads(fed, params: State, buffers: State, ids: Tensor) -> tuple[Tensor, State]:
    """`batch_losses` of each client's batch `ids` [K, B] and its gradient with respect to `params`
    ([K, ...] each); BatchNorm statistics in `buffers` are updated in place."""
    leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
    losses = batch_losses(fed, leaves, buffers, ids)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
    return losses.detach(), {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), grads)}


def rows_where(active: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """`new` for the clients in `active` ([K] bool), `old` for the others."""
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)


def keep_inactive(buffers: State, active: Tensor) -> State | None:
    """Copies of `buffers` (BatchNorm statistics, which a training-mode forward updates for every
    row) to give back to the clients not `active` after the step (`restore_inactive`); None when
    every client is active."""
    return None if bool(active.all()) else {n: b.clone() for n, b in buffers.items()}


def restore_inactive(buffers: State, kept: State | None, active: Tensor) -> None:
    """The clients not `active` get their buffers from `kept` (`keep_inactive`) back, in `buffers`."""
    if kept is not None:
        for n in buffers:
            buffers[n] = rows_where(active, buffers[n], kept[n])


def sgd_step(params: State, grads: State, momenta: State, sgd: SGD, lr: float, active: Tensor) -> None:
    """The engine's SGD rule (`SGD.apply`) with step size `lr`, in place, on the active clients
    only ([K] bool); `momenta` ({} without momentum) holds one buffer per parameter."""
    names = list(params)
    tensors, gradients = [params[n] for n in names], [grads[n] for n in names]
    buffers = [momenta[n] for n in names] if sgd.momentum else None
    if bool(active.all()):
        sgd.apply(tensors, gradients, buffers, lr)
    elif bool(active.any()):
        sgd.apply_rows(tensors, gradients, buffers, torch.nonzero(active).flatten(), lr)


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
