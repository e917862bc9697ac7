"""The method a cell runs: its registered algorithm with the cell's hyperparameters, wrapped by the
cell's knobs that act on the method itself.

One knob does today: privacy (`pflbench.simulator.privacy.with_privacy`: the method's uploads leave the clients
privatized, through `DifferentiallyPrivate`, itself an `Algorithm`). The others act in the engine (the
system knob: who trains how much, which uploads arrive; the shifts: the clients' data). The round
driver (`pflbench.simulator.rounds`) runs what `cell_method` returns as the cell's method, hook by hook, and
knows no knob: it is built here once, where `rounds.build_cell` builds the cell. A method built by
hand and handed to the driver would run without the knob's wrapper, its uploads leaving the clients
as they are: the driver asks `check_cell_method` first, which refuses it with what to call instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pflbench.simulator.privacy import DifferentiallyPrivate, with_privacy, would_wrap

if TYPE_CHECKING:
    from pflbench.algorithm import AnyAlgorithm
    from pflbench.config import CellConfig
    from pflbench.simulator.federation import Federation


def cell_method(algorithm_cls: type[AnyAlgorithm], cell: CellConfig, fed: Federation) -> AnyAlgorithm:
    """`algorithm_cls` built on the cell's Federation `fed` with the cell's hyperparameters, as the
    cell's knobs run it (wrapped under the privacy knob; itself otherwise)."""
    return with_privacy(algorithm_cls(fed, algorithm_cls.parse_hyperparams(cell.hp)), fed)


class NotTheCellsMethod(TypeError):
    """A method handed to the round driver that is not the cell's method as its knobs run it."""


def check_cell_method(algorithm: AnyAlgorithm, fed: Federation) -> None:
    """Refuse (`NotTheCellsMethod`) a method that the cell's knobs would wrap but that comes unwrapped: a
    cell with privacy whose method was built by hand (`cls(fed, hp)`) would upload its clients' models
    unprivatized, silently. Called by the round driver (`pflbench.simulator.rounds.run_rounds`, `run_round`)."""
    if not would_wrap(algorithm, fed):
        return
    name = type(algorithm).__name__
    raise NotTheCellsMethod(
        f"the cell has privacy on ({', '.join(f'privacy.{k}={v}' for k, v in sorted(fed.cell.privacy.items()))}), "
        f"but its method {name} was built without the privacy wrapper, so its uploads would leave the clients "
        f"unprivatized: build the method with pflbench.simulator.cell_method.cell_method({name}, cell, fed) (or the "
        f"Federation and method together with pflbench.simulator.rounds.build_cell), or wrap this one with "
        f"pflbench.simulator.privacy.with_privacy(method, fed)"
    )


def unwrapped(algorithm: AnyAlgorithm) -> AnyAlgorithm:
    """The method itself, under any knob's wrapper (`cell_method`): where its own attributes are read
    (a script probing `global_state`; a wrapper delegates the hooks, not the method's attributes)."""
    return algorithm.algorithm if isinstance(algorithm, DifferentiallyPrivate) else algorithm
