"""Every published cell watched by CI: `pflbench watch`.

`pflbench verify` checks the cells of one study that it is asked about, and repeats them exactly only on
the kind of machine that ran them (CPU model and instruction set, device, GPU, torch: pflbench/studies/verify.py);
elsewhere it compares within a tolerance of points, which sees a broken method and not a moved number.
Published cells ran on whatever machine a session had, and CI runs on another, so on its own it would
mostly compare within that tolerance. This module closes both gaps:

Fingerprints. A cell's first evaluation re-run on a kind of machine gives metrics that repeat bit for bit
on that kind; their digest (`fingerprint`: every metrics column but the wall times, in round and client
order) is recorded per kind of machine (`machine_key`: CPU model, family and model numbers, torch's vector
dispatch, torch) in `results/published/fingerprints.json` (`--record`, after the
rerun matched the stored cell: exactly on the cell's own kind, within the tolerance elsewhere). A later
rerun on that kind must give the same digest: one changed bit anywhere in the cell's first evaluation
fails, wherever the cell first ran. A kind without a fingerprint for the cell falls back to `verify`'s
comparison with the stored metrics.

Which cells a commit re-runs (each its first evaluation, `verify --rounds 1`):
- `--turn T --budget S` (CI): the published cells cut into slices of at most S seconds of stored cost each
  (`cost_slices`: each cell's first evaluation as stored, a GPU cell at its CPU twin's cost), and slice
  T mod (number of slices); CI takes T = (number of commits on main), so consecutive commits re-run every
  published cell once in as many commits as there are slices, and a slice never costs more than S, except
  that a cell whose first evaluation alone costs more than S is a slice of its own (the CI run that draws
  it costs that one cell). The slices follow a fixed hash order of the cells' names, cut where the next
  cell would pass S: a cell published later shifts the cuts after it by its own cost only;
- `--slice K/N`: the cells whose `slice_of` is K, a fixed hash of study and cell id into N slices (by count:
  a slice's cost is whatever its cells draw);
- `--representatives`: on every commit, the cheapest finished CPU cell of each (algorithm, model, client
  path) among all published studies, whose first evaluation is estimated at most `--max-seconds`. Any
  change to the engine, an algorithm or a model changes the computation of the cells that run that code,
  and every such cell shares its (algorithm, model, path) with a representative that runs the same code
  (the training step, the model's forward and backward, the algorithm's hooks): the representative moves
  with it, on the commit that made the change. Re-running every affected cell at once would cost the whole
  store's first evaluations (about 3.4 hours of one core today) for any engine change; the slices re-run
  each of them within N commits.
A moved cell fails CI with its study, cell id and the commit named.

A cell whose stored run differs beyond `verify`'s tolerance from a rerun on another kind of machine (a cell
at the edge of divergence: NaN on one CPU, finite on another) gets this kind's fingerprint only from a
reference: `--reference STORE`, a store holding the same cell re-run on this kind of machine at the commit
the cell was published from (`pflbench run` in a checkout of that commit). The rerun must repeat that
reference exactly, which shows that the code since has not moved it on this kind; the fingerprint is then
recorded like any other.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pflbench.storage.store import CONFIG, SUMMARY, read_json_dict, write_json
from pflbench.studies.verify import rounds_to_run

FINGERPRINTS = "fingerprints.json"
IGNORED = ("wall_time",)
# A CI slice's stored first-evaluation cost at most (`--turn`'s default), unless one cell alone is over it
# (then that cell is its own slice): 12 minutes keeps CI's whole run under 45 minutes (docs/howto/publish.md).
BUDGET = 720.0


@dataclass(frozen=True)
class PublishedCell:
    study: str
    folder: Path
    algorithm: str
    model: str
    path: str  # client batching: loop or batched
    device: str  # the device it ran on
    status: str
    first_eval_seconds: float  # its stored wall time's share of the rounds up to its first evaluation

    @property
    def name(self) -> str:
        return f"{self.study}/{self.folder.name}"


def published_cells(root: str | Path) -> list[PublishedCell]:
    """Every cell of every published study under `root` (a folder of studies with manifests)."""
    cells = []
    for manifest in sorted(Path(root).glob("*/manifest.json")):
        for folder in sorted(p for p in manifest.parent.iterdir() if (p / SUMMARY).is_file()):
            summary, cell = read_json_dict(folder / SUMMARY), read_json_dict(folder / CONFIG)["cell"]
            done = summary.get("rounds_completed") or int(cell["rounds"])
            share = (rounds_to_run(cell, 1) or done) / max(1, done)  # as `verify --rounds 1` counts it
            cells.append(
                PublishedCell(
                    manifest.parent.name,
                    folder,
                    cell["algorithm"],
                    str(cell.get("model")),
                    str(summary.get("client_batching")),
                    str(summary.get("device") or "cpu"),
                    str(summary.get("status")),
                    float(summary.get("wall_time") or 0.0) * min(1.0, share),
                )
            )
    return cells


def slice_of(cell_name: str, slices: int) -> int:
    """The slice (0..slices-1) of `study/cell`: fixed by the name, so it never moves between commits."""
    return int(hashlib.sha256(cell_name.encode()).hexdigest()[:12], 16) % slices


def slice_cost(cell: PublishedCell, cells: list[PublishedCell]) -> float:
    """What re-running `cell`'s first evaluation costs as stored, on a CPU: a cell that ran on a GPU is re-run on
    the CPU where CUDA is missing, so it counts at the stored cost of a CPU run of the same cell id (a study
    re-run on a GPU, e.g. table1-full-gpu beside table1-full) where one is published, else at its own."""
    if cell.device == "cpu":
        return cell.first_eval_seconds
    twins = [c.first_eval_seconds for c in cells if c.folder.name == cell.folder.name and c.device == "cpu"]
    return max([cell.first_eval_seconds, *twins])


def cost_slices(cells: list[PublishedCell], budget: float) -> tuple[list[list[PublishedCell]], list[PublishedCell]]:
    """The cells cut into slices of at most `budget` seconds of `slice_cost` each (module doc), and the cells
    whose first evaluation alone is over the budget: each of those is a slice of its own, so every published
    cell is in exactly one slice. The order is a fixed hash of each cell's name, so slices mix studies and a
    new cell moves only the cuts after it."""
    slices: list[list[PublishedCell]] = []
    alone: list[list[PublishedCell]] = []
    total = 0.0
    for cell in sorted(cells, key=lambda c: (hashlib.sha256(c.name.encode()).hexdigest(), c.name)):
        cost = slice_cost(cell, cells)
        if cost > budget:
            alone.append([cell])
            continue
        if not slices or total + cost > budget:
            slices.append([])
            total = 0.0
        slices[-1].append(cell)
        total += cost
    return slices + alone, [only for (only,) in alone]


def representatives(cells: list[PublishedCell], max_seconds: float) -> list[PublishedCell]:
    """The cheapest finished CPU cell of each (algorithm, model, client path) whose first evaluation is
    estimated at most `max_seconds` (module doc)."""
    best: dict[tuple, PublishedCell] = {}
    for cell in cells:
        if cell.status != "finished" or cell.device != "cpu" or cell.first_eval_seconds > max_seconds:
            continue
        key = (cell.algorithm, cell.model, cell.path)
        if key not in best or (cell.first_eval_seconds, cell.name) < (best[key].first_eval_seconds, best[key].name):
            best[key] = cell
    return sorted(best.values(), key=lambda c: c.name)


def fingerprint(metrics: pd.DataFrame) -> str:
    """The digest of a rerun's metrics: every column but the wall times, rows in round and client order."""
    frame = metrics.drop(columns=[c for c in IGNORED if c in metrics])
    frame = frame.sort_values([c for c in ("round", "client") if c in frame]).reset_index(drop=True)
    digest = hashlib.sha256()
    for column in sorted(frame.columns):
        digest.update(column.encode() + b"\0")
        values = frame[column].to_numpy()
        digest.update(values.tobytes() if values.dtype.kind in "biuf" else "\x1f".join(map(repr, values)).encode())
    return digest.hexdigest()


