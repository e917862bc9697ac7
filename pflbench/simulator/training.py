"""Local training of many clients at once.

Client models are stacked: every parameter and buffer carries a leading client dimension (the
torch.func "model ensembling" pattern). A step of the **batched** path runs one `vmap`-ed forward of
the module over all clients' parameters and one backward; the **loop** path trains the same clients
one after another with the same code at a client dimension of 1. Both follow the same per-client
batch plan and the same SGD rule, so they give the same parameters (up to float rounding).

Batch plan: a local epoch on a client with n samples is ceil(n / B) batches of exactly B samples
from a fresh shuffle; the last batch is completed with samples from the start of that shuffle
(a client with n < B sees some samples twice per batch). Full batches keep every client in lockstep
and BatchNorm statistics honest; clients with fewer steps simply stop early (they drop out of the
active set, so they get exactly the updates they would get alone).

CPU speed-ups (measured with `pflbench bench`, 2-core CPU, 2 torch threads, FedAvg on the CNN, batch
32; the numbers are in benchmarks/speed/README.md):
- Channels-last convolutions (`ClientModel.channels_last`, set by the Federation on a CPU): oneDNN's
  NHWC kernels run this CNN's small convolutions 1.3-1.6x faster than NCHW. One client's weights train
  as channels-last leaves (`to_channels_last`: strides NHWC even for one input channel, where
  `contiguous(memory_format=...)` would leave them NCHW and oneDNN would not switch), the stacked
  twins convert each client's weight per call, and the engine gets ordinary contiguous tensors back.
- Client threads (`threads` > 1, the loop path): clients are trained and evaluated side by side, one
  torch thread each, on a pool made once per process (`client_pool`). Two one-thread streams use two
  cores better than one two-thread stream on batches of 32 (torch's ops release the GIL; each thread
  binds a template of its own). A client's arithmetic does not depend on the thread it runs on, so
  the result is the one-after-another result at one torch thread, bit for bit (tested). Models with
  layers that draw random numbers (dropout) keep one client after another: parallel draws from the
  global generator would make the run irreproducible.

Compiled step (`compiled=True`): forward, backward and the SGD update of one step are one
`torch.compile`d function (torch.func.grad_and_value, so AOTAutograd sees the whole step and inductor
fuses the elementwise work around the convolutions and the update). Before channels-last it was
1.42x the eager step on CIFAR's shape and 1.11x on Fashion-MNIST's; inductor already lays
convolutions out channels-last on a CPU, so against the channels-last eager step it measured 1.02x and
0.77x, and it does not use client threads: it is off unless asked for (`compiled_training: on`).
It gives the eager path's parameters up to float rounding (tested).
It is used for models without buffers (torch.func's grad transform forbids BatchNorm's in-place
statistics update) and for the plain cross-entropy objective (FedAvg, Local, partial personalization, the
adaptation protocol): an algorithm's own objective is a fresh closure every round, which would make
dynamo recompile, so those steps stay eager. The batched path compiles steps where every client is
active and runs the few tail steps (clients past their last step dropped) eagerly, so the compiled
graph has one static shape. Compiled graphs are cached per (model, trainable set, SGD rule, path,
layout) in the process and by inductor on disk (`compile_cache_dir`), so later cells reuse them; the
seconds spent compiling are counted (`compile_seconds`). Where compilation fails, the engine says so
once and goes on eagerly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

# The method API's types, defined in pflbench.api_types and importable from here as before.
from pflbench.api_types import (
    SGD as SGD,
    Diverged as Diverged,
    Objective as Objective,
    State as State,
    cross_entropy as cross_entropy,
    weighted_mean as weighted_mean,
)
from pflbench.simulator.batching import set_conv_layout, stacked_twin
from pflbench.simulator.client_model import ClientModel, to_channels_last
from pflbench.simulator.row_rates import RowRates
from pflbench.simulator.static_step import static_unavailable, train_static


def batch_plan(
    num_samples: list[int], batch_size: int, epochs: int, steps: int | None, generators: list[torch.Generator]
) -> list[Tensor]:
    """Per client, positions into its own sample list: [steps_i, batch_size] (see module doc).
    `epochs` counts when `steps` is None; 0 epochs or 0 steps is an empty plan."""
    plans = []
    for n, gen in zip(num_samples, generators):
        if n == 0 or (epochs if steps is None else steps) == 0:
            plans.append(torch.empty(0, batch_size, dtype=torch.long))
            continue
        if steps is None:  # epochs: each epoch wraps around its own shuffle
            per_epoch = math.ceil(n / batch_size)
            repeats = math.ceil(per_epoch * batch_size / n)
            chunks = [torch.randperm(n, generator=gen).repeat(repeats)[: per_epoch * batch_size] for _ in range(epochs)]
        else:  # a fixed number of steps over a stream of shuffles
            needed = steps * batch_size
            chunks = [torch.randperm(n, generator=gen) for _ in range(math.ceil(needed / n))]
        stream = torch.cat(chunks)
        plans.append(stream[: len(stream) // batch_size * batch_size].view(-1, batch_size)[:steps])
    return plans


def train_clients(
    model: ClientModel,
    state: State,
    features: Tensor,
    labels: Tensor,
    client_indices: list[Tensor],
    plans: list[Tensor],
    sgd: SGD,
    *,
    objective: Objective = cross_entropy,
    aux: State | None = None,
    trainable: Iterable[str] | None = None,
    batched: bool = True,
    compiled: bool = False,
    threads: int = 1,
    static: bool = False,
) -> tuple[State, Tensor]:
    """Train K clients from `state` ([K, ...]); returns the new state and each client's mean loss.

    `client_indices[k]` are client k's sample ids into `features`/`labels`, `plans[k]` the positions
    within them for each step. Parameters outside `trainable` stay fixed. `compiled` runs the steps
    it can through the compiled step (module doc). `threads` > 1: the loop path trains that many
    clients side by side (module doc). `static`: the batched path trains through the static-buffer step
    (`pflbench.simulator.static_step`: a CUDA graph on CUDA), where it can. Raises `Diverged`.
    """
    aux = aux or {}
    trainable = set(model.param_names if trainable is None else trainable)
    compiled = compiled and objective is cross_entropy and not aux
    if batched:
        new_state, losses = train_group(
            model,
            state,
            features,
            labels,
            client_indices,
            plans,
            sgd,
            objective,
            aux,
            trainable,
            compiled,
            static=static,
        )
    else:
        if static:
            _note(
                "the static (CUDA-graph) step is not used here (the client loop trains one client at a time); "
                "training eagerly"
            )

        def one(k: int) -> tuple[State, Tensor]:
            return train_group(
                model,
                _rows(state, k),
                features,
                labels,
                client_indices[k : k + 1],
                plans[k : k + 1],
                sgd,
                objective,
                _rows(aux, k),
                trainable,
                compiled,
            )

        side_by_side = threads > 1 and len(client_indices) > 1 and not compiled and not model.stochastic
        outputs = _map_clients(one, len(client_indices), threads if side_by_side else 1)
        new_state = {name: torch.cat([s[name] for s, _ in outputs]) for name in state}
        losses = torch.cat([loss for _, loss in outputs])
    if not torch.isfinite(losses).all():
        raise Diverged(f"non-finite local loss for clients {torch.nonzero(~torch.isfinite(losses)).flatten().tolist()}")
    return new_state, losses


_client_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


_pool_lock = threading.Lock()


def client_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """`workers` threads with one intra-op torch thread each, made once per process.
    torch's thread setting is per thread, but a new thread copies a process-wide value the first time
    it runs an op; so each worker settles its own count first, and the caller's value is put back."""
    with _pool_lock:
        if workers not in _client_pools:
            caller = torch.get_num_threads()
            settled = threading.Barrier(workers + 1)

            def settle() -> None:
                torch.get_num_threads()  # this thread's lazy initialization, before it is changed
                torch.set_num_threads(1)
                settled.wait()

            pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="pflbench-client", initializer=settle
            )
            for _ in range(workers):
                pool.submit(lambda: None)
            settled.wait()
            torch.set_num_threads(caller)
            _client_pools[workers] = pool
        return _client_pools[workers]


