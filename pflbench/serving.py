"""An evaluation's context: whom a method's models are served to, and how they are scored (`Serving`).

Every eval_every rounds the engine scores each client's personalized model on its own splits, after
local adaptation too (the cell's `finetune_epochs`), and, in a cell with unseen clients, the models
the method gives the newcomers. The evaluation hooks (`Algorithm.evaluate`, `adapt_locally`,
`newcomer_models`) receive the population they serve as a `Serving`: the engine interface
(`pflbench.engine.Engine`) of the trained clients, or of the newcomers (pflbench.newcomers), never the
method's `self.engine` swapped for another. What a hook reads of the clients it serves comes from
`serving.clients`; what it reads of the method's training, from the method's own state.

`Scored` is what an evaluation hook returns for models it scored as it made them (FedMN's adapted
module pools, too large to keep one per client): the engine takes its scores instead of calling
`evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from torch import Tensor

if TYPE_CHECKING:
    from pflbench.api_types import State
    from pflbench.engine import Engine

# A method's models for a population, as the engine trains and scores them: a stacked State [N, ...] of the
# engine's model, or one such State per architecture group in a heterogeneous cell. A method with models of
# its own form (FedMN's pool and routings) names that form as its `PersonalModels` (pflbench.algorithm).
Models: TypeAlias = "State | list[State]"
Scores: TypeAlias = dict[str, tuple[Tensor, Tensor]]  # split -> (accuracy [N], loss [N])


@dataclass(frozen=True, eq=False)
class Serving:
    """The models of `clients` after round `round`, scored on their own splits."""

    round: int  # the last finished round (a newcomer's fit and an adaptation draw its batches from it)
    clients: Engine  # whom the models are for: the trained clients, or the newcomers (the engine interface)
    newcomers: bool = False  # True: clients the method never saw in training
    adapt_epochs: int = 0  # epochs of local adaptation of the after-adaptation protocol (finetune_epochs)

    def __repr__(self) -> str:
        who = "newcomers" if self.newcomers else "clients"
        return f"Serving(round {self.round}, {self.clients.num_clients} {who}, adapt_epochs={self.adapt_epochs})"


@dataclass(frozen=True, eq=False)
class Scored:
    """Models already scored: split -> (accuracy [N], loss [N]) of each client's model."""

    scores: Mapping[str, tuple[Tensor, Tensor]]


class Evaluates(Protocol):
    def evaluate(self, serving: Serving, models: Any, splits: tuple[str, ...]) -> Scores: ...


def score(method: Evaluates, serving: Serving, models: Any, splits: tuple[str, ...]) -> Scores:
    """split -> (accuracy, loss) of `models` on each of `serving.clients`' `splits`: their own scores
    where they come `Scored`, else the method's `evaluate`."""
    if isinstance(models, Scored):
        return {split: models.scores[split] for split in splits}
    return method.evaluate(serving, models, splits)
