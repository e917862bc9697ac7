"""`pflbench run SPEC`: run every cell of a spec that has no result yet, in parallel on Ray (a local
instance by default, an existing cluster with --ray-address/RAY_ADDRESS) or in this process
(--no-ray, --workers 1), with a live progress display, and record each cell in the results store.

One cell never stops the others: an exception is recorded as "failed" with its traceback, a NaN as
"diverged". Results and round checkpoints are written into the driver's store only, so a cluster
needs no shared results folder (pflbench/run/checkpoint_relay.py). Every node needs the data: a worker on
another node than the driver's checks that it has the dataset and partition the driver prepared, and
its cell fails with one message naming the node and the path where it does not (pflbench/run/node_data.py;
a worker never downloads).

Preemption (pflbench/run/preemption.py): SIGTERM or a first Ctrl-C stops a run's running cells at the end
of the round in progress, with a checkpoint of that round (or at once when the round has not ended
within `grace_seconds`; that round's work is lost), starts no new cell, and ends the run with
`PREEMPTED_EXIT` and one line naming each stopped cell and the round the next run resumes at. On Ray
the driver passes the stop to its cells through the progress board (`BoardStop`). A second Ctrl-C
cancels the running cells and exits at once (130); their results are simply absent, and the next run
starts them again from their last checkpoints.

A full disk (pflbench/storage/store.py's `DiskFull`: a checkpoint, a result or a claim that cannot be written for
lack of space): the cell being run or recorded stops without a result (its previous checkpoint, if
any, stays whole), no further cell is started, and the run ends with `DISK_FULL_EXIT` and one line
naming the file, the bytes it needed, the bytes free and the round the next run resumes the cell at.
Finished cells stay as they are; a run after space is freed continues.

Out of memory: a cell that cannot allocate (MemoryError; torch's CPU allocator failing, "can't
allocate memory"; torch.OutOfMemoryError on a GPU), and a Ray worker that Ray's memory monitor kills
(`ray.exceptions.OutOfMemoryError`), are reported as "out of memory (peak N MB)" with the cell (the
peak: the process's largest resident set, as the cell's last round reported it on Ray); a Ray cell is
retried at most `retries` times like any lost worker, then recorded as failed with that reason. A
worker the kernel's OOM killer ends (a cgroup's memory limit) is, to Ray, a worker that died
(WorkerCrashedError): it is told apart by the kernel's count of OOM kills of the worker's memory
cgroup, which rose since the cell's last round (pflbench/run/oom_kills.py), and named and retried the same
way ("out of memory (peak N MB): the kernel's OOM killer ended its worker"); the peak is the one the
cell's last round reported.

Round checkpoints (pflbench/storage/checkpoint.py): a running cell writes `<results>/<hash>/checkpoint.pt`
by the `checkpoint_every` / `checkpoint_minutes` policy, and a run that finds one continues the cell
from it ("resumed at round R of N"): after a kill, a Ctrl-C, a runner taking over an abandoned claim,
or a Ray worker or node that was lost. A lost worker's cell is retried up to `retries` times (then it
is "failed") and resumes from its checkpoint. On Ray a cell's checkpoints go through a keeper actor on
the driver's node into the driver's store (pflbench/run/checkpoint_relay.py), so a retry resumes from the
last one on whichever node it lands, the lost node's included. A cell group's cells (pflbench/simulator/groups.py)
are recorded each as it finishes: on Ray their results are relayed to the driver while the group's
other cells run (pflbench/run/result_relay.py); in-process each is written from its own thread
(`GroupRecorder`). A finished or diverged cell's checkpoint is removed once its result is
written (`keep_checkpoints` keeps it); a failed cell's is kept, so the next run continues it.

The parts, one module each in pflbench/run/: this module plans the run (partitions prepared once, the
cells to run, the closing summary); `options` (what a run is asked and what it reports), `cell` (one cell
or cell group run and its outcome), `recording` (claims and results in the store), `in_process` and
`on_ray` (where the cells run), `stops` (preemption and a full disk, as lines), `memory` (out of memory).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import cast

from rich.console import Console
from rich.markup import escape

from pflbench.config import CellConfig, cell_hash
from pflbench.run.display import Display, label, make_console
from pflbench.run.summary import print_summary
from pflbench.run.in_process import run_in_process
from pflbench.run.node_data import DataFingerprint, fingerprint
from pflbench.run.on_ray import Heartbeat, run_on_ray
from pflbench.run.options import PrepareError, RunOptions, RunReport
from pflbench.run.preemption import (
    Preemption,
)
from pflbench.run.ray_cluster import this_node
from pflbench.run.spec import Plan, describe_partition
from pflbench.run.options import RunStopped
from pflbench.run.stops import acknowledge
from pflbench.storage.store import COMPLETE, DAMAGED, Store


def prepare_partitions(
    cells: list[CellConfig], plan: Plan, options: RunOptions, console: Console
) -> tuple[list[CellConfig], dict[str, int], dict[str, DataFingerprint]]:
    """Build every distinct partition once, before any training: workers then find it in the cache,
    and an impossible partition stops the run before it starts. Cells of an optional dataset that
    cannot be loaded here are left out; returns the cells to run, {dataset: cells left out} and each
    cell's DataFingerprint by hash (what a worker on another node checks: pflbench/run/node_data.py)."""
    from pflbench.data import DatasetNotFoundError
    from pflbench.simulator.rounds import prepare_cell

    groups: dict[tuple, CellConfig] = {}
    group_of: dict[str, tuple] = {}
    for cell in cells:
        key = (
            cell.dataset,
            json.dumps(cell.dataset_options, sort_keys=True),
            cell.partition,
            json.dumps(cell.partition_params, sort_keys=True),
            cell.clients,
            cell.seed,
            cell.train_fraction,
            cell.val_fraction,
        )
        groups.setdefault(key, cell)
        group_of[cell_hash(cell)] = key
    prints: dict[tuple, DataFingerprint] = {}
    driver = this_node()
    missing: set[str] = set()
    with console.status("") as status:
        for i, (key, cell) in enumerate(groups.items(), 1):
            if cell.dataset in missing:
                continue
            status.update(
                f"preparing partitions {i}/{len(groups)}: {cell.dataset} {describe_partition(cell)} "
                f"{cell.clients} clients seed {cell.seed}"
            )
            try:
                dataset, splits = prepare_cell(cell, options.data_root, options.mirror)
                # options.data_root: resolved by run_plan
                prints[key] = fingerprint(dataset, splits, cast(Path, options.data_root), options.mirror, driver)
                del dataset, splits
            except DatasetNotFoundError as error:
                if cell.dataset not in plan.optional_datasets:
                    raise PrepareError(str(error)) from None
                missing.add(cell.dataset)
            except ValueError as error:  # PartitionError, a bad dataset option
                raise PrepareError(f"{label(cell)}: {error}") from None
    skipped = Counter(cell.dataset for cell in cells if cell.dataset in missing)
    kept = [cell for cell in cells if cell.dataset not in missing]
    return kept, dict(skipped), {cell_hash(cell): prints[group_of[cell_hash(cell)]] for cell in kept}


