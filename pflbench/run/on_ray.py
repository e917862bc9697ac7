"""Running cells on Ray: a task per cell or cell group with its declared resources, the progress board workers post to (and read stops from), lost workers retried, OOM kills named."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pflbench.config import CellConfig, cell_hash
from pflbench.run.cell import noting, posting, execute_cell, execute_group, failed_result, progress_of
from pflbench.run.display import Display, label
from pflbench.run.memory import ENDED_BY_THE_SIGNAL, cause_of, worker_lost
from pflbench.run.node_data import DataFingerprint, NodeDataError, check_node_data
from pflbench.run.options import PrepareError, RunOptions, RunStopped
from pflbench.run.preemption import (
    PREEMPTED_EXIT,
    BoardStop,
    Preempted,
    Preemption,
    keeping_signals,
)
from pflbench.run.ray_cluster import ClusterError, connect_ray, on_driver_node, ray_capacity, task_resources, this_node
from pflbench.run.recording import record, take
from pflbench.run.spec import Plan, Resources
from pflbench.run.stops import DISK_FULL_EXIT, checkpoint_round, disk_full_line, next_run, stopped_cell
from pflbench.storage.store import HEARTBEAT, DiskFull, Store

if TYPE_CHECKING:
    from pflbench.run.cell import CheckpointFiles
    from pflbench.simulator.rounds import CellResult


class Heartbeat:
    """Refreshes this runner's claims every HEARTBEAT seconds while cells run (a daemon thread)."""

    def __init__(self, store: Store):
        import threading

        self.store, self.stop = store, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="pflbench-claims")

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            self.store.heartbeat()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.store.release_all()  # interrupted or crashed cells are free for the next runner at once


class ProgressBoard:
    """A Ray actor (no CPU) that running cells post their latest round to; the driver polls it."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}
        self.notes: list[tuple[str, str]] = []
        self.stop: str | None = None  # the signal the driver was stopped by (pflbench/run/preemption.py)

    def post(self, key: str, info: dict) -> None:
        self.latest[key] = info

    def note(self, key: str, text: str) -> None:
        self.notes.append((key, text))

    def latest_of(self, key: str) -> dict | None:
        return self.latest.get(key)

    def snapshot(self) -> tuple[dict[str, dict], list[tuple[str, str]]]:
        """The latest round of every cell, and the notes posted since the last snapshot."""
        notes, self.notes = self.notes, []
        return self.latest, notes

    def request_stop(self, signal_name: str) -> None:
        """The driver was asked to stop (pflbench/run/preemption.py): its cells stop at the end of their round."""
        self.stop = signal_name

    def stop_requested(self) -> str | None:
        return self.stop


def start_board() -> Any:  # a Ray actor handle of a ProgressBoard
    """A ProgressBoard as a Ray actor on the driver's node (no CPU): a lost node must not take it along."""
    import ray

    return ray.remote(num_cpus=0)(ProgressBoard).options(scheduling_strategy=on_driver_node()).remote()


def _ray_task(
    cell: CellConfig,
    resources: Resources,
    options: RunOptions,
    board: Any,
    checkpoint_files: CheckpointFiles | None,
    data: DataFingerprint | None,
) -> CellResult | Preempted:
    """One attempt of a cell on a Ray worker: its progress to `board`, its checkpoints through
    `checkpoint_files` (the driver's store), its data checked first where this is not the driver's node."""
    from pflbench.run.oom_kills import OomKills

    key = cell_hash(cell)
    board.post.remote(key, {"round": 0, "oom_kills": OomKills.here()})  # the count a death in round 1 is judged by
    missing = node_data_problem(cell, data)
    if missing is not None:
        return missing
    try:
        return execute_cell(
            cell,
            resources,
            options,
            report=lambda info: board.post.remote(key, progress_of(info)),
            note=lambda text: board.note.remote(key, text),
            checkpoint_files=checkpoint_files,
            preemption=BoardStop(board),
        )
    except Preempted as stop:  # handed back as a value: the driver records no result
        return stop


