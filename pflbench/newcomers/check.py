"""The cell check of unseen clients: a cell whose `unseen_fraction` cannot run is refused before any work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pflbench.newcomers.ids import newcomer_count

if TYPE_CHECKING:
    from pflbench.config import CellConfig


def check_unseen(cell: CellConfig) -> None:
    """ValueError (one message naming the field and what is allowed) if the cell's unseen_fraction
    cannot be run: it must hold out at least one client and keep at least one for training (whether the
    algorithm can serve newcomers is its capability: `Algorithm.check_cell`)."""
    fraction, clients = cell.unseen_fraction, cell.clients
    if not fraction:
        return
    count = newcomer_count(fraction, clients)
    if count < 1:
        raise ValueError(
            f"unseen_fraction {fraction} of {clients} clients holds out no client "
            f"(round({fraction} x {clients}) = 0); use at least {0.5 / clients:.3g}, or 0 for none"
        )
    if count > clients - 1:
        raise ValueError(
            f"unseen_fraction {fraction} of {clients} clients holds out all {count} of them; "
            f"at least one client must train (at most {(clients - 1.5) / clients:.3g})"
        )
