"""What a run prints at its end and a dry run instead of running: the closing summary of every cell (with the problems named) and the table of the expanded cells."""

from __future__ import annotations

import json
from collections import Counter
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pflbench.config import CellConfig, cell_hash
from pflbench.run.display import PROBLEMS
from pflbench.run.spec import Plan
from pflbench.storage.store import Store


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
