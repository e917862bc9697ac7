"""System heterogeneity (the cell's `system` knob): stragglers and dropped uploads.

- **Stragglers**: a share `stragglers` of the clients (the same clients all run long: slow devices)
  do only a fraction `straggler_work` of their local work in every round they are sampled: each
  local batch plan (epochs or steps, whatever the algorithm asked for) is cut to its first
  ceil(fraction * length) steps, so a straggler always takes at least one step. `straggler_work` is
  one number, or `[low, high]`: the fraction is drawn uniformly per (round, straggler). The cut
  applies to the local training of a round only: the round's context (`pflbench.round_context.Round`,
  made by `Federation.round`) carries every client's share, and a plan made for it is cut
  (`Federation.local_plans`); the work done to form or adapt the evaluated models is planned with a
  round number and is not.
- **Dropout**: every sampled client fails to return its upload with probability `dropout` (one
  number, or one per client). The client did train: whatever the algorithm keeps on the client
  (its personal layers, its local model) it keeps; the server aggregates only the uploads that
  arrived (the upload `pflbench.payload.Payload` marks the lost ones; `Algorithm.aggregate` receives
  its arrived part), and when none arrived it keeps its state. A dropped upload
  is counted as not sent: `bytes_up` counts what reached the server (the failure is modelled as the
  client disappearing before it uploads), the download it received is counted.

Everything is drawn once from the cell's seed on its own stream ("system", pflbench.streams), as arrays over (round,
client) for every client, never from the training generators: the sampling schedule
(`federation.sample_schedule`) is untouched, and every algorithm run with the same seed meets the same
stragglers, work fractions and dropouts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pflbench import streams
from pflbench.config import reject_boolean

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from pflbench.config import CellConfig


def knob_problem(knob: str, error: ErrorDetails) -> str:
    """One pydantic error of a knob's entries as `knob.entry: message`."""
    message = error["msg"].removeprefix("Value error, ")
    entry = str(error["loc"][0]) if error["loc"] else ""
    return f"{knob}.{entry}: {message}" if entry else f"{knob}.{message}"


def reject_booleans(values: Any) -> Any:
    """`dropout: true` is a mistake, not probability 1 (pydantic's lax mode would take it as 1.0):
    `config.reject_boolean` for every entry of a knob, and every item of a list entry."""
    if isinstance(values, dict):
        for key, value in values.items():
            for v in value if isinstance(value, (list, tuple)) else [value]:
                try:
                    reject_boolean(v)
                except ValueError as error:
                    raise ValueError(f"{key}: {error}") from None
    return values


