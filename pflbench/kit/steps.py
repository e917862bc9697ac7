"""Custom local steps: the engine's pieces for algorithms whose local update is not SGD on a single
per-batch objective (Per-FedAvg's meta step on two or three batches, pFedMe's inner solve on one
batch, pFedHN's official inner optimizer and newcomer fits): per-client batch plans as one padded id
tensor with the step counts on the host (`step_plan`, from the engine's plan; `step_ids`), which
clients take each step (`Active`), per-client gradients of a stacked state, the engine's SGD rule for
the clients still active (`sgd_step`), the round's losses checked once after its steps
(`LossCheck`), the engine's choice between one batched call and a loop over clients
(`per_client`), and the steps' driver (`run_steps`): a method writes one step as a function of what it
carries from step to step, and the engine runs it eagerly or over static buffers (a CUDA graph on CUDA,
`pflbench.simulator.captured`; the `cuda_graphs` execution option).

Everything here works on stacked states ([K, ...], row k = client k), so one call serves the batched
path (all sampled clients at once) and the loop path (K = 1) alike.

No host synchronisation inside the steps. On a GPU a step of these small models is launches and
Python: a step that waits for the device (`.item()`, `bool(t)`, `.tolist()`, `torch.nonzero`, a
blocking copy to or from it) empties the launch queue, and the GPU idles while the host catches up.
So what a step decides (how many steps, which clients take this one, whether all do) is read from the
batch plan, which is built on the host; what the device needs of it (sample ids, the active clients'
masks and rows) goes over in one copy per round each; and the losses are checked for finiteness once,
after the round's steps (`LossCheck`), naming the same clients and step as a check at every step
would. The state updates use torch's foreach kernels (one launch for all tensors where a per-tensor
loop makes one each), which compute what the per-tensor operations compute, element by element: on a
CPU they are those very operations. Callers that pass a device mask where an `Active` is expected
(pFedHN's steps) still work, reading the mask on the host as before.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypedDict, Unpack
from collections.abc import Callable, Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from pflbench.simulator.captured import Carry, StaticLoop, cached, signature
from pflbench.streams import StreamLike
from pflbench.round_context import Round
from pflbench.simulator.training import SGD, Diverged, State

if TYPE_CHECKING:
    from pflbench.engine import Engine


@dataclass(frozen=True)
class Active:
    """The clients that take one local step, as known on the host from the batch plan: `everyone`
    (all K clients), `mask` ([K] bool, on the device) and, unless everyone is active, `rows` (their
    indices in ascending order, on the device). In a static step (`run_steps`) nothing is known on the
    host: `everyone` is False, `rows` None and `mask` a buffer refilled per step; every row is then
    computed and the inactive rows keep their values (`torch.where`)."""

    everyone: bool
    mask: Tensor
    rows: Tensor | None = None


class StepPlan:
    """A round's batch plan for K clients (`step_plan`): `ids` [K, S, B], the sample ids of each step
    on the device (S = the longest plan; past its last step a client repeats its last batch, which the
    caller masks out; a client without samples gets sample 0), and `counts` [K], each client's number
    of real steps, on the host."""

    def __init__(self, ids: Tensor, counts: Tensor) -> None:
        self.ids, self.counts = ids, counts

    @property
    def steps(self) -> int:
        return self.ids.shape[1]

    def active(self, step: int) -> Active:
        """The clients with a real step `step` (counts > step)."""
        return self._actives[step]

    @cached_property
    def _actives(self) -> list[Active]:
        """Every step's `Active`, made once: the steps where every client is active share one mask; the
        masks and rows of the others (the tail after the shortest plan) reach the device in one copy."""
        counts, device = self.counts.tolist(), self.ids.device
        everyone = Active(True, torch.ones(len(counts), dtype=torch.bool, device=device))
        shortest = min(counts, default=0)
        tail = range(shortest, self.steps)
        if not tail:
            return [everyone] * self.steps
        masks = [[c > step for c in counts] for step in tail]
        rows = [[k for k, on in enumerate(mask) if on] for mask in masks]
        packed = torch.tensor(
            [int(on) for mask in masks for on in mask] + [k for r in rows for k in r], dtype=torch.long
        ).to(device)  # one copy for the whole tail
        cut = len(tail) * len(counts)
        on_device = packed[:cut].view(len(tail), len(counts)).bool()
        tail_rows = packed[cut:].split([len(r) for r in rows])
        return [everyone] * shortest + [Active(False, on_device[i], tail_rows[i]) for i in range(len(tail))]


def step_plan(
    fed: Engine,
    rnd: int | Round,
    clients: Tensor,
    *,
    stream: StreamLike | None = None,
    epochs: int | None = None,
    steps: int | None = None,
    split: str = "train",
) -> StepPlan:
    """The engine's batch plan for `clients` (`Engine.local_plans`: for the round's context `rnd`,
    stragglers already cut) as a `StepPlan`. `stream`: the batch order's random stream (default
    "batches", the engine's). `clients` are read from the device once (none where they are on the
    host already: a caller making several plans of one round copies them once). The sample ids reach
    the device in one copy (positions padded on the host, then one gather from the clients'
    concatenated sample ids)."""
    clients = clients.cpu()  # the plan's every read of the clients, on the host
    indices = [fed.sample_ids(c, split) for c in clients.tolist()]
    plans = fed.local_plans(rnd, clients, epochs=epochs, steps=steps, split=split, stream=stream)
    counts = torch.tensor([len(p) for p in plans], dtype=torch.long)
    longest = int(counts.max()) if len(plans) else 0
    batch = fed.budget.batch_size
    # Positions into the concatenation of the clients' sample ids, with one more id at the end (sample
    # 0) for the clients without samples.
    positions = torch.empty(len(plans), longest, batch, dtype=torch.long)
    offset = 0
    for k, (plan, idx) in enumerate(zip(plans, indices)):
        if len(plan):
            positions[k, : len(plan)] = plan + offset
            positions[k, len(plan) :] = plan[-1] + offset
        offset += len(idx)
    positions[counts == 0] = offset
    pool = torch.cat([*indices, torch.zeros(1, dtype=torch.long, device=fed.device)])
    return StepPlan(pool[positions.to(fed.device)], counts)


class PlanOptions(TypedDict, total=False):
    """`step_plan`'s keyword arguments, as `step_ids` passes them on."""

    stream: StreamLike | None
    epochs: int | None
    steps: int | None
    split: str


