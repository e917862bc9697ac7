"""`pflbench run SPEC`: run every cell of a spec that has no result yet, in parallel on Ray (a local
instance by default, an existing cluster with --ray-address/RAY_ADDRESS) or in this process
(--no-ray, --workers 1), with a live progress display, and record each cell in the results store.

One cell never stops the others: an exception is recorded as "failed" with its traceback, a NaN as
"diverged", a lost Ray worker as "failed". Results are written by this process only (the driver),
so a cluster needs no shared results folder; the data root must be visible to every worker (each
loads the cell's dataset and partition from it). Ctrl-C cancels the running cells and exits; their
results are simply absent, and the next run starts them again.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pflbench.config import CellConfig, cell_hash
from pflbench.spec import Plan, Resources, describe_partition
from pflbench.store import COMPLETE, DAMAGED, HEARTBEAT, Store

PROBLEMS = ("failed", "diverged")


@dataclass(frozen=True)
class RunOptions:
    results: Path = Path("results")
    data_root: Path | None = None  # None: $PFLBENCH_DATA or ./data
    mirror: Path | None = None     # None: $PFLBENCH_DATA_MIRROR
    use_ray: bool = True
    workers: int | None = None     # cells at once; None: as many as Ray's resources allow
    ray_address: str | None = None
    force: bool = False            # rerun cells that already have a result
    device: str | None = None      # None: "cuda" for cells given GPUs, else "cpu"
    client_batching: str = "auto"  # local training batched across clients: auto | on | off
    compiled_training: str = "auto"  # torch.compile of the local step: auto | on | off
    channels_last: str = "auto"    # channels-last convolutions: auto | on | off
    client_threads: str = "auto"   # the loop path's clients side by side on the cell's threads: auto | off


@dataclass
class RunReport:
    outcomes: dict[str, str | None]  # every planned cell's hash -> its status after the run
    ran: int = 0
    elsewhere: int = 0  # cells another runner sharing the store had finished or was running
    skipped_datasets: dict[str, int] = field(default_factory=dict)  # optional dataset -> cells left out
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if any(status in PROBLEMS for status in self.outcomes.values()) else 0


class PrepareError(RuntimeError):
    """A cell's dataset or partition cannot be made; nothing has run."""


def label(cell: CellConfig) -> str:
    return (f"{cell.algorithm} · {cell.dataset} · {cell.partition} · {cell.clients} clients · seed {cell.seed} "
            f"· {cell_hash(cell)}")


# ---- one cell, wherever it runs -----------------------------------------------------------------

def failed_result(error: str):
    import pandas as pd

    from pflbench.federation import CellResult

    return CellResult("failed", pd.DataFrame(), pd.DataFrame(), {"status": "failed"}, {}, error)


def execute_cell(cell: CellConfig, resources: Resources, options: RunOptions,
                 report: Callable[[dict], None] | None = None):
    """Run one cell here (the driver or a Ray worker) with torch limited to the cell's CPU share.
    Returns a CellResult; an exception becomes a "failed" result carrying its traceback."""
    import torch

    from pflbench.cost import measured
    from pflbench.federation import run_cell

    # Threads beyond the cell's share oversubscribe the cores that the other cells use; on a busy
    # 2-core machine that made a small cell 10-100x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(resources.cpus)))
    try:
        device = options.device or ("cuda" if resources.gpus > 0 else "cpu")
        return measured(device, lambda: run_cell(  # peak memory and machine (pflbench/cost.py)
            cell, data_root=options.data_root, mirror=options.mirror, device=device,
            client_batching=options.client_batching, on_round=report, compiled_training=options.compiled_training,
            channels_last=options.channels_last, client_threads=options.client_threads))
    except Exception:
        return failed_result(traceback.format_exc())
    finally:
        torch.set_num_threads(threads)


# ---- progress -----------------------------------------------------------------------------------

