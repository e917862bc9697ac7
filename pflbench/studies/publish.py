"""Published studies: `results/published/<study>/`, tracked in git and rebuilt into the leaderboard.

A study is the cells of one `pflbench run` command (a spec, its scale and `--set`s), copied from the
store that run wrote into a store of its own, slimmed, with a `manifest.json` beside the cells:

    study        the folder's name
    command      the `pflbench run ...` that made it; spec, scale, sets: its parts
    commit       the pflbench git commit the cells ran with (each cell records it: pflbench/run/cost.py;
                 for cells from before that record, the checkout's commit when publishing), and `dirty`:
                 whether pflbench/ (the built-in algorithms and partitions included) had uncommitted changes. Cells run by
                 different commits, or by uncommitted code, are refused (--allow-dirty publishes them,
                 and the manifest says so)
    versions     pflbench, torch, Python
    machines     the machines the cells ran on (CPU model, logical cores, GPU), each with its cell count,
                 from the cells' own summaries (pflbench/run/cost.py)
    date         when the last cell finished; published_at: when this folder was written
    wall_time    elapsed_seconds: from the first cell's start to the last cell's end, per the store's
                 timestamps (the partitions' preparation before the first cell is not in it);
                 cell_seconds: the sum of the cells' wall times
    resources    CPUs and GPUs per cell (the spec's), which a rerun uses again
    cells        per cell id: `sets`, the `--set`s that narrow the spec to exactly that cell (checked
                 at publish time by expanding the spec with them; null where no such form was found)
    statuses     counts per status; missing: ids the command plans that have no result
    note         free text (e.g. "a demonstration study")

Slimming: each cell keeps config.json, summary.json, metrics.parquet, rounds.parquet, error.txt, and of
its artifacts only the arrays the reports draw or benchmarks/README.md reads (`REPORTED_ARTIFACTS`:
pFedLA's α for Figures 5-7, FedFomo's affinity matrix and aggregation weights, tens of KB a cell);
where arrays were dropped, the copy's summary records the new artifact file's size and checksum, so the
published store passes `pflbench store check` like any other.

Staleness (`study_state`): a study is stale when the current code no longer gives its cells the ids
they were stored under: a stored configuration resolved again (`pflbench.run.spec.resolve_cell`) hashes
differently (a hyperparameter added or removed, a configuration field changed), or the study's
command expanded again plans other cells (an algorithm's default changed, the spec changed). A study
is failed when a cell failed, incomplete when planned cells have no result yet (a long study published
cell by cell as it runs).
"""

from __future__ import annotations

