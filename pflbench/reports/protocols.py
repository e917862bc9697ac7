"""Evaluation protocols: which number "the personalized model's accuracy" is.

Papers score personalized FL in several ways, and the numbers differ by points, so every table says
which one it shows. A protocol is three choices:

    model      delivered  each client's model as the algorithm delivers it (no further training)
               adapted    that model after `finetune_epochs` epochs of local training on the client's
                          own training data (the engine's local adaptation; cells with finetune_epochs 0
                          have no adapted numbers)
    selection  final      the final round
               bestval    the round whose mean VALIDATION accuracy is highest (the test set is not used
                          to choose)
               besttest   the round whose mean TEST accuracy is highest: selected on the test set, an
                          optimistic number, shown only labeled as such (as delivered, mean over clients)
    averaging  clients    test accuracy averaged over clients (each client counts once)
               pooled     test accuracy over all clients' test samples together (sample-weighted)
               worst10    mean test accuracy of the worst 10% of clients

and maps to one key of a cell's summary.json (values in [0, 1]):

    {final|bestval}_accuracy[_adapted][_pooled]      clients / pooled
    {final|bestval}_worst10_accuracy[_adapted]       worst10
    best_accuracy                                    besttest (delivered, clients only)
    rounds: bestval_round[_adapted], best_round      the round a selection chose

The protocol's name, `model-selection-averaging` (e.g. `adapted-final-clients`), is what
benchmarks/reference/*.csv declare in their `protocol` column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pflbench.simulator.metrics import accuracy_key, round_key

if TYPE_CHECKING:
    import pandas as pd

MODELS = {"delivered": "as delivered", "adapted": "after local adaptation"}
SELECTIONS = {
    "final": "final round",
    "bestval": "best validation round",
    "besttest": "best test round (selected on test)",
}
AVERAGINGS = {"clients": "mean over clients", "pooled": "pooled over test samples", "worst10": "worst 10% of clients"}

MODEL_TEXT = {
    "delivered": "each client's personalized model as the algorithm delivers it (no further training)",
    "adapted": "each client's model after local adaptation (finetune_epochs epochs of training on the "
    "client's own training data)",
}
SELECTION_TEXT = {
    "final": "at the final round",
    "bestval": "at the round with the highest mean validation accuracy (chosen on the validation "
    "split, not the test split)",
    "besttest": "at the round with the highest mean test accuracy: selected on the test set, "
    "optimistic, for comparison only",
}
AVERAGING_TEXT = {
    "clients": "test accuracy averaged over clients, each client counting once",
    "pooled": "test accuracy over all clients' test samples together (sample-weighted)",
    "worst10": "mean test accuracy of the worst 10% of clients",
}


@dataclass(frozen=True)
class Protocol:
    model: str = "delivered"
    selection: str = "final"
    averaging: str = "clients"

    def __post_init__(self) -> None:
        for value, allowed, what in (
            (self.model, MODELS, "model"),
            (self.selection, SELECTIONS, "selection"),
            (self.averaging, AVERAGINGS, "averaging"),
        ):
            if value not in allowed:
                raise ValueError(f"protocol {what} {value!r}: allowed {', '.join(allowed)}")
        if self.selection == "besttest" and (self.model, self.averaging) != ("delivered", "clients"):
            raise ValueError("protocol selection 'besttest' exists only as delivered-besttest-clients")

    @classmethod
    def parse(cls, name: str | Protocol) -> Protocol:
        """`adapted-final-clients` -> Protocol("adapted", "final", "clients")."""
        if isinstance(name, Protocol):
            return name
        parts = str(name).strip().split("-")
        if len(parts) != 3:
            raise ValueError(
                f"protocol {name!r}: expected model-selection-averaging, e.g. "
                f"{', '.join(p.name for p in PROTOCOLS[:3])}"
            )
        return cls(*parts)

    @property
    def name(self) -> str:
        return f"{self.model}-{self.selection}-{self.averaging}"

    @property
    def adapted(self) -> bool:
        return self.model == "adapted"

    @property
    def worst10(self) -> bool:
        return self.averaging == "worst10"

    @property
    def key(self) -> str:
        """The summary.json key holding this protocol's number for one cell (pflbench.simulator.metrics writes it)."""
        return accuracy_key(self.selection, self.adapted, self.averaging)

    @property
    def round_key(self) -> str | None:
        """The summary key of the round the selection chose (None for the final round)."""
        return round_key(self.selection, self.adapted)

    @property
    def label(self) -> str:
        """ "as delivered · final round · mean over clients"."""
        return " · ".join((MODELS[self.model], SELECTIONS[self.selection], AVERAGINGS[self.averaging]))

    @property
    def short(self) -> str:
        """ "delivered · final · clients", for column headers."""
        return " · ".join((self.model, self.selection, self.averaging))

    @property
    def caption(self) -> str:
        """One sentence saying what the numbers are."""
        return (
            f"Protocol {self.label}: {MODEL_TEXT[self.model]}, {SELECTION_TEXT[self.selection]}; "
            f"{AVERAGING_TEXT[self.averaging]}."
        )

    def with_averaging(self, averaging: str) -> Protocol:
        return Protocol(self.model, self.selection, averaging)


PROTOCOLS: tuple[Protocol, ...] = tuple(
    [
        Protocol(m, s, a)
        for s in ("final", "bestval")
        for m in ("delivered", "adapted")
        for a in ("clients", "pooled", "worst10")
    ]
    + [Protocol("delivered", "besttest", "clients")]
)
DEFAULT = Protocol()  # delivered-final-clients
ADAPTED = Protocol("adapted", "final", "clients")
ALL_KEYS = tuple(p.key for p in PROTOCOLS)
ROUND_KEYS = tuple(dict.fromkeys(p.round_key for p in PROTOCOLS if p.round_key))


def _has_values(cells: pd.DataFrame, protocol: Protocol) -> bool:
    if protocol.key not in cells or "status" not in cells:
        return False
    values = cells.loc[cells["status"] == "finished", protocol.key]
    return any(_finite(v) for v in values)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def available(cells: pd.DataFrame) -> list[Protocol]:
    """The protocols some finished cell has a number for, in PROTOCOLS order; the default always."""
    return [p for p in PROTOCOLS if p == DEFAULT or _has_values(cells, p)]


def report_protocols(cells: pd.DataFrame, names: Sequence[str] | None = None) -> list[Protocol]:
    """The accuracy tables a report shows (mean over clients): `names` if given, else as delivered at
    the final round, then after local adaptation and at the best validation round where the store
    has those numbers. (The leaderboard offers every available protocol.)"""
    if names:
        return [Protocol.parse(n) for n in names]
    return [p for p in available(cells) if p.averaging == "clients" and p.selection != "besttest"]
