"""Round checkpoints: a long cell killed at round 590 of 600 continues from its last checkpoint.

The round loop (`run_rounds`) asks a `Checkpointer` once, after `algorithm.setup()`, for a state to
resume (`resume`), and calls it at the end of every round (`after_round`); nothing else in the loop
knows about checkpoints. A checkpoint holds everything the rest of the cell depends on:

- the algorithm's state, as its class declares it (`Algorithm.state_dict()`: the attributes named in
  `state`, `state_objects`; models, personal parts, hypernetworks and their optimizer moments, routings,
  affinities, counters, ...; an attribute declared nowhere makes the cell run on without checkpoints,
  saying which);
- the Federation's mutable state (the privacy knob's release counts);
- what the loop has recorded so far (per-round and per-client rows, artifacts, ...) and the cell's
  wall time so far (the resumed run's clock continues from it);
- the random state not derived from (seed, round, client): torch's, numpy's and Python's global
  generators (e.g. dropout draws from torch's).
Resuming from it gives the uninterrupted run's metrics and summary bit for bit (timings excepted):
tests/test_checkpoint.py checks this for every registered algorithm.

The file, `<store>/<hash>/checkpoint.pt`: one header line of JSON (format, the cell's hash, the code
version, the execution path, the round, the payload's size and SHA-256, who wrote it) and the payload
(torch.save). It is written atomically (temporary file, fsync, rename), so a kill at any moment leaves
the previous checkpoint or the new one; only the latest is kept. A checkpoint that is damaged
(checksum, truncation), from another configuration, code version, dataset content or execution path
(device, batched or loop path, compiled step, memory layout: each gives other float rounding) is
set aside into `<store>/_damaged/` with one line saying why, and the cell starts over. A cell on a Ray
worker keeps it in the driver's store, through the driver's node (`Checkpointer(files=...)`,
pflbench/run/checkpoint_relay.py): the same bytes, checks and atomic write.

Kept copies: with `keep_from` = r > 0, every checkpoint written at round r or later is also copied to
`<store>/_kept/<hash>/round-NNNN.pt` (the same bytes; never removed by pflbench), to go back to the
models of chosen rounds (e.g. `benchmarks/analysis/branch.py`); the store's cells ignore that folder.

When: every `every` rounds, and at least every `minutes` of wall time (defaults: by time only, every
5 minutes, so a cell that takes under a minute never writes one, and the write's cost stays a small
share of a long cell's time: measured in docs/measurements/index.md). The last round writes none (the result follows).
Preemption (pflbench/run/preemption.py): given a `Preemption`, the end of every round asks whether a
SIGTERM or Ctrl-C arrived; if so, a checkpoint of that round is written whatever the policy says, and
`Preempted` is raised (the runner stops there; the next run resumes at that round). At the last round
no checkpoint is written: the cell finishes and its result is written as usual.
The code version is a hash of the source files that compute a cell (`source_files`: what the round loop,
the cell groups' runner and the algorithm import, read from the source; their names inside the checkout
and their contents, so a node whose checkout lives elsewhere resumes too) and of the torch / numpy /
Python versions: a change to that code retires its checkpoints, a change to the run machinery alone
(runner, store, CLI, reports) does not, so a checkpoint carried between machines or GPU loans resumes
across unrelated commits. Why this and not a worktree pinned for carried cells: a pinned tree would have
to travel beside the current one (twice the source on a 64 MiB carry) and would run carried cells without
the fixes and speed-ups made since; the hash keeps the guarantee that matters (resumed = uninterrupted, bit
for bit) by retiring exactly the checkpoints whose computing code changed.
The payload is unpickled with `weights_only=False` after its checksum is verified: it is this
store's own file (a store from elsewhere is as trusted as the code you run it with).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pflbench.algorithm import AnyAlgorithm
    from pflbench.simulator.federation import Federation

from pflbench.config import CellConfig, cell_hash
from pflbench.run.preemption import Preempted, StopRequest
from pflbench.storage.code_version import code_version, execution_path, same_path
from pflbench.storage.store import CHECKPOINT, KEPT, DiskFull, atomic_write

MAGIC = b"PFLBENCH-CHECKPOINT"


FORMAT = 1


DEFAULT_MINUTES = 5.0


class CheckpointProblem(ValueError):
    """Why a checkpoint cannot be resumed from (one line)."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a running cell writes a checkpoint (module doc). `every`: rounds between checkpoints (0:
    by time only); `minutes`: at most this much wall time between checkpoints (0: not by time);
    `keep`: leave the last checkpoint in place when the cell finishes; `keep_from`: also keep a copy of
    every checkpoint written at this round or later (0: none; module doc)."""

    every: int = 0
    minutes: float = DEFAULT_MINUTES
    keep: bool = False
    keep_from: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 0:
            raise ValueError(
                f"checkpoint every must be a whole number of rounds >= 0 (0: by time only), got {self.every!r}"
            )
        if not self.minutes >= 0:
            raise ValueError(f"checkpoint minutes must be >= 0 (0: not by time), got {self.minutes!r}")
        if not isinstance(self.keep_from, int) or isinstance(self.keep_from, bool) or self.keep_from < 0:
            raise ValueError(f"keep checkpoints from must be a round >= 1 (0: keep none), got {self.keep_from!r}")

    def due(self, rnd: int, rounds: int, since_last: float) -> bool:
        if rnd >= rounds:
            return False
        return bool(self.every and rnd % self.every == 0) or bool(self.minutes and since_last >= 60 * self.minutes)


@dataclass
class Resumed:
    """What `Checkpointer.resume` hands back to the round loop."""

    round: int
    elapsed: float  # the cell's wall time up to the checkpoint
    loop: dict  # the loop's records, as it gave them to `after_round`


def random_state(device: torch.device) -> dict:
    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"].cpu())  # generator states live on the CPU, whatever map_location did
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def federation_state(fed: Federation) -> dict[str, Any]:
    """What rounds change in the Federation: the privacy plan's counters (its other fields too, all
    drawn from the seed; small)."""
    from pflbench.algorithm import check_capturable

    if fed.privacy is None:
        return {}
    values = {k: v for k, v in vars(fed.privacy).items() if k != "params"}
    check_capturable(values, "Federation.privacy")
    return {"privacy": values}


def load_federation_state(fed: Federation, state: dict[str, Any]) -> None:
    if ("privacy" in state) != (fed.privacy is not None):
        raise CheckpointProblem("its privacy knob does not match this cell's")
    for key, value in state.get("privacy", {}).items():
        setattr(fed.privacy, key, value)


def encode_checkpoint(header: dict, payload: dict) -> bytes:
    """The checkpoint file's bytes: one header line (with the payload's size and SHA-256), then the payload."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    header = {**header, "format": FORMAT, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    return MAGIC + b" " + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def write_checkpoint_bytes(path: Path, data: bytes) -> None:
    """Write a checkpoint's bytes atomically (temporary file in the same folder, fsync, rename); for lack
    of space, `DiskFull` (pflbench/storage/store.py) with the bytes needed, the previous checkpoint untouched."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())  # the rename must never expose a file the disk does not hold yet

    try:
        atomic_write(Path(path), write)
    except DiskFull as full:
        raise full.needing(len(data)) from None


def write_checkpoint(path: Path, header: dict, payload: dict) -> int:
    """Write atomically (temporary file in the same folder, fsync, rename); returns the file's bytes."""
    data = encode_checkpoint(header, payload)
    write_checkpoint_bytes(path, data)
    return len(data)