def node_data_problem(cell: CellConfig, data: DataFingerprint | None) -> CellResult | None:
    """On a Ray worker on another node than the driver's: the failed result of a cell whose data this
    node lacks (one message naming the node and the path), else None."""
    import ray

    if data is None or data.driver_node == ray.get_runtime_context().get_node_id():
        return None
    try:
        check_node_data(cell, data, this_node())
    except NodeDataError as error:
        return failed_result(str(error))
    except Exception:
        return failed_result(traceback.format_exc())
    return None


def _ray_group_task(
    cells: list[CellConfig],
    resources: Resources,
    options: RunOptions,
    board: Any,
    checkpoint_files: list[CheckpointFiles | None],
    data: list[DataFingerprint | None],
    relay: Any = None,
    attempts: list[int] | None = None,
) -> list:
    """One attempt of a cell group on a Ray worker (`_ray_task` for each of its cells, in one process as
    `execute_group` runs them): per cell, in order, its result, or the `Preempted` / `DiskFull` that
    stopped it (handed back as values: the driver records no result for it). A cell whose data this
    node lacks fails alone; the others run as the group. With `relay` (pflbench/run/result_relay.py) each
    cell's result goes to the driver as the cell finishes, under its attempt `attempts[i]`, and its
    place in the returned list says `RELAYED`."""
    import ray

    from pflbench.run.oom_kills import OomKills
    from pflbench.run.result_relay import RELAYED

    keys = [cell_hash(cell) for cell in cells]
    kills = OomKills.here()
    for key in keys:
        board.post.remote(key, {"round": 0, "oom_kills": kills})  # the count a death in round 1 is judged by
    outcomes: list = [node_data_problem(cell, fingerprint) for cell, fingerprint in zip(cells, data)]
    relayed: set[int] = set()

    def hand_on(i: int, result: CellResult) -> None:
        """Cell i's result to the driver now (cell i of `cells`); kept for the return value where refused."""
        if relay is not None and attempts is not None:
            try:
                accepted = ray.get(relay.put.remote(keys[i], attempts[i], result))
            except ray.exceptions.RayError:  # the relay is gone (the driver too): the return value carries it
                accepted = False
            if accepted:
                relayed.add(i)

    for i, outcome in enumerate(outcomes):
        if outcome is not None:
            hand_on(i, outcome)
    runnable = [i for i, outcome in enumerate(outcomes) if outcome is None]
    if runnable:
        try:
            run = execute_group(
                [cells[i] for i in runnable],
                resources,
                options,
                [posting(board, keys[i]) for i in runnable],
                [noting(board, keys[i]) for i in runnable],
                preemption=BoardStop(board),
                checkpoint_files=[checkpoint_files[i] for i in runnable],
                on_finished=lambda j, result: hand_on(runnable[j], result),
            )
        except (Preempted, DiskFull) as stop:  # the whole group's: every cell not finished stops without a result
            for i in runnable:
                outcomes[i] = stop
        else:
            for i, result, stopped_by in zip(runnable, run.results, run.stopped):
                outcomes[i] = stopped_by if stopped_by is not None else result
    return [RELAYED if i in relayed else outcome for i, outcome in enumerate(outcomes)]