def step_ids(fed: Engine, rnd: int | Round, clients: Tensor, **options: Unpack[PlanOptions]) -> tuple[Tensor, Tensor]:
    """`step_plan`'s sample ids [K, S, B] and step counts [K], both on the device (`options`: those of
    `step_plan`: stream, epochs, steps, split)."""
    plan = step_plan(fed, rnd, clients, **options)
    return plan.ids, plan.counts.to(plan.ids.device)


def batch_losses(fed: Engine, params: State, buffers: State, ids: Tensor) -> Tensor:
    """Mean cross-entropy of each client's batch `ids` [K, B] under `params` ([K, ...] each), [K],
    differentiable with respect to `params`. The forward runs in training mode, so BatchNorm
    statistics in `buffers` are updated in place (pass clones to discard them)."""
    inputs, labels = fed.data(ids)
    logits = fed.model.forward({**params, **buffers}, inputs, train=True)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)


def loss_and_grads(fed: Engine, params: State, buffers: State, ids: Tensor) -> tuple[Tensor, State]:
    """`batch_losses` of each client's batch `ids` [K, B] and its gradient with respect to `params`
    ([K, ...] each); BatchNorm statistics in `buffers` are updated in place."""
    leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
    losses = batch_losses(fed, leaves, buffers, ids)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
    return losses.detach(), {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), grads)}


def rows_where(active: Tensor | Active, new: Tensor, old: Tensor) -> Tensor:
    """`new` for the clients in `active` (an `Active`, or a [K] bool mask), `old` for the others."""
    if isinstance(active, Active):
        if active.everyone:
            return new
        active = active.mask
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)


def keep_inactive(buffers: State, active: Tensor | Active) -> State | None:
    """Copies of `buffers` (BatchNorm statistics, which a training-mode forward updates for every
    row) to give back to the clients not `active` after the step (`restore_inactive`); None when
    every client is active."""
    return None if _everyone(active) else clone_state(buffers)


def restore_inactive(buffers: State, kept: State | None, active: Tensor | Active) -> None:
    """The clients not `active` get their buffers from `kept` (`keep_inactive`) back, in `buffers`."""
    if kept is not None:
        for n in buffers:
            buffers[n] = rows_where(active, buffers[n], kept[n])


