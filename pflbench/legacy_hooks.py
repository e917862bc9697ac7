"""The hooks' old form, kept working for one release (the method API is public: GUIDE, "Contracts").

Before the round context, the hooks took the round number and the sampled clients and exchanged
dicts or lists of dicts: `configure(self, rnd, clients)`, `receive(self, rnd, clients, download)`,
`local_train(self, rnd, clients, state)`, `send(self, rnd, clients, state)`, `aggregate(self, rnd,
clients, upload)`, `aggregate_arrived(self, rnd, clients, upload, positions)`, `evaluate(self,
personal, split)`, `adapt_locally(self, personal, rnd, epochs)`, `newcomer_models(self, rnd,
newcomers)`. A class that still defines a hook in that form (told apart by its parameter count) gets a
DeprecationWarning naming the new form when it is defined, at the hook's line of the user's file (and on
the command line one line per file: pflbench.deprecation), and runs as it did:

- the engine's calls reach its old-form hooks translated: the round as a `RoundNumber` (an int that
  carries its Round, so that its `local_train`'s `fed.train(rnd, ...)` is still cut to the stragglers'
  share, and nothing else it trains is, as before), payloads as
  the dict (stacked) or list (per client) it returned, its `evaluate`/`adapt_locally` on newcomers with
  `self.fed` standing for the newcomers' Federation for the call (as `Algorithm.serving` did);
- its calls in the old form (`super().configure(rnd, clients)`, ...) reach new-form hooks translated
  back, so it may subclass any built-in;
- `aggregate_arrived`, where a class overrides it, receives the arrived uploads as before, and an
  override of `evaluate_splits(personal, splits)` scores the models as before.

Every hook of every algorithm class passes through `LegacyHooks.__init_subclass__`; new-form hooks get
only the translation of old-form calls (one isinstance per call).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from contextlib import contextmanager
from typing import Any, Callable

import torch

from pflbench import deprecation, streams
from pflbench.payload import Payload
from pflbench.round_context import Round, RoundNumber
from pflbench.serving import Serving

# hook -> (parameters of the old form, of the new form), `self` not counted
FORMS = {
    "configure": (2, 1), "receive": (3, 2), "local_train": (3, 2), "send": (3, 2), "aggregate": (3, 2),
    "evaluate": (2, 3), "adapt_locally": (3, 2), "newcomer_models": (2, 1),
}
NEW_FORM = {
    "configure": "configure(self, rnd: Round) -> Payload",
    "receive": "receive(self, rnd: Round, download: Payload) -> state",
    "local_train": "local_train(self, rnd: Round, state) -> state",
    "send": "send(self, rnd: Round, state) -> Payload",
    "aggregate": "aggregate(self, rnd: Round, upload: Payload) -> None",
    "evaluate": "evaluate(self, serving: Serving, models, splits: tuple[str, ...]) -> {split: (accuracy, loss)}",
    "adapt_locally": "adapt_locally(self, serving: Serving, models) -> models",
    "newcomer_models": "newcomer_models(self, serving: Serving) -> models",
}
WHERE = ("(Round: pflbench.round_context, Payload: pflbench.payload, Serving: pflbench.serving; "
         "docs/howto/own-method.md)")


def _parameters(fn: Callable) -> int | None:
    """Positional parameters after `self`; None where *args makes the form unknowable."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _is_context(value: Any) -> bool:
    return isinstance(value, (Round, Serving))


def old_form(payload: Payload) -> Any:
    """A payload as an old-form hook exchanged it: a stacked dict, or a list of per-client dicts."""
    return payload.state if payload.is_stacked else payload.rows


def as_payload(value: Any, clients: Any) -> Payload:
    """What an old-form hook returned (a dict of stacked tensors, or a list of per-client dicts)."""
    if isinstance(value, Payload):
        return value
    if isinstance(value, (list, tuple)):
        count = len(value)
        owners = clients if count == len(clients) else _owners(clients, count)
        return Payload.from_rows(list(value), owners)
    return Payload.from_state(dict(value), clients)


