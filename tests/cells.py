"""Small cells on the generated Synthetic dataset, shared by the algorithm tests. The defaults are
the ones the tests' thresholds were measured with; each test file overrides what it needs."""

import numpy as np

from pflbench.simulator.execution import ExecutionOptions
from pflbench.algorithm import get_algorithm
from pflbench.config import CellConfig
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import prepare_cell, run_cell, with_server

SMALL_CELL = dict(
    algorithm="fedavg",
    dataset="synthetic",
    dataset_options={"num_samples": 1000},
    partition="pathological",
    partition_params={"classes_per_client": 3},
    clients=5,
    rounds=3,
    local_epochs=1,
    batch_size=16,
    lr=0.05,
    seed=0,
)


def small_cell(**overrides) -> CellConfig:
    return CellConfig(**{**SMALL_CELL, **overrides})


def federation(cell: CellConfig, data_root) -> Federation:
    """The cell's federation, batched or looped as its algorithm allows."""
    dataset, splits = prepare_cell(cell, data_root)
    return Federation(cell, dataset, splits, algorithm_batched=get_algorithm(cell.algorithm).capabilities.batched)


def assert_batched_matches_loop(cell: CellConfig, data_root, device: str | None = None) -> None:
    """The batched path and the client loop give the same run (up to float rounding) and the same bytes."""
    on = run_cell(cell, data_root=data_root, execution=ExecutionOptions(device=device, client_batching="on"))
    off = run_cell(cell, data_root=data_root, execution=ExecutionOptions(device=device, client_batching="off"))
    assert on.summary["client_batching"] == "batched" and off.summary["client_batching"] == "loop"
    np.testing.assert_allclose(on.metrics["accuracy"], off.metrics["accuracy"], atol=0.02)
    np.testing.assert_allclose(on.metrics["loss"], off.metrics["loss"], rtol=1e-3)
    assert on.rounds["bytes_up"].equals(off.rounds["bytes_up"])
    assert on.rounds["bytes_down"].equals(off.rounds["bytes_down"])


def received(alg, rnd: int, clients):
    """Round `rnd`'s context (as the engine makes it, with its channel to the server) once `alg` has
    configured it, and the state its clients received: what `local_train` starts from."""
    context = alg.engine.round(rnd, clients)
    download = alg.configure(context)
    context = with_server(alg, alg.engine, context.with_download(download))
    return context, alg.receive(context, download)