def parse_header(line: bytes) -> dict:
    """The header of a checkpoint from its first line (newline included); CheckpointProblem (one line)
    if it is not one."""
    if not line.startswith(MAGIC + b" ") or not line.endswith(b"\n"):
        raise CheckpointProblem("damaged: no checkpoint header")
    try:
        header = json.loads(line[len(MAGIC) + 1 :])
    except (ValueError, UnicodeDecodeError):
        raise CheckpointProblem("damaged: unreadable header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointProblem(
            f"format {header.get('format') if isinstance(header, dict) else '?'} is not this code's ({FORMAT})"
        )
    header["header_bytes"] = len(line)
    return header


def read_header(path: Path) -> dict:
    """The header of a checkpoint file; CheckpointProblem (one line) if it is not one."""
    with open(path, "rb") as file:
        return parse_header(file.readline(1 << 16))


def decode_header(data: bytes) -> dict:
    """The header of a checkpoint given as bytes (`encode_checkpoint`'s); CheckpointProblem if none."""
    end = data.find(b"\n", 0, 1 << 16)
    return parse_header(data[: end + 1] if end >= 0 else data[: 1 << 16])


def verify_checkpoint(data: bytes) -> tuple[dict, bytes]:
    """Header and payload bytes of a checkpoint, its size and checksum verified; CheckpointProblem otherwise."""
    header = decode_header(data)
    body = data[header["header_bytes"] :]
    if len(body) != header.get("bytes"):
        raise CheckpointProblem(f"damaged: {len(body)} bytes of payload, the header says {header.get('bytes')}")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CheckpointProblem("damaged: checksum differs")
    return header, body