def _owners(clients: Any, count: int) -> Any:
    """Rows beyond the sampled clients (one message per client of the cell, e.g.): positions 0.. after them."""
    extra = torch.arange(count - len(clients), device=clients.device)
    return torch.cat([clients, extra])


def _round_of(rnd: Any, clients: Any) -> Round:
    """The Round an old-form call means: the one a `RoundNumber` carries (for `clients`), else a round
    outside the engine's local training (nothing cut), as a plain number meant before."""
    if isinstance(rnd, RoundNumber):
        return dataclasses.replace(rnd.round, clients=clients)
    return Round(int(rnd), clients)


@contextmanager
def _serving(algorithm: Any, fed: Any):
    """`algorithm.fed` is `fed` while an old-form evaluation hook serves another population."""
    if fed is algorithm.fed:
        yield
        return
    trained, algorithm.fed = algorithm.fed, fed
    try:
        yield
    finally:
        algorithm.fed = trained


# ---- the engine's (new-form) call of an old-form hook -----------------------------------------------

def _number(rnd: Round, local: bool = False) -> RoundNumber:
    """The round number an old-form hook receives: carrying the Round, its work shares only in
    `local_train` (where the old engine cut a straggler's plans, and nowhere else)."""
    return RoundNumber(rnd if local else dataclasses.replace(rnd, work=None))


def _call_old(name: str, self: Any, old: Callable, *args: Any) -> Any:
    if name == "configure":
        (rnd,) = args
        return as_payload(old(self, _number(rnd), rnd.clients), rnd.clients)
    if name == "receive":
        rnd, download = args
        return old(self, _number(rnd), rnd.clients, old_form(download))
    if name == "local_train":
        rnd, state = args
        return old(self, _number(rnd, local=True), rnd.clients, state)
    if name == "send":
        rnd, state = args
        return as_payload(old(self, _number(rnd), rnd.clients, state), rnd.clients)
    if name == "aggregate":
        rnd, upload = args
        return old(self, _number(rnd), upload.clients, old_form(upload))
    serving = args[0]
    if name == "evaluate":
        models, splits = args[1:]
        with _serving(self, serving.clients):
            return {split: old(self, models, split) for split in splits}
    if name == "adapt_locally":
        with _serving(self, serving.clients):
            return old(self, args[1], serving.round, serving.adapt_epochs)
    return old(self, serving.round, serving.clients)  # newcomer_models


# ---- an old-form call of a new-form hook --------------------------------------------------------------

def _call_new(name: str, self: Any, new: Callable, *args: Any, **kwargs: Any) -> Any:
    values = _bind(name, args, kwargs)
    if name in ("configure", "receive", "local_train", "send", "aggregate"):
        clients = values["clients"]
        rnd = _round_of(values["rnd"], clients)
        if name == "configure":
            return old_form(new(self, rnd))
        if name == "receive":
            download = as_payload(values["download"], clients)
            return new(self, rnd.with_download(download), download)
        if name == "local_train":
            return new(self, rnd, values["state"])
        if name == "send":
            return old_form(new(self, rnd, values["state"]))
        return new(self, rnd, as_payload(values["upload"], clients))
    fed = self.fed
    if name == "evaluate":
        split = values["split"]
        serving = Serving(0, fed, adapt_epochs=fed.cell.finetune_epochs)
        return new(self, serving, values["personal"], (split,))[split]
    if name == "adapt_locally":
        return new(self, Serving(int(values["rnd"]), fed, adapt_epochs=values["epochs"]), values["personal"])
    return new(self, Serving(int(values["rnd"]), values["newcomers"], newcomers=True,
                             adapt_epochs=fed.cell.finetune_epochs))


