"""The results store: one directory per cell, named by the cell's hash.

    results/<hash>/config.json       resolved configuration + versions (pflbench, torch, python, dataset checksum)
                  metrics.parquet    per eval round and client: accuracy, loss, val_*, bytes, wall time
                  rounds.parquet     per round: clients, bytes down/up, wall time
                  artifacts/arrays.npz   e.g. aggregation weights, one array per name and round
                  error.txt          the traceback (failed) or the reason (diverged)
                  summary.json       status, final/best/worst-10% accuracy, communication, wall time
                  checkpoint.pt      the latest round checkpoint while the cell runs (pflbench.storage.checkpoint);
                                     removed once a finished cell's result is written

Every file is written atomically (temporary file in the same folder, then os.replace), and
summary.json is written last and removed first: a cell has a result exactly when its summary exists,
so a kill at any moment leaves a readable store in which an interrupted cell simply has no result.

A full disk (ENOSPC, or EDQUOT: a quota): a write that fails for lack of space removes its temporary
file and raises `DiskFull`, whose one line names the file, the bytes it needed and the bytes free
there; `Store.write` checks the result's size against the free space before it touches the cell's
folder. So a partial file never becomes a result (nor a checkpoint: pflbench/storage/checkpoint.py writes
through `atomic_write` too), and `pflbench run` stops starting cells (pflbench/run/runner.py).

Integrity: the summary lists every other file of the cell with its size and SHA-256 (`files`), so a
result counts only while each of them is there, whole and unchanged (`Store.check`). A cell folder
whose files were truncated, garbled or deleted is *damaged*; a folder whose name is not the hash of
the configuration inside it (a copy, a stray folder) is *foreign*. Neither is ever read as a result:
`load_store` returns the intact cells only and `store_problems` lists the others (`pflbench store
check`); `pflbench run` sets a damaged cell's folder aside under `_damaged/` (nothing is deleted) and
runs the cell again. Cells written before the manifest existed are checked by reading their files.

Claims: runners sharing one store (two `pflbench run` at once, several machines on a network folder)
split the matrix. Before running a cell a runner creates `<hash>/claim.json` atomically (O_EXCL) with
its owner (host, pid) and refreshes its time every `HEARTBEAT` seconds while the cell runs; another
runner skips a claimed cell. A claim whose owner stopped refreshing it for `CLAIM_STALE` seconds, or
whose owner process is gone (same host), is taken over.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import numpy as np
import pandas as pd

from pflbench.config import CellConfig, cell_hash

if TYPE_CHECKING:
    from pflbench.api_types import CellResult

CONFIG, SUMMARY, ERROR = "config.json", "summary.json", "error.txt"
METRICS, ROUNDS = "metrics.parquet", "rounds.parquet"
CHECKPOINT = "checkpoint.pt"  # the latest round checkpoint of a running cell (pflbench.storage.checkpoint)
ARTIFACTS = Path("artifacts") / "arrays.npz"
# Outcomes that are results of the configuration itself (divergence is deterministic given the seed),
# so resuming skips them; "failed" (a crash, a lost worker) is retried.
COMPLETE = ("finished", "diverged")
DAMAGED = "damaged"  # a status of our own: the summary exists but the cell's files do not hold up
KEPT = "_kept"  # round checkpoints kept on request (`pflbench run --keep-checkpoints-from`): <store>/_kept/<hash>/
SET_ASIDE = "_damaged"  # where `run` moves a damaged cell's folder before running the cell again
CLAIM = "claim.json"
HEARTBEAT = 30.0  # seconds between refreshes of a running cell's claim
CLAIM_STALE = 180.0  # a claim not refreshed for this long belongs to a runner that died


@dataclass(frozen=True)
class Problem:
    """Why a folder of the store is not a result: `kind` "damaged" or "foreign", the folder's name,
    the file at fault (relative to the folder) and what is wrong with it."""

    kind: str
    folder: str
    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.folder}/{self.file}: {self.what}"


def file_record(path: Path) -> dict:
    """Size and SHA-256 of a file, as the summary's manifest keeps them."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def read_json_dict(path: Path) -> dict:
    """A JSON object from `path`; ValueError (with the reason) for anything else."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"holds a JSON {type(data).__name__}, not an object")
    return data


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; the user's disk quota exceeded


class DiskFull(OSError):
    """A write failed for lack of space (module doc): `path` the file, `needed` the bytes it needed
    (None: not known), `free` the bytes free on that file system (None: not known)."""

    def __init__(self, path: str | Path, needed: int | None, free: int | None, code: int = errno.ENOSPC) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.path, self.needed, self.free = Path(path), needed, free

    def __reduce__(
        self,
    ) -> tuple[type[DiskFull], tuple[Any, ...]]:  # crosses from a Ray actor (the checkpoint keeper) with its fields
        return DiskFull, (self.path, self.needed, self.free, self.errno)

    def needing(self, needed: int) -> DiskFull:
        """The same failure, the bytes the write needed now known."""
        return DiskFull(self.path, needed, self.free, self.errno or errno.ENOSPC)  # (always set)

    def __str__(self) -> str:
        what = "disk quota exceeded" if self.errno == errno.EDQUOT else "disk full"
        needed = "an unknown number of bytes" if self.needed is None else f"{self.needed:,} bytes"
        free = "unknown" if self.free is None else f"{self.free:,} bytes"
        return f"{what}: cannot write {self.path} (it needs {needed}; free there: {free})"


def free_bytes(path: Path) -> int | None:
    """The bytes free to this user on the file system holding `path` (its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def no_space(err: BaseException, path: Path, needed: int | None = None) -> DiskFull | None:
    """`err` as a DiskFull about `path` if it is a failure for lack of space, else None."""
    if isinstance(err, DiskFull):
        return err if needed is None else err.needing(needed)
    if isinstance(err, OSError) and err.errno in NO_SPACE:
        return DiskFull(path, needed, free_bytes(path), err.errno)
    return None


def disk_full_in(err: BaseException, path: Path) -> DiskFull | None:
    """The failure for lack of space that `err` is or was raised from (its causes and contexts), as a
    DiskFull about the file it names, else about `path` (e.g. the folder being written); None if none is."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        full = no_space(cause, Path(getattr(cause, "filename", None) or path))
        if full is not None:
            return full
        cause = cause.__cause__ or cause.__context__
    return None


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` then rename over `path`: readers see the old file or the whole new one. A failure
    for lack of space raises `DiskFull` (the temporary file removed, like on any failure)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as err:
        raise (no_space(err, path) or err) from None
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        full = no_space(err, path)
        if full is None:
            raise
        raise full from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`data` written atomically (`atomic_write`); a `DiskFull` says how many bytes it needed."""
    try:
        atomic_write(path, lambda tmp: tmp.write_bytes(data))
    except DiskFull as full:
        raise full.needing(len(data)) from None


def write_json(path: Path, data: dict) -> None:
    atomic_write_bytes(path, json_bytes(data))


class Store:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"  # this runner, in claims
        self.claimed: set[Path] = set()
        self.taken_over: set[Path] = set()  # the cell folders whose abandoned claim this runner took over

    # ---- claims: runners sharing a store split its cells (see the module doc) -------------------
    def claim(self, cell: CellConfig) -> bool:
        """Take the cell for this runner: True, or False if another live runner holds it (`DiskFull`
        where the claim cannot be written for lack of space)."""
        folder = self.cell_dir(cell)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise (no_space(err, folder) or err) from None
        path = folder / CLAIM
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._abandoned(path):
                    return False
                taken = folder / f".claim.{uuid.uuid4().hex}.stale"
                try:
                    os.rename(path, taken)  # only one runner's rename of the stale claim succeeds
                except FileNotFoundError:
                    continue
                if not self._abandoned(taken):  # renewed meanwhile: give it back
                    os.replace(taken, path)
                    return False
                taken.unlink(missing_ok=True)
                self.taken_over.add(folder)
                continue
            try:
                with os.fdopen(fd, "w") as file:
                    json.dump(
                        {
                            "owner": self.owner,
                            "host": self.host,
                            "pid": self.pid,
                            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                        },
                        file,
                    )
            except OSError as err:  # no claim at all rather than an unreadable one that blocks the cell
                path.unlink(missing_ok=True)
                raise (no_space(err, path) or err) from None
            self.claimed.add(path)
            return True
        return False

    def took_over(self, cell: CellConfig) -> bool:
        """Whether this runner's claim of `cell` replaced an abandoned one (a runner killed while it ran the cell)."""
        return self.cell_dir(cell) in self.taken_over

    def _abandoned(self, path: Path) -> bool:
        """Whether a claim's owner is gone: no refresh for CLAIM_STALE s, or a dead process here."""
        try:
            if time.time() - path.stat().st_mtime > CLAIM_STALE:
                return True
            holder = json.loads(path.read_text())
        except FileNotFoundError:
            return True
        except (OSError, ValueError):  # being written right now, or garbage: judged by its age alone
            return False
        if isinstance(holder, dict) and holder.get("host") == self.host and isinstance(holder.get("pid"), int):
            try:
                os.kill(holder["pid"], 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def claim_holder(self, cell: CellConfig) -> str | None:
        """Who holds the cell's claim ("host:pid:id"), if anyone."""
        try:
            holder = json.loads((self.cell_dir(cell) / CLAIM).read_text())
            return holder.get("owner") if isinstance(holder, dict) else None
        except (OSError, ValueError):
            return None

    def heartbeat(self) -> None:
        """Refresh every claim this runner holds."""
        for path in list(self.claimed):
            try:
                os.utime(path)
            except FileNotFoundError:
                self.claimed.discard(path)

    def release(self, cell: CellConfig) -> None:
        path = self.cell_dir(cell) / CLAIM
        if path in self.claimed:
            self.claimed.discard(path)
            path.unlink(missing_ok=True)

    def release_all(self) -> None:
        for path in list(self.claimed):
            path.unlink(missing_ok=True)
        self.claimed.clear()

    def cell_dir(self, cell: CellConfig) -> Path:
        return self.root / cell_hash(cell)

    def status(self, cell: CellConfig) -> str | None:
        """The recorded outcome ("finished", "diverged", "failed"), "damaged" if the cell's folder has
        a summary but does not hold up (`check`), or None if the cell has no result."""
        folder = self.cell_dir(cell)
        if not (folder / SUMMARY).exists():
            return None
        if self.check(folder):
            return DAMAGED
        return self.summary(cell).get("status")

    def summary(self, cell: CellConfig) -> dict:
        """The recorded summary, {} if none or unreadable."""
        try:
            return read_json_dict(self.cell_dir(cell) / SUMMARY)
        except (OSError, ValueError):
            return {}

    def check(self, folder: Path) -> list[Problem]:
        """What is wrong with a cell folder that has a summary: [] for an intact result."""
        return check_folder(Path(folder))

    def set_aside(self, cell: CellConfig) -> Path:
        """Move a damaged cell's folder to `_damaged/<hash>-<time>/` (kept for the user, never deleted)."""
        folder = self.cell_dir(cell)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = self.root / SET_ASIDE / f"{folder.name}-{stamp}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(folder, target)
        return target

    def checkpoint_path(self, cell: CellConfig) -> Path:
        """The cell's round checkpoint (pflbench.storage.checkpoint), there while it runs or after a kill."""

        return self.cell_dir(cell) / CHECKPOINT

    def remove_checkpoint(self, cell: CellConfig) -> None:
        self.checkpoint_path(cell).unlink(missing_ok=True)

    def write(self, cell: CellConfig, result: CellResult) -> Path:
        """Record a `CellResult` (status finished, diverged or failed); replaces an earlier result.
        `DiskFull` before anything is touched where the free space is less than the result's files need
        (and, where a write runs out of space all the same, with no result left: module doc)."""
        folder = self.cell_dir(cell)
        files = result_files(cell, result)
        needed, free = sum(map(len, files.values())), free_bytes(folder)
        if free is not None and free < needed:
            raise DiskFull(folder, needed, free)
        (folder / SUMMARY).unlink(missing_ok=True)  # from here until the new summary: no result
        for stale in (ERROR, METRICS, ROUNDS, *(p.name for p in folder.glob(".*.tmp"))):  # tmp: left by a kill
            (folder / stale).unlink(missing_ok=True)
        shutil.rmtree(folder / ARTIFACTS.parent, ignore_errors=True)
        summary = dict(
            result.summary,
            status=result.status,
            hash=cell_hash(cell),
            runner=self.owner,
            completed_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )
        if result.error:
            summary["error"] = result.error.strip().splitlines()[-1]
        summary["files"] = {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        }  # as file_record reads them back
        try:
            for name, data in files.items():
                atomic_write_bytes(folder / name, data)
            write_json(folder / SUMMARY, summary)  # last: the cell now has a result
        except DiskFull:  # no part of a result is left behind: the folder holds what it held before (a checkpoint)
            for name in files:
                (folder / name).unlink(missing_ok=True)
            shutil.rmtree(folder / ARTIFACTS.parent, ignore_errors=True)
            raise
        return folder


def result_files(cell: CellConfig, result: CellResult) -> dict[str, bytes]:
    """The files of a cell's result but its summary, by name in the cell's folder, as bytes (their
    size known before anything is written)."""
    config = {
        "hash": cell_hash(cell),
        "cell": cell.model_dump(mode="json"),
        "versions": {
            "pflbench": version("pflbench"),
            "torch": result.summary.get("torch", version("torch")),
            "python": platform.python_version(),
        },
        "dataset_checksum": result.summary.get("dataset_checksum"),
        **({"card": result.card} if getattr(result, "card", None) else {}),
    }
    files = {CONFIG: json_bytes(config)}
    if result.error:
        files[ERROR] = result.error.encode()
    files[METRICS], files[ROUNDS] = _parquet(result.metrics), _parquet(result.rounds)
    if result.artifacts:
        files[ARTIFACTS.as_posix()] = _npz(result.artifacts)
    return files


def json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()  # a file object: np.savez would append ".npz" to a path
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stubs: **arrays as its allow_pickle
    return buffer.getvalue()


def flatten(data: dict, prefix: str = "") -> dict:
    """{"hp": {"mu": 1}} -> {"hp.mu": 1}"""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_folder(folder: Path) -> list[Problem]:
    """The problems of one cell folder that has a summary (see the module doc); [] if intact."""

    def problem(kind: str, file: str, what: str) -> list[Problem]:
        return [Problem(kind, folder.name, file, what)]

    try:
        summary = read_json_dict(folder / SUMMARY)
    except OSError as err:
        return problem(DAMAGED, SUMMARY, f"unreadable ({err.strerror or err})")
    except ValueError as err:
        return problem(DAMAGED, SUMMARY, str(err))
    if not isinstance(summary.get("status"), str):
        return problem(DAMAGED, SUMMARY, "no status")
    try:
        config = read_json_dict(folder / CONFIG)
        cell = CellConfig.stored(config["cell"])
    except FileNotFoundError:
        return problem(DAMAGED, CONFIG, "missing")
    except OSError as err:
        return problem(DAMAGED, CONFIG, f"unreadable ({err.strerror or err})")
    except (ValueError, KeyError, TypeError) as err:  # pydantic's ValidationError is a ValueError
        return problem(DAMAGED, CONFIG, str(err).splitlines()[0] if str(err) else "not a cell configuration")
    if cell_hash(cell) != folder.name:
        return problem(
            "foreign",
            CONFIG,
            f"the folder's name is not the hash of the configuration inside "
            f"it ({cell_hash(cell)}): a copy or a stray folder, not read as a result",
        )
    manifest = summary.get("files")
    if isinstance(manifest, dict):
        found = []
        for name, record in manifest.items():
            path = folder / name
            if not path.is_file():
                found += problem(DAMAGED, name, "missing")
            elif not isinstance(record, dict) or path.stat().st_size != record.get("bytes"):
                found += problem(
                    DAMAGED,
                    name,
                    f"{path.stat().st_size} bytes, the summary recorded "
                    f"{record.get('bytes') if isinstance(record, dict) else '?'}",
                )
            elif file_record(path)["sha256"] != record.get("sha256"):
                found += problem(DAMAGED, name, "content changed since it was written (checksum differs)")
        return found
    return _check_by_reading(folder, summary)


def _check_by_reading(folder: Path, summary: dict) -> list[Problem]:
    """Cells written before the manifest existed: every file they must have is read whole."""
    found = []
    needed = [METRICS, ROUNDS] if summary["status"] in COMPLETE else []
    for name in needed:
        try:
            pd.read_parquet(folder / name)
        except FileNotFoundError:
            found.append(Problem(DAMAGED, folder.name, name, "missing"))
        except Exception as err:  # pyarrow raises several types for a damaged file
            found.append(Problem(DAMAGED, folder.name, name, f"unreadable ({type(err).__name__})"))
    if (folder / ARTIFACTS).exists():
        try:
            with zipfile.ZipFile(folder / ARTIFACTS) as archive:
                bad = archive.testzip()
            if bad is not None:
                found.append(Problem(DAMAGED, folder.name, ARTIFACTS.as_posix(), f"array {bad} is corrupt"))
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            found.append(Problem(DAMAGED, folder.name, ARTIFACTS.as_posix(), f"unreadable ({err})"))
    return found


def scan_store(results_dir: str | Path) -> tuple[list[tuple[Path, dict, dict]], list[Problem]]:
    """Every folder of the store with a summary: the intact ones as (folder, config, summary) and the
    problems of the others. Folders without a summary (a cell running, or killed) are neither."""
    intact: list[tuple[Path, dict, dict]] = []
    problems: list[Problem] = []
    root = Path(results_dir)
    if not root.is_dir():
        return intact, problems
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != SET_ASIDE):
        if not (folder / SUMMARY).exists():
            continue
        try:
            found = check_folder(folder)
            if not found:
                intact.append((folder, read_json_dict(folder / CONFIG), read_json_dict(folder / SUMMARY)))
        except FileNotFoundError:
            continue  # removed by a concurrent rerun of this cell
        except (OSError, ValueError) as err:  # changed under our feet: report, never crash
            found = [Problem(DAMAGED, folder.name, "", str(err))]
        problems += found
    return intact, problems


def store_problems(results_dir: str | Path) -> list[Problem]:
    """The damaged and foreign entries of a store (`pflbench store check`)."""
    return scan_store(results_dir)[1]


def load_store(results_dir: str | Path) -> pd.DataFrame:
    """One row per intact cell with a result: `hash`, the configuration's columns flattened
    (`algorithm`, ..., `partition_params.alpha`, `hp.mu`), the summary's columns (`status`,
    `final_accuracy`, ...; a summary key that is also a config key, like `model`, becomes
    `resolved_model`), `pflbench` (version), `path` and `null_fields` (the flattened configuration
    keys set to None, comma-separated: a frame shows None and an absent key alike, as NaN, where
    `hp.inner_steps: null` is a setting of its own). Cells without a summary (running or killed) are
    not included, nor damaged or foreign folders (`store_problems` lists those)."""
    rows = []
    for folder, config, summary in scan_store(results_dir)[0]:
        row = {"hash": folder.name, **flatten(config["cell"])}
        row["null_fields"] = ",".join(key for key, value in row.items() if value is None)
        for key, value in summary.items():
            if key == "files":
                continue
            row[f"resolved_{key}" if key in config["cell"] else key] = value
        row.update(pflbench=config.get("versions", {}).get("pflbench"), path=str(folder), card=config.get("card"))
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=["hash", "status"])
    return pd.DataFrame(rows)
