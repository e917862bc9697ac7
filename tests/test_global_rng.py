"""A cell whose model draws from torch's global generator (dropout) runs the same in any process state:
`run_cell` seeds that generator from the cell's seed and gives the caller's state back."""

import numpy as np
import torch

from cells import small_cell
from pflbench.simulator.rounds import run_cell

IMAGES = dict(dataset="synthetic-images", dataset_options={"num_samples": 200, "channels": 3, "size": 32})


def test_dropout_cell_ignores_what_ran_before(tmp_path):
    cell = small_cell(algorithm="fedavg", model="vgg8", clients=4, rounds=2, lr=0.01, **IMAGES)
    runs = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        before = torch.get_rng_state()
        runs.append(run_cell(cell, data_root=tmp_path))
        assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is left as it was
    first, second = runs
    np.testing.assert_array_equal(first.metrics["loss"], second.metrics["loss"])
    np.testing.assert_array_equal(first.metrics["accuracy"], second.metrics["accuracy"])


def test_dropout_draws_differ_between_seeds(tmp_path):
    """The seeding is per cell, not one constant: another seed draws other dropout masks (and data)."""
    runs = [
        run_cell(
            small_cell(algorithm="local", model="vgg8", clients=4, rounds=2, lr=0.01, seed=seed, **IMAGES),
            data_root=tmp_path,
        )
        for seed in (0, 1)
    ]
    assert not np.array_equal(runs[0].metrics["loss"], runs[1].metrics["loss"])