def run_on_ray(
    cells: list[CellConfig],
    plan: Plan,
    options: RunOptions,
    store: Store,
    display: Display,
    data: dict[str, DataFingerprint] | None = None,
    preemption: Preemption | None = None,
) -> None:
    """Run `cells` as Ray tasks (`data`: each cell's DataFingerprint by hash, checked on other nodes), one
    task per cell, or per cell group where the execution options form groups (pflbench.simulator.groups: one task
    with `group_resources`; each of its cells is recorded as it finishes, its result relayed to the driver
    while the others run (pflbench/run/result_relay.py); a lost group is retried as a group of the cells it
    had not finished, each from its own checkpoint; `workers` then counts groups).
    A stop asked for through `preemption` reaches the running cells through the board: they stop at the
    end of their round with a checkpoint, or are cancelled `grace_seconds` after the signal; no other
    cell starts, and `RunStopped` says where each stopped cell resumes (module doc). The scheduling
    itself: `RayRun`."""
    import ray

    try:
        with keeping_signals():  # a SIGTERM while Ray starts reaches `preemption`
            owned = connect_ray(options.ray_address, options.workers, plan.resources.cpus)
    except ClusterError as error:
        raise PrepareError(str(error)) from None
    if preemption is not None:
        preemption.take_signals()  # ray.init replaced SIGTERM's handler with one that exits
    running: dict = {}  # each running unit's task (its ObjectRef) -> the unit's cells
    try:
        if plan.resources.gpus > 0 and not ray.cluster_resources().get("GPU", 0):
            raise PrepareError(
                f"the spec asks for {plan.resources.gpus:g} GPU per cell but the Ray cluster has "
                f"none; run with --set resources.gpus=0"
            )
        RayRun(cells, plan, options, store, display, data or {}, preemption, running).loop()
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        if owned:
            ray.shutdown()


