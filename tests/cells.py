"""Small cells on the generated Synthetic dataset, shared by the algorithm tests. The defaults are
the ones the tests' thresholds were measured with; each test file overrides what it needs."""
from pflbench.algorithm import get_algorithm
from pflbench.config import CellConfig
from pflbench.federation import Federation, prepare_cell

SMALL_CELL = dict(algorithm="fedavg", dataset="synthetic", dataset_options={"num_samples": 1000},
                  partition="pathological", partition_params={"classes_per_client": 3}, clients=5, rounds=3,
                  local_epochs=1, batch_size=16, lr=0.05, seed=0)


def small_cell(**overrides) -> CellConfig:
    return CellConfig(**{**SMALL_CELL, **overrides})


def federation(cell: CellConfig, data_root) -> Federation:
    """The cell's federation, batched or looped as its algorithm allows."""
    dataset, splits = prepare_cell(cell, data_root)
    return Federation(cell, dataset, splits, "cpu", "auto", get_algorithm(cell.algorithm).batched)
