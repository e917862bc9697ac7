"""What a person sees of a run: the live progress of its cells, the closing summary, the dry run's table
of cells. Only the console; the run itself is `pflbench.run.runner`."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Protocol, Self
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from pflbench.config import CellConfig, cell_hash
from pflbench.run.spec import Plan
from pflbench.storage.store import Store

if TYPE_CHECKING:
    from pflbench.api_types import CellResult

PROBLEMS = ("failed", "diverged")


def label(cell: CellConfig) -> str:
    return (
        f"{cell.algorithm} · {cell.dataset} · {cell.partition} · {cell.clients} clients · seed {cell.seed} "
        f"· {cell_hash(cell)}"
    )


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
    counts them). A log that is not a terminal also gets a progress line per cell as its evaluations finish
    (the round, the test and validation accuracy), at most one per `LOG_EVERY` seconds per cell, so that a
    long run's log shows where it is (a terminal shows it live instead)."""

    LOG_EVERY = 30.0

    def __init__(self, console: Console, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.total = total
        self.clock = clock
        self.started = clock()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.overall = self.progress.add_task("cells", total=total, info="")
        self.running: dict[str, TaskID] = {}
        self.counts: Counter = Counter()
        self.elsewhere = 0  # cells skipped because another runner sharing the store has them
        self.logged: dict[str, tuple[int, float]] = {}  # a log's last progress line per cell: (its round, when)

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, cell: CellConfig, info: dict) -> None:
        """`info` is what the engine's on_round reports: round, rounds, mean_accuracy."""
        try:
            self._update(cell, info)
        except Exception as err:  # the display is not worth a cell: report and go on
            self._display_failed(err)

    def done(self, cell: CellConfig, result: CellResult) -> None:
        try:
            self._done(cell, result)
        except Exception as err:
            self._display_failed(err)

    def note(self, cell: CellConfig, text: str) -> None:
        """A line about a running cell (resumed from its checkpoint, checkpoint set aside, retried)."""
        try:
            self.console.print(f"[yellow]note:[/] {escape(label(cell))}: {escape(text)}", highlight=False)
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
        self.progress.update(
            self.running[key], completed=info.get("round", 0), info="" if accuracy is None else f"acc {accuracy:.1%}"
        )
        self._update_overall()
        if not self.console.is_terminal:
            self._log_evaluation(cell, key, info)

    def _log_evaluation(self, cell: CellConfig, key: str, info: dict) -> None:
        """A log's progress line (class doc) where a newer evaluation than the last line's came in."""
        rnd = int(info.get("round") or 0)
        accuracy, val = info.get("mean_accuracy"), info.get("mean_val_accuracy")
        evaluated = rnd if rnd >= cell.rounds else rnd - rnd % max(1, cell.eval_every)  # the latest evaluation's round
        if evaluated < 1 or (accuracy is None and val is None):
            return
        last_round, last_at = self.logged.get(key, (0, float("-inf")))
        now = self.clock()
        if evaluated <= last_round or now - last_at < self.LOG_EVERY:
            return
        self.logged[key] = (evaluated, now)
        scores = ", ".join(
            f"{name} {value:.1%}" for name, value in (("acc", accuracy), ("val", val)) if value is not None
        )
        self.console.print(
            f"progress {escape(label(cell))}: round {evaluated} of {cell.rounds}, {scores}  "
            f"[{format_duration(now - self.started)}]",
            highlight=False,
        )

    def _done(self, cell: CellConfig, result: CellResult) -> None:
        self.counts[result.status] += 1  # first: the run's outcome counts never depend on the display
        task = self.running.pop(cell_hash(cell), None)
        self.logged.pop(cell_hash(cell), None)
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
        self.console.print(
            f"[{style}]{result.status:<8}[/] {escape(label(cell))}  {escape(detail)}"
            + (f"  ({wall:.1f} s)" if wall is not None else "")
            + f"  {escape(self.position())}",
            highlight=False,
        )

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


# ---- the end of a run ------------------------------------------------------------------------------


class RunOutcome(Protocol):
    """What the summary reads of a run's outcome (`pflbench.run.options.RunReport`; named by what it offers,
    since the runner imports this module)."""

    @property
    def outcomes(self) -> dict[str, str | None]: ...

    @property
    def ran(self) -> int: ...

    @property
    def skipped_datasets(self) -> dict[str, int]: ...

    @property
    def interrupted(self) -> bool: ...


