"""What a report must say beside its tables: datasets a run left out, and cells not finished yet.

A report sees only the store. Two things it cannot see there are written for it:

- `<results>/_notes.json`, written by `pflbench run`: datasets it left out because they could not be
  loaded here (an optional dataset with no copy in the data root or mirror and no download):

      {"skipped_datasets": {"fmnist": {"cells": 44, "reason": "...", "looked_in": ["/root/...", ...],
                                       "how_to_provide": "..."}}}

  Every field but `cells` is optional; the report fills in the two ways to provide the data.
- cells being run or abandoned: folders with `config.json` but no `summary.json` (a runner writes the
  summary last), and `claim.json` files (a runner's claim on a cell it is running).
"""

from __future__ import annotations

import json
from collections.abc import Set
from pathlib import Path

NOTES = "_notes.json"
HOW_TO_PROVIDE = (
    "point `--from DIR` (or `$PFLBENCH_DATA_MIRROR`) at a folder holding a copy, or run "
    "`pflbench data prepare` where there is a network, then run the spec again: finished "
    "cells are kept and only the missing ones run"
)


def read_notes(results: str | Path) -> dict:
    try:
        data = json.loads((Path(results) / NOTES).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def skipped_datasets(results: str | Path, present: Set[str] = frozenset()) -> list[dict]:
    """The datasets a run left out, as {dataset, cells, reason, looked_in, how_to_provide}; a dataset
    that has results in the store now (provided and run since) is not listed."""
    skipped = read_notes(results).get("skipped_datasets") or {}
    out: list[dict] = []
    if not isinstance(skipped, dict):
        return out
    for dataset, info in sorted(skipped.items()):
        if str(dataset) in present:
            continue
        info = info if isinstance(info, dict) else {"cells": info}
        looked = info.get("looked_in") or []
        out.append(
            {
                "dataset": str(dataset),
                "cells": info.get("cells"),
                "reason": str(info.get("reason") or "it cannot be loaded here (no local copy, no download)"),
                "looked_in": [str(p) for p in (looked if isinstance(looked, list) else [looked])],
                "how_to_provide": str(info.get("how_to_provide") or HOW_TO_PROVIDE),
            }
        )
    return out


def skipped_text(item: dict) -> str:
    cells = f"{item['cells']} cells on " if item.get("cells") is not None else "the cells on "
    looked = f" Looked in: {', '.join(item['looked_in'])}." if item["looked_in"] else ""
    return (
        f"{cells}{item['dataset']} were left out: {item['reason'].rstrip('.')}.{looked} "
        f"To include them: {item['how_to_provide'].rstrip('.')}."
    )


def store_progress(results: str | Path) -> dict[str, int]:
    """{"running": cells claimed by a runner and without a result yet, "unfinished": cells started but
    without a result and without a claim (running in an older runner, or killed)}."""
    from pflbench.storage.store import CLAIM, CONFIG, SUMMARY

    root = Path(results)
    running = unfinished = 0
    if not root.is_dir():
        return {"running": 0, "unfinished": 0}
    for folder in root.iterdir():
        try:
            if not folder.is_dir() or (folder / SUMMARY).exists():
                continue
            if (folder / CLAIM).exists():
                running += 1
            elif (folder / CONFIG).exists():
                unfinished += 1
        except OSError:
            continue
    return {"running": running, "unfinished": unfinished}


def progress_text(progress: dict[str, int]) -> str:
    parts = []
    if progress.get("running"):
        n = progress["running"]
        parts.append(f"{n} {'cell is' if n == 1 else 'cells are'} being run (claimed by a runner, no result yet)")
    if progress.get("unfinished"):
        n = progress["unfinished"]
        parts.append(
            f"{n} {'cell was' if n == 1 else 'cells were'} started but {'has' if n == 1 else 'have'} no "
            f"result (running, or interrupted: `pflbench run` runs them again)"
        )
    if not parts:
        return ""
    return (
        "This store is still being filled: "
        + "; ".join(parts)
        + ". The tables show the finished cells only; run `pflbench report` again when the run ends."
    )