def sgd_step(params: State, grads: State, momenta: State, sgd: SGD, lr: float, active: Tensor | Active) -> None:
    """The engine's SGD rule (`SGD.apply`) with step size `lr`, in place, on the active clients
    only (an `Active`, or a [K] bool mask, read on the host); `momenta` ({} without momentum) holds
    one buffer per parameter."""
    names = list(params)
    tensors, gradients = [params[n] for n in names], [grads[n] for n in names]
    buffers = [momenta[n] for n in names] if sgd.momentum else None
    if isinstance(active, Active):
        if active.everyone:
            sgd.apply(tensors, gradients, buffers, lr)
        elif active.rows is None:  # a static step's mask: every row stepped, the inactive ones kept
            _apply_where(sgd, tensors, gradients, buffers, lr, active.mask)
        else:
            sgd.apply_rows(tensors, gradients, buffers, active.rows, lr)
    elif bool(active.all()):
        sgd.apply(tensors, gradients, buffers, lr)
    elif bool(active.any()):
        sgd.apply_rows(tensors, gradients, buffers, torch.nonzero(active).flatten(), lr)


def _apply_where(
    sgd: SGD, params: list[Tensor], grads: list[Tensor], momenta: list[Tensor] | None, lr: float, mask: Tensor
) -> None:
    """`SGD.apply` on copies of every row, then the rows of `mask` take the new values (in place) and the
    others keep theirs: `apply_rows`'s values without reading the rows on the host (each element's update
    is its own, wherever it sits in the tensor)."""
    with torch.no_grad():
        new = [p.clone() for p in params]
        new_momenta = None if momenta is None else [m.clone() for m in momenta]
        sgd.apply(new, grads, new_momenta, lr)
        for p, n in zip(params, new):
            p.copy_(rows_where(mask, n, p))
        for m, n in zip(momenta or [], new_momenta or []):
            m.copy_(rows_where(mask, n, m))


def _everyone(active: Tensor | Active) -> bool:
    return active.everyone if isinstance(active, Active) else bool(active.all())


def clone_state(state: State) -> State:
    """Copies of `state`'s tensors (one foreach copy for all)."""
    copies = [torch.empty_like(t) for t in state.values()]
    if copies:
        torch._foreach_copy_(copies, list(state.values()))
    return dict(zip(state, copies))


class LossCheck:
    """Finiteness of a round's local losses, checked once after the steps: one host synchronisation a
    round instead of one a step. Each `add` is one check, of one or more losses ([K] each) of the
    clients `active` at that point; `first_failure` finds the first check where an active client's
    loss was not finite, and its clients: what a check made at that point would have found (the steps
    after a non-finite loss only carry it on; the caller keeps its results to itself until it has
    asked)."""

    def __init__(self) -> None:
        self._losses: list[Tensor] = []
        self._masks: list[Tensor] = []
        self._width: int | None = None

    def add(self, active: Tensor | Active, *losses: Tensor) -> None:
        """Queue one check (on the device: nothing is read here). Every check has as many losses."""
        self._check_width(losses)
        self._losses.extend(losses)
        self._masks.append(active.mask if isinstance(active, Active) else active)

    def _check_width(self, losses: tuple[Tensor, ...]) -> None:
        """The first check sets how many losses a check has; ValueError when a later one differs."""
        if self._width is None:
            self._width = len(losses)
        elif len(losses) != self._width:
            raise ValueError(f"a check has {self._width} losses; got {len(losses)}")

    def first_failure(self) -> tuple[int, Tensor] | None:
        """(index of the first check with a non-finite loss of an active client, [K] bool mask of
        those clients, on the device), or None when every active client's loss was finite. Reads one
        flag from the device (more only when a check failed)."""
        return self.verdict()[0]

    def verdict(self, rows_ok: Tensor | None = None) -> tuple[tuple[int, Tensor] | None, bool]:
        """`first_failure`, and whether every entry of `rows_ok` (e.g. `finite` of the trained state,
        [K] bool on the device; None: nothing more) is True, read from the device together: the
        round's one host synchronisation where both are checked (more only when a check failed)."""
        flags: list[Tensor] = []
        bad = None
        if self._masks:
            checks, width = len(self._masks), self._width
            assert width is not None  # set by the first `add`
            bad = (~torch.isfinite(torch.stack(self._losses))).view(checks, width, -1).any(1) & torch.stack(self._masks)
            flags.append(bad.any(1).any())
        if rows_ok is not None:
            flags.append(rows_ok.all())
        if not flags:
            return None, True
        read = torch.stack(flags).tolist()
        failed, ok = (read[0] if bad is not None else False), (read[-1] if rows_ok is not None else True)
        if not failed or bad is None:
            return None, ok
        first = int(torch.nonzero(bad.any(1))[0])
        return (first, bad[first]), ok

    def raise_if_diverged(
        self, rows_ok: Tensor, clients: Tensor, method: str, *, loss: str = "loss", at_step: bool = False
    ) -> None:
        """`verdict(rows_ok)` as a method's local training reports it: `Diverged` naming the clients (of
        `clients`) of the first check with a non-finite loss ("non-finite {method} {loss}", and the local
        step where `at_step`), else all of them where an entry of `rows_ok` is False."""
        failure, ok = self.verdict(rows_ok)  # one read of the device for both
        if failure is not None:
            step, bad = failure
            where = f" at local step {step}" if at_step else ""
            raise Diverged(f"non-finite {method} {loss} for clients {clients[bad.to(clients.device)].tolist()}{where}")
        if not ok:
            raise Diverged(f"non-finite {method} parameters for clients {clients.tolist()}")