import datetime
import io
import json
import platform
import shlex
import shutil
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pflbench.run.cost import CODE_DIRS, REPO, git_commit
from pflbench.storage.store import (
    ARTIFACTS,
    CONFIG,
    ERROR,
    METRICS,
    ROUNDS,
    SUMMARY,
    file_record,
    read_json_dict,
    write_json,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pflbench.config import CellConfig
    from pflbench.run.spec import Plan

MANIFEST = "manifest.json"
PUBLISHED = Path("results") / "published"
KEPT_FILES = (CONFIG, METRICS, ROUNDS, ERROR)  # the summary is written last, after the artifacts
# Artifact names (without their _roundNNNNN suffix) that the reports read: pflbench/reports/build.py.
REPORTED_ARTIFACTS = ("alpha", "alpha_layers", "affinity", "weights")


class PublishError(ValueError):
    """A publish request that cannot be done; nothing was written."""


def command_text(spec: str, scale: str | None, sets: list[str]) -> str:
    parts = ["pflbench", "run", spec] + (["--scale", scale] if scale else [])
    for item in sets:
        parts += ["--set", item]
    return shlex.join(parts)


def yaml_value(value: Any) -> str:
    """A value as `--set` reads it (YAML; JSON is YAML)."""
    return (
        value
        if isinstance(value, str) and value.strip() == value and value and value[0] not in "[{\"'"
        else json.dumps(value)
    )


def _axis_values(cell: CellConfig) -> dict[str, str]:
    """The `--set` items that put each matrix axis of the structured kind at `cell`'s value."""
    dataset = {"name": cell.dataset, "options": cell.dataset_options} if cell.dataset_options else cell.dataset
    return {
        "algorithm": f"algorithm={cell.algorithm}",
        "dataset": f"dataset={yaml_value(dataset)}",
        "partition": f"partition={yaml_value({'scheme': cell.partition, 'params': cell.partition_params})}",
        "clients": f"clients={cell.clients}"
        if cell.participation == 1.0
        # the axis's entry form
        else f"clients={yaml_value({'clients': cell.clients, 'participation': cell.participation})}",
        "seed": f"seed={cell.seed}",
    }


def narrowing_sets(cell: CellConfig, spec: str, scale: str | None, sets: Sequence[str], plan: Plan) -> list[str] | None:
    """`--set`s that, added to the study's command (whose expansion is `plan`), expand the spec to
    exactly `cell`: its variant's name where the spec has a variants axis, the axes on which the plan's
    cells differ, set to this cell's values (all five axes where that is not enough); None if no such
    form gives exactly this cell (checked by expanding the spec)."""
    from pflbench.config import cell_hash
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets
    from pflbench.run.spec_problems import SpecError

    mine = _axis_values(cell)
    varying = [k for k in mine if len({_axis_values(c)[k] for c in plan.cells}) > 1]
    for variant in [[f"variant={name}"] for name in plan.variants] or [[]]:
        for keys in dict.fromkeys([tuple(varying), tuple(mine)]):
            narrowing = variant + [mine[k] for k in keys]
            try:
                narrowed = load_spec(spec, parse_sets([*sets, *narrowing]), scale=scale)
            except (SpecError, ValueError):
                continue
            if [cell_hash(c) for c in narrowed.cells] == [cell_hash(cell)]:
                return narrowing
    return None


def _slim_artifacts(source: Path, target: Path) -> dict | None:
    """Copy the reported arrays of `source`'s artifacts to `target`; the new file's record, or None
    when no reported array is there (no file written)."""
    import numpy as np

    from pflbench.reports.cells import ROUND_KEY

    with np.load(source, allow_pickle=False) as data:
        names = list(data.files)
        kept = [
            n for n in names if (m := ROUND_KEY.match(n)) and m["name"] in REPORTED_ARTIFACTS or n in REPORTED_ARTIFACTS
        ]
        if not kept:
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        if len(kept) == len(names):
            shutil.copyfile(source, target)
        else:
            buffer = io.BytesIO()
            np.savez_compressed(buffer, **{n: data[n] for n in kept})
            target.write_bytes(buffer.getvalue())
    return file_record(target)


def copy_cell(folder: Path, target: Path) -> None:
    """One cell folder into the published store, slimmed (module doc)."""
    target.mkdir(parents=True, exist_ok=True)
    summary = read_json_dict(folder / SUMMARY)
    files = dict(summary.get("files") or {})
    for name in KEPT_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, target / name)
    if (folder / ARTIFACTS).is_file():
        record = _slim_artifacts(folder / ARTIFACTS, target / ARTIFACTS)
        if record is None:
            files.pop(ARTIFACTS.as_posix(), None)
        else:
            files[ARTIFACTS.as_posix()] = record
    if "files" in summary:
        summary["files"] = files
    write_json(target / SUMMARY, summary)


def publish(
    spec: str,
    study: str,
    results: str | Path,
    *,
    scale: str | None = None,
    sets: Sequence[str] = (),
    out: str | Path = PUBLISHED,
    note: str | None = None,
    replace: bool = False,
    allow_dirty: bool = False,
) -> Path:
    """Copy the cells of `pflbench run SPEC [--scale] [--set ...]` from the store `results` into
    `out/<study>/` with a manifest (module doc); returns the study's folder."""
    from pflbench.config import cell_hash
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets
    from pflbench.storage.store import scan_store

    sets = list(sets)
    if not study or study != Path(study).name or study.startswith((".", "_")):
        raise PublishError(f"study name {study!r}: give a plain folder name (letters, digits, '-', '_'), not a path")
    target = Path(out) / study
    if target.exists() and not replace:
        raise PublishError(f"{target} exists already; pass --replace to publish over it")
    plan = load_spec(spec, parse_sets(sets), scale=scale)
    intact = {folder.name: (folder, config, summary) for folder, config, summary in scan_store(results)[0]}
    planned = [cell_hash(cell) for cell in plan.cells]
    found = [h for h in planned if h in intact]
    if not found:
        raise PublishError(
            f"none of the {len(planned)} cells of `{command_text(spec, scale, sets)}` has a result "
            f"in {results}: run that command first (with --results {results})"
        )
    commit, dirty = code_of([intact[h][2] for h in found], allow_dirty)
    staging = Path(out) / f".{study}.publishing"
    shutil.rmtree(staging, ignore_errors=True)
    for h in found:
        copy_cell(intact[h][0], staging / h)
    summaries = [intact[h][2] for h in found]
    cells_by_hash = {cell_hash(cell): cell for cell in plan.cells}
    manifest = {
        "study": study,
        "command": command_text(spec, scale, sets),
        "spec": spec,
        "scale": scale,
        "sets": sets,
        "commit": commit,
        "dirty": dirty,
        "versions": {"pflbench": version("pflbench"), "torch": version("torch"), "python": platform.python_version()},
        "machines": machines_of(summaries),
        **run_times(summaries),
        "published_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "resources": {"cpus": plan.resources.cpus, "gpus": plan.resources.gpus},
        "cells": {h: {"sets": narrowing_sets(cells_by_hash[h], spec, scale, sets, plan)} for h in found},
        "statuses": dict(Counter(s.get("status", "?") for s in summaries)),
        "missing": [h for h in planned if h not in intact],
        "artifacts_kept": list(REPORTED_ARTIFACTS),
        "note": note,
    }
    write_json(staging / MANIFEST, manifest)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    study_state.cache_clear()
    return target