def cpu_generation() -> str:
    """The CPU's family and model numbers (/proc/cpuinfo): a cloud's model name ("Intel(R) Xeon(R)
    Processor") covers several generations whose math libraries pick different kernels."""
    import re

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "family ? model ?"
    found = {key: re.search(rf"^{key}\s*:\s*(\S+)", text, re.MULTILINE) for key in ("cpu family", "model")}
    return "family {} model {}".format(*(m.group(1) if m else "?" for m in found.values()))


def machine_key(device: str = "cpu") -> str:
    """This machine's kind, as fingerprints are filed: CPU model and generation, torch's vector dispatch,
    torch (and the GPU). Finer than `verify`'s kind: a fingerprint must never be compared across kernels."""
    import torch

    from pflbench.run.cost import cpu_capability, cpu_model

    parts = [cpu_model(), cpu_generation(), cpu_capability(), f"torch {torch.__version__}"]
    if device.startswith("cuda"):
        parts.append(torch.cuda.get_device_name(torch.device(device)))
    return " | ".join(parts)


class FingerprintBook:
    """results/published/fingerprints.json: {machine kind: {study/cell: {fingerprint, rounds, commit, date}}}.

    `save` writes this book's own records into the file as it is at that moment, under an exclusive lock
    on a sibling lock file: two recording runs side by side (a long cell in one, a new study in another)
    each keep what the other filed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.kinds: dict[str, dict[str, dict]] = read_json_dict(self.path) if self.path.is_file() else {}
        self.recorded: dict[tuple[str, str], dict] = {}  # (kind, cell) -> entry: what this book adds

    def get(self, kind: str, cell: str) -> dict | None:
        return self.kinds.get(kind, {}).get(cell)

    def record(self, kind: str, cell: str, value: str, rounds: int | None, commit: str | None) -> None:
        entry = {
            "fingerprint": value,
            "rounds": rounds,
            "commit": commit,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        }
        self.kinds.setdefault(kind, {})[cell] = entry
        self.recorded[kind, cell] = entry

    def save(self) -> None:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kinds = read_json_dict(self.path) if self.path.is_file() else {}
            for (kind, cell), entry in self.recorded.items():
                kinds.setdefault(kind, {})[cell] = entry
            write_json(self.path, {kind: dict(sorted(cells.items())) for kind, cells in sorted(kinds.items())})
            self.kinds = kinds


@dataclass
class Watched:
    cell: PublishedCell
    outcome: str  # "identical (fingerprint)", "identical", "within tolerance"; or MOVED, DIFFERS, PROBLEM
    detail: str = ""
    seconds: float | None = 0.0  # the rerun's (None: not measured)
    recorded: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome not in ("MOVED", "DIFFERS", "PROBLEM")


def reference_problem(cell: PublishedCell, reference: Path) -> str | None:
    """Why `reference` (a cell folder) cannot stand in for `cell`'s stored run on this kind of machine, or None."""
    if not (reference / SUMMARY).is_file():
        return f"no finished cell {cell.folder.name} in the reference store"
    stored, ran = read_json_dict(cell.folder / SUMMARY), read_json_dict(reference / SUMMARY)
    if not stored.get("code_commit") or ran.get("code_commit") != stored.get("code_commit"):
        return (
            f"the reference ran commit {str(ran.get('code_commit'))[:10]}, the cell was published from "
            f"{str(stored.get('code_commit'))[:10]}"
        )
    if ran.get("code_dirty"):
        return "the reference ran from a checkout with uncommitted changes"
    return None  # whether it ran on this kind of machine: `verify`'s rule, through check_cell's mode