OLD_PARAMETERS = {
    "configure": ("rnd", "clients"), "receive": ("rnd", "clients", "download"),
    "local_train": ("rnd", "clients", "state"), "send": ("rnd", "clients", "state"),
    "aggregate": ("rnd", "clients", "upload"), "evaluate": ("personal", "split"),
    "adapt_locally": ("personal", "rnd", "epochs"), "newcomer_models": ("rnd", "newcomers"),
}


def _bind(name: str, args: tuple, kwargs: dict) -> dict:
    names = OLD_PARAMETERS[name]
    if len(args) > len(names):
        raise TypeError(f"{name}() takes {len(names)} arguments in its old form ({', '.join(names)})")
    values = dict(zip(names, args))
    values.update(kwargs)
    return values


# ---- wrapping the hooks of each class -----------------------------------------------------------------

def _old_form_hook(name: str, old: Callable) -> Callable:
    @functools.wraps(old)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and _is_context(args[0]):
            return _call_old(name, self, old, *args)
        return old(self, *args, **kwargs)

    hook.__pflbench_hook__ = "old"  # type: ignore[attr-defined]
    return hook


def _new_form_hook(name: str, new: Callable) -> Callable:
    @functools.wraps(new)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get("rnd", kwargs.get("serving"))
        if _is_context(first) or not (args or kwargs):
            return new(self, *args, **kwargs)
        return _call_new(name, self, new, *args, **kwargs)

    hook.__pflbench_hook__ = "new"  # type: ignore[attr-defined]
    return hook


def _routing_aggregate(inherited: Callable) -> Callable:
    """`aggregate` of a class that overrides the old `aggregate_arrived`: when uploads were lost, the
    arrived ones go to its `aggregate_arrived`, as the engine did."""

    @functools.wraps(inherited)
    def aggregate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and isinstance(args[0], Round) and len(args[1]) < len(args[0].clients):
            rnd, upload = args
            return self.aggregate_arrived(_number(rnd), rnd.clients, old_form(upload), upload.positions)
        return inherited(self, *args, **kwargs)

    aggregate.__pflbench_hook__ = "routed"  # type: ignore[attr-defined]
    return aggregate


def _evaluating_splits(old: Callable) -> Callable:
    """`evaluate` of a class that overrides the old `evaluate_splits(personal, splits)`: the engine's
    scoring reaches it, with `self.fed` the population served for the call."""

    @functools.wraps(old)
    def evaluate(self: Any, serving: Any, models: Any, splits: tuple[str, ...]) -> Any:
        with _serving(self, serving.clients):
            return old(self, models, splits)

    evaluate.__pflbench_hook__ = "old"  # type: ignore[attr-defined]
    return evaluate