def code_of(summaries: list[dict], allow_dirty: bool) -> tuple[str | None, bool]:
    """The commit and dirtiness the cells ran with (module doc); PublishError where they do not say one
    clean commit, unless `allow_dirty`."""
    recorded = {(s.get("code_commit"), bool(s.get("code_dirty"))) for s in summaries if s.get("code_commit")}
    if any(not s.get("code_commit") for s in summaries):  # cells from before the record: the checkout now
        recorded.add(git_commit())
    commits = sorted({c for c, _ in recorded if c})
    dirty = any(d for _, d in recorded)
    if (len(commits) > 1 or dirty) and not allow_dirty:
        why = (
            f"the cells ran with {len(commits)} different commits ({', '.join(c[:10] for c in commits)})"
            if len(commits) > 1
            else f"the cells ran with uncommitted changes in {', '.join(CODE_DIRS)}"
        )
        raise PublishError(
            f"{why}: a manifest could not say what made them; run them again with one committed "
            f"checkout (or pass --allow-dirty: the manifest then says so)"
        )
    return (commits[0] if len(commits) == 1 else (", ".join(commits) or None)), dirty or len(commits) > 1


def machines_of(summaries: list[dict]) -> list[dict]:
    """The distinct machines of the cells' summaries, each with its cell count."""
    counts = Counter(
        json.dumps({k: s.get(k) for k in ("cpu_model", "cpu_cores", "gpu_model", "device")}, sort_keys=True)
        for s in summaries
    )
    return [{**json.loads(key), "cells": n} for key, n in counts.most_common()]


def run_times(summaries: list[dict]) -> dict:
    """date (the last cell's end) and wall_time (module doc), from the cells' summaries."""
    ends, starts = [], []
    for s in summaries:
        try:
            end = datetime.datetime.fromisoformat(s["completed_at"])
        except (KeyError, TypeError, ValueError):
            continue
        ends.append(end)
        starts.append(end - datetime.timedelta(seconds=float(s.get("wall_time") or 0.0)))
    cell_seconds = sum(float(s.get("wall_time") or 0.0) for s in summaries)
    return {
        "date": max(ends).isoformat(timespec="seconds") if ends else None,
        "wall_time": {
            "elapsed_seconds": (max(ends) - min(starts)).total_seconds() if ends else None,
            "cell_seconds": cell_seconds,
        },
    }


def read_manifest(study: str | Path) -> dict | None:
    """A study's manifest, or None where the folder has none (a store that is not a published study)."""
    try:
        return read_json_dict(Path(study) / MANIFEST)
    except (OSError, ValueError):
        return None