class RayRun:
    """One `run_on_ray`'s scheduling: the units of work (a cell alone, or a cell group run as one task),
    the driver-side actors (progress board, checkpoint keeper, result relay), and one method per event of
    `loop`: a unit started, a grouped cell's result relayed, a unit's task ended or lost, a stop asked for,
    a full disk."""

    def __init__(
        self,
        cells: list[CellConfig],
        plan: Plan,
        options: RunOptions,
        store: Store,
        display: Display,
        data: dict[str, DataFingerprint],
        preemption: Preemption | None,
        running: dict,
    ) -> None:
        import ray

        from pflbench.run.checkpoint_relay import start_keeper
        from pflbench.run.result_relay import start_relay
        from pflbench.simulator.groups import form_groups, group_resources

        self.plan, self.options, self.store, self.display, self.preemption = plan, options, store, display, preemption
        self.running = running
        self.worker_options = replace(options, results=Path(options.results).absolute())  # checkpoints, from any cwd
        # On the driver's node, as the store: a lost node must take neither with it.
        self.board = start_board()
        self.keeper = start_keeper(self.worker_options.results)
        driver_node = ray.get_runtime_context().get_node_id()
        self.data = {key: replace(value, driver_node=driver_node) for key, value in data.items()}
        # A lost worker's cell is retried here, not by Ray, so that each retry is said and bounded.
        self.task = ray.remote(_ray_task).options(**task_resources(plan.resources))
        # Units of work: a cell alone, or a cell group (pflbench.simulator.groups) where the execution options form
        # them; a group is one task with the resources the group needs (`group_resources`).
        grouped = options.execution.grouped(options.execution.device or ("cuda" if plan.resources.gpus > 0 else "cpu"))
        self.waiting = form_groups(cells) if grouped else [[cell] for cell in cells]
        self.relay = start_relay() if grouped else None  # a group's cells' results, as each finishes
        self.recorded: set[str] = set()  # the cells of running groups whose results came through the relay
        self.attempts: dict[str, int] = {}
        self.by_key = {cell_hash(cell): cell for cell in cells}
        # Claim cells only as they can start, so that runners sharing the store split the matrix.
        widest = group_resources(plan.resources, max(map(len, self.waiting), default=1)) if grouped else plan.resources
        self.limit = options.workers or ray_capacity(ray.cluster_resources(), widest) or len(self.waiting)
        self.stopping_since: float | None = None
        self.latest_peak: dict[str, int] = {}  # each cell's worker's peak memory, as its last round reported it
        self.stopped: list[str] = []  # the preempted cells, in words
        self.stopped_keys: set[str] = set()  # and their hashes
        self.in_hand: list[CellConfig] = []  # the unit whose ended task is being handled (out of `running`)

    def loop(self) -> None:
        """Start units as capacity allows, record each as it ends, until none waits or runs (or a stop
        asked for has ended them all). Where the signal reached every process of the job at once (a
        scheduler's `scancel`, a Kubernetes pod's termination), Ray's own processes end with the driver's
        stop under way: a Ray error then is the job ending, not a fault (`ended_with_the_job`)."""
        import ray

        try:
            self.schedule()
        except (ray.exceptions.RayError, ConnectionError):
            if not self.signalled():
                raise
            self.ended_with_the_job()
        if self.stopping_since is not None or self.stopped:
            assert self.preemption is not None  # stopping: it was requested
            raise RunStopped(
                f"preempted ({self.preemption.signal}) on Ray: "
                + ("; ".join(self.stopped) if self.stopped else "no cell was running")
                + "; run the same command again to continue",
                PREEMPTED_EXIT,
            )

    def signalled(self, wait: float = 2.0) -> bool:
        """Whether a stop was asked for, allowing the signal `wait` seconds to reach this process after Ray's
        own processes (signalled at the same moment) were seen ending."""
        if self.preemption is None:
            return False
        deadline = time.monotonic() + wait
        while not self.preemption.requested and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs here, as soon as the signal arrives
        return self.preemption.requested

    def ended_with_the_job(self) -> None:
        """The signal ended Ray's processes (the keeper's and the workers' included): every unfinished cell
        stops where its last checkpoint in the store is, without another call to Ray (its processes are
        gone or going; a call could wait for them)."""
        assert self.preemption is not None and self.preemption.signal is not None  # (signalled)
        # The dropped tasks' errors are these workers' ends, said below: not Ray's "unhandled error" lines too.
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        units = [*self.running.values(), self.in_hand]
        cells = {cell_hash(cell): cell for unit in units for cell in self.unfinished(unit)}
        for cell in cells.values():
            if cell_hash(cell) not in self.stopped_keys:
                self.store.release(cell)
                self.stopped_keys.add(cell_hash(cell))
                self.stopped.append(
                    f"cell {cell_hash(cell)} ({label(cell)}): {ENDED_BY_THE_SIGNAL}; "
                    f"{next_run(checkpoint_round(cell, self.store), cell.rounds)}"
                )
        self.running.clear()
        self.stopping_since = self.stopping_since or time.monotonic()

    def schedule(self) -> None:
        """`loop`'s work: start, wait, record, show progress."""
        import ray

        while self.waiting or self.running:
            if self.preemption is not None and self.preemption.requested and self.stopping_since is None:
                self.stopping_since = time.monotonic()
                self.waiting.clear()
                ray.get(self.board.request_stop.remote(self.preemption.signal))
            if self.stopping_since is not None and time.monotonic() - self.stopping_since > self.options.grace_seconds:
                self.cancel_after_grace()
                break
            while self.waiting and len(self.running) < self.limit:
                taken = [cell for cell in self.waiting.pop(0) if take(cell, self.store, self.options, self.display)]
                if taken:
                    self.start(taken)
            done, _ = ray.wait(list(self.running), num_returns=1, timeout=0.5)
            self.drain()  # before the ended tasks' values: a relayed result has come in by the time its task ends
            for ref in done:
                self.ended(ref)
            self.show_progress()

    def unfinished(self, unit: list[CellConfig]) -> list[CellConfig]:
        """The cells of a running unit whose results have not come through the relay."""
        return [cell for cell in unit if cell_hash(cell) not in self.recorded]

    def drain(self) -> None:
        """Record each grouped cell whose result the relay received since the last drain."""
        import ray

        if self.relay is None:
            return
        for key, result in ray.get(self.relay.drain.remote()):
            cell = self.by_key[key]
            self.recorded.add(key)
            try:
                ray.get(self.keeper.close.remote(key))  # no late write of its checkpoint after this
            except ray.exceptions.RayError:
                pass
            try:
                record(cell, result, self.store, self.options, self.display)
            except DiskFull as error:
                raise self.disk_full(error, cell, [cell]) from None

    def start(self, unit: list[CellConfig]) -> None:
        """Open each cell's next attempt with the keeper (only it may write the cell's checkpoint), then run
        the cell, or the group, as one task."""
        import ray

        from pflbench.run.checkpoint_relay import RelayedCheckpointFile
        from pflbench.simulator.groups import group_resources

        files: list[CheckpointFiles | None] = []
        for cell in unit:
            key = cell_hash(cell)
            attempt = self.attempts.get(key, 0)
            ray.get(self.keeper.open.remote(key, attempt))
            if self.relay is not None and len(unit) > 1:
                ray.get(self.relay.open.remote(key, attempt))
            self.board.post.remote(key, {"round": 0})  # nothing of an earlier attempt is taken for this one's
            files.append(RelayedCheckpointFile(self.keeper, key, attempt))
        ref: ray.ObjectRef  # of a cell's outcome, or of a group's outcomes (a list)
        if len(unit) == 1:
            ref = self.task.remote(
                unit[0],
                self.plan.resources,
                self.worker_options,
                self.board,
                files[0],
                self.data.get(cell_hash(unit[0])),
            )
        else:
            group_task = ray.remote(_ray_group_task).options(
                **task_resources(group_resources(self.plan.resources, len(unit)))
            )
            ref = group_task.remote(
                unit,
                self.plan.resources,
                self.worker_options,
                self.board,
                files,
                [self.data.get(cell_hash(cell)) for cell in unit],
                self.relay,
                [self.attempts.get(cell_hash(cell), 0) for cell in unit],
            )
        self.running[ref] = unit

    def ended(self, ref: Any) -> None:
        """A unit's task ended: record each of its cells not yet recorded, or, where its worker was lost,
        retry the unit or record it failed (`lost`)."""
        import ray

        unit = self.in_hand = self.running.pop(ref)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayError as error:  # the worker died, was killed, ran out of memory
            outcome = self.lost(unit, error)
            if outcome is None:
                return
            unit, value = outcome
        full = None
        for i, (cell, result) in enumerate(zip(unit, value if len(unit) > 1 else [value])):
            if cell_hash(cell) in self.recorded:  # recorded as it finished: its place says RELAYED
                continue
            if isinstance(result, Preempted):
                self.stop(cell, result)
                continue
            try:
                ray.get(self.keeper.close.remote(cell_hash(cell)))  # no late write of a lost attempt after this
            except ray.exceptions.RayError:  # the keeper is gone: nothing can write through it either
                pass
            if isinstance(result, DiskFull):  # a group's cell stopped by a full disk: no result
                self.store.release(cell)
                full = full or (result, cell)
                continue
            try:
                record(cell, result, self.store, self.options, self.display)
            except DiskFull as error:
                raise self.disk_full(error, cell, unit[i:]) from None
        if full is not None:
            raise self.disk_full(full[0], full[1], []) from None

    def lost(self, unit: list[CellConfig], error: Exception) -> tuple[list[CellConfig], Any] | None:
        """A unit whose worker was lost: None where nothing is left to record (each cell recorded through
        the relay, stopped by a stop asked for, or started again: a retry, from its checkpoint), else the
        cells still to record and their failed results (a list for a group, as a group task returns)."""
        import ray

        if self.relay is not None and len(unit) > 1:  # what the lost group finished is recorded, and only that
            for cell in unit:
                ray.get(self.relay.close.remote(cell_hash(cell)))
            self.drain()
        unit = self.unfinished(unit)
        if not unit:
            return None
        if isinstance(error, DiskFull):  # the keeper could not write its checkpoint: as in process
            raise self.disk_full(error, unit[0], unit) from None
        if self.stopping_since is not None or self.signalled(wait=0):  # ended by the same signal: no retry now
            for cell in unit:
                self.stop(cell, None)
            return None
        whys = []
        for cell in unit:  # a group's cells were lost together: each is retried, from its checkpoint
            key = cell_hash(cell)
            self.attempts[key] = self.attempts.get(key, 0) + 1
            last = ray.get(self.board.latest_of.remote(key)) or {}  # what this attempt posted last
            oom = last.get("oom_kills")
            killed = oom is not None and not isinstance(error, ray.exceptions.OutOfMemoryError) and oom.rose()
            whys.append(worker_lost(error, last.get("peak_mb", self.latest_peak.get(key)), oom_killed=killed))
        tried = max(self.attempts[cell_hash(cell)] for cell in unit)
        retries = self.options.retries
        if tried <= retries:
            for cell, why in zip(unit, whys):
                self.display.note(
                    cell,
                    f"{why}; retry {tried} of {retries}, from its checkpoint where it has one"
                    + (f" (its group of {len(unit)} cells again)" if len(unit) > 1 else ""),
                )
            self.start(unit)
            return None
        value = [
            failed_result(f"Ray: {type(error).__name__}: {error}\n{why} (after {retries} retries)\n") for why in whys
        ]
        return unit, (value if len(unit) > 1 else value[0])

    def stop(self, cell: CellConfig, why: Preempted | None) -> None:
        """A preempted cell (`why`; None: its worker was ended by the signal too): no result; its claim and
        its attempt (keeper, relay) closed."""
        import ray

        try:
            ray.get(self.keeper.close.remote(cell_hash(cell)))
            if self.relay is not None:
                ray.get(self.relay.close.remote(cell_hash(cell)))
        except ray.exceptions.RayError:
            pass
        self.store.release(cell)
        self.stopped_keys.add(cell_hash(cell))
        if why is None:
            self.stopped.append(
                f"cell {cell_hash(cell)} ({label(cell)}): {ENDED_BY_THE_SIGNAL}; "
                f"{next_run(checkpoint_round(cell, self.store), cell.rounds)}"
            )
            return
        if why.in_round:
            why.resumes_at = checkpoint_round(cell, self.store)
        self.stopped.append(stopped_cell(why, cell, self.options.grace_seconds))

    def cancel_after_grace(self) -> None:
        """`grace_seconds` after a stop was asked for: what came through the relay recorded, every running
        unit cancelled, its unfinished cells stopped (that round's work lost)."""
        import ray

        self.drain()
        assert self.preemption is not None  # stopping: it was requested, so it has a signal
        for ref, unit in list(self.running.items()):
            ray.cancel(ref, force=True)
            for cell in self.unfinished(unit):
                self.stop(cell, Preempted(cast(str, self.preemption.signal), in_round=True))
        self.running.clear()

    def disk_full(self, full: BaseException, cell: CellConfig, unit: list[CellConfig]) -> RunStopped:
        """A full disk: the unit's cells released, every other running task cancelled; the line names each
        cell stopped without a result (the unit's and the cancelled tasks' unfinished cells)."""
        import ray

        stopped = dict.fromkeys(cell_hash(other) for other in unit)
        for other in unit:
            self.store.release(other)
        for ref, running in list(self.running.items()):
            ray.cancel(ref, force=True)
            for other in self.unfinished(running):
                self.store.release(other)
                stopped[cell_hash(other)] = None
        others = tuple(self.by_key[key] for key in stopped if key != cell_hash(cell))
        # a DiskFull, here or through the Ray errors that wrapped it
        return RunStopped(disk_full_line(cast(DiskFull, cause_of(full)), cell, self.store, others), DISK_FULL_EXIT)

    def show_progress(self) -> None:
        """The board's latest round of each running cell on the display, and the notes cells posted."""
        import ray

        latest, notes = ray.get(self.board.snapshot.remote())
        self.latest_peak.update({key: info["peak_mb"] for key, info in latest.items() if "peak_mb" in info})
        for key, text in notes:  # a cell that finished since it posted still gets its note
            if key in self.by_key:
                self.display.note(self.by_key[key], text)
        for unit in self.running.values():
            for cell in self.unfinished(unit):
                if cell_hash(cell) in latest:
                    self.display.update(cell, latest[cell_hash(cell)])