def run_plan(plan: Plan, options: RunOptions = RunOptions(), console: Console | None = None) -> RunReport:
    """Run the plan's cells that have no result yet (all of them with `force`); see the module doc."""
    from pflbench.data import data_mirror, data_root
    from pflbench.loader.plugins import sources_for

    console = console or make_console()
    # Absolute paths, resolved here once: Ray workers may start elsewhere and without our environment.
    # The user's plugins travel with the cells: a worker loads exactly the code the cells were planned with.
    options = replace(
        options,
        data_root=data_root(options.data_root),
        mirror=data_mirror(options.mirror),
        plugins=sources_for(plan.cells),
    )
    store = Store(options.results)
    before = {cell_hash(cell): store.status(cell) for cell in plan.cells}
    for cell in plan.cells:
        if before[cell_hash(cell)] == DAMAGED:
            problems = "; ".join(f"{p.file}: {p.what}" for p in store.check(store.cell_dir(cell)))
            kept = store.set_aside(cell)
            before[cell_hash(cell)] = None
            console.print(
                f"[yellow]note:[/] cell {cell_hash(cell)} ({escape(label(cell))}) was damaged ({escape(problems)}); "
                f"its files are kept in {escape(str(kept))} and it runs again",
                highlight=False,
            )
    todo = [cell for cell in plan.cells if options.force or before[cell_hash(cell)] not in COMPLETE]
    report = RunReport(outcomes=dict(before))
    scale = f" (scale {plan.scale})" if len(plan.scales) > 1 else ""
    console.print(
        f"{escape(plan.name)}{scale}: {len(plan.cells)} cells, {len(plan.cells) - len(todo)} with results in "
        f"{escape(str(options.results))}, {len(todo)} to run",
        highlight=False,
    )
    if not todo:
        print_summary(console, plan, store, report, 0.0)
        return report
    todo, report.skipped_datasets, data = prepare_partitions(todo, plan, options, console)
    notes = skipped_dataset_notes(report.skipped_datasets, options)
    record_skipped_datasets(store, plan, notes)
    for dataset, note in notes.items():
        console.print(
            f"[yellow]note:[/] dataset {escape(repr(dataset))} cannot be loaded here: {escape(note['reason'])}; "
            f"its {note['cells']} cells are left out and the run goes on without it. "
            f"{escape(note['how_to_provide'])}",
            highlight=False,
        )
        report.outcomes = {
            k: v
            for k, v in report.outcomes.items()
            if k not in {cell_hash(c) for c in plan.cells if c.dataset == dataset}
        }
    in_process = not options.use_ray or options.workers == 1
    where = (
        "in this process"
        if in_process
        else (
            f"on Ray ({options.ray_address or os.environ.get('RAY_ADDRESS') or 'local instance'}"
            + (f", {options.workers} workers" if options.workers else "")
            + ")"
        )
    )
    console.print(
        f"running {len(todo)} cells {where}, {plan.resources.cpus:g} CPU"
        + (f" and {plan.resources.gpus:g} GPU" if plan.resources.gpus else "")
        + " each",
        highlight=False,
    )
    started = time.perf_counter()
    preemption = Preemption(options.grace_seconds, on_request=lambda name: acknowledge(name, options.grace_seconds))
    with Display(console, len(todo)) as display, Heartbeat(store), preemption.installed():
        try:
            if in_process:
                run_in_process(todo, plan, options, store, display, preemption)
            else:
                run_on_ray(todo, plan, options, store, display, data, preemption)
        except RunStopped as stop:
            report.stopped = stop
        except KeyboardInterrupt:
            report.interrupted = True
    report.ran = sum(display.counts.values())
    report.elsewhere = display.elsewhere
    if display.elsewhere:
        console.print(
            f"[yellow]note:[/] {display.elsewhere} cells were finished or being run by another runner "
            f"sharing {escape(str(options.results))}; run again later to pick up any it did not finish",
            highlight=False,
        )
    report.outcomes.update({cell_hash(c): store.status(c) for c in todo})
    print_summary(console, plan, store, report, time.perf_counter() - started)
    if report.stopped is not None:
        console.print(f"[yellow]{escape(report.stopped.line)}[/]", highlight=False, soft_wrap=True)
    return report