_T = TypeVar("_T")


def _map_clients(work: Callable[[int], _T], count: int, threads: int) -> list[_T]:
    """[work(0), ..., work(count - 1)]: one after another, or on `threads` client threads."""
    if threads <= 1 or count <= 1:
        return [work(k) for k in range(count)]
    return list(client_pool(threads).map(work, range(count)))


def _rows(state: State, k: int) -> State:
    return {name: t[k : k + 1] for name, t in state.items()}


def train_group(
    model: ClientModel,
    state: State,
    features: Tensor,
    labels: Tensor,
    client_indices: list[Tensor],
    plans: list[Tensor],
    sgd: SGD,
    objective: Objective,
    aux: State,
    trainable: set[str],
    compiled: bool = False,
    *,
    rates: RowRates | None = None,
    static: bool = False,
) -> tuple[State, Tensor]:
    """`train_clients`'s batched path (and, per client, its loop path). `rates`: each row's own SGD
    values (`pflbench.simulator.row_rates`; rows of several cells, `pflbench.simulator.groups`), else `sgd`'s for all.
    `static`: through the static-buffer step where it can (`pflbench.simulator.static_step`)."""
    device = features.device
    num_clients = len(plans)
    steps = torch.tensor([len(p) for p in plans])
    max_steps = int(steps.max()) if num_clients else 0
    batch_size = plans[0].shape[1] if num_clients else 0
    # Sample ids of every (client, step, position), padded past each client's last step.
    ids = torch.zeros(num_clients, max_steps, batch_size, dtype=torch.long, device=device)
    for k, (plan, idx) in enumerate(zip(plans, client_indices)):
        ids[k, : len(plan)] = idx[plan.to(device)]
    # One client (the loop path) trains unstacked tensors: no vmap, no per-step slicing.
    single = num_clients == 1
    loss_sum = torch.zeros(num_clients, device=device)
    start = {name: (t[0] if single else t) for name, t in state.items()}
    carried: State | None
    first_step, carried = 0, None
    if static and not compiled:  # the steps where two or more clients are active
        why_not = static_unavailable(model, objective is cross_entropy and not aux, num_clients, trainable)
        if why_not is not None:
            _note(f"the static (CUDA-graph) step is not used here ({why_not}); training eagerly")
        else:
            # Where one client is left, the eager steps below take it on its own (an unstacked forward:
            # another float order than a stacked row's), so the static step stops there.
            first_step = sorted(steps.tolist())[-2]
            if first_step:
                start, carried = train_static(
                    model, start, features, labels, ids[:, :first_step], steps.tolist(), sgd, rates, trainable, loss_sum
                )
    if compiled and num_clients:  # the steps where every client is active
        done = _compiled_steps(
            model, start, features, labels, ids[:, : int(steps.min())], sgd, trainable, single, loss_sum
        )
        if done is not None:
            start, carried = done
            first_step = int(steps.min())
    # One client's convolution weights train in channels-last order (module doc); the stacked twins
    # convert per call instead. The bound module holds these very leaves, updated in place.
    layout = to_channels_last if single and model.channels_last else (lambda t: t)
    work = {name: layout(t.detach().clone()).requires_grad_(name in trainable) for name, t in start.items()}
    leaves = [work[name] for name in model.param_names if name in trainable]
    momenta = sgd.momenta(leaves)
    if momenta is not None and carried:
        momenta = [
            torch.empty_like(leaf).copy_(carried[name])
            for name, leaf in zip([n for n in model.param_names if n in trainable], leaves)
        ]
    full = torch.arange(num_clients)
    with model.bound(work, train=True) if single else contextlib.nullcontext() as net:
        for step in range(first_step, max_steps):
            active = full[steps > step]
            rows = None if len(active) == num_clients else active.to(device)
            if rows is None:
                view, aux_view, batch = work, aux, ids[:, step]
            else:  # clients past their last step sit out: gather the active ones
                view = {name: t[rows] for name, t in work.items()}
                aux_view = {name: t[rows] for name, t in aux.items()}
                batch = ids[rows, step]
            x, y = features[batch], labels[batch]
            if single:
                assert net is not None  # the bound module (one client)
                logits = net(x[0]).unsqueeze(0)
                losses = objective(logits, y, {name: t.unsqueeze(0) for name, t in view.items()}, aux_view)
            else:
                logits = model.forward(view, x, train=True)
                losses = objective(logits, y, view, aux_view)
            grads: tuple[Tensor, ...] | list[Tensor] = torch.autograd.grad(losses.sum(), leaves, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads)]
            with torch.no_grad():
                if rows is None:
                    loss_sum += losses.detach()
                    if rates is None:
                        sgd.apply(leaves, grads, momenta)
                    else:
                        rates.apply(leaves, grads, momenta)
                else:
                    loss_sum.index_add_(0, rows, losses.detach())
                    for name in model.buffer_names:  # BatchNorm statistics of the gathered copies
                        work[name].index_copy_(0, rows, view[name])
                    if rates is None:
                        sgd.apply_rows(leaves, grads, momenta, rows)
                    else:
                        rates.apply_rows(leaves, grads, momenta, rows)
    mean_loss = loss_sum / steps.clamp(min=1).to(device)
    return {
        name: (t.detach().contiguous().unsqueeze(0) if single else t.detach()) for name, t in work.items()
    }, mean_loss