def format_duration(seconds: float) -> str:
    """45s, 2m10s, 1h05m."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Display:
    """A rich progress view: all cells, and one line per running cell with its round and accuracy;
    a line per completed cell is printed above it (and is all a non-terminal log gets), ending with
    `[n/total, ETA ...]`: the cells finished so far and the time left at the pace so far (wall time
    since the start per finished cell, times the cells left; with cells in parallel the pace already
    counts them)."""

    def __init__(self, console: Console, total: int, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.total = total
        self.clock = clock
        self.started = clock()
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 console=console, disable=not console.is_terminal)
        self.overall = self.progress.add_task("cells", total=total, info="")
        self.running: dict[str, int] = {}
        self.counts: Counter = Counter()
        self.elsewhere = 0  # cells skipped because another runner sharing the store has them

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def update(self, cell: CellConfig, info: dict) -> None:
        """`info` is what the engine's on_round reports: round, rounds, mean_accuracy."""
        try:
            self._update(cell, info)
        except Exception as err:  # the display is not worth a cell: report and go on
            self._display_failed(err)

    def done(self, cell: CellConfig, result) -> None:
        try:
            self._done(cell, result)
        except Exception as err:
            self._display_failed(err)

    def _display_failed(self, err: Exception) -> None:
        try:
            print(f"note: progress display error ({type(err).__name__}); the run goes on", file=sys.stderr)
        except Exception:
            pass

    def _update(self, cell: CellConfig, info: dict) -> None:
        key = cell_hash(cell)
        if key not in self.running:
            self.running[key] = self.progress.add_task(escape(label(cell)), total=cell.rounds, info="")
        accuracy = info.get("mean_accuracy")
        self.progress.update(self.running[key], completed=info.get("round", 0),
                             info="" if accuracy is None else f"acc {accuracy:.1%}")
        self._update_overall()

    def _done(self, cell: CellConfig, result) -> None:
        self.counts[result.status] += 1  # first: the run's outcome counts never depend on the display
        task = self.running.pop(cell_hash(cell), None)
        if task is not None:
            self.progress.remove_task(task)
        self.progress.advance(self.overall)
        self._update_overall()
        accuracy = result.summary.get("final_accuracy")
        adapted = result.summary.get("final_accuracy_adapted")
        detail = f"acc {accuracy:.1%}" if accuracy is not None else ""
        if adapted is not None:
            detail += f" (adapted {adapted:.1%})"
        if result.error:
            detail += f"  {result.error.strip().splitlines()[-1]}"
        wall = result.summary.get("wall_time")
        style = {"finished": "green", "diverged": "yellow"}.get(result.status, "red")
        self.console.print(f"[{style}]{result.status:<8}[/] {escape(label(cell))}  {escape(detail)}"
                           + (f"  ({wall:.1f} s)" if wall is not None else "") + f"  {escape(self.position())}",
                           highlight=False)

    def position(self) -> str:
        """`[n/total, ETA 2m10s]` after a cell finished (`[n/total, done]` after the last)."""
        finished = sum(self.counts.values())
        left = max(0, self.total - finished - self.elsewhere)
        if not left:
            return f"[{finished}/{self.total}, done]"
        per_cell = (self.clock() - self.started) / max(finished, 1)
        return f"[{finished}/{self.total}, ETA {format_duration(per_cell * left)}]"

    def _update_overall(self) -> None:
        info = f"{len(self.running)} running · {self.counts['failed']} failed · {self.counts['diverged']} diverged"
        self.progress.update(self.overall, info=info)


# ---- executors ----------------------------------------------------------------------------------

def run_in_process(cells: list[CellConfig], plan: Plan, options: RunOptions, store: Store, display: Display) -> None:
    import torch

    if plan.resources.gpus > 0 and not torch.cuda.is_available():
        raise PrepareError(f"the spec asks for {plan.resources.gpus:g} GPU per cell but this machine has none; "
                           f"run with --set resources.gpus=0")
    for cell in cells:
        if not take(cell, store, options, display):
            continue
        display.update(cell, {"round": 0})
        result = execute_cell(cell, plan.resources, options,
                              report=lambda info, cell=cell: display.update(cell, info))
        store.write(cell, result)
        store.release(cell)
        display.done(cell, result)


def take(cell: CellConfig, store: Store, options: RunOptions, display: Display) -> bool:
    """Whether this runner runs `cell` now: not if another runner sharing the store finished it
    meanwhile or holds its claim (the claim is ours when this returns True)."""
    if not options.force and store.status(cell) in COMPLETE:
        display.elsewhere += 1
        return False
    if not store.claim(cell):
        display.elsewhere += 1
        return False
    if not options.force and store.status(cell) in COMPLETE:  # finished between the check and the claim
        store.release(cell)
        display.elsewhere += 1
        return False
    return True