class KnobParams(BaseModel):
    """Base of the `system.*` and `privacy.*` entries: unknown entries are errors, values are frozen,
    and no entry may be a boolean."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    text_entries: ClassVar[frozenset[str]] = frozenset()  # named choices: their own check says what is allowed

    @model_validator(mode="before")
    @classmethod
    def _no_booleans(cls, values: Any) -> Any:
        if isinstance(values, dict):
            reject_booleans({k: v for k, v in values.items() if k not in cls.text_entries})
            return values
        return reject_booleans(values)


class SystemParams(KnobParams):
    """The `system.*` entries of a cell (all off by default)."""

    stragglers: float = Field(0.0, ge=0.0, le=1.0)  # share of the clients that are stragglers
    straggler_work: float | tuple[float, float] = 0.5  # fraction of the local work a straggler does
    dropout: float | list[float] = 0.0  # probability that a sampled client's upload never arrives

    @field_validator("straggler_work")
    @classmethod
    def _work_in_range(cls, value: float | tuple[float, float]) -> float | tuple[float, float]:
        values = [value] if isinstance(value, (int, float)) else list(value)
        if any(isinstance(v, bool) or not 0.0 < v <= 1.0 for v in values):
            raise ValueError(f"must be a fraction in (0, 1] or [low, high] of such fractions, got {value!r}")
        if len(values) == 2 and values[0] > values[1]:
            raise ValueError(f"[low, high] needs low <= high, got {list(values)}")
        return value

    @field_validator("dropout")
    @classmethod
    def _probabilities(cls, value: float | list[float]) -> float | list[float]:
        values = [value] if isinstance(value, (int, float)) else list(value)
        if not values or any(isinstance(v, bool) or not 0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"must be a probability in [0, 1] or one per client, got {value!r}")
        return value

    @model_validator(mode="after")
    def _work_needs_stragglers(self) -> Self:
        if self.stragglers == 0 and "straggler_work" in self.model_fields_set and self.straggler_work != 0.5:
            raise ValueError("straggler_work is set but stragglers is 0 (give the share of straggling clients)")
        return self


def parse_system(values: dict[str, Any], clients: int) -> dict[str, Any]:
    """The cell's `system` entries validated, with only those that differ from the defaults kept (so
    that writing a default explicitly gives the cell the same hash as leaving it out). ValueError
    naming the entry and what is allowed."""
    allowed = (
        "stragglers (share of clients, 0-1), straggler_work (fraction in (0, 1] or [low, high]), "
        "dropout (probability, or a list with one per client)"
    )
    try:
        params = SystemParams(**values)
    except ValidationError as err:
        problems = "; ".join(knob_problem("system", e) for e in err.errors())
        raise ValueError(f"{problems} (allowed: {allowed})") from None
    if isinstance(params.dropout, list) and len(params.dropout) != clients:
        raise ValueError(
            f"system.dropout: a list needs one probability per client ({clients}), got {len(params.dropout)}"
        )
    data = params.model_dump(mode="json")
    defaults = SystemParams.model_validate({}).model_dump(mode="json")
    if params.stragglers == 0:
        data.pop("straggler_work")  # meaningless without stragglers
    return {k: v for k, v in data.items() if v != defaults[k]}


class SystemPlan:
    """The stragglers' work fractions and the dropped uploads of a cell, drawn once from its seed."""

    def __init__(self, params: SystemParams, clients: int, rounds: int, seed: int) -> None:
        rng = streams.generator(seed, "system", kind="numpy")
        # Fixed draws for every (round, client), whatever the knob's values: raising the dropout
        # probability only adds dropped uploads, and the stragglers are a prefix of one permutation.
        order = rng.permutation(clients)
        work_u = rng.random((rounds, clients))
        drop_u = rng.random((rounds, clients))
        count = round(params.stragglers * clients)
        self.straggler = np.zeros(clients, dtype=bool)
        self.straggler[order[:count]] = True
        low, high = (
            (params.straggler_work,) * 2 if isinstance(params.straggler_work, (int, float)) else params.straggler_work
        )
        self.work = np.where(self.straggler[None, :], low + (high - low) * work_u, 1.0)  # [rounds, clients]
        p = np.broadcast_to(np.asarray(params.dropout, dtype=float), (clients,))
        self.dropped = drop_u < p[None, :]  # [rounds, clients]

    @classmethod
    def from_cell(cls, cell: CellConfig) -> SystemPlan | None:
        if not cell.system:
            return None
        return cls(SystemParams(**cell.system), cell.clients, cell.rounds, cell.seed)

    def arrived(self, rnd: int, clients: torch.Tensor) -> torch.Tensor:
        """[K] bool: whether each of round `rnd`'s clients' upload reaches the server."""
        return torch.as_tensor(~self.dropped[rnd - 1, clients.cpu().numpy()], device=clients.device)


def cut(plans: list[torch.Tensor], work: list[float]) -> list[torch.Tensor]:
    """Batch plans, each cut to its client's share of the work (`work`, aligned with `plans`): its first
    ceil(share * length) steps, so a straggler takes at least one step."""
    return [plan[: math.ceil(share * len(plan) - 1e-9)] if share < 1 else plan for share, plan in zip(work, plans)]
