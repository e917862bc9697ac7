"""The rendezvous of a cell group (pflbench.simulator.groups' module doc): the cells' threads meet at their plain
training call, and the requests that can share one batched step (`_merge_key`) run as one.

A cell's thread trains through its membership of the group (`membership()`, set while `Member.joined`
runs; None for a cell not in a group), which `Federation._train_on` asks: the engine's one seam with cell
groups. Here, apart from the runner of a group (`pflbench.simulator.groups.run_group`), so that the Federation
asks it without depending on the rounds and cells a group runs.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Iterator

import torch
from torch import Tensor

from pflbench.simulator.row_rates import RowRates, structure
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, Diverged, State, train_group, cross_entropy, train_clients

_local = threading.local()


def membership() -> Member | None:
    """The calling thread's membership of a cell group (None: the thread's cell is not grouped)."""
    return getattr(_local, "member", None)


@dataclass
class _Request:
    model: ClientModel
    state: State
    features: Tensor
    labels: Tensor
    client_indices: list[Tensor]
    plans: list[Tensor]
    sgd: SGD
    kwargs: dict

    @property
    def rows(self) -> int:
        return len(self.plans)


_ALONE = object()  # outcome: the request's own thread makes the ungrouped call
_signatures: weakref.WeakKeyDictionary[ClientModel, tuple] = weakref.WeakKeyDictionary()


def _structure(model: ClientModel) -> tuple:
    """What makes two cells' models the same computation: the module (its repr names every layer and
    its settings), every tensor's name and shape, the memory layout."""
    if model not in _signatures:
        _signatures[model] = (
            type(model._module).__qualname__,
            repr(model._module),
            tuple((name, tuple(shape)) for name, shape in model.shapes.items()),
        )
    return (_signatures[model], model.channels_last, model.stochastic)


def _merge_key(request: _Request) -> tuple | None:
    """The class of requests `request` can share one batched step with; None: it runs as asked."""
    kw = request.kwargs
    if not kw.get("batched", True) or kw.get("compiled", False) or request.model.stochastic or not request.rows:
        return None
    aux = kw.get("aux") or {}
    trainable = kw.get("trainable")
    trainable = frozenset(request.model.param_names if trainable is None else trainable)
    return (
        _structure(request.model),
        kw.get("objective", cross_entropy),
        tuple((name, t.dtype, tuple(t.shape[1:])) for name, t in sorted(aux.items())),
        trainable,
        structure(request.sgd),
        bool(kw.get("static", False)),
        int(request.plans[0].shape[1]),
        request.features.device,
        request.features.dtype,
        tuple(request.features.shape[1:]),
        request.labels.dtype,
        tuple(request.labels.shape[1:]),
        tuple((name, t.dtype) for name, t in request.state.items()),
    )


@dataclass
class GroupStats:
    """How a cell's training calls went in its group: calls made, calls that shared a step with
    other cells' calls, and the clients of those shared steps (summed)."""

    calls: int = 0
    merged: int = 0
    merged_width: int = 0

    def as_dict(self) -> dict:
        return {
            "calls": self.calls,
            "merged_calls": self.merged,
            "mean_merged_width": self.merged_width / self.merged if self.merged else 0.0,
        }


class Member:
    """One cell's place in a `CellGroup`: its thread's training calls go through `train_clients`."""

    def __init__(self, group: CellGroup, name: str):
        self.group, self.name = group, name
        self.stats = GroupStats()

    def train_clients(self, *args: Any, **kwargs: Any) -> tuple[State, Tensor]:
        """`pflbench.simulator.training.train_clients` (its arguments: the seven leading ones positional, as `_Request`
        holds them), as a rendezvous with the group's other cells."""
        self.stats.calls += 1
        model, state, features, labels, client_indices, plans, sgd = args
        request = _Request(model, state, features, labels, client_indices, plans, sgd, kwargs)
        outcome = self.group._rendezvous(self, request)
        if outcome is _ALONE:
            return train_clients(*args, **kwargs)
        if isinstance(outcome, BaseException):
            raise outcome
        return cast("tuple[State, Tensor]", outcome)  # a merged request's outcome (CellGroup._merged)

    def leave(self) -> None:
        self.group._leave(self)

    @contextmanager
    def joined(self) -> Iterator[Member]:
        """While the block runs, the calling thread trains through this membership; it leaves the
        group when the block ends, however it ends."""
        _local.member = self
        try:
            yield self
        finally:
            _local.member = None
            self.leave()


