"""Round checkpoints of cells on Ray workers, kept in the driver's store.

A cell on a Ray worker reads and writes its round checkpoint through a `CheckpointKeeper`: a Ray actor
that the runner starts on the driver's own node (no CPU), which keeps it in the driver's store with the
same atomic, checksummed write as a cell run in the driver's process (`pflbench.storage.checkpoint.CheckpointFile`).
A retry reads the checkpoint back through the keeper wherever it lands. So a lost node takes none of
its cells' checkpoints with it, and a cluster needs no shared folder: the store is the driver's, for
results and checkpoints alike.

Why through Ray rather than a storage location given by URI (pyarrow.fs / fsspec: NFS, S3, GCS):
- it needs nothing a Ray cluster does not have: no bucket, no credentials or shared mount on every
  node; the checkpoints stay where the results are (`pflbench store check` lists them, the driver
  removes them when it writes the result, a damaged one goes to the store's `_damaged/`);
- one writer per store: the driver's node writes results and checkpoints, so no node's view of a
  network folder, its clock or a file it half wrote can confuse a resume;
- the guarantees are the local ones, end to end: the worker encodes the checkpoint (a header with the
  payload's size and SHA-256), the keeper verifies both before writing (what crossed the network is
  what was encoded), then writes atomically with fsync; a resuming worker verifies them again, and a
  damaged checkpoint is set aside with its reason;
- the price is the checkpoint's bytes crossing to the driver's node, once per checkpoint, and the
  write is synchronous (when `save` returns, the checkpoint is on the driver's disk): measured in
  docs/measurements/index.md.
What it does not cover: losing the driver's node, which holds the store (and ends the run anyway). A
storage URI would cover that too, at the price of the infrastructure above.

Attempts: the runner opens each attempt of a cell (`open`) before starting it and closes the cell
(`close`) before recording its result. The keeper writes (or sets aside) only for the cell's open
attempt: a late write from a lost attempt (a call still in flight when its worker died, a worker cut
off from the cluster) can neither replace a newer round nor leave a checkpoint behind a finished cell.

A sweep's trials (pflbench/tuning/sweep.py) keep theirs in the same keeper, started by `pflbench sweep` on its
driver's node over `<sweep folder>/checkpoints/`, by trial id. Ray Tune, not the driver's code, restarts
a trial whose worker or node was lost, so each start of a trial opens its own attempt (`begin`): the
latest start owns the trial's checkpoint, and an earlier, lost one's late write is refused the same way.
A trial's id is not its cell's hash (two trials may sample the same values), so `begin` names the hash
its checkpoints must carry.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pflbench.storage.checkpoint import CheckpointFile, CheckpointProblem, verify_checkpoint
from pflbench.storage.store import CHECKPOINT, SET_ASIDE


class StaleAttempt(RuntimeError):
    """A checkpoint write from an attempt of a cell that is not its current one."""


class CheckpointKeeper:
    """The driver node's side (a Ray actor): the checkpoints of a store's cells, by cell hash."""

    def __init__(self, store_root: str) -> None:
        self.root = Path(store_root)
        self.host = socket.gethostname()
        self.attempts: dict[str, int] = {}  # cell hash (or trial id) -> the attempt allowed to write
        self.begun: dict[str, int] = {}  # trial id -> the last attempt `begin` opened
        self.cells: dict[str, str] = {}  # trial id -> the cell hash its checkpoints carry (a cell's key is its hash)

    def _file(self, key: str) -> CheckpointFile:
        return CheckpointFile(self.root / key / CHECKPOINT, self.root / SET_ASIDE)

    def _check(self, key: str, attempt: int) -> None:
        if self.attempts.get(key) != attempt:
            current = self.attempts.get(key)
            raise StaleAttempt(
                f"checkpoint of cell {key}: attempt {attempt} is not the cell's current one "
                f"({'closed' if current is None else current}); nothing written"
            )

    def open(self, key: str, attempt: int) -> None:
        self.attempts[key] = attempt

    def begin(self, key: str, cell: str) -> int:
        """Open the next attempt of `key` (a sweep's trial, module doc), whose checkpoints carry cell hash
        `cell`, and return its number: from now on only this attempt writes `key`'s checkpoint."""
        attempt = self.begun[key] = self.begun.get(key, -1) + 1
        self.cells[key] = cell
        self.open(key, attempt)
        return attempt

    def close(self, key: str) -> None:
        self.attempts.pop(key, None)

    def read(self, key: str) -> bytes | None:
        return self._file(key).read()

    def write(self, key: str, attempt: int, data: bytes) -> None:
        self._check(key, attempt)
        try:
            header, _ = verify_checkpoint(data)
        except CheckpointProblem as problem:
            raise CheckpointProblem(f"checkpoint of cell {key} arrived {problem}; nothing written") from None
        if header.get("hash") != self.cells.get(key, key):
            sent_as = f"trial {key}'s (cell {self.cells[key]})" if key in self.cells else f"cell {key}'s"
            raise CheckpointProblem(f"a checkpoint of cell {header.get('hash')} sent as {sent_as}; nothing written")
        self._file(key).write(data)

    def keep(self, key: str, attempt: int, rnd: int, data: bytes) -> str:
        self._check(key, attempt)
        return f"{self.host}:{self._file(key).keep(rnd, data)}"

    def set_aside(self, key: str, attempt: int, reason: str) -> str:
        self._check(key, attempt)
        return f"{self.host}:{self._file(key).set_aside(reason)}"

    def remove(self, key: str, attempt: int) -> None:
        self._check(key, attempt)
        self._file(key).remove()


def start_keeper(store_root: Path) -> Any:  # an actor handle
    """The keeper of `store_root` (absolute: the driver's store) as a Ray actor on the driver's node."""
    import ray

    from pflbench.run.ray_cluster import on_driver_node

    actor = ray.remote(num_cpus=0, max_restarts=0)(CheckpointKeeper)
    return actor.options(scheduling_strategy=on_driver_node()).remote(str(Path(store_root).absolute()))


class RelayedCheckpointFile:
    """The worker's side: one attempt of one cell, `CheckpointFile`'s interface over the keeper."""

    def __init__(self, keeper: Any, key: str, attempt: int) -> None:
        self.keeper, self.key, self.attempt = keeper, key, attempt

    def read(self) -> bytes | None:
        import ray

        return ray.get(self.keeper.read.remote(self.key))

    def write(self, data: bytes) -> None:
        import ray

        ray.get(self.keeper.write.remote(self.key, self.attempt, data))

    def keep(self, rnd: int, data: bytes) -> str:
        import ray

        return ray.get(self.keeper.keep.remote(self.key, self.attempt, rnd, data))

    def set_aside(self, reason: str) -> str:
        import ray

        return ray.get(self.keeper.set_aside.remote(self.key, self.attempt, reason))

    def remove(self) -> None:
        import ray

        ray.get(self.keeper.remove.remote(self.key, self.attempt))
