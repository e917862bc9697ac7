"""Results of grouped cells on Ray, relayed to the driver as each cell finishes.

A cell group (pflbench.simulator.groups) is one Ray task; its cells finish at different rounds. Were their results
only the task's return value, a finished cell would wait for the group's slowest to reach the store
(`pflbench status` would not show it), and a worker lost before the group's end would lose it: the
retry would run it again from its checkpoint. So the group's task hands each cell's result, as the cell
finishes, to a `ResultRelay`: a Ray actor on the driver's node (no CPU, beside the checkpoint keeper of
pflbench/run/checkpoint_relay.py), which the driver drains while it waits on its tasks and records each
result as it records a cell alone's. The task's return value then carries `RELAYED` in that cell's place.

Attempts, as the keeper's: the driver opens each attempt of a cell (`open`) before starting it, and the
relay takes one result per open attempt (`put` closes it). Before it retries a lost group the driver
closes the group's cells (`close`) and drains once more: what came in by then is recorded, and a late
`put` from the lost attempt (a call still in flight when its worker died) is refused, so a cell is
neither recorded twice nor recomputed once recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pflbench.api_types import CellResult

RELAYED = "relayed to the driver"  # a group task's outcome for a cell whose result went through the relay


class ResultRelay:
    """The driver node's side (a Ray actor): finished cells' results, by cell hash, until drained."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}  # cell hash -> the attempt whose result is awaited
        self.pending: list[tuple[str, CellResult]] = []

    def open(self, key: str, attempt: int) -> None:
        self.attempts[key] = attempt

    def close(self, key: str) -> None:
        self.attempts.pop(key, None)

    def put(self, key: str, attempt: int, result: CellResult) -> bool:
        """Keep `result` of attempt `attempt` of cell `key` for the driver; False (nothing kept): not the
        cell's open attempt, or one whose result came already."""
        if self.attempts.get(key) != attempt:
            return False
        del self.attempts[key]
        self.pending.append((key, result))
        return True

    def drain(self) -> list[tuple[str, CellResult]]:
        """The results put since the last drain, in the order they came."""
        pending, self.pending = self.pending, []
        return pending


def start_relay() -> Any:  # an actor handle
    """A ResultRelay as a Ray actor on the driver's node (no CPU): a lost node must not take it along."""
    import ray

    from pflbench.run.ray_cluster import on_driver_node

    actor = ray.remote(num_cpus=0, max_restarts=0)(ResultRelay)
    return actor.options(scheduling_strategy=on_driver_node()).remote()
