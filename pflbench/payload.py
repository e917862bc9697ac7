"""What crosses the network in one direction of a round: a `Payload`, per client, named tensors.

A method's `configure` returns the round's download and its `send` the round's upload, both Payloads;
its `aggregate` receives the upload as it reached the server. The engine counts the bytes of exactly
these tensors (`nbytes`), so a method's communication is whatever its hooks exchange.

Rows belong to clients (`clients[k]` owns row k). A payload is made from a stacked State (every client
the same tensors: one tensor [K, ...] per name, the batched layout; `from_state`) or from one dict of
unstacked tensors per client (payloads that differ between clients: different architectures, routed
modules, layers a client keeps; `from_rows`). Both read the same way: `state` stacks, `rows` and
`row(k)` split. A `header` carries facts about the rows that are not data (ids of the models a row
holds, which layers it carries): it travels with the payload and is not counted.

Uploads lost on the way (the `system.dropout` knob) are part of the payload: `delivered(arrived)` marks
them, they count 0 bytes, and `arrived()` is the payload of those that reached the server, with their
`positions` among the rows sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

State = dict[str, Tensor]


class Payload:
    """Per-client tensors crossing the network in one round (module doc). Immutable: every method that
    changes something returns a new Payload sharing the tensors."""

    __slots__ = ("_state", "_rows", "_stacked", "clients", "header", "_lost", "_positions")

    def __init__(
        self,
        clients: Tensor,
        *,
        state: State | None = None,
        rows: Sequence[Mapping[str, Tensor]] | None = None,
        stacked: bool = True,
        header: Mapping[str, Tensor] | None = None,
        lost: Tensor | None = None,
        positions: Tensor | None = None,
    ):
        if (state is None) == (rows is None):
            raise ValueError("a Payload is made from a stacked state or from per-client rows (one of them)")
        if rows is not None and len(rows) != len(clients):
            raise ValueError(f"a Payload of {len(clients)} clients needs one row each, got {len(rows)}")
        self.clients = clients
        self._state = state
        self._rows = None if rows is None else [dict(row) for row in rows]
        self._stacked = state is not None or stacked
        self.header: Mapping[str, Tensor] = dict(header or {})
        self._lost = lost
        self._positions = positions

    # ---- made from ---------------------------------------------------------------------------------
    @classmethod
    def from_state(cls, state: State, clients: Tensor, header: Mapping[str, Tensor] | None = None) -> Payload:
        """Every client the same tensors: `state[n]` is [len(clients), ...], row k client k's."""
        return cls(clients, state=state, header=header)

    @classmethod
    def broadcast(cls, one: Mapping[str, Tensor], clients: Tensor) -> Payload:
        """One model to every one of `clients`: each `one[n]` ([1, ...], e.g. the global state's) expanded to
        [len(clients), ...], a view (no copy)."""
        count = len(clients)
        return cls(clients, state={n: t.expand(count, *t.shape[1:]) for n, t in one.items()})

    @classmethod
    def empty(cls, clients: Tensor) -> Payload:
        """Nothing for any of `clients` (0 bytes each)."""
        return cls(clients, state={})

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Mapping[str, Tensor]],
        clients: Tensor,
        header: Mapping[str, Tensor] | None = None,
        *,
        stacked: bool = False,
    ) -> Payload:
        """One dict of unstacked tensors per client (they may differ between clients). `stacked`: the
        rows are one State's, taken apart (e.g. privatized client by client), and read back stacked."""
        return cls(clients, rows=rows, stacked=stacked, header=header)

    # ---- read as -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.clients)

    @property
    def is_stacked(self) -> bool:
        """Whether every client's row has the same tensors (`state` is then the natural form)."""
        return self._stacked

    @property
    def state(self) -> State:
        """The rows stacked: one tensor [len(self), ...] per name (the tensors themselves where the
        payload was made from a state). ValueError where clients' rows differ."""
        if self._state is not None:
            return self._state
        rows = self._rows or []
        if not rows:
            return {}
        names = list(rows[0])
        if any(list(row) != names for row in rows):
            raise ValueError("this payload's rows hold different tensors per client: read it with rows / row(k)")
        return {n: torch.stack([row[n] for row in rows]) for n in names}

    @property
    def rows(self) -> list[dict[str, Tensor]]:
        """One dict of unstacked tensors per client (views of a stacked payload's tensors)."""
        if self._rows is not None:
            return [dict(row) for row in self._rows]
        return [self.row(k) for k in range(len(self))]

    def row(self, k: int) -> dict[str, Tensor]:
        """Client k's tensors, unstacked."""
        if self._rows is not None:
            return dict(self._rows[k])
        return {n: t[k] for n, t in (self._state or {}).items()}

    @property
    def nbytes(self) -> Tensor:
        """Bytes per client [len(self)] (long, on the CPU): what each row's tensors take; 0 for a lost one."""
        if self._rows is not None:
            sizes = torch.tensor(
                [sum(t.numel() * t.element_size() for t in row.values()) for row in self._rows], dtype=torch.long
            )
        else:
            sizes = torch.zeros(len(self), dtype=torch.long)
            for t in (self._state or {}).values():
                sizes += t[0].numel() * t.element_size()
        if self._lost is not None:
            sizes[self._lost.cpu()] = 0
        return sizes

    # ---- lost on the way -------------------------------------------------------------------------------
    def delivered(self, arrived: Tensor | None) -> Payload:
        """This payload with the rows whose `arrived` [len(self)] bool is False marked lost (None: all arrived)."""
        if arrived is None:
            return self
        return Payload(
            self.clients,
            state=self._state,
            rows=self._rows,
            stacked=self._stacked,
            header=self.header,
            lost=~arrived,
            positions=self._positions,
        )

    @property
    def lost(self) -> Tensor | None:
        """[len(self)] bool: the rows that never arrived (None: none was lost)."""
        return self._lost

    def arrived(self) -> Payload:
        """The rows that reached the server (this payload itself when none was lost), with their
        `positions` among this payload's rows."""
        if self._lost is None or not bool(self._lost.any()):
            return self
        keep = torch.nonzero(~self._lost).flatten().to(self.clients.device)
        picked = keep.tolist()
        return Payload(
            self.clients[keep],
            state=None if self._state is None else {n: t[keep] for n, t in self._state.items()},
            rows=None if self._rows is None else [self._rows[k] for k in picked],
            stacked=self._stacked,
            header={n: t[keep.to(t.device)] for n, t in self.header.items()},
            positions=keep,
        )

    @property
    def positions(self) -> Tensor:
        """Where each row sat among the rows sent (`arrived()`): arange(len(self)) where none was lost."""
        if self._positions is None:
            return torch.arange(len(self), device=self.clients.device)
        return self._positions

    def __repr__(self) -> str:
        form = "stacked" if self._state is not None else ("rows, stacked" if self._stacked else "rows")
        lost = "" if self._lost is None else f", {int(self._lost.sum())} lost"
        return f"Payload({len(self)} clients, {form}{lost}, {int(self.nbytes.sum())} bytes)"