class DeviceLossCheck(LossCheck):
    """`LossCheck`'s answers from flags kept on the device and updated in place by each check (the first
    failing check's index and its clients, and the checks' count): what a static step (`run_steps`) keeps
    across its replays, where a list of the steps' losses cannot grow. `reset` before a call's steps."""

    def __init__(self, width: int, device: torch.device) -> None:
        super().__init__()
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.first = torch.full((), -1, dtype=torch.long, device=device)
        self.bad = torch.zeros(width, dtype=torch.bool, device=device)

    def reset(self) -> None:
        self.count.zero_()
        self.first.fill_(-1)
        self.bad.zero_()

    def add(self, active: Tensor | Active, *losses: Tensor) -> None:
        self._check_width(losses)
        with torch.no_grad():
            bad = ~torch.isfinite(losses[0])
            for loss in losses[1:]:
                bad |= ~torch.isfinite(loss)
            bad &= active.mask if isinstance(active, Active) else active
            new = bad.any() & (self.first < 0)
            self.first.copy_(torch.where(new, self.count, self.first))
            self.bad.copy_(torch.where(new, bad, self.bad))
            self.count += 1

    def verdict(self, rows_ok: Tensor | None = None) -> tuple[tuple[int, Tensor] | None, bool]:
        flags = [self.first >= 0] + ([rows_ok.all()] if rows_ok is not None else [])
        failed, *rest = torch.stack(flags).tolist()
        ok = rest[0] if rest else True
        return ((int(self.first), self.bad.clone()) if failed else None), ok


# (the step's carried tensors, its inputs this step: one id tensor [K, B] per plan, who is active, the
# losses' check) -> the carried tensors after the step
Step = Callable[[Carry, list[Tensor], Active, LossCheck], Carry]


