"""The batched plain local step over static buffers: on CUDA captured once as a CUDA graph and replayed,
on a CPU the same code called eagerly (the capture and the cache: `pflbench.simulator.captured`).

Why. On a GPU a step of these small CNNs is host work (Python, autograd, ~80 launches), not arithmetic. A CUDA graph replays the step's kernels with one launch; what it needs is that every
tensor the step reads or writes lives at a fixed address and every value that changes (the batch, who
is active, the learning rates) is in a tensor, not in Python. So the step here is written against
static buffers, one `StaticStep` per (model, trainable set, width K, batch B, input layout and dtypes,
SGD structure, device): the clients' state [K, ...], momenta, the step's inputs x [K, B, ...] and
labels y [K, B], the active rows [K] (bool), the rows' rates (`pflbench.simulator.row_rates.RowRates`), the
summed losses [K]. A call (`train_static`) copies the clients' state in, then per step refills x, y
and the active mask and runs the step (a replay on CUDA, a call on a CPU), and copies the state out.

The step computes every row and keeps the inactive rows' values with `torch.where` (parameters,
momenta, BatchNorm statistics and counters, summed losses): rows past their last step (stragglers, a
shorter plan) keep exactly what they had, as `pflbench.simulator.training`'s gathered tail steps give them, and
the graph keeps one shape. A row's arithmetic is its own in the batched layers (one convolution per
client on a CPU, a grouped convolution on CUDA, one matmul per client, BatchNorm per client channel;
the sum's gradient is 1 for every row), so on a CPU the static step gives today's batched step bit for
bit (tests/test_static_step.py: plain and BatchNorm CNNs, stragglers, clients with fewer samples than
a batch, momentum and weight decay, per-row learning rates). There is no short last batch to handle:
the engine's batch plan fills every batch (`pflbench.simulator.training.batch_plan`).

Why `torch.cuda.graphs` and not `torch.compile(mode="reduce-overhead")`: the graph replays the very
kernels the eager step launches (so graphs on and off can be compared bit for bit on the device, and
`verify`'s tolerance is untouched), it captures forward, backward and the update with BatchNorm's
in-place statistics (which torch.func's transforms refuse: the compiled step's limit), costs a
capture (tens of milliseconds) instead of a compilation (tens of seconds per shape, on a 15-minute
device), and cannot recompile on a new Python value (the rates are tensors either way).

Only the plain objective (`cross_entropy`, no aux) with a natively batched model (`pflbench.simulator.batching`)
and at least two rows is captured; other calls train eagerly with one reason line
(`static_unavailable`). Finiteness is checked once per call by the caller, as before.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from pflbench.simulator.captured import CACHED as CACHED  # static steps kept per model (tests read it here)
from pflbench.simulator.captured import cached, capture_or_none
from pflbench.simulator.row_rates import RowRates, Rule, structure

# What this module needs of `pflbench.simulator.training`'s types, named here (training imports this module).
State = dict[str, Tensor]  # name -> tensor with a leading client dimension


class SGD(Rule, Protocol):
    """The engine's SGD rule (`pflbench.simulator.training.SGD`): its values, and fresh momentum buffers."""

    def momenta(self, params: list[Tensor]) -> list[Tensor] | None: ...


class ClientModel(Protocol):
    """The engine's batched model (`pflbench.simulator.client_model.ClientModel`), as far as the static step uses it."""

    param_names: list[str]
    buffer_names: list[str]
    static_steps: dict
    _twins: dict[bool, Any]

    @property
    def channels_last(self) -> bool: ...

    def forward(self, state: State, x: Tensor, train: bool) -> Tensor: ...


def static_unavailable(model: ClientModel, plain_objective: bool, width: int, trainable: set[str]) -> str | None:
    """None if a batched call can go through the static step, else why not (one line). `plain_objective`:
    the engine's cross-entropy with no aux."""
    if not plain_objective:
        return "the method's own objective: a fresh function each round"
    if width < 2:
        return "one client trains unstacked"
    if not trainable:
        return "nothing to train"
    if model._twins[True] is None or model._twins[False] is None:
        return "the model has a layer without a batched twin (vmap)"
    return None


