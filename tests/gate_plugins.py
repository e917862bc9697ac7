"""A FedAvg plugin whose cells can be held at the start of a round, so that a test can kill the process
running them there (shared by tests/test_cell_groups.py and tests/test_group_results_ray.py).

The plugin's cells give FedAvg's results. In the folder GATE it writes:
- `ran-<rounds>-<pid>` when a cell starts round 1 (each time a cell is computed from the start);
- `waiting-<pid>-<n>` when a cell of more than `at_round` rounds reaches the start of round `at_round`
  while GATE/armed exists (n tells the cells of one process apart); the cell then waits there until
  GATE/open exists or GATE/armed is gone (or the test kills its process).
"""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import os
import time
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg

GATE = Path({gate!r})


@ALGORITHMS.register({name!r})
class GatedFedAvg(FedAvg):
    """FedAvg held at the start of round {at_round} while GATE/armed exists (tests/gate_plugins.py)."""

    def configure(self, rnd):
        rounds = self.engine.budget.rounds
        if rnd.number == 1:
            (GATE / f"ran-{{rounds}}-{{os.getpid()}}").touch()
        if rounds > {at_round} and rnd.number == {at_round} and (GATE / "armed").exists():
            (GATE / f"waiting-{{os.getpid()}}-{{id(self)}}").touch()
            deadline = time.monotonic() + {seconds}
            while (GATE / "armed").exists() and not (GATE / "open").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never killed this process nor released the gate")
                time.sleep(0.05)
        return super().configure(rnd)
'''


def write_gated_fedavg(path: Path, gate: Path, name: str, at_round: int, seconds: float = 180) -> Path:
    """Write the plugin file `path` registering the algorithm `name`, gated by the folder `gate` at
    `at_round`; the gate folder is made. Returns `path`."""
    gate.mkdir(exist_ok=True)
    path.write_text(SOURCE.format(gate=str(gate), name=name, at_round=at_round, seconds=seconds))
    return path
