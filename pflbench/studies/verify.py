"""Running stored cells again and comparing with what is stored: `pflbench rerun` and `pflbench verify`.

A rerun starts from the cell's stored configuration (config.json, exactly: not re-resolved) with the
execution options its summary records (device, client batching, channels-last, client threads,
compiled step) and the CPUs per cell of its study's manifest (torch's thread count), as `pflbench run`
ran it, so the same code on the same kind of machine repeats it bit for bit.

`compare(stored folder, rerun result)`:
  - exact, on the same kind of machine (`machine_kind`: CPU model, device type, GPU model and torch
    version all equal): every column of metrics.parquet except the wall times, and rounds.parquet's
    round, clients, bytes_down and bytes_up, must be equal value for value (NaN equals NaN);
  - within tolerance, elsewhere: another CPU's vector kernels, a GPU or another torch round floats
    differently, and SGD carries a last-bit difference on through the rounds, so per-client numbers
    cannot match. Then the status and the rounds completed (and who joined them) must still be equal
    (the bytes sent are not: a method whose messages follow learned values, HeurpFedLA, sends other bytes
    when rounding tips one of its decisions), and each evaluated round's mean accuracy over clients
    (test, validation, after adaptation) within ACCURACY_TOLERANCE. That number is measured, not
    chosen: the comment at ACCURACY_TOLERANCE says how it was measured.
`--rounds R` (a paper-scale cell takes an hour): the rerun stops after the first R rounds, rounded up
to the cell's next evaluation round (`rounds_to_run`), and the comparison keeps the stored rows of
those rounds; everything about the rounds that ran is the full run's (`run_rounds(stop_after=)`), so
the comparison is as strict as above. A rerun never reads or writes a round checkpoint: it starts
from round 1, whatever a store holds for the cell.
A cell whose stored configuration the current code resolves to another id (`resolve_cell`) is reported
as such (its code or defaults changed); a cell folder whose files fail their checksums (`pflbench store
check`) is reported as damaged and still compared, so that the numbers that changed are named.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from pflbench.storage.store import CONFIG, METRICS, ROUNDS, SUMMARY, check_folder, read_json_dict

if TYPE_CHECKING:
    from pflbench.api_types import CellResult

# Each evaluated round's mean accuracy over clients, absolute (0.01 = 1 percentage point), where kernels
# differ. Measured with benchmarks/verify_tolerance.py (the same cells through the client loop with
# contiguous convolutions and through the batched path with channels-last ones, 2026-11-24): the 42
# batchable cells of benchmarks/ci.yaml (seed 0, 3 rounds) moved by 0.00 pp; demo.yaml's Fashion-MNIST
# cells (CNN, 20 rounds of 2 epochs, ~21 validation and ~90 test samples per client) by up to 2.78 pp
# (FedAvg, test), 2.67 (pFedLA), 1.90 (Local, validation) and 6.67 (Ditto, validation; 4.33 test).
# So ±10 pp: across kinds of machines a rerun catches a method that is broken, not a subtle change;
# exact verification needs the same kind of machine.
ACCURACY_TOLERANCE = 0.10
IGNORED_METRICS = ("wall_time",)  # seconds: never repeat
ROUND_COLUMNS = ("round", "clients", "bytes_down", "bytes_up")  # rounds.parquet's columns that must repeat
MEAN_COLUMNS = ("accuracy", "val_accuracy", "accuracy_adapted", "val_accuracy_adapted")
KIND_KEYS = ("cpu_model", "cpu_capability", "device", "gpu_model", "torch")


@dataclass
class Difference:
    what: str  # e.g. "metrics.parquet accuracy"
    detail: str  # where and by how much

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"


@dataclass
class CellCheck:
    """The outcome of re-running one stored cell."""

    cell_id: str
    mode: str = "exact"  # "exact" (same kind of machine) or "tolerance"
    why_tolerance: str = ""
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # stale id, damaged files
    stored_curve: list[float] = field(default_factory=list)  # mean test accuracy per eval round
    rerun_curve: list[float] = field(default_factory=list)
    seconds: float | None = None
    rounds: int | None = None  # the first rounds compared (None: the whole run)
    rerun_result: CellResult | None = None
    label: str = ""  # algorithm · dataset · scheme · clients · seed

    @property
    def ok(self) -> bool:
        return not self.differences and not self.notes

    @property
    def verdict(self) -> str:
        if self.differences:
            return "DIFFERS"
        if self.notes:
            return "PROBLEM"
        return "identical" if self.mode == "exact" else f"within tolerance (±{ACCURACY_TOLERANCE * 100:g} pp)"


def machine_kind(summary: dict, versions: dict | None = None) -> dict:
    """What must be equal for a rerun to repeat a cell exactly (cpu_capability: where the cell records it;
    cells from before that record are compared on the model name alone)."""
    return {
        "cpu_model": summary.get("cpu_model"),
        "cpu_capability": summary.get("cpu_capability"),
        "device": summary.get("device"),
        "gpu_model": summary.get("gpu_model"),
        "torch": (versions or {}).get("torch", summary.get("torch")),
    }


def execution_options(summary: dict, cpus: float = 1.0) -> tuple[dict, float]:
    """ExecutionOptions fields and the CPUs per cell that repeat how the cell was executed."""

    def on_off(value: object) -> str:
        return "auto" if value is None else ("on" if value else "off")

    batching = summary.get("client_batching")
    threads = summary.get("client_threads")
    if isinstance(threads, (int, float)) and threads > 1:
        cpus = float(threads)
    options = {
        "client_batching": {"batched": "on", "loop": "off"}.get(str(batching), "auto"),
        "compiled_training": on_off(summary.get("compiled_training")),
        "channels_last": on_off(summary.get("channels_last")),
        "client_threads": "auto" if isinstance(threads, (int, float)) and threads > 1 else "off",
    }
    return options, cpus


def rounds_to_run(cell: dict, rounds: int | None) -> int | None:
    """The rounds a `--rounds` rerun runs: `rounds` rounded up to the cell's next evaluation round, at
    most the cell's rounds; None (the whole run) where that is every round."""
    if rounds is None:
        return None
    total, every = int(cell["rounds"]), max(1, int(cell.get("eval_every") or 1))
    upto = min(total, -(-max(1, rounds) // every) * every)
    return None if upto >= total else upto


def rerun(
    folder: str | Path,
    *,
    cpus: float | None = None,
    device: str | None = None,
    data_root: str | Path | None = None,
    mirror: str | Path | None = None,
    rounds: int | None = None,
) -> CellResult:
    """Run the stored cell at `folder` again (module doc), its first `rounds` rounds only if given
    (exactly those: `rounds_to_run` rounds up); returns its CellResult."""
    import torch

    from pflbench.config import CellConfig
    from pflbench.data import data_mirror, data_root as resolve_root
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.studies.publish import read_manifest
    from pflbench.run.cell import execute_cell
    from pflbench.run.options import RunOptions
    from pflbench.run.spec import Resources

    folder = Path(folder)
    config, summary = read_json_dict(folder / CONFIG), read_json_dict(folder / SUMMARY)
    cell = CellConfig.stored(config["cell"])  # a field the store lacks: the value the cell ran with
    manifest = read_manifest(folder.parent) or {}
    options, cell_cpus = execution_options(summary, cpus or float((manifest.get("resources") or {}).get("cpus", 1)))
    recorded = summary.get("device") or "cpu"
    if device is None:
        device = recorded if not recorded.startswith("cuda") or torch.cuda.is_available() else "cpu"
    run_options = RunOptions(
        data_root=resolve_root(data_root),
        mirror=data_mirror(mirror),
        use_ray=False,
        execution=ExecutionOptions(device=device, **options),
    )
    return execute_cell(
        cell,
        Resources(cpus=cell_cpus, gpus=1.0 if device.startswith("cuda") else 0.0),
        run_options,
        checkpoints=False,
        stop_after=rounds,
    )


def per_round_means(metrics: pd.DataFrame, column: str) -> pd.Series:
    rows = metrics[~metrics["newcomer"].astype(bool)] if "newcomer" in metrics else metrics
    return rows.groupby("round")[column].mean() if column in rows and len(rows) else pd.Series(dtype=float)


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality with NaN equal to NaN."""
    same = a == b
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    return same


def _frame_differences(
    name: str, stored: pd.DataFrame, rerun: pd.DataFrame, columns: Iterable[str]
) -> list[Difference]:
    found = []
    if len(stored) != len(rerun):
        return [Difference(name, f"{len(stored)} rows stored, {len(rerun)} in the rerun")]
    for column in columns:
        if column not in stored or column not in rerun:
            if column in stored or column in rerun:
                found.append(
                    Difference(f"{name} {column}", f"only in the {'stored' if column in stored else 'rerun'} file")
                )
            continue
        a, b = stored[column].to_numpy(), rerun[column].to_numpy()
        try:
            same = _equal(a, b)
        except TypeError:
            same = np.array([x == y for x, y in zip(a, b)])
        if not same.all():
            bad = np.flatnonzero(~same)
            first = bad[0]
            where = ", ".join(f"{k} {stored[k].iloc[first]}" for k in ("round", "client") if k in stored)
            detail = f"{len(bad)} of {len(a)} values differ; first at {where or f'row {first}'}: stored {a[first]!r}, rerun {b[first]!r}"
            if a.dtype.kind in "fi" and b.dtype.kind in "fi":
                gap = np.nanmax(np.abs(a[bad].astype(float) - b[bad].astype(float))) if len(bad) else 0.0
                detail += f"; largest gap {gap:.6g}"
            found.append(Difference(f"{name} {column}", detail))
    return found


def first_rounds(frame: pd.DataFrame, rounds: int | None) -> pd.DataFrame:
    """The rows of rounds 1..`rounds` (all with None): what a `--rounds` rerun is compared on."""
    return frame if rounds is None else frame[frame["round"] <= rounds].reset_index(drop=True)


def compare(folder: str | Path, result: CellResult, exact: bool, rounds: int | None = None) -> list[Difference]:
    """How the rerun `result` differs from the cell stored at `folder` (module doc); [] if it does not.
    `rounds`: the rerun ran only the first `rounds` rounds; the stored rows after them are left out."""
    folder = Path(folder)
    summary = read_json_dict(folder / SUMMARY)
    found = []
    stored_status = summary.get("status")
    if rounds is not None and not (stored_status == "diverged" and (summary.get("diverged_round") or 0) <= rounds):
        stored_status = "finished"  # the stored run went on past these rounds
    if stored_status != result.status:
        found.append(
            Difference(
                "status",
                f"stored {stored_status!r}, rerun {result.status!r}"
                + (f" ({result.error.strip().splitlines()[-1]})" if result.error else ""),
            )
        )
    try:
        stored_metrics = pd.read_parquet(folder / METRICS)
        stored_rounds = pd.read_parquet(folder / ROUNDS)
    except Exception as error:  # pyarrow raises several types for a damaged file
        return found + [Difference("stored files", f"unreadable ({type(error).__name__}: {error})")]
    stored_metrics, stored_rounds = first_rounds(stored_metrics, rounds), first_rounds(stored_rounds, rounds)
    if exact:
        found += _frame_differences("rounds.parquet", stored_rounds, result.rounds, ROUND_COLUMNS)
        columns = [
            c for c in dict.fromkeys([*stored_metrics.columns, *result.metrics.columns]) if c not in IGNORED_METRICS
        ]
        return found + _frame_differences("metrics.parquet", stored_metrics, result.metrics, columns)
    # Across kinds of machines the bytes sent are not required equal: a method whose messages follow learned
    # values (HeurpFedLA sends a layer only when its aggregation weights say so) sends other bytes when the
    # float rounding tips a decision (table1-quick's HeurpFedLA cell 1d25597801be: 2 of 10 rounds, 8.5 % more).
    found += _frame_differences("rounds.parquet", stored_rounds, result.rounds, ("round", "clients"))
    for column in MEAN_COLUMNS:
        a, b = per_round_means(stored_metrics, column), per_round_means(result.metrics, column)
        if list(a.index) != list(b.index):
            found.append(
                Difference(
                    f"metrics.parquet {column}",
                    f"evaluated rounds differ: stored {list(a.index)}, rerun {list(b.index)}",
                )
            )
            continue
        gaps = (a - b).abs()
        both_nan = a.isna() & b.isna()
        bad = gaps[~both_nan & ~(gaps <= ACCURACY_TOLERANCE)]
        if len(bad):
            rnd = bad.index[0]
            found.append(
                Difference(
                    f"metrics.parquet mean {column}",
                    f"{len(bad)} of {len(a)} rounds beyond ±{ACCURACY_TOLERANCE * 100:g} pp; first round "
                    f"{rnd}: stored {a[rnd]:.4f}, rerun {b[rnd]:.4f}",
                )
            )
    return found


def kind_differences(folder: str | Path, result: CellResult) -> list[str]:
    """How the machine that ran the stored cell at `folder` differs in kind from the one that produced
    `result` here ("cpu_model 'A' then, 'B' now", ...); empty: the same kind, so the bits must repeat."""
    import torch

    from pflbench.run.cost import cpu_capability, cpu_model

    folder = Path(folder)
    config, summary = read_json_dict(folder / CONFIG), read_json_dict(folder / SUMMARY)
    here = {
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
        "device": result.summary.get("device", "cpu"),
        "gpu_model": result.summary.get("gpu_model"),
        "torch": torch.__version__,
    }
    then = machine_kind(summary, config.get("versions"))
    return [
        f"{k} {then.get(k)!r} then, {here.get(k)!r} now"
        for k in KIND_KEYS
        if then.get(k) != here.get(k) and (k != "cpu_capability" or then.get(k))
    ]


def check_cell(
    folder: str | Path,
    *,
    cpus: float | None = None,
    data_root: str | Path | None = None,
    mirror: str | Path | None = None,
    force_tolerance: bool = False,
    rounds: int | None = None,
) -> CellCheck:
    """Re-run the stored cell at `folder` and compare (module doc); only its first `rounds` rounds
    (rounded up to an evaluation round) if given."""
    import time

    from pflbench.config import cell_hash
    from pflbench.run.spec import resolve_cell
    from pflbench.run.spec_problems import SpecError

    folder = Path(folder)
    check = CellCheck(folder.name)
    try:
        stored = read_json_dict(folder / CONFIG)["cell"]
        check.label = (
            f"{stored['algorithm']} · {stored['dataset']} · {stored.get('partition')} · "
            f"{stored.get('clients')} clients · seed {stored.get('seed')}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for problem in check_folder(folder):
        check.notes.append(f"damaged: {problem.file}: {problem.what}")
    config = read_json_dict(folder / CONFIG)
    read_json_dict(folder / SUMMARY)  # readable before any rerun (kind_differences reads it after)
    try:
        now = cell_hash(resolve_cell(config["cell"]))
    except (SpecError, ValueError, KeyError, TypeError) as error:
        now = f"none ({str(error).splitlines()[-1][:200]})"
    if now != folder.name:
        check.notes.append(f"stale: the current code resolves this stored configuration to cell id {now}")
    check.rounds = rounds_to_run(config["cell"], rounds)
    started = time.perf_counter()
    result = rerun(folder, cpus=cpus, data_root=data_root, mirror=mirror, rounds=check.rounds)
    check.seconds = time.perf_counter() - started
    check.rerun_result = result
    differing = kind_differences(folder, result)
    if differing or force_tolerance:
        check.mode = "tolerance"
        check.why_tolerance = "forced" if not differing else "another kind of machine: " + ", ".join(differing)
    check.differences = compare(folder, result, exact=check.mode == "exact", rounds=check.rounds)
    try:
        check.stored_curve = per_round_means(
            first_rounds(pd.read_parquet(folder / METRICS), check.rounds), "accuracy"
        ).tolist()
    except Exception:
        pass
    check.rerun_curve = per_round_means(result.metrics, "accuracy").tolist() if len(result.metrics) else []
    return check


def sample_cells(
    study: str | Path,
    k: int | None,
    seed: int,
    max_seconds: float | None = None,
    cells: list[str] | None = None,
    rounds: int | None = None,
) -> list[Path]:
    """`k` cell folders of `study` drawn at random with `seed` (all with k None), among those whose
    stored wall time is at most `max_seconds` (with `rounds`: the stored wall time's share of the
    rounds a `--rounds` rerun runs); or the cells named."""
    study = Path(study)
    folders = sorted(p for p in study.iterdir() if (p / SUMMARY).is_file())
    if cells:
        by_name = {p.name: p for p in folders}
        unknown = [c for c in cells if c not in by_name]
        if unknown:
            raise ValueError(f"no cell {', '.join(unknown)} in {study}")
        return [by_name[c] for c in cells]
    if max_seconds is not None:

        def seconds(p: Path) -> float:
            try:
                summary = read_json_dict(p / SUMMARY)
                # A drawn sample checks reproducibility, and a divergence is not reproducible across
                # CPU kinds (the float order decides where a blow-up happens): such cells are
                # verified only by name.
                if summary.get("status") == "diverged":
                    return math.inf
                value, done = summary.get("wall_time"), summary.get("rounds_completed")
                upto = rounds_to_run(read_json_dict(p / CONFIG)["cell"], rounds) if rounds is not None else None
            except (OSError, ValueError, KeyError, TypeError):
                return math.inf
            if not isinstance(value, (int, float)):
                return math.inf
            return float(value) * (min(1.0, upto / done) if upto and isinstance(done, int) and done > 0 else 1.0)

        folders = [p for p in folders if seconds(p) <= max_seconds]
    if k is None or k >= len(folders):
        return folders
    return sorted(random.Random(seed).sample(folders, k))