class Heartbeat:
    """Refreshes this runner's claims every HEARTBEAT seconds while cells run (a daemon thread)."""

    def __init__(self, store: Store):
        import threading

        self.store, self.stop = store, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="pflbench-claims")

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            self.store.heartbeat()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.store.release_all()  # interrupted or crashed cells are free for the next runner at once


class ProgressBoard:
    """A Ray actor (no CPU) that running cells post their latest round to; the driver polls it."""

    def __init__(self):
        self.latest: dict[str, dict] = {}

    def post(self, key: str, info: dict) -> None:
        self.latest[key] = info

    def snapshot(self) -> dict[str, dict]:
        return self.latest


def _ray_task(cell: CellConfig, resources: Resources, options: RunOptions, board):
    key = cell_hash(cell)
    board.post.remote(key, {"round": 0})
    return execute_cell(cell, resources, options, report=lambda info: board.post.remote(key, info))


RAY_CONNECT_TIMEOUT = 5.0  # seconds to reach a cluster's address before giving up


def join_cluster(address: str, settings: dict) -> None:
    """Connect to the Ray cluster at `address`, failing within seconds with a clear message where
    Ray itself would wait for minutes (nothing listening) or raise an authentication error.

    Token authentication: a cluster started by `ray start --head` on a machine that has a Ray token
    (`~/.ray/auth_token`, $RAY_AUTH_TOKEN or $RAY_AUTH_TOKEN_PATH) requires it, and Ray's client only
    sends it when RAY_AUTH_MODE=token. When RAY_AUTH_MODE is not set and such a token exists, it is
    set here for this process and its workers, so the documented command works as written."""
    import socket

    import ray

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if address not in ("auto", "local") and host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT).close()
        except OSError as err:
            raise PrepareError(f"cannot reach a Ray cluster at {address} ({err.strerror or err}); start one with "
                               f"`ray start --head --port={port}` or check --ray-address / $RAY_ADDRESS") from None
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray read its configuration at import: make it see the mode (what Ray's own CLI does)
            from ray._raylet import Config

            Config.initialize("")
        except Exception:  # a Ray without this hook: the environment variable is all we can do
            pass
    try:
        ray.init(address=address, **settings)
    except Exception as err:  # Ray raises ConnectionError, AuthenticationError, RuntimeError, ...
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        hint = (" The cluster asks for token authentication: give this runner the cluster's token "
                "($RAY_AUTH_TOKEN or ~/.ray/auth_token) and RAY_AUTH_MODE=token."
                if "auth" in type(err).__name__.lower() or "RAY_AUTH" in str(err) else "")
        raise PrepareError(f"cannot join the Ray cluster at {address}: {detail}.{hint}") from None


def connect_ray(options: RunOptions, resources: Resources) -> bool:
    """Connect to Ray; True when this run started (and so must stop) the instance. An instance
    already initialized in this process (e.g. by a test) is used as it is."""
    import logging

    import ray

    if ray.is_initialized():
        return False
    settings = dict(log_to_driver=False, logging_level=logging.WARNING)  # cell output lives in the store
    address = options.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        join_cluster(address, settings)
    else:
        cpus = None if options.workers is None else max(1, int(options.workers * resources.cpus + 0.999))
        ray.init(num_cpus=cpus, include_dashboard=False, **settings)
    return True


def ray_capacity(cluster: dict, resources: Resources) -> int:
    """How many cells of `resources` the cluster can run at once (0 if it says nothing)."""
    fits = [int(cluster.get("CPU", 0) // resources.cpus)]
    if resources.gpus > 0:
        fits.append(int(cluster.get("GPU", 0) // resources.gpus))
    return max(0, min(fits))


def run_on_ray(cells: list[CellConfig], plan: Plan, options: RunOptions, store: Store, display: Display) -> None:
    import ray

    owned = connect_ray(options, plan.resources)
    running: dict = {}
    try:
        if plan.resources.gpus > 0 and not ray.cluster_resources().get("GPU", 0):
            raise PrepareError(f"the spec asks for {plan.resources.gpus:g} GPU per cell but the Ray cluster has "
                               f"none; run with --set resources.gpus=0")
        board = ray.remote(num_cpus=0)(ProgressBoard).remote()
        task = ray.remote(_ray_task).options(num_cpus=plan.resources.cpus, num_gpus=plan.resources.gpus,
                                             max_retries=0)  # a lost worker is a failed cell, not a silent rerun
        waiting = list(cells)
        # Claim cells only as they can start, so that runners sharing the store split the matrix.
        limit = options.workers or ray_capacity(ray.cluster_resources(), plan.resources) or len(cells)
        while waiting or running:
            while waiting and len(running) < limit:
                cell = waiting.pop(0)
                if take(cell, store, options, display):
                    running[task.remote(cell, plan.resources, options, board)] = cell
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in done:
                cell = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as error:  # the worker died, was killed, ran out of memory
                    result = failed_result(f"Ray: {type(error).__name__}: {error}")
                store.write(cell, result)
                store.release(cell)
                display.done(cell, result)
            latest = ray.get(board.snapshot.remote())
            for cell in running.values():
                if cell_hash(cell) in latest:
                    display.update(cell, latest[cell_hash(cell)])
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        if owned:
            ray.shutdown()


# ---- preparation ----------------------------------------------------------------------------------

def prepare_partitions(cells: list[CellConfig], plan: Plan, options: RunOptions,
                       console: Console) -> tuple[list[CellConfig], dict[str, int]]:
    """Build every distinct partition once, before any training: workers then find it in the cache,
    and an impossible partition stops the run before it starts. Cells of an optional dataset that
    cannot be loaded here are left out; returns the cells to run and {dataset: cells left out}."""
    from pflbench.data import DatasetNotFoundError
    from pflbench.federation import prepare_cell

    groups: dict[tuple, CellConfig] = {}
    for cell in cells:
        key = (cell.dataset, json.dumps(cell.dataset_options, sort_keys=True), cell.partition,
               json.dumps(cell.partition_params, sort_keys=True), cell.clients, cell.seed,
               cell.train_fraction, cell.val_fraction)
        groups.setdefault(key, cell)
    missing: set[str] = set()
    with console.status("") as status:
        for i, cell in enumerate(groups.values(), 1):
            if cell.dataset in missing:
                continue
            status.update(f"preparing partitions {i}/{len(groups)}: {cell.dataset} {describe_partition(cell)} "
                          f"{cell.clients} clients seed {cell.seed}")
            try:
                prepare_cell(cell, options.data_root, options.mirror)
            except DatasetNotFoundError as error:
                if cell.dataset not in plan.optional_datasets:
                    raise PrepareError(str(error)) from None
                missing.add(cell.dataset)
            except ValueError as error:  # PartitionError, a bad dataset option
                raise PrepareError(f"{label(cell)}: {error}") from None
    skipped = Counter(cell.dataset for cell in cells if cell.dataset in missing)
    return [cell for cell in cells if cell.dataset not in missing], dict(skipped)


# ---- the run ------------------------------------------------------------------------------------

def run_plan(plan: Plan, options: RunOptions = RunOptions(), console: Console | None = None) -> RunReport:
    """Run the plan's cells that have no result yet (all of them with `force`); see the module doc."""
    from pflbench.data import data_mirror, data_root

    console = console or make_console()
    # Absolute paths, resolved here once: Ray workers may start elsewhere and without our environment.
    options = replace(options, data_root=data_root(options.data_root), mirror=data_mirror(options.mirror))
    store = Store(options.results)
    before = {cell_hash(cell): store.status(cell) for cell in plan.cells}
    for cell in plan.cells:
        if before[cell_hash(cell)] == DAMAGED:
            problems = "; ".join(f"{p.file}: {p.what}" for p in store.check(store.cell_dir(cell)))
            kept = store.set_aside(cell)
            before[cell_hash(cell)] = None
            console.print(f"[yellow]note:[/] cell {cell_hash(cell)} ({escape(label(cell))}) was damaged ({escape(problems)}); "
                          f"its files are kept in {escape(str(kept))} and it runs again", highlight=False)
    todo = [cell for cell in plan.cells if options.force or before[cell_hash(cell)] not in COMPLETE]
    report = RunReport(outcomes=dict(before))
    scale = f" (scale {plan.scale})" if len(plan.scales) > 1 else ""
    console.print(f"{escape(plan.name)}{scale}: {len(plan.cells)} cells, {len(plan.cells) - len(todo)} with results in "
                  f"{escape(str(options.results))}, {len(todo)} to run", highlight=False)
    if not todo:
        print_summary(console, plan, store, report, 0.0)
        return report
    todo, report.skipped_datasets = prepare_partitions(todo, plan, options, console)
    notes = skipped_dataset_notes(report.skipped_datasets, options)
    record_skipped_datasets(store, plan, notes)
    for dataset, note in notes.items():
        console.print(f"[yellow]note:[/] dataset {escape(repr(dataset))} cannot be loaded here: {escape(note['reason'])}; "
                      f"its {note['cells']} cells are left out and the run goes on without it. "
                      f"{escape(note['how_to_provide'])}", highlight=False)
        report.outcomes = {k: v for k, v in report.outcomes.items()
                           if k not in {cell_hash(c) for c in plan.cells if c.dataset == dataset}}
    in_process = not options.use_ray or options.workers == 1
    where = "in this process" if in_process else (
        f"on Ray ({options.ray_address or os.environ.get('RAY_ADDRESS') or 'local instance'}"
        + (f", {options.workers} workers" if options.workers else "") + ")")
    console.print(f"running {len(todo)} cells {where}, {plan.resources.cpus:g} CPU"
                  + (f" and {plan.resources.gpus:g} GPU" if plan.resources.gpus else "") + " each", highlight=False)
    started = time.perf_counter()
    with Display(console, len(todo)) as display, Heartbeat(store):
        try:
            (run_in_process if in_process else run_on_ray)(todo, plan, options, store, display)
        except KeyboardInterrupt:
            report.interrupted = True
    report.ran = sum(display.counts.values())
    report.elsewhere = display.elsewhere
    if display.elsewhere:
        console.print(f"[yellow]note:[/] {display.elsewhere} cells were finished or being run by another runner "
                      f"sharing {escape(str(options.results))}; run again later to pick up any it did not finish",
                      highlight=False)
    report.outcomes.update({cell_hash(c): store.status(c) for c in todo})
    print_summary(console, plan, store, report, time.perf_counter() - started)
    return report


NOTES = "_notes.json"  # in the store: what a run left out (read by `pflbench report`)


def skipped_dataset_notes(skipped: dict[str, int], options: RunOptions) -> dict[str, dict]:
    """Why each optional dataset was left out, where it was looked for, and how to provide it."""
    looked = [f"data root {options.data_root}"] + ([f"mirror {options.mirror}"] if options.mirror else
                                                    ["no mirror ($PFLBENCH_DATA_MIRROR unset, no --from)"])
    return {dataset: {
        "cells": count,
        "reason": f"no copy found ({'; '.join(looked)}) and it could not be downloaded",
        "looked_in": [str(options.data_root)] + ([str(options.mirror)] if options.mirror else []),
        "how_to_provide": "Provide it with `--from DIR` / $PFLBENCH_DATA_MIRROR (an offline mirror folder) or "
                          f"`pflbench data prepare {dataset}` (download into the data root, where a network is available).",
    } for dataset, count in skipped.items()}


def record_skipped_datasets(store: Store, plan: Plan, notes: dict[str, dict]) -> None:
    """Keep `<store>/_notes.json` current: this run's skipped datasets are added, the plan's datasets
    that were available this time are removed (the report shows what is still missing)."""
    from pflbench.store import read_json_dict, write_json

    path = store.root / NOTES
    try:
        data = read_json_dict(path)
    except (OSError, ValueError):
        data = {}
    skipped = data.get("skipped_datasets") if isinstance(data.get("skipped_datasets"), dict) else {}
    for dataset in {cell.dataset for cell in plan.cells} - set(notes):
        skipped.pop(dataset, None)
    skipped.update({dataset: {**note, "spec": plan.name} for dataset, note in notes.items()})
    if skipped or path.exists():
        write_json(path, {**data, "skipped_datasets": skipped})


def print_summary(console: Console, plan: Plan, store: Store, report: RunReport, seconds: float) -> None:
    counts = Counter(status or "no result" for status in report.outcomes.values())
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    console.print(f"{escape(plan.name)}: {parts} ({report.ran} run now, in {seconds:.0f} s)", highlight=False)
    for dataset, count in report.skipped_datasets.items():
        console.print(f"[yellow]note:[/] {count} cells on {escape(repr(dataset))} were left out: it cannot be loaded here.")
    problems = [cell for cell in plan.cells if report.outcomes.get(cell_hash(cell)) in PROBLEMS]
    if problems:
        table = Table("cell", "algorithm", "dataset", "partition", "clients", "seed", "status", "error",
                      title=escape(f"cells without a finished result (tracebacks: {store.root}/<cell>/error.txt)"))
        for cell in problems:
            table.add_row(*map(escape, (cell_hash(cell), cell.algorithm, cell.dataset, cell.partition, str(cell.clients),
                                        str(cell.seed), str(report.outcomes[cell_hash(cell)]),
                                        str(store.summary(cell).get("error", "")))))
        console.print(table)
    if report.interrupted:
        console.print("[yellow]interrupted:[/] cells that were running have no result; run again to resume.")


# ---- dry run --------------------------------------------------------------------------------------

# A name field and the dict field that belongs to it: shown together as `name(entry=value, ...)`.
NAMED_SETTINGS = {"algorithm": "hp", "dataset": "dataset_options", "partition": "partition_params"}


def _named(cells: list[CellConfig], name_field: str) -> tuple[list[str], list[str]]:
    """Per cell, its name with the entries that vary among cells of that name; and, per name, the
    entries that do not."""
    settings = NAMED_SETTINGS[name_field]
    by_name: dict[str, list[dict]] = {}
    for cell in cells:
        by_name.setdefault(getattr(cell, name_field), []).append(getattr(cell, settings))
    varying = {name: [k for k in dicts[0] if len({json.dumps(d.get(k)) for d in dicts}) > 1]
               for name, dicts in by_name.items()}

    def text(name: str, entries: dict, keys) -> str:
        return f"{name}({', '.join(f'{k}={json.dumps(entries[k])}' for k in keys)})" if keys else name

    per_cell = [text(getattr(c, name_field), getattr(c, settings), varying[getattr(c, name_field)]) for c in cells]
    fixed = [text(name, dicts[0], [k for k in dicts[0] if k not in varying[name]])
             for name, dicts in by_name.items() if dicts[0] or len(by_name) == 1]
    return per_cell, fixed


def print_plan(console: Console, plan: Plan, store: Store, as_json: bool = False) -> None:
    """The expanded cells and their recorded status: a table of what varies between cells, lines
    with what does not; or the fully resolved cells as JSON."""
    statuses = [store.status(cell) or "to run" for cell in plan.cells]
    if as_json:
        print(json.dumps([{"hash": cell_hash(cell), "status": status, "config": cell.model_dump(mode="json")}
                          for cell, status in zip(plan.cells, statuses)], indent=2))
        return
    columns, fixed, per_name = {}, [], {}
    for field in CellConfig.model_fields:
        if field in NAMED_SETTINGS:
            values, constant = _named(plan.cells, field)
            if len({getattr(cell, field) for cell in plan.cells}) == 1:
                fixed += constant  # one name for every cell: its settings are every cell's
            elif constant:  # settings of one name hold for that name's cells only
                per_name[field] = constant
        elif field in NAMED_SETTINGS.values():
            continue
        else:
            values = [json.dumps(getattr(cell, field)).strip('"') for cell in plan.cells]
        if len(set(values)) > 1:
            columns[field] = values
        elif field not in NAMED_SETTINGS:
            fixed.append(f"{field}={values[0]}")
    scale = f", scale {plan.scale}" if len(plan.scales) > 1 else ""
    table = Table("#", "cell", *map(escape, columns), "status",
                  title=escape(f"{plan.name}: {len(plan.cells)} cells ({plan.source}{scale})"))
    for i, (cell, status) in enumerate(zip(plan.cells, statuses)):
        table.add_row(str(i + 1), cell_hash(cell), *(escape(values[i]) for values in columns.values()), escape(status))
    console.print(table)
    console.print(escape(f"every cell: {', '.join(fixed)}"), highlight=False)
    for field, constant in per_name.items():
        console.print(escape(f"per {field} (each in its own cells only): {', '.join(constant)}"), highlight=False)
    counts = Counter(statuses)
    console.print(f"resources per cell: {plan.resources.cpus:g} CPU, {plan.resources.gpus:g} GPU; "
                  + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())), highlight=False)
    for algorithm, path in sorted(plan.tuned.items()):
        console.print(escape(f"{algorithm}: tuned configuration {path} (hp_source=tuned)"), highlight=False)
    for dataset in sorted(plan.optional_datasets):
        console.print(escape(f"{dataset}: optional (its cells are left out, with a note, where it cannot be loaded)"),
                      highlight=False)


# ---- command line -------------------------------------------------------------------------------

def make_console() -> Console:
    # Wide when not a terminal (logs, pipes), so tables are not squeezed to 80 columns.
    return Console(highlight=False, width=shutil.get_terminal_size((160, 24)).columns)