def watch_cell(
    cell: PublishedCell,
    book: FingerprintBook,
    kind: str,
    *,
    record: bool,
    commit: str | None,
    data_root: str | Path | None = None,
    mirror: str | Path | None = None,
    reference: Path | None = None,
) -> Watched:
    """Re-run `cell`'s first evaluation and judge it: against this kind's fingerprint where one is recorded,
    else against the stored metrics (`pflbench.studies.verify.check_cell`), or where those differ against the
    `reference` store's run of the cell (module doc); with `record`, file the fingerprint of a rerun that
    matched."""
    from pflbench.studies.verify import check_cell, compare, kind_differences

    check = check_cell(cell.folder, rounds=1, data_root=data_root, mirror=mirror)
    if check.notes:  # a stale id or damaged files: as `pflbench verify` reports them
        return Watched(cell, "PROBLEM", "; ".join(check.notes), check.seconds)
    assert check.rerun_result is not None  # a check without notes ran the cell
    value = fingerprint(check.rerun_result.metrics)
    known = book.get(kind, cell.name)
    if known is not None and known.get("rounds") == check.rounds:
        if known["fingerprint"] == value:
            return Watched(cell, "identical (fingerprint)", seconds=check.seconds)
        detail = (
            f"its first evaluation (rounds 1-{check.rounds}) no longer repeats the fingerprint recorded on "
            f"this kind of machine at commit {str(known.get('commit'))[:10]} ({known.get('date')})"
        )
        if check.differences:
            detail += "; against the stored metrics: " + "; ".join(map(str, check.differences[:3]))
        return Watched(cell, "MOVED", detail, check.seconds)
    if check.differences:
        detail = f"{check.verdict}: " + "; ".join(map(str, check.differences[:3]))
        if reference is None:
            return Watched(cell, "DIFFERS", detail, check.seconds)
        problem = reference_problem(cell, reference / cell.folder.name)
        if problem is not None:
            return Watched(cell, "DIFFERS", f"{detail}; reference not usable: {problem}", check.seconds)
        ran = reference / cell.folder.name
        other_kind = kind_differences(ran, check.rerun_result)
        if other_kind:
            return Watched(
                cell,
                "DIFFERS",
                f"{detail}; reference not usable: it ran on another kind of machine ({', '.join(other_kind)})",
                check.seconds,
            )
        against = compare(ran, check.rerun_result, exact=True, rounds=check.rounds)  # the same rerun, no second one
        if against:
            return Watched(
                cell,
                "DIFFERS",
                f"{detail}; and against the reference run of its commit on this kind "
                f"of machine: " + "; ".join(map(str, against[:3])),
                check.seconds,
            )
        watched = Watched(
            cell,
            "identical to the reference",
            f"the stored run (another kind of machine) differs: {detail}; this kind's run of the "
            f"published commit is repeated exactly",
            check.seconds,
        )
    else:
        watched = Watched(
            cell,
            "identical" if check.mode == "exact" else "within tolerance",
            "" if check.mode == "exact" else check.why_tolerance,
            check.seconds,
        )
    if record:
        book.record(kind, cell.name, value, check.rounds, commit)
        watched.recorded = True
    return watched