class CellGroup:
    """The rendezvous of a group's cells (module doc)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._live: set[Member] = set()
        self._waiting: dict[Member, _Request] = {}
        self._outcomes: dict[Member, object] = {}
        self._tables: dict[tuple, tuple[list[Tensor], Tensor, Tensor, list[int]]] = {}

    def member(self, name: str = "") -> Member:
        member = Member(self, name)
        with self._cond:
            self._live.add(member)
        return member

    def _leave(self, member: Member) -> None:
        with self._cond:
            self._live.discard(member)
            self._waiting.pop(member, None)
            self._cond.notify_all()  # the others may all be waiting now

    def _rendezvous(self, member: Member, request: _Request) -> object:
        with self._cond:
            self._waiting[member] = request
            while member not in self._outcomes:
                if self._live <= self._waiting.keys():  # every live cell waits here: this one leads
                    batch, self._waiting = self._waiting, {}
                    break
                self._cond.wait()
            else:
                return self._outcomes.pop(member)
        outcomes: dict[Member, object] = {}
        try:
            outcomes = self._run(batch)
        except Exception:  # an error of the leader's own making: every request runs as asked, on its own thread
            outcomes = {}
        finally:
            with self._cond:
                self._outcomes.update({m: outcomes.get(m, _ALONE) for m in batch})
                self._cond.notify_all()
        with self._cond:
            return self._outcomes.pop(member)

    def _run(self, batch: dict[Member, _Request]) -> dict[Member, object]:
        classes: dict[object, list[Member]] = {}
        outcomes: dict[Member, object] = {}
        for member, request in batch.items():
            key = _merge_key(request)
            if key is None:
                outcomes[member] = _ALONE
            else:
                classes.setdefault(key, []).append(member)
        for members in classes.values():
            if len(members) == 1:
                outcomes[members[0]] = _ALONE
                continue
            try:
                results = self._merged([batch[m] for m in members])
            except Exception:  # not a divergence (that is per request): each runs alone, and fails alone
                results = [_ALONE] * len(members)
            for m, result in zip(members, results):
                outcomes[m] = result
                if result is not _ALONE:
                    m.stats.merged += 1
                    m.stats.merged_width += sum(batch[o].rows for o in members)
        return outcomes

    def _table(self, requests: list[_Request]) -> tuple[Tensor, Tensor, list[int]]:
        """The requests' features and labels as one table, and each request's offset into it. Requests
        of one cell share its tensors; a class's concatenation is made once and kept while its
        tensors live (the few latest)."""
        sources: list[tuple[Tensor, Tensor]] = []
        for r in requests:
            if not any(f is r.features and y is r.labels for f, y in sources):
                sources.append((r.features, r.labels))
        if len(sources) == 1:
            return sources[0][0], sources[0][1], [0] * len(requests)
        key = tuple((id(f), id(y)) for f, y in sources)
        if key not in self._tables:
            if len(self._tables) >= 4:
                self._tables.pop(next(iter(self._tables)))
            starts = [0]
            for f, _ in sources[:-1]:
                starts.append(starts[-1] + len(f))
            # The source tensors are kept with the table, so their ids stay theirs while it is cached.
            self._tables[key] = (
                [t for pair in sources for t in pair],
                torch.cat([f for f, _ in sources]),
                torch.cat([y for _, y in sources]),
                starts,
            )
        kept, features, labels, starts = self._tables[key]
        where = [next(i for i, (f, y) in enumerate(sources) if f is r.features and y is r.labels) for r in requests]
        return features, labels, [starts[i] for i in where]

    def _merged(self, requests: list[_Request]) -> list[object]:
        """One `train_group` over the requests' clients; per request its (state, loss) or `Diverged`."""
        first = requests[0]
        features, labels, offsets = self._table(requests)
        indices = [idx + offset if offset else idx for r, offset in zip(requests, offsets) for idx in r.client_indices]
        plans = [plan for r in requests for plan in r.plans]
        state = {name: torch.cat([r.state[name] for r in requests]) for name in first.state}
        auxes = [r.kwargs.get("aux") or {} for r in requests]
        aux = {name: torch.cat([a[name] for a in auxes]) for name in auxes[0]}
        trainable = first.kwargs.get("trainable")
        trainable = set(first.model.param_names if trainable is None else trainable)
        # Each row's own SGD values where the requests' rules differ (one learning rate a cell); else the
        # rule's scalars, as before.
        rates = (
            None
            if all(r.sgd == first.sgd for r in requests)
            else RowRates.of(
                [r.sgd for r in requests for _ in range(r.rows)],
                features.device,
                first.state[first.model.param_names[0]].dtype,
            )
        )
        new_state, losses = train_group(
            first.model,
            state,
            features,
            labels,
            indices,
            plans,
            first.sgd,
            first.kwargs.get("objective", cross_entropy),
            aux,
            trainable,
            False,
            rates=rates,
            static=bool(first.kwargs.get("static", False)),
        )
        finite = torch.isfinite(losses).tolist()  # one host sync for the class, as `train_clients` has one
        results: list[object] = []
        start = 0
        for r in requests:
            stop = start + r.rows
            bad = [k for k, ok in enumerate(finite[start:stop]) if not ok]
            if bad:
                results.append(Diverged(f"non-finite local loss for clients {bad}"))
            else:
                # copies: a cell keeping its rows must not keep the whole class's tensors alive
                results.append(
                    ({name: t[start:stop].clone() for name, t in new_state.items()}, losses[start:stop].clone())
                )
            start = stop
        return results