class StaticStep:
    """One batched plain step over static buffers (module doc); `run` replays it (CUDA) or calls it."""

    def __init__(
        self, model: ClientModel, state: State, trainable: set[str], x: Tensor, y: Tensor, sgd: SGD, capture_it: bool
    ) -> None:
        self.model = model
        width = len(y)
        self.state = {name: torch.zeros_like(t) for name, t in state.items()}
        self.leaves = [self.state[n].requires_grad_(True) for n in model.param_names if n in trainable]
        self.buffers = [n for n in model.buffer_names if n in self.state]
        self.kept = {n: torch.zeros_like(self.state[n]) for n in self.buffers}
        self.momenta = sgd.momenta(self.leaves)
        self.x, self.y = torch.zeros_like(x), torch.zeros_like(y)
        self.active = torch.ones(width, dtype=torch.bool, device=y.device)
        self.rates = RowRates.of([sgd] * width, y.device, self.leaves[0].dtype if self.leaves else torch.float32)
        self.loss_sum = torch.zeros(width, device=y.device)
        self.graph: torch.cuda.CUDAGraph | None = (
            capture_or_none(self._step, "the batched plain step") if capture_it else None
        )

    def _step(self) -> None:
        """Forward, loss, backward and the update of the active rows, on the buffers."""
        with torch.no_grad():
            if self.kept:
                torch._foreach_copy_(list(self.kept.values()), [self.state[n] for n in self.buffers])
        logits = self.model.forward(self.state, self.x, train=True)
        per_sample = torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.y.flatten(), reduction="none")
        losses = per_sample.view(self.y.shape).mean(dim=1)
        grads = torch.autograd.grad(losses.sum(), self.leaves, allow_unused=True)
        with torch.no_grad():
            gradients = [torch.zeros_like(p) if g is None else g for p, g in zip(self.leaves, grads)]
            new, new_momenta = self.rates.updates(self.leaves, gradients, self.momenta)
            _keep_inactive(self.active, self.leaves, new)
            if self.momenta is not None and new_momenta is not None:
                _keep_inactive(self.active, self.momenta, new_momenta)
            if self.kept:  # the inactive rows' BatchNorm statistics and counters as they were
                _keep_inactive(
                    self.active,
                    list(self.kept.values()),
                    [self.state[n] for n in self.buffers],
                    into=[self.state[n] for n in self.buffers],
                )
            self.loss_sum.copy_(torch.where(self.active, self.loss_sum + losses.detach(), self.loss_sum))

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def load(self, state: State, rates: RowRates) -> None:
        """The call's starting point: the clients' state, fresh momenta, no losses, the rows' rates."""
        with torch.no_grad():
            torch._foreach_copy_(list(self.state.values()), [state[n] for n in self.state])
            if self.momenta is not None:
                torch._foreach_zero_(self.momenta)
            self.loss_sum.zero_()
            self.rates.fill(rates)


def _keep_inactive(active: Tensor, olds: list[Tensor], news: list[Tensor], into: list[Tensor] | None = None) -> None:
    """`into` (default `olds`) <- the `news` rows where `active`, the `olds` rows elsewhere."""
    for old, new, target in zip(olds, news, into or olds):
        target.copy_(torch.where(active.view(-1, *([1] * (old.dim() - 1))), new, old))


def train_static(
    model: ClientModel,
    state: State,
    features: Tensor,
    labels: Tensor,
    ids: Tensor,
    counts: list[int],
    sgd: SGD,
    rates: RowRates | None,
    trainable: set[str],
    loss_sum: Tensor,
) -> tuple[State, State | None]:
    """The steps `ids` [K, S, B] (sample ids on the device) of `pflbench.simulator.training.train_group`'s
    batched path through the static step, from `state`: row k takes the steps before its `counts[k]`
    and sits out the others; `rates` are each row's SGD values (None: `sgd`'s). Adds the rows' losses
    to `loss_sum` [K]; returns the new state and the momenta by trainable name (None without momentum),
    fresh tensors, for the eager steps that may follow (`train_group` goes on from there)."""
    width, steps = ids.shape[:2]
    device = features.device
    x, y = features[ids[:, 0]], labels[ids[:, 0]]
    key = (
        tuple(sorted(trainable)),
        width,
        tuple(x.shape),
        x.stride(),
        x.dtype,
        y.dtype,
        tuple((n, t.dtype) for n, t in state.items()),
        structure(sgd),
        str(device),
        model.channels_last,
    )
    step = cached(
        model.static_steps,
        key,
        lambda: StaticStep(model, state, trainable, x, y, sgd, device.type == "cuda"),
        f"the batched step ({width} rows, batch {x.shape[1]})",
    )
    step.load(state, rates or RowRates.of([sgd] * width, device, step.rates.neg_lr.dtype))
    shortest = min(counts, default=0)
    masks = _masks(counts, steps, shortest, device)
    flat_x = step.x.view(-1, *step.x.shape[2:]) if step.x.is_contiguous() else None
    for s in range(steps):
        with torch.no_grad():
            chosen = ids[:, s].flatten()
            if flat_x is not None:
                torch.index_select(features, 0, chosen, out=flat_x)
            else:  # inputs in another memory layout (channels-last): the gather, then a copy
                step.x.copy_(features[ids[:, s]])
            torch.index_select(labels, 0, chosen, out=step.y.view(-1))
            if s == 0 or s >= shortest:  # every row is active until the shortest plan ends
                step.active.copy_(masks[0 if s < shortest else 1 + s - shortest])
        step.run()
    with torch.no_grad():
        loss_sum += step.loss_sum
        new_state = {n: t.detach().clone() for n, t in step.state.items()}
        names = [n for n in model.param_names if n in trainable]
        momenta = None if step.momenta is None else {n: m.clone() for n, m in zip(names, step.momenta)}
    return new_state, momenta


def _masks(counts: list[int], steps: int, shortest: int, device: torch.device) -> Tensor:
    """[1 + tail, K] bool: every row, then the active rows of each step after the shortest plan
    (`shortest`..`steps` - 1), in one copy to the device."""
    rows = [[True] * len(counts)] + [[c > s for c in counts] for s in range(shortest, steps)]
    return torch.tensor(rows, dtype=torch.bool).to(device)
