"""A model as a representation followed by a linear head, for methods whose local objective reads the
representation (FedDBE's bias vector and mean regularizer, GPFL's conditional valves, ...).

The head is the model's last layer when it is an `nn.Linear` (the CNNs' and the MLP's `fc3`,
MobileNetV3's `classifier.3`); the representation of a sample is that layer's input (`Head`, `head_of`).
`forward_with_features` gives the logits and the representation of one batch per client from one forward
(a forward pre-hook on the head, in whichever form the engine calls the model: one client bound,
the natively batched twin, or vmap), so BatchNorm statistics are updated exactly as in the engine's own
step. `train_with_features` is local SGD on an objective that sees the representation: the engine's
batch plan (`pflbench.kit.steps.step_plan`: the round's stragglers cut), its SGD rule on every trainable
tensor (the model's and a method's own, e.g. a per-client vector riding in the same State), the clients
batched or one at a time as the engine trains them, and a carry (per-client tensors the objective
passes from step to step, such as a running mean). It runs eagerly (no compiled or captured step), and
its calls are the method's own: in a cell group they are not merged with other cells'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from pflbench.round_context import Round
from pflbench.kit.steps import step_plan
from pflbench.streams import StreamLike
from pflbench.simulator.client_model import ClientModel, to_channels_last
from pflbench.simulator.training import SGD, Diverged, State

if TYPE_CHECKING:
    from pflbench.engine import Engine

__all__ = ["FeatureObjective", "Head", "forward_with_features", "head_of", "train_with_features"]


@dataclass(frozen=True)
class Head:
    """The model's linear head: its module's name, its weight's and bias's tensor names, and `dim`, the
    size of the representation it reads."""

    module: str
    weight: str
    bias: str | None
    dim: int

    def logits(self, state: State, features: Tensor) -> Tensor:
        """The head applied to `features` [K, B, dim] with each client's head in `state`: [K, B, C]."""
        out = torch.bmm(features, state[self.weight].transpose(1, 2))
        return out if self.bias is None else out + state[self.bias].unsqueeze(1)


def head_of(model: ClientModel) -> Head:
    """The last layer of `model` as a `Head`; ValueError when it is not an `nn.Linear`."""
    last = [n for n in model.layers[-1] if n in model.param_names]
    owner = last[0].rpartition(".")[0] if last else ""
    module = model.template.get_submodule(owner) if owner else None
    if not isinstance(module, nn.Linear):
        raise ValueError(
            f"this method reads the representation before a linear head, but the model's last layer "
            f"({owner or 'none'}) is a {type(module).__name__}: models with a linear last layer: "
            f"cnn, cnn-bn, mlp, mobilenetv3-large"
        )
    return Head(owner, f"{owner}.weight", f"{owner}.bias" if module.bias is not None else None, module.in_features)


