"""What an algorithm can run, as data (`Capabilities`), and the one check of a cell against it.

A cell asking for something its algorithm cannot do is refused before any work (`check_cell`), with
an error that names the fields involved and the algorithms that can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Capabilities:
    """Inherited like any class attribute (a method derived from FedMN loops over clients as FedMN does)."""

    # Whether local training may run batched across clients (False: the engine loops, and says so).
    batched: bool = True
    # Whether it works when clients have different architectures (a cell whose `model` is a group spec
    # such as "hetero5"); those that need one shared model refuse such cells.
    heterogeneous_models: bool = False
    # The knobs ("system.dropout", "privacy", "privacy.mode", ...) it cannot honour, with why.
    refused_knobs: Mapping[str, str] = field(default_factory=dict)
    # Unseen clients (`unseen_fraction`): why it cannot give a newcomer a model ("" where it can).
    newcomers: str = ""


class Refusal(ValueError):
    """A cell its algorithm cannot run; `fields` are the cell's fields involved."""

    def __init__(self, fields: tuple[str, ...], message: str):
        super().__init__(message)
        self.fields = fields


def refusal(
    name: str, capabilities: Capabilities, cell: Any, others: Iterable[tuple[str, Capabilities]]
) -> Refusal | None:
    """Why the algorithm `name` with `capabilities` cannot run `cell` (None: it can). `others`: every
    registered algorithm's (name, capabilities), for the list of those that can."""
    from pflbench.config import is_heterogeneous

    others = list(others)

    def able(test: Callable[[Capabilities], bool]) -> str:
        return ", ".join(n for n, c in others if test(c)) or "none"

    if is_heterogeneous(cell.model) and not capabilities.heterogeneous_models:
        return Refusal(
            ("algorithm", "model"),
            (
                f"algorithm {name!r} needs one architecture shared by all clients, but model {cell.model!r} gives "
                f"clients different architectures; algorithms for heterogeneous models: "
                f"{able(lambda c: c.heterogeneous_models)} (or give a single model name)"
            ),
        )
    for knob, why in capabilities.refused_knobs.items():
        group, _, entry = knob.partition(".")
        if getattr(cell, group).get(entry) if entry else getattr(cell, group):
            return Refusal(
                ("algorithm", "system", "privacy"),
                (
                    f"algorithm {name!r} cannot run with {knob}: {why} (algorithms that can: "
                    f"{able(lambda c: knob not in c.refused_knobs and group not in c.refused_knobs)})"  # noqa: B023 (called in this iteration)
                ),
            )
    if cell.unseen_fraction and capabilities.newcomers:
        return Refusal(
            ("unseen_fraction", "clients", "algorithm"),
            (
                f"unseen_fraction: algorithm {name!r} cannot give unseen clients a model: {capabilities.newcomers}; "
                f"algorithms that can: {able(lambda c: not c.newcomers)} (or unseen_fraction 0)"
            ),
        )
    return None