def studies(root: str | Path = PUBLISHED) -> list[Path]:
    """The published study folders under `root` (those with a manifest), by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()  # not a `.NAME.publishing` folder left by an interrupted publish
        if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file()
    )


LEADERBOARD = "leaderboard.yaml"  # beside the study folders: how the leaderboard presents them (`beside_studies`)


def beside_studies(root: str | Path = PUBLISHED) -> dict[str, list[Path]]:
    """{study: the study folders shown beside it on its leaderboard page}, from `<root>/leaderboard.yaml`:

        beside:
          table1-full: [table1-full-pfedhn-official, table1-pfedla-server]   # variants of the column

    A variant study's rows then sit in the column's tables, labelled by what differs (pflbench.reports);
    each study keeps its own page too. No file: nothing beside anything. A name that is no published
    study is a PublishError naming the studies there."""
    import yaml

    path = Path(root) / LEADERBOARD
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise PublishError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    known = {folder.name: folder for folder in studies(root)}
    beside = data.get("beside") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or set(data) - {"beside"}
        or not isinstance(beside, dict)
        or not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in beside.values())
    ):
        raise PublishError(f"{path}: expected `beside: {{STUDY: [STUDY, ...]}}`")
    unknown = sorted({name for study, others in beside.items() for name in (study, *others)} - set(known))
    if unknown:
        raise PublishError(
            f"{path}: no published study {', '.join(map(repr, unknown))} "
            f"(published: {', '.join(sorted(known)) or 'none'})"
        )
    return {study: [known[name] for name in others if name != study] for study, others in beside.items()}


def find_cell(cell_id: str, roots: list[Path]) -> Path:
    """The folder of cell `cell_id` in one of the stores or published roots `roots` (a root holding
    studies is searched study by study); FileNotFoundError naming where it looked."""
    for root in roots:
        for store in [root, *studies(root)]:
            if (store / cell_id / SUMMARY).is_file():
                return store / cell_id
    raise FileNotFoundError(
        f"no cell {cell_id} in {', '.join(map(str, roots))} (nor in their studies); "
        f"give the store that holds it with --results DIR"
    )


def spec_path(spec: str) -> Path:
    """A manifest's spec path, relative to the working directory or else to the checkout."""
    path = Path(spec)
    return path if path.is_absolute() or path.exists() else REPO / spec


@dataclass
class StudyState:
    """What the index says about a study: its manifest, and why it is stale or failed (empty: fine)."""

    path: Path
    manifest: dict
    stale: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # planned cells not run yet (a study published as it runs)
    commit_now: str | None = None

    @property
    def label(self) -> str:
        return "stale" if self.stale else "failed" if self.failed else "incomplete" if self.incomplete else "current"


@lru_cache(maxsize=64)
def study_state(path: str | Path) -> StudyState | None:
    """The state of the published study at `path` under the current code (module doc); None where
    the folder has no manifest. Cached: the index and every page of a study ask for it."""
    from pflbench.config import cell_hash
    from pflbench.run.spec import load_spec, resolve_cell
    from pflbench.run.spec_axes import parse_sets
    from pflbench.run.spec_problems import SpecError

    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        return None
    state = StudyState(path, manifest, commit_now=git_commit()[0])
    stored = sorted(p for p in path.iterdir() if (p / CONFIG).is_file())
    changed = []
    for folder in stored:
        try:
            cell = resolve_cell(read_json_dict(folder / CONFIG)["cell"])
            now = cell_hash(cell)
        except (SpecError, ValueError, KeyError, TypeError) as error:
            now = f"none ({str(error).splitlines()[-1][:160]})"
        if now != folder.name:
            changed.append(f"{folder.name} -> {now}")
    if changed:
        state.stale.append(
            f"{len(changed)} of {len(stored)} stored configurations resolve to other cell ids "
            f"with the current code: " + "; ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        )
    spec = manifest.get("spec")
    if spec:
        try:
            plan = load_spec(spec_path(spec), parse_sets(list(manifest.get("sets") or [])), scale=manifest.get("scale"))
            now_ids = {cell_hash(c) for c in plan.cells}
            then_ids = {p.name for p in stored} | set(manifest.get("missing") or [])
            if now_ids != then_ids:
                state.stale.append(
                    f"`{manifest.get('command')}` now plans {len(now_ids - then_ids)} cells that are "
                    f"not in the study and no longer {len(then_ids - now_ids)} that are (an algorithm's "
                    f"defaults or the spec changed)"
                )
        except (SpecError, ValueError) as error:
            state.stale.append(
                f"`{manifest.get('command')}` cannot be expanded with the current code: "
                f"{str(error).splitlines()[0][:200]}"
            )
    statuses = manifest.get("statuses") or {}
    if statuses.get("failed"):
        state.failed.append(f"{statuses['failed']} cells failed")
    if manifest.get("missing"):
        planned = len(manifest["missing"]) + len(stored)
        state.incomplete.append(
            f"{len(stored)} of the {planned} cells its command plans are published; "
            f"{len(manifest['missing'])} still to run"
        )
    return state


def reproduce_commands(study: str | Path, cell_id: str) -> dict:
    """What a cell page shows to re-run the cell: `rerun` always, `run` (spec + --set) where known."""
    manifest = read_manifest(study) or {}
    out = {"rerun": f"pflbench rerun {cell_id}", "run": None}  # None: no --set form narrows the spec to it
    sets = ((manifest.get("cells") or {}).get(cell_id) or {}).get("sets")
    if manifest.get("spec") and sets is not None:
        out["run"] = command_text(manifest["spec"], manifest.get("scale"), list(manifest.get("sets") or []) + sets)
    return out