class LegacyHooks:
    """What keeps the old form working (module doc): the hooks' translation, and the old methods."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, (old_count, new_count) in FORMS.items():
            fn = cls.__dict__.get(name)
            if not inspect.isfunction(fn) or hasattr(fn, "__pflbench_hook__"):
                continue
            count = _parameters(fn)
            if count == old_count and old_count != new_count:
                form = f"{name}({', '.join(OLD_PARAMETERS[name])})"
                deprecation.warn(f"algorithm class {cls.__qualname__}: {form} is the old form of the hook, "
                                 f"deprecated; write {NEW_FORM[name]} {WHERE}",
                                 old=f"{cls.__name__}.{form}", new=NEW_FORM[name], where=deprecation.location_of(fn))
                setattr(cls, name, _old_form_hook(name, fn))
            elif count == new_count:
                setattr(cls, name, _new_form_hook(name, fn))
        if inspect.isfunction(cls.__dict__.get("aggregate_arrived")):
            deprecation.warn(f"algorithm class {cls.__qualname__}: aggregate_arrived is deprecated; "
                             f"{NEW_FORM['aggregate']} receives only the uploads that reached the server "
                             f"(upload.clients, and upload.positions among rnd.clients) {WHERE}",
                             old=f"{cls.__name__}.aggregate_arrived(rnd, clients, upload, positions)",
                             new=NEW_FORM["aggregate"], where=deprecation.location_of(cls.__dict__["aggregate_arrived"]))
            cls.aggregate = _routing_aggregate(cls.aggregate)  # type: ignore[method-assign]
        if inspect.isfunction(cls.__dict__.get("evaluate_splits")):
            deprecation.warn(f"algorithm class {cls.__qualname__}: evaluate_splits is deprecated; the engine calls "
                             f"{NEW_FORM['evaluate']} with every split {WHERE}",
                             old=f"{cls.__name__}.evaluate_splits(personal, splits)", new=NEW_FORM["evaluate"],
                             where=deprecation.location_of(cls.__dict__["evaluate_splits"]))
            cls.evaluate = _evaluating_splits(cls.__dict__["evaluate_splits"])  # type: ignore[method-assign]

    # ---- the old methods, for one release ------------------------------------------------------------
    def aggregate_arrived(self, rnd: Any, clients: Any, upload: Any, positions: Any) -> None:
        """Deprecated: `aggregate(rnd, upload)` receives only the uploads that arrived."""
        _deprecated("Algorithm.aggregate_arrived(rnd, clients, upload, positions)", NEW_FORM["aggregate"])
        if len(positions):
            self.aggregate(rnd, clients[positions], upload)  # type: ignore[attr-defined]

    def evaluate_splits(self, personal: Any, splits: tuple[str, ...]) -> Any:
        """Deprecated: `evaluate(serving, models, splits)` scores every split."""
        _deprecated("Algorithm.evaluate_splits(personal, splits)", NEW_FORM["evaluate"])
        fed = self.fed  # type: ignore[attr-defined]
        return self.evaluate(Serving(0, fed, adapt_epochs=fed.cell.finetune_epochs), personal,  # type: ignore[attr-defined]
                             tuple(splits))

    @contextmanager
    def serving(self, newcomers: Any):
        """Deprecated: the evaluation hooks receive the population they serve (`Serving.clients`)."""
        _deprecated("Algorithm.serving(newcomers)", "the Serving the evaluation hooks receive (serving.clients)")
        with _serving(self, newcomers):
            yield newcomers


def _deprecated(old: str, new: str) -> None:
    deprecation.warn(f"{old} is deprecated: use {new} {WHERE}", old=old, new=new)


# ---- the deprecated `salt=` of the engine's training calls ---------------------------------------------

def batch_stream(stream: streams.StreamLike | None, salt: int | None) -> streams.StreamLike:
    """The batch-order stream of a call that may still pass the deprecated `salt=` (one release)."""
    if salt is None:
        return streams.BATCHES if stream is None else stream
    declared = _declared_batch_orders().get(salt)
    named = declared.name if declared is not None else "batches.<purpose>"
    deprecation.warn(
        f"salt={salt:#x} is deprecated: pass stream={named!r} (a named stream, pflbench.streams)",
        old=f"salt={salt:#x}",
        new=f"stream={named!r}",
    )
    if stream is not None and str(stream) != streams.BATCHES.name:
        raise ValueError("give stream= or the deprecated salt=, not both")
    # a plugin's own salt: its old derivation, under a name of its own
    return declared if declared is not None else streams.salted_batches(f"batches.salt-{salt:#x}", salt)


def _declared_batch_orders() -> dict[int, streams.Stream]:
    """salt -> the batch-order stream declared with it: the engine's, and those the registered algorithms'
    classes and modules declare (pflbench.streams), to name a deprecated salt's stream."""
    from pflbench.algorithm import ALGORITHMS

    found = {s.salt: s for s in streams.ENGINE.values() if s.salt is not None}
    for _, cls in ALGORITHMS.items():
        for owner in (*cls.__mro__, sys.modules.get(cls.__module__)):
            for value in vars(owner).values() if owner is not None else ():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(item, streams.Stream) and item.salt is not None:
                        found.setdefault(item.salt, item)
    return found