def print_summary(console: Console, plan: Plan, store: Store, report: RunOutcome, seconds: float) -> None:
    """The run's outcome (`report`: a runner.RunReport): counts, left-out datasets, cells with problems."""
    counts = Counter(status or "no result" for status in report.outcomes.values())
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    console.print(f"{escape(plan.name)}: {parts} ({report.ran} run now, in {seconds:.0f} s)", highlight=False)
    for dataset, count in report.skipped_datasets.items():
        console.print(
            f"[yellow]note:[/] {count} cells on {escape(repr(dataset))} were left out: it cannot be loaded here."
        )
    problems = [cell for cell in plan.cells if report.outcomes.get(cell_hash(cell)) in PROBLEMS]
    if problems:
        table = Table(
            "cell",
            "algorithm",
            "dataset",
            "partition",
            "clients",
            "seed",
            "status",
            "error",
            title=escape(f"cells without a finished result (tracebacks: {store.root}/<cell>/error.txt)"),
        )
        for cell in problems:
            table.add_row(
                *map(
                    escape,
                    (
                        cell_hash(cell),
                        cell.algorithm,
                        cell.dataset,
                        cell.partition,
                        str(cell.clients),
                        str(cell.seed),
                        str(report.outcomes[cell_hash(cell)]),
                        str(store.summary(cell).get("error", "")),
                    ),
                )
            )
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
    varying = {
        name: [k for k in dicts[0] if len({json.dumps(d.get(k)) for d in dicts}) > 1] for name, dicts in by_name.items()
    }

    def text(name: str, entries: dict, keys: list[str]) -> str:
        return f"{name}({', '.join(f'{k}={json.dumps(entries[k])}' for k in keys)})" if keys else name

    per_cell = [text(getattr(c, name_field), getattr(c, settings), varying[getattr(c, name_field)]) for c in cells]
    fixed = [
        text(name, dicts[0], [k for k in dicts[0] if k not in varying[name]])
        for name, dicts in by_name.items()
        if dicts[0] or len(by_name) == 1
    ]
    return per_cell, fixed


def print_plan(console: Console, plan: Plan, store: Store, as_json: bool = False) -> None:
    """The expanded cells and their recorded status: a table of what varies between cells, lines
    with what does not; or the fully resolved cells as JSON."""
    statuses = [store.status(cell) or "to run" for cell in plan.cells]
    if as_json:
        print(
            json.dumps(
                [
                    {"hash": cell_hash(cell), "status": status, "config": cell.model_dump(mode="json")}
                    for cell, status in zip(plan.cells, statuses)
                ],
                indent=2,
            )
        )
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
    table = Table(
        "#",
        "cell",
        *map(escape, columns),
        "status",
        title=escape(f"{plan.name}: {len(plan.cells)} cells ({plan.source}{scale})"),
    )
    for i, (cell, status) in enumerate(zip(plan.cells, statuses)):
        table.add_row(str(i + 1), cell_hash(cell), *(escape(values[i]) for values in columns.values()), escape(status))
    console.print(table)
    console.print(escape(f"every cell: {', '.join(fixed)}"), highlight=False)
    for field, constant in per_name.items():
        console.print(escape(f"per {field} (each in its own cells only): {', '.join(constant)}"), highlight=False)
    counts = Counter(statuses)
    console.print(
        f"resources per cell: {plan.resources.cpus:g} CPU, {plan.resources.gpus:g} GPU; "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
        highlight=False,
    )
    for algorithm, path in sorted(plan.tuned.items()):
        console.print(escape(f"{algorithm}: tuned configuration {path} (hp_source=tuned)"), highlight=False)
    for dataset in sorted(plan.optional_datasets):
        console.print(
            escape(f"{dataset}: optional (its cells are left out, with a note, where it cannot be loaded)"),
            highlight=False,
        )


def make_console(stderr: bool = False) -> Console:
    """The run's console (stdout), or with `stderr` one for warnings and notes beside machine-readable
    output. Wide when not a terminal (logs, pipes), so tables are not squeezed to 80 columns."""
    return Console(highlight=False, stderr=stderr, width=shutil.get_terminal_size((160, 24)).columns)
