"""The round's context: what a method's round hooks know about the round they run in (`Round`).

The engine (`pflbench.simulator.rounds.run_round`) makes one `Round` per round and hands it to every hook of
the round (`pflbench.algorithm.Algorithm`): its number, the sampled clients, each client's share of
its local work (the `system.stragglers` knob), and, once the server has configured the round, what it
sent down (`download`). A Round is frozen: no hook can change what another hook of the round reads,
and what a hook computes depends only on its arguments and the method's own state.

Local training is cut to the stragglers' share where the Federation is given the Round itself
(`fed.train(rnd, clients, state)`, `fed.local_plans(rnd, ...)`, `pflbench.kit.steps.step_ids(fed, rnd, ...)`);
given a plain round number (`rnd.number`, `rnd.number + 1`, ...) nothing is cut: the work done to
form, adapt or serve models is never a straggler's.

The hooks after `configure` (`receive`, `local_train`, `send`, `aggregate`) receive the round once the
server has sent its download: a `ClientRound`, the same Round whose `download` is always there (typed
`Payload`, not Optional), so a hook reads `rnd.download.state` without a None check. Only `configure`
sees a plain `Round` (its download is what it returns).

A server that updates after each client (pFedHN, MH-pFedHN: the next client trains the model the
updated server gives it) hands each client's upload to the engine as it is made, in `local_train`:
`rnd.deliver(upload)`, the engine's channel to the server. The engine drops what `system.dropout`
loses, the privacy knob privatizes what leaves the client, and the server's hook for it,
`Algorithm.aggregate_client`, receives what arrived (`deliver` returns it; None when it was lost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from pflbench.payload import Payload


@dataclass(frozen=True, eq=False)
class Round:
    """One round, as its hooks see it."""

    number: int  # 1, 2, ... (the cell's rounds)
    clients: Tensor  # [K] the sampled clients (positions in the Federation), ascending
    # The share of its local work each client does this round, by position in the Federation (every
    # client's, so a method that trains more than the sampled clients cuts theirs too); None: all of it.
    work: tuple[float, ...] | None = None
    # What the server sent down this round (`configure`'s payload); None inside `configure`.
    download: Payload | None = None

    def work_of(self, clients: Tensor) -> list[float] | None:
        """The share of their local work `clients` do this round (None: all of it, for every client)."""
        if self.work is None:
            return None
        return [self.work[c] for c in clients.tolist()]

    def with_download(self, download: Payload) -> ClientRound:
        """This round once the server has sent `download` (what `receive`, `local_train`, `send` and
        `aggregate` see)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(Round)}
        return ClientRound(**{**fields, "download": download})

    def __repr__(self) -> str:
        stragglers = "" if self.work is None else f", {sum(w < 1 for w in self.work)} stragglers"
        return f"Round({self.number}, clients={self.clients.tolist()}{stragglers})"


Deliver = Callable[[Payload], "Payload | None"]  # one client's upload -> what reached the server (None: lost)


def no_server(upload: Payload) -> Payload | None:
    """`deliver` of a round the engine does not drive: there is no server to deliver to."""
    raise RuntimeError(
        "rnd.deliver: this round has no server to deliver to; the engine gives a round its channel to "
        "the server when it drives it (pflbench.simulator.rounds.run_round, or pflbench.simulator.rounds.with_server)"
    )


@dataclass(frozen=True, eq=False, repr=False)
class ClientRound(Round):
    """A round once the server has configured it (module doc): what `receive`, `local_train`, `send`
    and `aggregate` receive. Its `download` (`configure`'s payload) is always there; `deliver` hands
    one client's upload to the server during `local_train`, for a server that updates after each
    client (`Algorithm.aggregate_client`)."""

    download: Payload = dataclasses.field(kw_only=True)
    deliver: Deliver = dataclasses.field(default=no_server, kw_only=True)


def round_number(rnd: int | Round) -> int:
    """The round's number, from a Round or a number."""
    return rnd.number if isinstance(rnd, Round) else int(rnd)


def work_of(rnd: int | Round, clients: Tensor) -> list[float] | None:
    """The share of their local work `clients` do when trained for `rnd`: a Round's straggler work;
    None (all of it) for a plain round number."""
    if isinstance(rnd, Round):
        return rnd.work_of(clients)
    return None