def verify_checkpoint_file(path: Path) -> dict:
    """The header of the checkpoint file at `path`, its payload's size and checksum verified as
    `verify_checkpoint` does, reading the file in pieces; CheckpointProblem (one line) otherwise."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as file:
        header = parse_header(file.readline(1 << 16))
        while piece := file.read(1 << 20):
            digest.update(piece)
            size += len(piece)
    if size != header.get("bytes"):
        raise CheckpointProblem(f"damaged: {size} bytes of payload, the header says {header.get('bytes')}")
    if digest.hexdigest() != header.get("sha256"):
        raise CheckpointProblem("damaged: checksum differs")
    return header


def decode_checkpoint(data: bytes, device: torch.device | str = "cpu") -> tuple[dict, dict]:
    """Header and payload of a checkpoint given as bytes (tensors on `device`, loaded there directly so
    that tensors sharing storage still share it), verified (`verify_checkpoint`); CheckpointProblem otherwise."""
    import torch

    header, body = verify_checkpoint(data)
    try:
        payload = torch.load(io.BytesIO(body), map_location=device, weights_only=False)
    except Exception as err:  # unpickling a damaged payload raises many types
        raise CheckpointProblem(f"damaged: unreadable payload ({type(err).__name__})") from None
    return header, payload


def read_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[dict, dict]:
    """Header and payload of a checkpoint file, verified (`decode_checkpoint`); CheckpointProblem otherwise."""
    return decode_checkpoint(Path(path).read_bytes(), device)


class CheckpointFile:
    """Where one cell's checkpoint is kept: `path`, in a folder this process can write (the store's
    own folder when the cell runs where the store is). The Checkpointer reads, writes, keeps copies and
    sets aside through these five methods only, so that a cell on a Ray worker of another machine can keep its
    checkpoint in the driver's store instead (pflbench/run/checkpoint_relay.py)."""

    def __init__(self, path: Path, set_aside_dir: Path) -> None:
        self.path, self.set_aside_dir = Path(path), Path(set_aside_dir)

    def read(self) -> bytes | None:
        """The checkpoint's bytes, or None where there is none. A temporary file left by a write that
        a kill cut is removed first (it never is a checkpoint)."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        write_checkpoint_bytes(self.path, data)

    def keep(self, rnd: int, data: bytes) -> str:
        """A copy of a checkpoint's bytes as `<store>/_kept/<hash>/round-NNNN.pt` (module doc); its path."""
        target = self.path.parent.parent / KEPT / self.path.parent.name / f"round-{rnd:04d}.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_checkpoint_bytes(target, data)
        return str(target)

    def set_aside(self, reason: str) -> str:
        """Move the checkpoint into `set_aside_dir` (never deleted), with its reason beside it; where it went."""
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = self.set_aside_dir / f"{self.path.parent.name}-checkpoint-{stamp}.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path, target)
        target.with_suffix(".why.txt").write_text(reason + "\n")
        return str(target)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class Checkpointer:
    """The checkpoint of one cell at `folder/checkpoint.pt` (module doc). `note` receives the lines a
    user should see (resumed, set aside); `set_aside_dir` is where unusable checkpoints are kept.
    `files`: where the checkpoint is read and written (default: `CheckpointFile(folder/checkpoint.pt,
    set_aside_dir)`, this machine's files; a Ray worker gets the driver's store, pflbench/run/checkpoint_relay.py).
    `preemption`: where a stop on SIGTERM / Ctrl-C is asked for (module doc; None: never)."""

    def __init__(
        self,
        folder: Path,
        cell: CellConfig,
        policy: CheckpointPolicy = CheckpointPolicy(),
        set_aside_dir: Path | None = None,
        note: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        files: CheckpointFile | None = None,
        preemption: StopRequest | None = None,
    ) -> None:
        self.folder, self.cell, self.policy = Path(folder), cell, policy
        self.path = self.folder / CHECKPOINT
        self.set_aside_dir = Path(set_aside_dir) if set_aside_dir is not None else self.folder.parent / "_damaged"
        self.files = files if files is not None else CheckpointFile(self.path, self.set_aside_dir)
        self.note = note or (lambda text: None)
        self.clock = clock
        self.seconds = 0.0  # spent writing checkpoints, over the runs of this cell (a resumed run adds to them)
        self.written = 0
        self.last_bytes = 0
        self.resumed_from: int | None = None
        self.dataset_checksum: str | None = None  # the cell's data, from `resume`
        self.error: str | None = None  # why this cell cannot be checkpointed (StateError), once found
        self.preemption = preemption
        self.rounds_done = 0  # the last round that ended (or the round resumed at)
        self.latest_round: int | None = None  # the round of the checkpoint a next run would resume from
        self._last = clock()

    # -- start of the cell --
    def resume(self, fed: Federation, algorithm: AnyAlgorithm, provenance: dict | None = None) -> Resumed | None:
        """After `algorithm.setup()`: load the checkpoint into `algorithm` and `fed` and return the
        loop's records, or None to start from round 1 (no checkpoint, or one set aside).
        `provenance["dataset_checksum"]`, where given, must match the checkpoint's (data re-prepared
        under the same name is another run)."""
        self._last = self.clock()
        self.dataset_checksum = (provenance or {}).get("dataset_checksum")
        # The code version reads and parses the source (cached): at the start, never first inside a save
        # that a preemption deadline (SIGALRM raising between bytecodes) may interrupt mid-parse.
        code_version(type(algorithm))
        data = self.files.read()
        if data is None:
            return None
        before = set(vars(algorithm))
        try:
            return self._load(data, fed, algorithm)
        except CheckpointProblem as problem:
            reason = str(problem)
        except Exception as err:  # a payload that does not fit this algorithm (StateError, KeyError, ...)
            reason = f"does not fit this algorithm ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})"
        for name in set(vars(algorithm)) - before:  # undo a partial load: a fresh setup() from round 1
            delattr(algorithm, name)
        algorithm.setup()
        kept = self.set_aside(reason)
        self.note(f"checkpoint set aside ({reason}); kept as {kept}; the cell starts over")
        return None

    def _load(self, data: bytes, fed: Federation, algorithm: AnyAlgorithm) -> Resumed:
        header = decode_header(data)
        if header.get("hash") != cell_hash(self.cell):
            raise CheckpointProblem(f"from another configuration ({header.get('hash')})")
        version = code_version(type(algorithm))
        if header.get("code") != version:
            raise CheckpointProblem(f"from another code version ({header.get('code')}, this code {version})")
        path = execution_path(fed)
        if not same_path(header.get("execution"), path):
            raise CheckpointProblem(f"from another execution path ({header.get('execution')}, this run {path})")
        if header.get("dataset_checksum") != self.dataset_checksum:
            raise CheckpointProblem(
                f"from other data (dataset checksum {header.get('dataset_checksum')}, this run {self.dataset_checksum})"
            )
        if not isinstance(header.get("round"), int) or not 1 <= header["round"] < self.cell.rounds:
            raise CheckpointProblem(f"damaged: round {header.get('round')!r} of {self.cell.rounds}")
        header, payload = decode_checkpoint(data, fed.device)
        if payload.get("round") != header["round"]:
            raise CheckpointProblem("damaged: header and payload disagree on the round")
        algorithm.load_state_dict(payload["algorithm"])
        load_federation_state(fed, payload["federation"])
        set_random_state(payload["random"])  # last: nothing after it draws before round r + 1
        self.resumed_from = self.rounds_done = self.latest_round = header["round"]
        self.seconds, self.written = payload["checkpoint_seconds"], payload["checkpoints_written"]
        self.note(f"resumed at round {header['round']} of {self.cell.rounds}")
        return Resumed(header["round"], float(payload["elapsed"]), payload["loop"])

    # -- end of each round --
    def after_round(self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float) -> None:
        """Write a checkpoint after round `rnd` if the policy says it is due. `loop`: the loop's
        records so far (handed back by `resume`); `elapsed`: the cell's wall time so far."""
        from pflbench.algorithm import StateError

        self.rounds_done = rnd
        if self.preemption is not None and self.preemption.requested:
            self.preemption.round_ended()
            if rnd < self.cell.rounds:
                self._preempted(rnd, fed, algorithm, loop, elapsed)
        now = self.clock()
        if self.error is not None or not self.policy.due(rnd, self.cell.rounds, now - self._last):
            return
        try:
            self.save(rnd, fed, algorithm, loop, elapsed)
        except StateError as err:  # the algorithm breaks the state contract: say so, and run on without
            self.error = str(err)
            self.note(f"no checkpoints for this cell: {err}")

    def _preempted(self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float) -> None:
        """A stop was asked for (module doc): a checkpoint of round `rnd`, then `Preempted`."""
        from pflbench.algorithm import StateError

        if self.error is None:
            try:
                self.save(rnd, fed, algorithm, loop, elapsed)
            except StateError as err:
                self.error = str(err)
        signal = self.preemption.signal if self.preemption is not None else None  # asked for: `after_round` saw it
        raise Preempted(signal or "signal", rounds_done=rnd, resumes_at=self.latest_round, checkpoint_error=self.error)

    def save(self, rnd: int, fed: Federation, algorithm: AnyAlgorithm, loop: dict, elapsed: float) -> None:
        start = self.clock()
        payload = {
            "round": rnd,
            "algorithm": algorithm.state_dict(),
            "federation": federation_state(fed),
            "loop": loop,
            "elapsed": elapsed,
            "random": random_state(fed.device),
            "checkpoint_seconds": self.seconds,
            "checkpoints_written": self.written + 1,
        }
        header = {
            "hash": cell_hash(self.cell),
            "code": code_version(type(algorithm)),
            "round": rnd,
            "rounds": self.cell.rounds,
            "execution": execution_path(fed),
            "dataset_checksum": self.dataset_checksum,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        data = encode_checkpoint(header, payload)
        self.files.write(data)
        if self.policy.keep_from and rnd >= self.policy.keep_from:
            self.files.keep(rnd, data)
        self.last_bytes = len(data)
        self.latest_round = rnd
        self.written += 1
        self._last = self.clock()
        self.seconds += self._last - start

    def summary(self) -> dict:
        """For the cell's summary: the time checkpoints cost (all runs of the cell up to its result,
        as its wall time counts them; the write of the checkpoint a run resumed from is not counted),
        how many were written, the size of the last, and the round this run resumed at."""
        return {
            "checkpoint_seconds": self.seconds,
            "checkpoints_written": self.written,
            "checkpoint_bytes": self.last_bytes,
            "resumed_from_round": self.resumed_from,
            **({"checkpoint_error": self.error} if self.error else {}),
        }

    # -- housekeeping --
    def set_aside(self, reason: str) -> str:
        """Move the checkpoint into the set-aside folder (never deleted), with its reason beside it."""
        return self.files.set_aside(reason)

    def remove(self) -> None:
        self.files.remove()


def describe_checkpoints(results_dir: str | Path, entries: list[dict] | None = None) -> list[str]:
    """`pflbench store check`'s lines about checkpoints: one per cell that has one (`entries`: the store's
    `list_checkpoints`, where the caller has it)."""
    lines = []
    for entry in list_checkpoints(results_dir) if entries is None else entries:
        if entry["problem"]:
            lines.append(f"checkpoint: {entry['hash']}/{CHECKPOINT}: {entry['problem']} (set aside when the cell runs)")
        else:
            lines.append(
                f"checkpoint: {entry['hash']} at round {entry['round']} of {entry['rounds']} "
                f"({entry['bytes'] / 1e6:.1f} MB, written {entry['written_at']}); the next run continues it"
            )
    return lines


def list_checkpoints(results_dir: str | Path) -> list[dict]:
    """The cells of a store with a checkpoint: {hash, round, rounds, written_at, bytes, problem}
    (`pflbench store check`); each file is read whole, its size and checksum verified (a checkpoint the
    next run would set aside has a problem)."""
    root = Path(results_dir)
    found: list[dict[str, Any]] = []
    if not root.is_dir():
        return found
    for path in sorted(root.glob(f"*/{CHECKPOINT}")):
        entry = {"hash": path.parent.name, "path": str(path), "bytes": path.stat().st_size}
        try:
            header = verify_checkpoint_file(path)
            entry.update(
                round=header.get("round"),
                rounds=header.get("rounds"),
                written_at=header.get("written_at"),
                problem=None if header.get("hash") == path.parent.name else "from another configuration",
            )
        except (OSError, CheckpointProblem) as err:
            entry.update(round=None, rounds=None, written_at=None, problem=str(err))
        found.append(entry)
    return found
