"""What a person sees of a run: the live progress of its cells, the closing summary, the dry run's table
of cells. Only the console; the run itself is `pflbench.run.runner`."""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from pflbench.config import CellConfig, cell_hash

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


def make_console(stderr: bool = False) -> Console:
    """The run's console (stdout), or with `stderr` one for warnings and notes beside machine-readable
    output. Wide when not a terminal (logs, pipes), so tables are not squeezed to 80 columns."""
    return Console(highlight=False, stderr=stderr, width=shutil.get_terminal_size((160, 24)).columns)
