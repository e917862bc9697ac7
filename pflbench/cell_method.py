"""The method a cell runs: its registered algorithm with the cell's hyperparameters, wrapped by the
cell's knobs that act on the method itself.

One knob does today: privacy (`pflbench.privacy.with_privacy`: the method's uploads leave the clients
privatized, through `DifferentiallyPrivate`, itself an `Algorithm`). The others act in the engine (the
system knob: who trains how much, which uploads arrive; the shifts: the clients' data). The round
driver (`pflbench.rounds`) runs what `cell_method` returns as the cell's method, hook by hook, and
knows no knob: it is built here once, where `rounds.build_cell` builds the cell.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pflbench.privacy import with_privacy

if TYPE_CHECKING:
    from pflbench.algorithm import Algorithm
    from pflbench.config import CellConfig
    from pflbench.federation import Federation


def cell_method(algorithm_cls: type[Algorithm[Any]], cell: CellConfig, fed: Federation) -> Algorithm[Any]:
    """`algorithm_cls` built on the cell's Federation `fed` with the cell's hyperparameters, as the
    cell's knobs run it (wrapped under the privacy knob; itself otherwise)."""
    return with_privacy(algorithm_cls(fed, algorithm_cls.parse_hyperparams(cell.hp)), fed)
