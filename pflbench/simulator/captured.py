"""A step function over static buffers: on CUDA captured once as a CUDA graph and replayed, on a CPU the
same function called eagerly. The engine's one mechanism for steps without host overhead: the plain
batched step (`pflbench.simulator.static_step`) and the methods' own steps (`pflbench.kit.steps.run_steps`: pFedMe's
inner solve, Per-FedAvg's meta step, pFedHN's official inner optimizer) use it.

Why. On a GPU a step of these small CNNs is host work (Python, autograd, tens of launches), not arithmetic.
A CUDA graph replays the step's kernels with one launch. What it needs of the step: every tensor it reads or
writes lives at a fixed address (the static buffers, filled before each replay), it reads nothing from the
device on the host (no `.item()`, no boolean mask indexing, no `torch.nonzero`), and every Python value it
uses is fixed for the graph's life (so the graph's cache key names them). On a CPU the same function is
called, so what runs there is what the graph replays, and tests on a CPU compare it with the eager step.

- `capture(fn)`: `fn`'s kernels as a CUDA graph (a few eager calls on a side stream first: lazy
  initialization of cuBLAS, cuDNN and autograd must not happen inside the capture).
- `capture_or_none(fn, what)`: the same, or None with a line on stderr where the capture fails (an op that
  cannot be captured, a host read, too little memory): the caller then calls `fn` eagerly, the same
  function on the same buffers, so the cell goes on with the eager step's numbers, only slower.
- `Captured(fn, capture)`: `run()` replays the graph, or calls `fn` where nothing was captured.
- `StaticLoop`: a step `body(carry, inputs) -> carry` over static buffers: groups of named tensors carried
  from step to step (a state, momenta, BatchNorm statistics), the step's inputs (sample ids, the active
  rows' mask); `load` copies a call's starting point in, `feed` a step's inputs, `run` steps once, `result`
  copies the carried tensors out.
- `cached(cache, key, make)`: such objects kept per key (the model's cache, `ClientModel.static_steps`),
  the oldest dropped past `CACHED` (each holds its buffers and, on CUDA, its graph's memory).
"""

from __future__ import annotations

import sys
import time
from typing import TypeVar
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

CACHED = 4  # static steps kept per model
WARMUP = 3  # eager calls on a side stream before a capture

Carry = dict[str, dict[str, Tensor]]  # groups of named tensors carried from one step to the next
T = TypeVar("T")


def capture(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """`fn` captured as a CUDA graph, after `WARMUP` eager calls on a side stream (each call's effects on
    the buffers stay: the caller fills them again before the first replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # cell groups' threads launch meanwhile
        fn()
    return graph


def capture_or_none(fn: Callable[[], None], what: str) -> torch.cuda.CUDAGraph | None:
    """`capture(fn)`, or None where capturing fails, said on stderr in one line (the caller runs `fn` eagerly:
    the warm-up calls left the buffers as an eager call would, and the caller fills them before each step)."""
    try:
        return capture(fn)
    except Exception as error:  # noqa: BLE001 (whatever the capture raised, the eager step is the fallback)
        first = str(error).splitlines()[0][:200] if str(error) else ""
        print(
            f"pflbench: capturing {what} as a CUDA graph failed ({type(error).__name__}: {first}); it runs eagerly",
            file=sys.stderr,
            flush=True,
        )
        return None


class Captured:
    """`fn` as a CUDA graph (`capture=True`; eager where the capture fails) or as itself: `run` replays or calls it."""

    def __init__(self, fn: Callable[[], None], capture_it: bool, what: str = "a step") -> None:
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = capture_or_none(fn, what) if capture_it else None

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()


class StaticLoop:
    """`body(carry, inputs) -> carry` over static buffers (module doc), captured where `capture_it`.

    The body gets shallow copies of the carried groups (it may rebind their entries) whose tensors are the
    static buffers (it may also update them in place), and the input buffers; what it returns is copied
    into the carried buffers. It must be a function of these and of constants only: the first body given
    for a key is the one every later call runs (replayed on CUDA, called on a CPU)."""

    def __init__(
        self,
        carry: Carry,
        inputs: Sequence[Tensor],
        body: Callable[[Carry, list[Tensor]], Carry],
        capture_it: bool,
        what: str = "a method's step",
    ) -> None:
        with torch.no_grad():
            self.carry = {
                group: {n: t.detach().clone() for n, t in tensors.items()} for group, tensors in carry.items()
            }
            self.inputs = [x.clone() for x in inputs]
        self.body = body
        self.step = Captured(self._step, capture_it, what)

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return self.step.graph

    def _step(self) -> None:
        out = self.body({group: dict(tensors) for group, tensors in self.carry.items()}, self.inputs)
        with torch.no_grad():
            for group, tensors in self.carry.items():
                for name, buffer in tensors.items():
                    new = out[group][name]
                    if new is not buffer:
                        buffer.copy_(new)

    def load(self, carry: Carry) -> None:
        """The call's starting point, copied into the carried buffers (one foreach copy)."""
        with torch.no_grad():
            mine = [t for tensors in self.carry.values() for t in tensors.values()]
            theirs = [carry[group][n] for group, tensors in self.carry.items() for n in tensors]
            if mine:
                torch._foreach_copy_(mine, theirs)

    def feed(self, index: int, value: Tensor) -> None:
        """Input `index`'s value for the next step (a device-to-device copy; no host read)."""
        self.inputs[index].copy_(value)

    def run(self) -> None:
        self.step.run()

    def result(self) -> Carry:
        """Copies of the carried tensors (the buffers are refilled by the next call)."""
        with torch.no_grad():
            return {group: {n: t.clone() for n, t in tensors.items()} for group, tensors in self.carry.items()}


def signature(carry: Carry, inputs: Sequence[Tensor]) -> tuple:
    """What a static loop's buffers fix: each carried tensor's name, shape, strides, dtype and device (the
    step computes on these buffers: a loop is reused only for the same layout), each input's shape, dtype
    and device (inputs are copied into their buffers, whatever their strides)."""

    def of(t: Tensor) -> tuple:
        return tuple(t.shape), t.dtype, str(t.device)

    return (
        tuple(
            (group, tuple((n, (*of(t), t.stride())) for n, t in tensors.items())) for group, tensors in carry.items()
        ),
        tuple(of(x) for x in inputs),
    )


def cached(cache: dict, key: Hashable, make: Callable[[], T], what: str) -> T:
    """`cache[key]`, made by `make` if absent (the oldest entry dropped past `CACHED`); a line on stderr
    when a graph was captured (`what` names the step)."""
    if key in cache:
        return cache[key]
    began = time.perf_counter()
    made = make()
    if len(cache) >= CACHED:
        cache.pop(next(iter(cache)))
    cache[key] = made
    if getattr(made, "graph", None) is not None:
        print(
            f"pflbench: captured {what} as a CUDA graph in {time.perf_counter() - began:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    return made
