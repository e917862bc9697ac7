"""Cell groups: cells that share a model architecture run in lock-step in one process, and the local
training they ask of the engine at the same time is one batched step across all of them.

Design. Each cell of a group runs its own rounds on its own thread (`run_group`), exactly the code a
cell alone runs (`pflbench.simulator.rounds.run_rounds`): its server step, aggregation, random streams,
evaluation, metrics and checkpoints stay its own, and nothing in an algorithm knows it is grouped.
The one seam is the engine's plain training call: `Federation._train_on` asks the thread's group
membership (`membership()`; None for a cell not in a group, which trains exactly as before) instead of
calling `pflbench.simulator.training.train_clients`. That call is a rendezvous (`CellGroup`, pflbench.simulator.rendezvous): a
request waits until every live cell of the group is either waiting there too or has left the group
(finished, failed, diverged); then the last one to arrive becomes the leader, sorts the waiting requests into
classes that can share one step (`_merge_key`: the same model structure and memory layout, the same
objective function and aux layout, the same trainable set, the same SGD structure (momentum or not,
weight decay or not: the values, learning rates included, are each row's own, `pflbench.simulator.row_rates`),
the same batch size and device, the batched eager path, the static step or not) and runs each class of
two or more requests as one `train_group` call over the concatenated clients (states and aux concatenated along the client dimension; the
samples of each request index its own cell's features, so the features and labels of the class are
concatenated once and each request's sample ids shifted by its offset). A request alone in its class,
or one that asks for the loop path or the compiled step, is handed back to its own thread, which makes
exactly the call it would make outside a group. Why threads rather than an event loop or a
re-written round driver: the algorithms' hooks are ordinary sequential Python that may train several
times a round (FedRep's two phases, adaptation during evaluation, pFedHN's per-client loop), so a
thread per cell keeps every method unchanged and needs no hook of its own; torch releases the GIL
in its kernels, and in lock-step only the leader computes while the others wait. Lock-step is
deterministic: which requests meet depends only on each cell's own sequence of training calls, never
on timing, so a grouped run gives the same numbers every time.

Equality (tests/test_cell_groups.py). Every client's arithmetic in the batched step is its own (the
stacked layers run one convolution per client on a CPU, one batched matmul, BatchNorm per client
channel; the loss of the sum has gradient 1 for each client), so a request merged with others gets,
bit for bit, what the batched path gives it alone when it has two or more clients. A one-client
request alone takes the unstacked path (`train_group`'s `single`); merged, it trains stacked:
the same arithmetic in another float order, equal within the tolerance the tests state.

Randomness. Nothing in a round may draw from torch's global generator while other cells run on
threads of the same process: `pflbench.streams.torch_global` blocks (model initialization) are
serialized by a lock, and a cell whose models draw from the global generator while training (dropout:
`ClientModel.stochastic`, or such a module held by the algorithm, as FedMN's) is run alone, before
the group, exactly as `run_cell` runs it. (So a round must not train inside a `torch_global` block:
holding the lock at the rendezvous would stall a cell that waits for it. The built-in methods use
those blocks to initialize modules in `setup`, which `run_group` runs before the threads start.)

What stays per cell and is not batched: the custom steps of `pflbench.kit.steps` (pFedMe, Per-FedAvg) and
algorithms' own training loops run on their cell's thread; while they run, the others wait at the
rendezvous (lock-step), so a group is best formed of cells of one algorithm (GUIDE, "Speed").
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from collections.abc import Callable

import torch
from torch import nn

from pflbench.simulator import rounds
from pflbench.algorithm import Algorithm
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.federation import EVALUATED, Federation, federation_device
from pflbench.simulator.metrics import CELL_GROUP_KEYS
from pflbench.simulator.rendezvous import CellGroup, GroupStats, Member
from pflbench.simulator.rendezvous import membership as membership  # a thread's membership, importable here as before
from pflbench.simulator.resolve import ensure_resolved
from pflbench.simulator.rounds import CellResult

if TYPE_CHECKING:
    from pflbench.config import CellConfig
    from pflbench.simulator.rounds import RoundCheckpointer

# ---- the in-process group runner -----------------------------------------------------------------


def draws_global_generator(fed: Federation, algorithm: Algorithm) -> bool:
    """Whether the cell's training draws from torch's global generator (dropout and the like: in the
    cell's models or in a module the algorithm holds), so that it cannot share a process's threads."""
    if any(m.stochastic for m in fed.models):
        return True
    return any(
        isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU))
        for module in held_modules(algorithm)
        for m in module.modules()
    )


def held_modules(algorithm: Algorithm) -> list[nn.Module]:
    """The nn.Modules `algorithm` holds, and those of a method it wraps (a knob's wrapper holds the cell's
    method: pflbench.simulator.cell_method)."""
    held = list(vars(algorithm).values())
    return [v for v in held if isinstance(v, nn.Module)] + [
        m for v in held if isinstance(v, Algorithm) for m in held_modules(v)
    ]


@dataclass
class GroupRun:
    """Per cell of a group (in the given order): its result, and how its training calls went."""

    results: list  # a CellResult, or None for a cell stopped by one of `passthrough`'s exceptions
    stats: list[GroupStats | None] = field(default_factory=list)
    alone: list[bool] = field(default_factory=list)  # run alone, before the group (see module doc)
    stopped: list[BaseException | None] = field(default_factory=list)  # `passthrough`'s exception per cell


def run_group(
    cells: list[CellConfig],
    *,
    data_root: str | Path | None = None,
    mirror: str | Path | None = None,
    execution: ExecutionOptions | None = None,
    evaluate: tuple[str, ...] | None = None,
    checkpointers: Sequence[RoundCheckpointer | None] | None = None,
    on_round: list[Callable[[dict], None] | None] | None = None,
    stop_after: int | None = None,
    passthrough: tuple[type[BaseException], ...] = (),
    on_finished: Callable[[int, CellResult], None] | None = None,
) -> GroupRun:
    """Run `cells` as one group in this process, each on its own thread; per cell the `CellResult`
    `pflbench.simulator.rounds.run_cell` would give (a failed cell: status "failed" with its traceback, as the
    runner records one; a diverging cell: "diverged"). A cell that fails or diverges leaves the group and
    the others go on. `checkpointers[i]`, `on_round[i]`: cell i's, as `run_cell` takes them. An exception
    of a `passthrough` type (the runner's: preemption, a full disk) is not a failure: it stops that cell
    (`GroupRun.stopped`), and the caller decides. Each cell's summary gets `cell_group_*` keys: the
    group's size, the cell's training calls and how many shared a step, and their mean width.
    `on_finished(i, result)`: called as soon as cell i has its result, complete (its `cell_group_*` keys
    included), while the others may still run: on cell i's thread, or on this one for a cell that
    failed to build or ran alone; so a caller can record a cell without waiting for the group's slowest
    (the Ray runner does: pflbench/run/result_relay.py). An exception it raises is ignored: the result is
    still in `GroupRun.results`."""
    execution = execution or ExecutionOptions()
    evaluate = rounds.check_evaluated(evaluate or EVALUATED)
    count = len(cells)
    checkpointers = checkpointers or [None] * count
    on_round = on_round or [None] * count
    results: list = [None] * count
    stopped: list[BaseException | None] = [None] * count
    alone = [False] * count
    group = CellGroup()
    jobs: list[tuple[int, Federation, Algorithm, dict[str, Any], Member]] = []

    def finish(i: int, result: CellResult, member: Member | None = None, static_step: bool = False) -> None:
        """Cell i's result, complete (`member`: its place in the group, whose calls are all made; `static_step`:
        whether its batched steps went through static buffers, a CUDA graph on CUDA), handed on."""
        if member is not None and result.summary is not None:
            result.summary.update(
                {
                    "cell_group_cells": len(jobs),
                    "cell_group_calls": member.stats.calls,
                    "cell_group_merged_calls": member.stats.merged,
                    "cell_group_mean_width": member.stats.as_dict()["mean_merged_width"],
                    "cell_group_static_step": static_step,
                }
            )
        results[i] = result
        if on_finished is not None:
            try:
                on_finished(i, result)
            except Exception:  # the caller's problem, not the cell's: the result is still returned
                pass

    def cell_rounds(i: int, fed: Federation, algorithm: Algorithm, provenance: dict[str, Any]) -> CellResult:
        """Cell i's rounds, its algorithm set up (alone or as a member of the group)."""
        return rounds.run_rounds(
            fed,
            algorithm,
            on_round=on_round[i],
            provenance=provenance,
            evaluate=evaluate,
            checkpointer=checkpointers[i],
            stop_after=stop_after,
            set_up=True,
        )

    # Built and set up one after another here, each inside its own global generator as run_cell does.
    for i, cell in enumerate(cells):
        try:
            cell = ensure_resolved(cell)
            dataset, splits = rounds.prepare_cell(cell, data_root, mirror)
            provenance = {
                "dataset_checksum": dataset.checksum,
                "torch": torch.__version__,
                "device": federation_device(execution).type,
            }
            with rounds.cell_global_rng(cell.seed, federation_device(execution)):
                fed, algorithm = rounds.build_cell(
                    cell, dataset, splits, execution, withhold_test="test" not in evaluate
                )
                algorithm.setup()
                if draws_global_generator(fed, algorithm):  # alone, here, in its own generator
                    alone[i] = True
                    finish(i, cell_rounds(i, fed, algorithm, provenance))
                    continue
        except passthrough as stop:
            stopped[i] = stop
            continue
        except Exception:
            finish(i, _failed(traceback.format_exc()))
            continue
        jobs.append((i, fed, algorithm, provenance, group.member(str(i))))

    def run(i: int, fed: Federation, algorithm: Algorithm, provenance: dict[str, Any], member: Member) -> None:
        result = None
        with member.joined():
            try:
                result = cell_rounds(i, fed, algorithm, provenance)
            except passthrough as stop:
                stopped[i] = stop
            except Exception:
                result = _failed(traceback.format_exc())
        if result is not None:  # out of the group (`joined`): its calls, and their counts, are final
            finish(i, result, member, fed.static_step)

    # Daemon threads: a preemption's deadline raised in this (the main) thread ends the process without
    # waiting for cells still inside a round (their checkpoints are written atomically).
    threads = [threading.Thread(target=run, args=job, name=f"pflbench-cell-{job[0]}", daemon=True) for job in jobs]
    with torch.random.fork_rng(devices=[]):  # the caller's global generator, as it was
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    stats: list[GroupStats | None] = [None] * count
    for i, *_, member in jobs:
        stats[i] = member.stats
    return GroupRun(results, stats, alone, stopped)


# The summary keys a grouped cell's run adds (how it ran, not what it computed: pflbench.simulator.metrics).
SUMMARY_KEYS = CELL_GROUP_KEYS
GROUP_LIMIT = 32  # cells in one group at most (`form_groups`): threads, and every cell's data held at once


def architecture_key(cell: CellConfig) -> tuple:
    """Cells with equal keys build the same model architecture: the same dataset (its options give the
    input shape and the classes) and the same model name."""
    options = tuple(sorted((k, repr(v)) for k, v in (cell.dataset_options or {}).items()))
    return (cell.dataset, options, cell.model)


class _Resources(Protocol):
    """What `group_resources` uses of a spec's `pflbench.run.spec_schema.Resources` (not imported here, even
    for type checking: that would close an import circle through pflbench.algorithm)."""

    @property
    def gpus(self) -> float: ...

    def model_copy(self: _R, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> _R: ...


_R = TypeVar("_R", bound=_Resources)


def group_resources(resources: _R, cells: int) -> _R:
    """What a group of `cells` cells, each asking `resources` (a spec's `Resources`), asks of Ray as one
    task: one cell's CPUs, since in lock-step one cell computes at a time on that many torch threads
    (`pflbench.run.cell.execute_group`); and the cells' GPU fractions summed, at most one whole GPU, since
    the group trains in one process on one device (a cell asking for whole GPUs: the same GPUs)."""
    gpus = resources.gpus if resources.gpus >= 1 else min(1.0, round(resources.gpus * cells, 4))
    return resources.model_copy(update={"gpus": gpus})


def form_groups(cells: list, limit: int = GROUP_LIMIT) -> list[list]:
    """`cells` as cell groups of at most `limit` cells that share a model architecture, in the order the
    cells come (a group is placed where its first cell was)."""
    groups: dict[tuple, list[list]] = {}
    order: list[list] = []
    for cell in cells:
        chunks = groups.setdefault(architecture_key(cell), [])
        if not chunks or len(chunks[-1]) >= limit:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(cell)
    return order


def _failed(error: str) -> CellResult:
    import pandas as pd

    return CellResult("failed", pd.DataFrame(), pd.DataFrame(), {"status": "failed"}, {}, error)
