"""Telling a Ray worker that the kernel's OOM killer ended from another sudden death.

A memory limit on a shared cluster is a cgroup's (a Kubernetes pod's, a SLURM job's) or the machine's:
past it, the kernel kills a process (SIGKILL), and Ray reports that worker as it reports any worker that
died (WorkerCrashedError); Ray's own memory monitor, which names its kills (OutOfMemoryError), acts only
on the machine's memory and only when it is quicker than the kernel. The kernel counts its OOM kills:
per memory cgroup (cgroup v2: `oom_kill` in memory.events, kills of the cgroup's processes and its
descendants'; v1: `oom_kill` in memory.oom_control) and per machine (`oom_kill` in /proc/vmstat).

So a cell on a Ray worker posts, with each round's progress, where the count of its process's memory
cgroup is kept and its value (`OomKills.here`, read every round: a process may be moved to another
cgroup); when the worker dies, the runner reads that count again on the worker's node (`rose`): if it
rose since the worker's last round, the worker was killed for memory (or, at the same moment, another
process of its cgroup was), and the cell is "out of memory (peak N MB)". Where no memory cgroup counts
(no cgroup file readable), the machine's count is used: any process's OOM kill on that machine in that
window would then be taken for the worker's. A worker that dies before its first round's report, or
whose node is gone, is not told apart ("Ray worker lost").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def count_file() -> Path | None:
    """The file that counts OOM kills of this process's memory cgroup, else the machine's (None: neither)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if "memory" in controllers.split(","):  # cgroup v1's memory hierarchy
            candidates.append(CGROUP_ROOT / "memory" / relative / "memory.oom_control")
        elif controllers == "":  # cgroup v2, mounted alone or beside v1 ("unified")
            candidates += [
                CGROUP_ROOT / relative / "memory.events",
                CGROUP_ROOT / "unified" / relative / "memory.events",
            ]
    for candidate in [*candidates, VMSTAT]:
        if read_count(candidate) is not None:
            return candidate
    return None


def read_count(path: str | Path) -> int | None:
    """The `oom_kill N` count in `path` (None: not there, or unreadable)."""
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class OomKills:
    """A count of OOM kills (`count` in `path`) on Ray node `node`, as a cell's worker read it."""

    node: str
    path: str
    count: int

    @classmethod
    def here(cls) -> OomKills | None:
        """This process's count, now (on a Ray worker or driver)."""
        import ray

        path = count_file()
        count = read_count(path) if path is not None else None
        if count is None:
            return None
        return cls(ray.get_runtime_context().get_node_id(), str(path), count)

    def rose(self, timeout: float = 5.0) -> bool:
        """Whether the count rose since it was read: read on its node (here on the driver's, else by a task
        pinned there; False where that node is gone or does not answer within `timeout` seconds)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.node == ray.get_runtime_context().get_node_id():
            now = read_count(self.path)
        else:
            if not any(node["NodeID"] == self.node and node["Alive"] for node in ray.nodes()):
                return False
            task = ray.remote(num_cpus=0, max_retries=0)(read_count).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=self.node, soft=False)
            )
            try:
                now = ray.get(task.remote(self.path), timeout=timeout)
            except (ray.exceptions.RayError, TimeoutError):
                return False
        return now is not None and now > self.count