def run_steps(
    fed: Engine, plans: Sequence[StepPlan], carry: Carry, step: Step, key: Hashable
) -> tuple[Carry, LossCheck]:
    """A method's own local steps: for each step s of `plans[0]`, `carry = step(carry, [p.ids[:, s] for p in
    plans], plans[0].active(s), losses)`; returns the carried tensors after the last step and the check of
    the losses (`LossCheck.verdict`, the caller's one read of the device).

    Eagerly, as written, unless the engine runs its steps over static buffers (the `cuda_graphs` execution
    option); then the same `step` runs over the buffers of a `pflbench.simulator.captured.StaticLoop` (captured once
    as a CUDA graph and replayed on CUDA, called on a CPU) cached on the model: the step sees an `Active`
    without rows (every row computed, the inactive ones kept with `torch.where`) and a `DeviceLossCheck`.
    `key` names the constants `step` uses (hyperparameters, the SGD rule): a step is kept per key, shapes
    and layouts, and the first `step` given for it is the one that runs. On a CPU both forms give the
    same bits (tests/test_captured_steps.py)."""
    plan = plans[0]
    why_not = static_unavailable(fed, len(plan.counts)) if plan.steps else ""
    if why_not is not None:
        if why_not and why_not not in _noted:
            _noted.add(why_not)
            print(
                f"pflbench: the static (CUDA-graph) step is not used here ({why_not}); training eagerly",
                file=sys.stderr,
                flush=True,
            )
        losses = LossCheck()
        for s in range(plan.steps):
            carry = step(carry, [p.ids[:, s] for p in plans], plan.active(s), losses)
        return carry, losses
    model, device = fed.model, plan.ids.device
    inputs = [p.ids[:, 0] for p in plans] + [plan.active(0).mask]
    data = tuple(
        t.data_ptr() for t in (getattr(fed, "features", None), getattr(fed, "labels", None)) if t is not None
    )  # the tensors the step's gathers read, at their addresses
    full_key = (
        "own step",
        getattr(step, "__qualname__", repr(step)),
        key,
        signature(carry, inputs),
        data,
        model.channels_last,
    )
    static = cached(
        model.static_steps,
        full_key,
        lambda: _StaticSteps(carry, inputs, step, device),
        f"{getattr(step, '__qualname__', 'a step')} ({len(plan.counts)} rows)",
    )
    static.check.reset()
    static.loop.load(carry)
    shortest = int(plan.counts.min()) if len(plan.counts) else 0
    for s in range(plan.steps):
        for i, p in enumerate(plans):
            static.loop.feed(i, p.ids[:, s])
        if s == 0 or s >= shortest:  # every row is active until the shortest plan ends
            static.loop.feed(len(plans), plan.active(s).mask)
        static.loop.run()
    return static.loop.result(), static.check


_noted: set[str] = set()


def static_unavailable(fed: Engine, width: int) -> str | None:
    """None if `run_steps` runs over static buffers for `width` clients; else why not: "" where the engine
    does not ask for it (`cuda_graphs` off, or auto before verification), else one line."""
    if not getattr(fed, "static_step", False) or width == 0:  # the Federation's execution option
        return ""
    model = fed.model
    if model.stochastic:
        return "the model draws random numbers (dropout)"
    if width > 1 and (model._twins[True] is None or model._twins[False] is None):
        return "the model has a layer without a batched twin (vmap)"
    return None


class _StaticSteps:
    """A method's step over static buffers (`run_steps`): the loop and its losses' check."""

    def __init__(self, carry: Carry, inputs: list[Tensor], step: Step, device: torch.device) -> None:
        self.check = DeviceLossCheck(len(inputs[-1]), device)
        check = self.check

        def body(carried: Carry, given: list[Tensor]) -> Carry:
            return step(carried, given[:-1], Active(False, given[-1]), check)

        self.loop = StaticLoop(carry, inputs, body, device.type == "cuda")

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return self.loop.graph


def per_client(fed: Engine, clients: Tensor, fn: Callable[..., Any], *stacked: Any) -> Any:
    """`fn(clients, *stacked)` once for all clients where the engine batches, else once per client
    (rows k:k+1 of every stacked argument), outputs concatenated along the client dimension. `fn`
    returns a State, a Tensor or a tuple of them."""
    if fed.batched or len(clients) <= 1:
        return fn(clients, *stacked)
    outputs = [fn(clients[k : k + 1], *[_rows(s, k) for s in stacked]) for k in range(len(clients))]
    return _concat(outputs)


def _rows(value: Any, k: int) -> Any:
    if isinstance(value, dict):
        return {n: t[k : k + 1] for n, t in value.items()}
    return value[k : k + 1]


def _concat(outputs: list[Any]) -> Any:
    first = outputs[0]
    if isinstance(first, tuple):
        return tuple(_concat([o[i] for o in outputs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {n: torch.cat([o[n] for o in outputs]) for n in first}
    return torch.cat(outputs)


def finite(state: State) -> Tensor:
    """Per client [K]: whether every floating tensor of its row is finite."""
    ok: Tensor | None = None
    for t in state.values():
        if t.is_floating_point():
            row = torch.isfinite(t.flatten(1)).all(1)
            ok = row if ok is None else ok & row
    assert ok is not None, "a state without floating tensors"  # (a model's parameters are floating)
    return ok
