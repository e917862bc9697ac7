"""An algorithm's card: how reports, `pflbench list` and the leaderboard show the method.

The card is data, registered once with the class (`@ALGORITHMS.register("my-avg", card=Card(...))`),
never inherited (a method derived from FedAvg is not shown as FedAvg), and stored with every cell's
result (config.json, `card`), so a report built from the store alone shows a plugin's method by its
display name and family, and a published table does not change when the code's card does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Families of methods, in the order of the reports' panels; a family not listed here comes after them.
# "baselines" are drawn in grey in every panel as context.
FAMILIES = ("baselines", "hypernetworks and layer-wise aggregation", "personal layers", "regularized and meta-learned")


@dataclass(frozen=True)
class Card:
    """What the reports show of a method (nothing in pflbench/reports/ names algorithms)."""

    display_name: str = ""  # the row label, e.g. "Per-FedAvg" (empty: the registered name)
    family: str = "other"  # the figures' panel (FAMILIES, or a family of your own)
    paper: str = ""  # authors, venue, year
    personalizes: str = ""  # in one line: which part of the model or objective is each client's own
    reference: bool = False  # a reference row (bounds the methods, never ranked among them)
    row_order: int | None = None  # position among the tables' rows (None: after those with one, by name)
    # Algorithms this one can reduce to on some cells, with why: {"fedavg": "FedBN is FedAvg when ..."};
    # where the two give bit-identical results the tables flag the row ("= FedAvg") with that reason.
    reduces_to: Mapping[str, str] = field(default_factory=dict)

    def named(self, name: str) -> Card:
        """This card with the registered `name` as display name where it gives none."""
        return self if self.display_name else dataclasses.replace(self, display_name=name)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (stored with each cell's result)."""
        return {**dataclasses.asdict(self), "reduces_to": dict(self.reduces_to)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Card:
        """A stored card (keys a later version added or dropped are tolerated)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