def compile_cache_dir() -> str:
    """Where inductor keeps compiled kernels and FX graphs between processes (its own default is a
    temporary directory that does not survive a reboot): $TORCHINDUCTOR_CACHE_DIR, else
    ~/.cache/pflbench/inductor."""
    return os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pflbench", "inductor")
    )


def compile_available() -> str | None:
    """None if torch.compile can be used here, else why not (one line)."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if sys.platform == "win32":
        return "torch.compile's CPU backend needs a C++ compiler setup that Windows builds usually lack"
    return None


_warned: set[str] = set()


def _note(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"pflbench: {message}", file=sys.stderr, flush=True)


def _make_step(
    model: ClientModel, trainable: tuple[str, ...], sgd: SGD, single: bool, device_type: str
) -> Callable[[State, State, State | None, Tensor, Tensor], tuple[State, State | None, Tensor]]:
    """The functional step: (trainable params, frozen params, momenta, x, y) -> (new params, new
    momenta, per-client losses)."""
    compute = copy.deepcopy(model._module) if single else stacked_twin(model.template, device_type == "cuda")
    if compute is None:  # no native twin: vmap over the functional call
        compute = model.template
    compute.train(True)
    layout = model.channels_last
    if not single and compute is not model.template:
        set_conv_layout(compute, layout)

    def logits_of(state: State, x: Tensor) -> Tensor:
        if single:
            if layout:
                state = {name: to_channels_last(t) for name, t in state.items()}
            return functional_call(compute, state, (x[0],)).unsqueeze(0)
        if compute is model.template:
            return vmap(lambda s, xb: functional_call(compute, s, (xb,)))(state, x)
        clients, batch = x.shape[:2]
        out = functional_call(compute, state, (x.flatten(0, 1),))
        return out.view(clients, batch, *out.shape[1:])

    def step(
        params: State, others: State, momenta: State | None, x: Tensor, y: Tensor
    ) -> tuple[State, State | None, Tensor]:
        def loss_of(p: State) -> tuple[Tensor, Tensor]:
            losses = cross_entropy(logits_of({**p, **others}, x), y, {}, {})
            return losses.sum(), losses.detach()

        grads, (_, losses) = grad_and_value(loss_of, has_aux=True)(params)
        names = list(params)
        new_params = [params[name].clone() for name in names]  # the engine's rule, on fresh copies
        new_momenta = None if momenta is None else [momenta[name].clone() for name in names]
        sgd.apply(new_params, [grads[name] for name in names], new_momenta)
        return (dict(zip(names, new_params)), None if new_momenta is None else dict(zip(names, new_momenta)), losses)

    return torch.compile(step, dynamic=False)


def _compiled_steps(
    model: ClientModel,
    start: State,
    features: Tensor,
    labels: Tensor,
    ids: Tensor,
    sgd: SGD,
    trainable: set[str],
    single: bool,
    loss_sum: Tensor,
) -> tuple[State, State | None] | None:
    """Run the steps `ids` ([K, steps, B]) through the compiled step; returns (state, momenta), or
    None (nothing done) where compilation is unavailable or failed."""
    why_not = compile_available()
    if why_not is not None:
        _note(f"compiled training steps unavailable ({why_not}); training eagerly")
        return None
    if model.buffer_names:
        # torch.func's grad transform forbids BatchNorm's in-place running-statistics update
        _note("compiled training steps need a model without buffers (BatchNorm statistics); training eagerly")
        return None
    key = (tuple(sorted(trainable)), sgd, single, features.device.type, model.channels_last)
    if key not in model._compiled:
        compile_cache_dir()
        model._compiled[key] = _make_step(model, key[0], sgd, single, features.device.type)
    step = model._compiled[key]
    if step is None:
        return None
    params = {name: t for name, t in start.items() if name in trainable}
    others = {name: t for name, t in start.items() if name not in trainable}
    fresh = sgd.momenta(list(params.values()))
    momenta = None if fresh is None else dict(zip(params, fresh))
    del fresh  # the buffers live in `momenta` alone, freed as the steps replace them
    for s in range(ids.shape[1]):
        batch = ids[:, s]
        x, y = features[batch], labels[batch]
        first = not getattr(step, "_pflbench_ran", False)
        began = time.perf_counter()
        try:
            params, momenta, losses = step(params, others, momenta, x, y)
        except Exception as err:  # a backend or tracing failure: eager from here on, for this key
            if s:
                raise  # half-way through a client's steps: no safe way to go on
            model._compiled[key] = None
            _note(
                f"torch.compile failed ({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}); "
                f"training eagerly"
            )
            return None
        if first:
            step._pflbench_ran = True
            model.compile_seconds += time.perf_counter() - began
        loss_sum += losses
    return {**params, **others}, momenta


EVAL_CHUNK = {"cpu": 256, "cuda": 4096}


@torch.no_grad()
def evaluate_client_splits(
    model: ClientModel,
    state: State,
    features: Tensor,
    labels: Tensor,
    splits: list[list[Tensor]],
    batched: bool = True,
    max_samples: int | None = None,
    threads: int = 1,
) -> list[tuple[Tensor, Tensor]]:
    """Accuracy and mean loss [K] of each client's model on each of several splits (`splits[s][k]`:
    client k's sample ids in split s), in one pass: a client's samples of every split go through
    its model together, and the sums are kept apart per split.
    At most `max_samples` samples (over all clients) go through the model at once: by default
    EVAL_CHUNK for the device (a CPU is 2-2.5x faster at 256 than at 4096 samples a call, whose
    activations fall out of cache: 4096 Fashion-MNIST test samples through the CNN, 1 thread)."""
    device = features.device
    max_samples = max_samples or EVAL_CHUNK.get(device.type, EVAL_CHUNK["cuda"])
    num_clients, num_splits = len(splits[0]), len(splits)
    if not batched:  # one client at a time, or `threads` side by side (no randomness in evaluation)
        results = _map_clients(
            lambda k: evaluate_client_splits(
                model,
                _rows(state, k),
                features,
                labels,
                [split[k : k + 1] for split in splits],
                batched=True,
                max_samples=max_samples,
            ),
            num_clients,
            threads,
        )
        return [
            (torch.cat([r[s][0] for r in results]), torch.cat([r[s][1] for r in results])) for s in range(num_splits)
        ]
    sizes = torch.tensor([[len(split[k]) for split in splits] for k in range(num_clients)], device=device).view(
        num_clients, num_splits
    )
    totals = sizes.sum(1)
    longest = int(totals.max()) if num_clients else 0
    correct = torch.zeros(num_clients, num_splits, device=device)
    loss = torch.zeros(num_clients, num_splits, device=device)
    ids = torch.zeros(num_clients, longest, dtype=torch.long, device=device)
    which = torch.zeros(num_clients, longest, dtype=torch.long, device=device)  # the split of each position
    for k in range(num_clients):
        own = [split[k] for split in splits]
        ids[k, : int(totals[k])] = torch.cat(own) if own else ids[k, :0]
        which[k, : int(totals[k])] = torch.repeat_interleave(torch.arange(num_splits, device=device), sizes[k])
    chunk = max(1, max_samples // max(1, num_clients))
    for start in range(0, longest, chunk):
        batch = ids[:, start : start + chunk]
        valid = (torch.arange(start, start + batch.shape[1], device=device) < totals[:, None]).float()
        logits = model.forward(state, features[batch], train=False)
        y = labels[batch]
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        part = which[:, start : start + chunk]
        correct.scatter_add_(1, part, (logits.argmax(-1) == y).float() * valid)
        loss.scatter_add_(1, part, ce * valid)
    denom = sizes.float()  # a client without samples in a split gets NaN there, not a fake 0
    return [(correct[:, s] / denom[:, s], loss[:, s] / denom[:, s]) for s in range(num_splits)]
