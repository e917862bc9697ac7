"""Joining Ray: a local instance or an existing cluster, for the runner and the sweep alike."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pflbench.run.spec_schema import Resources


class ClusterError(RuntimeError):
    """The Ray cluster named cannot be reached or joined; nothing has run."""


RAY_CONNECT_TIMEOUT = 5.0  # seconds to reach a cluster's address before giving up


def join_cluster(address: str, settings: dict) -> None:
    """Connect to the Ray cluster at `address`, failing within seconds with a clear message where
    Ray itself would wait for minutes (nothing listening) or raise an authentication error.

    Token authentication: a cluster started by `ray start --head` on a machine that has a Ray token
    (`~/.ray/auth_token`, $RAY_AUTH_TOKEN or $RAY_AUTH_TOKEN_PATH) requires it, and Ray's client only
    sends it when RAY_AUTH_MODE=token. When RAY_AUTH_MODE is not set and such a token exists, it is
    set here for this process and its workers, so the documented command works as written."""
    import socket

    import ray

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if address not in ("auto", "local") and host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT).close()
        except OSError as err:
            raise ClusterError(
                f"cannot reach a Ray cluster at {address} ({err.strerror or err}); start one with "
                f"`ray start --head --port={port}` or check --ray-address / $RAY_ADDRESS"
            ) from None
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray read its configuration at import: make it see the mode (what Ray's own CLI does)
            from ray._raylet import Config  # type: ignore[attr-defined]  # compiled: its stub lacks Config

            Config.initialize("")
        except Exception:  # a Ray without this hook: the environment variable is all we can do
            pass
    try:
        ray.init(address=address, **settings)
    except Exception as err:  # Ray raises ConnectionError, AuthenticationError, RuntimeError, ...
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        hint = (
            " The cluster asks for token authentication: give this runner the cluster's token "
            "($RAY_AUTH_TOKEN or ~/.ray/auth_token) and RAY_AUTH_MODE=token."
            if "auth" in type(err).__name__.lower() or "RAY_AUTH" in str(err)
            else ""
        )
        raise ClusterError(f"cannot join the Ray cluster at {address}: {detail}.{hint}") from None


def connect_ray(address: str | None, workers: int | None, cpus_per_cell: float) -> bool:
    """Connect to Ray: the cluster at `address` (else $RAY_ADDRESS), else a local instance sized for
    `workers` cells of `cpus_per_cell` CPUs (None: all CPUs). True when this call started (and so the
    caller must stop) the instance; an instance already initialized in this process (e.g. by a test)
    is used as it is."""
    import ray

    if ray.is_initialized():
        return False
    settings: dict[str, Any] = dict(
        log_to_driver=False, logging_level=logging.WARNING
    )  # cell output lives in the store
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        join_cluster(address, settings)
    else:
        cpus = None if workers is None else max(1, int(workers * cpus_per_cell + 0.999))
        # Workers at the driver's priority, not Ray's default niceness 15: beside other work at niceness 0
        # (a shared machine) a cell on a worker at 15 gets ~1/30 of a core, while the same cell run
        # in-process (--no-ray) gets its share (docs/faults.md, "Ray workers' priority").
        ray.init(num_cpus=cpus, include_dashboard=False, _system_config={"worker_niceness": 0}, **settings)
    return True


def ray_capacity(cluster: dict, resources: Resources) -> int:
    """How many cells of `resources` the cluster can run at once (0 if it says nothing)."""
    fits = [int(cluster.get("CPU", 0) // resources.cpus)]
    if resources.gpus > 0:
        fits.append(int(cluster.get("GPU", 0) // resources.gpus))
    return max(0, min(fits))


def task_resources(resources: Resources) -> dict[str, Any]:
    """What a cell's Ray task asks for: its CPUs and its GPU fraction (8 cells of 1/8 share one GPU;
    Ray sets each task's CUDA_VISIBLE_DEVICES to the GPU it was given, so the cell's "cuda" is that GPU).
    Retries are the runner's own (max_retries=0), so that each is said and bounded."""
    return {"num_cpus": resources.cpus, "num_gpus": resources.gpus, "max_retries": 0}


def on_driver_node() -> NodeAffinitySchedulingStrategy:
    """A scheduling strategy that places an actor on this process's (the driver's) node and nowhere
    else: the runner's progress board and checkpoint keeper must not live, and die, on a worker node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def this_node() -> str:
    """This process's machine, for messages: host name and Ray node address where Ray runs here."""
    import socket

    try:
        import ray

        address = ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # not in a Ray process
        address = None
    host = socket.gethostname()
    return f"{host} ({address})" if address else host