def forward_with_features(
    model: ClientModel, state: State, x: Tensor, train: bool, head: Head | None = None
) -> tuple[Tensor, Tensor]:
    """(logits [K, B, C], representation [K, B, D]) of inputs [K, B, ...] under the stacked `state` of
    `model`'s tensors, from one forward (`ClientModel.forward`'s paths; in training mode BatchNorm
    buffers in `state` are updated in place, per client)."""
    head = head or head_of(model)
    clients, batch = x.shape[:2]
    seen: list[Tensor] = []

    def grab(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
        seen.append(args[0])

    if clients == 1:  # one client: a plain call of the bound module, as ClientModel.forward_single
        single = {n: t[0] for n, t in state.items()}
        if model.channels_last:
            single = {n: to_channels_last(t) for n, t in single.items()}
        with model.bound(single, train) as net:
            handle = net.get_submodule(head.module).register_forward_pre_hook(grab)
            try:
                out = net(x[0])
            finally:
                handle.remove()
        return out.unsqueeze(0), seen[0].unsqueeze(0)
    twin = model._twins[x.device.type == "cuda"]  # the engine's natively batched twin (pflbench.simulator.batching)
    if twin is None:  # vmap: the representation leaves each call as an output
        template = model.template
        template.train(train)

        def call(s: State, xb: Tensor) -> tuple[Tensor, Tensor]:
            got: list[Tensor] = []
            handle = template.get_submodule(head.module).register_forward_pre_hook(lambda _m, args: got.append(args[0]))
            try:
                out = functional_call(template, s, (xb,))
            finally:
                handle.remove()
            return out, got[0]

        logits, features = vmap(call)(state, x)
        return logits, features
    twin.train(train)
    handle = twin.get_submodule(head.module).register_forward_pre_hook(grab)
    try:
        out = functional_call(twin, state, (x.flatten(0, 1),))
    finally:
        handle.remove()
    return out.view(clients, batch, *out.shape[1:]), seen[0].reshape(clients, batch, -1)


# (logits [K, B, C], representation [K, B, D], labels [K, B], the clients' state [K, ...] (differentiable),
#  the carry [K, ...]) -> (loss per client [K], the carry after this step)
FeatureObjective = Callable[[Tensor, Tensor, Tensor, State, State], tuple[Tensor, State]]


def train_with_features(
    engine: Engine,
    rnd: int | Round,
    clients: Tensor,
    state: State,
    objective: FeatureObjective,
    *,
    carry: State | None = None,
    trainable: list[str] | None = None,
    epochs: int | None = None,
    stream: StreamLike | None = None,
    train: bool = True,
    sgd: SGD | None = None,
) -> tuple[State, State, Tensor]:
    """Local SGD of `clients` from `state` ([K, ...]: the model's tensors and any of the method's own,
    which the objective reads) on `objective` (`FeatureObjective`), `epochs` of the engine's batch plan
    (None: the budget's local epochs; `stream`: its batch order), updating the `trainable` tensors
    (default: the model's parameters and every floating tensor of `state` that is not the model's) by the
    engine's SGD rule (or `sgd`). `train`: the model's mode in the forward (False: BatchNorm normalizes
    with its running statistics and leaves them as they are). Returns (state, carry, mean loss per
    client); raises `Diverged` on a non-finite loss."""
    model = engine.model
    rule = engine.sgd if sgd is None else sgd
    extra = [n for n, t in state.items() if n not in model.shapes and t.is_floating_point()]
    names = [n for n in (trainable if trainable is not None else [*model.param_names, *extra]) if n in state]
    plan = step_plan(engine, rnd, clients, stream=stream, epochs=epochs)
    counts = plan.counts

    def run(rows: Tensor, start: State, carried: State, ids: Tensor, steps: Tensor) -> tuple[State, State, Tensor]:
        work = {n: t.detach().clone().requires_grad_(n in names) for n, t in start.items()}
        carried = {n: t.detach().clone() for n, t in carried.items()}
        leaves = [work[n] for n in names]
        momenta = rule.momenta(leaves)
        loss_sum = torch.zeros(len(rows), device=ids.device)
        everyone = torch.arange(len(rows))
        for step in range(int(steps.max()) if len(steps) else 0):
            on = everyone[steps > step]
            active = None if len(on) == len(rows) else on.to(ids.device)
            view = work if active is None else {n: t[active] for n, t in work.items()}
            held = carried if active is None else {n: t[active] for n, t in carried.items()}
            x, y = engine.data(ids[:, step] if active is None else ids[active, step])
            logits, features = forward_with_features(model, {n: view[n] for n in model.names}, x, train=train)
            losses, after = objective(logits, features, y, view, held)
            grads = torch.autograd.grad(losses.sum(), leaves, allow_unused=True)
            grads_list = [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads)]
            with torch.no_grad():
                if active is None:
                    loss_sum += losses.detach()
                    rule.apply(leaves, grads_list, momenta)
                    carried = {n: t.detach() for n, t in after.items()}
                else:
                    loss_sum.index_add_(0, active, losses.detach())
                    for n in model.buffer_names:  # BatchNorm statistics of the gathered copies
                        work[n].index_copy_(0, active, view[n])
                    rule.apply_rows(leaves, grads_list, momenta, active)
                    for n, t in after.items():
                        carried[n] = carried[n].index_copy(0, active, t.detach())
        mean = loss_sum / steps.clamp(min=1).to(loss_sum.device)
        return {n: t.detach() for n, t in work.items()}, carried, mean

    carry = carry or {}
    if engine.batched or len(clients) <= 1:
        new_state, new_carry, loss = run(clients, state, carry, plan.ids, counts)
    else:  # one client at a time, as the engine's loop path
        parts = [
            run(
                clients[k : k + 1],
                {n: t[k : k + 1] for n, t in state.items()},
                {n: t[k : k + 1] for n, t in carry.items()},
                plan.ids[k : k + 1],
                counts[k : k + 1],
            )
            for k in range(len(clients))
        ]
        new_state = {n: torch.cat([p[0][n] for p in parts]) for n in state}
        new_carry = {n: torch.cat([p[1][n] for p in parts]) for n in carry}
        loss = torch.cat([p[2] for p in parts])
    if not bool(torch.isfinite(loss).all()):
        raise Diverged(f"non-finite local loss for clients {torch.nonzero(~torch.isfinite(loss)).flatten().tolist()}")
    return new_state, new_carry, loss