NOTES = "_notes.json"  # in the store: what a run left out (read by `pflbench report`)


def skipped_dataset_notes(skipped: dict[str, int], options: RunOptions) -> dict[str, dict]:
    """Why each optional dataset was left out, where it was looked for, and how to provide it."""
    looked = [f"data root {options.data_root}"] + (
        [f"mirror {options.mirror}"] if options.mirror else ["no mirror ($PFLBENCH_DATA_MIRROR unset, no --from)"]
    )
    return {
        dataset: {
            "cells": count,
            "reason": f"no copy found ({'; '.join(looked)}) and it could not be downloaded",
            "looked_in": [str(options.data_root)] + ([str(options.mirror)] if options.mirror else []),
            "how_to_provide": "Provide it with `--from DIR` / $PFLBENCH_DATA_MIRROR (an offline mirror folder) or "
            f"`pflbench data prepare {dataset}` (download into the data root, where a network is available).",
        }
        for dataset, count in skipped.items()
    }


def record_skipped_datasets(store: Store, plan: Plan, notes: dict[str, dict]) -> None:
    """Keep `<store>/_notes.json` current: this run's skipped datasets are added, the plan's datasets
    that were available this time are removed (the report shows what is still missing)."""
    from pflbench.storage.store import read_json_dict, write_json

    path = store.root / NOTES
    try:
        data = read_json_dict(path)
    except (OSError, ValueError):
        data = {}
    skipped: dict = cast(dict, data.get("skipped_datasets")) if isinstance(data.get("skipped_datasets"), dict) else {}
    for dataset in {cell.dataset for cell in plan.cells} - set(notes):
        skipped.pop(dataset, None)
    skipped.update({dataset: {**note, "spec": plan.name} for dataset, note in notes.items()})
    if skipped or path.exists():
        write_json(path, {**data, "skipped_datasets": skipped})
