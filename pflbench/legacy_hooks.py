"""The method API's old forms, kept working for one release, for the classes that use them.

The old forms (GUIDE, "Contracts": a plugin written against the documented API keeps working for one
release after a change, with one visible warning naming the user's file and the new form):

- the hooks before the round context, which took the round number and the sampled clients and exchanged
  dicts or lists of dicts: `configure(self, rnd, clients)`, `receive(self, rnd, clients, download)`,
  `local_train(self, rnd, clients, state)`, `send(self, rnd, clients, state)`, `aggregate(self, rnd,
  clients, upload)`, `evaluate(self, personal, split)`, `adapt_locally(self, personal, rnd, epochs)`,
  `newcomer_models(self, rnd, newcomers)` (told apart by their parameter count), and the methods
  `aggregate_arrived`, `evaluate_splits` and `serving(newcomers)`;
- the card's and the capabilities' fields as class attributes (`display_name = ...`, `batched = ...`;
  pflbench.algorithm reads them into the card), and read back from the class (`self.display_name`);
- `check_models` / `check_knobs` / `check_newcomers` (now `Algorithm.check_cell`);
- `salt=` where a batch order is asked for (`fed.train`, `fed.local_plans`, `fed.batch_generators`,
  `pflbench.steps.step_plan` / `step_ids`): now `stream=` (pflbench.streams);
- FedAvg's behaviour from the base class: a class that extends `Algorithm` and leaves one of the hooks
  FedAvg defines (`setup`, `configure`, `receive`, `send`, `aggregate`, `personalized`) to it, or calls
  one of FedAvg's helpers (`is_local`, `stays_on_client`, `shared_names`, `weighted_mean`,
  `fit_local_part`) it does not define, when `Algorithm` was FedAvg: now it extends `FedAvg`
  (pflbench.fedavg);
- checkpoint state found by walking the instance's attributes: a class none of whose own classes
  declares `state`, and whose source sets attributes its bases do not declare: now it declares them
  (`state = (*Base.state, "name", ...)`, pflbench.algorithm). The walk goes on for such a class, rather
  than an error, because it was the documented contract ("keep your state in attributes and there is
  nothing to write"), and a documented form keeps working for one release (GUIDE, "Contracts").

`adapt(cls)` runs when a class is registered (`ALGORITHMS.register`, which calls it as the registries'
adapter that pflbench.plugins installs: this module builds on pflbench.algorithm and pflbench.fedavg, so
they never import it). A class that uses none of them
(every built-in) is returned as it is: nothing of this module wraps or touches it. A class that uses one
(its hooks' forms, its attributes, and for the calls its source) is registered as an adapted
subclass, `cls` between two classes of this module, its method resolution order

    [Adapted, cls and the user's classes above it, OldFormBase, the first built-in base, ..., Algorithm]

(FedAvg placed before `Algorithm` where the class relied on it; a class whose only old forms are these
two is `[Adapted, cls, ..., FedAvg, Algorithm]`, with no hook wrapped):

- `Adapted`'s hooks take the engine's calls (the round's `Round`, a `Payload`, the evaluation's
  `Serving`) to the user's old-form hooks translated: the round as a `RoundNumber` (an int that carries
  its Round, so that a `local_train`'s `fed.train(rnd, ...)` is still cut to the stragglers' share, and
  nothing else it trains is, as before), payloads as the dict (stacked) or list (per client) it
  exchanged, its `evaluate`/`adapt_locally` on newcomers with `self.fed` standing for the newcomers'
  engine for the call; an `aggregate_arrived` override receives the arrived uploads, an
  `evaluate_splits` override scores the models;
- `OldFormBase`'s hooks take the user's old-form calls (`super().configure(rnd, clients)`, ...) to the
  built-in's new-form hooks, so it may subclass any built-in; it holds the old methods (warning when
  called), the mirror attributes (`display_name`, `batched`, ...) and `self.fed`, the engine interface
  (`self.engine`) under its old name, without a notice of its own;
- where it passes `salt=`, its `fed` accepts it (`SaltedFederation`), and so do `step_plan` /
  `step_ids` as its module calls them;
- where it declares no state, `Adapted.state_dict` / `load_state_dict` walk the instance's attributes
  (all but `engine`, `hp`, `state_objects` and `state_rebuilt`), as checkpoints did before.

Each old form is said once, at the user's file and line (pflbench.deprecation: a DeprecationWarning, and
on the command line one line per file): the hooks', the attributes', FedAvg's and the state's when the
class is registered, a call's (salt=, check_*, ...) when it is made.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
import sys
import tokenize
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Callable, Iterator

import torch

from pflbench import deprecation, steps, streams
from pflbench.algorithm import ALGORITHMS, A, Algorithm
from pflbench.algorithm_state import captured_state, restore_state
from pflbench.capabilities import LEGACY_CAPABILITY_ATTRIBUTES, refusal
from pflbench.card import LEGACY_CARD_ATTRIBUTES
from pflbench.fedavg import FedAvg
from pflbench.payload import Payload
from pflbench.round_context import Round, RoundNumber
from pflbench.serving import Serving

if TYPE_CHECKING:
    from pflbench.capabilities import Capabilities
    from pflbench.card import Card

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
OLD_PARAMETERS = {
    "configure": ("rnd", "clients"), "receive": ("rnd", "clients", "download"),
    "local_train": ("rnd", "clients", "state"), "send": ("rnd", "clients", "state"),
    "aggregate": ("rnd", "clients", "upload"), "evaluate": ("personal", "split"),
    "adapt_locally": ("personal", "rnd", "epochs"), "newcomer_models": ("rnd", "newcomers"),
}
WHERE = ("(Round: pflbench.round_context, Payload: pflbench.payload, Serving: pflbench.serving; "
         "docs/howto/own-method.md)")
MIRRORS = (*LEGACY_CARD_ATTRIBUTES, *LEGACY_CAPABILITY_ATTRIBUTES)
# Old forms found in a module's source: what makes a class that is otherwise current need the adapter.
OLD_CALLS = re.compile(r"\bsalt\s*=|\.(check_models|check_knobs|check_newcomers|serving|aggregate_arrived|"
                       r"evaluate_splits)\(")
MIRROR_READS = re.compile(r"\b(self|cls|type\(self\))\.(" + "|".join(MIRRORS) + r")\b(?!\s*=[^=])")


# ---- what a class uses of the old forms ----------------------------------------------------------------

def _is_built_in(klass: type) -> bool:
    return klass.__module__ == "pflbench" or klass.__module__.startswith("pflbench.") or klass is object


def _user_classes(cls: type) -> list[type]:
    """`cls` and the classes above it that are the user's (before the first of pflbench's own)."""
    mro = cls.__mro__
    first = next(i for i, klass in enumerate(mro) if _is_built_in(klass))
    return list(mro[:first])


def _parameters(fn: Callable) -> int | None:
    """Positional parameters after `self`; None where *args makes the form unknowable."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _is_old_hook(name: str, fn: Any) -> bool:
    old_count, new_count = FORMS[name]
    return inspect.isfunction(fn) and old_count != new_count and _parameters(fn) == old_count


def _source(klass: type) -> str:
    try:
        return inspect.getsource(klass)
    except (OSError, TypeError):
        return ""


@dataclasses.dataclass
class OldForms:
    """What a class uses of the old forms (module doc)."""

    hooks: list[tuple[type, str]]  # (the user's class, hook) defined in the old form
    methods: list[tuple[type, str]]  # (the user's class, "aggregate_arrived" | "evaluate_splits") overridden
    attributes: bool  # declares card or capability fields as class attributes
    calls: bool  # its source calls an old form (salt=, check_*, serving, ...) or reads a mirror
    salt: bool  # its source passes salt=
    fedavg: list[str] = dataclasses.field(default_factory=list)  # FedAvg's hooks / helpers it relied on
    walked: list[str] | None = None  # the attributes it sets undeclared, where it declares no state

    @property
    def hook_forms(self) -> bool:
        """Whether it uses an old form of the hooks, methods, attributes or calls (`OldFormBase`)."""
        return bool(self.hooks or self.methods or self.attributes or self.calls)

    def __bool__(self) -> bool:
        return self.hook_forms or bool(self.fedavg) or self.walked is not None


def old_forms(cls: type) -> OldForms:
    users = _user_classes(cls)
    hooks = [(k, name) for k in users for name in FORMS if _is_old_hook(name, k.__dict__.get(name))]
    methods = [(k, name) for k in users for name in ("aggregate_arrived", "evaluate_splits")
               if inspect.isfunction(k.__dict__.get(name))]
    attributes = any(name in k.__dict__ for k in users for name in MIRRORS)
    sources = [_source(k) for k in users]
    calls = any(OLD_CALLS.search(s) or MIRROR_READS.search(s) for s in sources)
    salt = any(re.search(r"\bsalt\s*=", s) for s in sources)
    fedavg = _fedavg_relied_on(cls, users, sources)
    return OldForms(hooks, methods, attributes, calls, salt, fedavg, _walked_state(cls, users, sources, fedavg))


FEDAVG_HOOKS = ("setup", "configure", "receive", "send", "aggregate", "personalized")
FEDAVG_HELPERS = ("is_local", "stays_on_client", "shared_names", "weighted_mean", "fit_local_part")
ASSIGNED = re.compile(r"\bself\.([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)")  # `self.name = ...`, annotated or not


def _uncommented(source: str) -> str:
    """`source` without its comments (a commented-out example assigns nothing)."""
    lines = source.splitlines()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, SyntaxError):  # a class's source cut from its module: keep it as it is
        return source
    return "\n".join(lines)


def _fedavg_relied_on(cls: type, users: list[type], sources: list[str]) -> list[str]:
    """FedAvg's hooks that `cls` leaves to `Algorithm`, and FedAvg's helpers its source calls without
    defining them, when it does not extend FedAvg (the hooks' defaults were FedAvg's)."""
    if not users or issubclass(cls, FedAvg):
        return []
    hooks = [name for name in FEDAVG_HOOKS if getattr(cls, name) is getattr(Algorithm, name)]
    defined = {name for klass in cls.__mro__ for name in klass.__dict__}
    helpers = [name for name in FEDAVG_HELPERS if name not in defined
               and any(re.search(rf"\b(self|super\(\))\.{name}\(", source) for source in sources)]
    return hooks + helpers


def _walked_state(cls: type, users: list[type], sources: list[str], fedavg: list[str]) -> list[str] | None:
    """Where none of the user's classes declares `state`: the attributes its source sets that its bases
    (and FedAvg, where it relied on it) do not declare, or [] where its source cannot be read; else None."""
    if not users or any("state" in klass.__dict__ for klass in users):
        return None
    bases = [cls, FedAvg] if fedavg else [cls]
    kinds = ("state", "state_objects", "state_rebuilt")
    declared = {"engine", "hp", "fed", *(n for k in bases for kind in kinds for n in getattr(k, kind))}
    if not all(sources):
        return []
    assigned = dict.fromkeys(m.group(1) for source in sources for m in ASSIGNED.finditer(_uncommented(source)))
    undeclared = [name for name in assigned if name not in declared]
    return undeclared or None


# ---- the adapter ----------------------------------------------------------------------------------------

def adapt(cls: A, card: Card | None = None, capabilities: Capabilities | None = None) -> A:
    """`cls` itself where it uses no old form; else its adapted subclass (module doc), the old forms of
    its hooks said at their lines. `card` and `capabilities` (the registry's) give the mirror attributes."""
    uses = old_forms(cls)
    if not uses:
        return cls
    for klass, name in uses.hooks:
        form = f"{name}({', '.join(OLD_PARAMETERS[name])})"
        deprecation.warn(f"algorithm class {klass.__qualname__}: {form} is the old form of the hook, "
                         f"deprecated; write {NEW_FORM[name]} {WHERE}",
                         old=f"{klass.__name__}.{form}", new=NEW_FORM[name],
                         where=deprecation.location_of(klass.__dict__[name]))
    for klass, name in uses.methods:
        hook = "aggregate" if name == "aggregate_arrived" else "evaluate"
        why = ("receives only the uploads that reached the server (upload.clients, and upload.positions among "
               "rnd.clients)" if hook == "aggregate" else "is called with every split")
        deprecation.warn(f"algorithm class {klass.__qualname__}: {name} is deprecated; {NEW_FORM[hook]} {why} "
                         f"{WHERE}", old=f"{klass.__name__}.{name}", new=NEW_FORM[hook],
                         where=deprecation.location_of(klass.__dict__[name]))
    if uses.fedavg:
        deprecation.warn(
            f"algorithm class {cls.__qualname__} extends Algorithm, which was FedAvg and is now only the hooks; "
            f"it relies on FedAvg's {', '.join(uses.fedavg)}: extend FedAvg (from pflbench.fedavg "
            f"import FedAvg; class {cls.__name__}(FedAvg))",
            old=f"class {cls.__name__}(Algorithm) relying on FedAvg's {', '.join(uses.fedavg)}",
            new=f"class {cls.__name__}(FedAvg)", owner=cls)
    if uses.walked is not None:
        names = ", ".join(repr(name) for name in uses.walked) or "..."
        declared = "FedAvg" if uses.fedavg else cls.__mro__[1].__name__  # whose `state` it extends
        deprecation.warn(
            f"algorithm class {cls.__qualname__}: checkpoint state found by walking the instance's attributes is "
            f"deprecated; declare what rounds change: state = (*{declared}.state, {names}) "
            f"(pflbench.algorithm: state, state_objects, state_rebuilt)",
            old=f"{cls.__name__}: undeclared state ({names})",
            new=f"state = (*{declared}.state, {names})", owner=cls)
    _say_mirror_reads(cls)
    base = FedAvg if uses.fedavg else cls.__mro__[len(_user_classes(cls))]
    namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "__doc__": cls.__doc__, "__pflbench_adapted__": cls}
    if uses.walked is not None:
        namespace.update(state_dict=walked_state_dict, load_state_dict=load_walked_state_dict)
    if not uses.hook_forms:  # FedAvg's defaults or undeclared state only: no hook wrapped
        bases = (cls, base) if uses.fedavg else (cls,)
        return cast("A", type(cls.__name__, bases, namespace))
    box: list[type] = []  # OldFormBase, for its hooks' super()
    old_base = type(f"{base.__name__}OldForm", (base,), {
        "__module__": __name__, "__doc__": "The old forms' base (pflbench.legacy_hooks)",
        **{name: _old_call_of_new(name, box) for name in FORMS}, **_OLD_METHODS,
        **_mirrors(card, capabilities), "fed": _FED,
    })
    box.append(old_base)
    for name in FORMS:  # the user's hook, else the base's (FedAvg's where it relied on it)
        namespace[name] = _dispatch(name, next(k.__dict__[name] for k in (*_user_classes(cls), *base.__mro__)
                                               if name in k.__dict__))
    if any(name == "aggregate_arrived" for _, name in uses.methods):
        namespace["aggregate"] = _routing_aggregate(namespace["aggregate"])
    splits = next((k.__dict__["evaluate_splits"] for k, name in uses.methods if name == "evaluate_splits"), None)
    if splits is not None:
        namespace["evaluate"] = _evaluating_splits(splits)
    adapted_box: list[Any] = []
    if uses.salt:

        def __init__(self: Any, fed: Any, hp: Any) -> None:
            super(adapted_box[0], self).__init__(SaltedFederation(_federation(fed)), hp)

        namespace["__init__"] = __init__
        _salted_steps(cls)
    adapted = type(cls.__name__, (cls, old_base), namespace)
    adapted_box.append(adapted)
    return cast("A", adapted)


# ---- checkpoint state found by walking the instance (a class that declares none) -------------------------

def _walked(algorithm: Any) -> tuple[str, ...]:
    cls = type(algorithm)
    skipped = {"engine", "hp", *cls.state_rebuilt, *cls.state_objects}
    return tuple(name for name in vars(algorithm) if name not in skipped)


def walked_state_dict(self: Any) -> dict:
    """`Algorithm.state_dict()` of a class that declares no state: every attribute but `engine`, `hp`,
    `state_rebuilt` and `state_objects` (those through their own state), as checkpoints were taken before."""
    return captured_state(self, _walked(self))


def load_walked_state_dict(self: Any, state: dict) -> None:
    """`Algorithm.load_state_dict()` of a class that declares no state (`walked_state_dict`'s)."""
    restore_state(self, state, tuple(dict.fromkeys((*_walked(self), *state["attributes"]))))


def _engine(self: Any) -> Any:
    return self.engine


def _set_engine(self: Any, engine: Any) -> None:
    self.engine = engine


# An old-form class's `self.fed`: the engine interface (`self.engine`), under its old name, without a
# notice of its own (the class's old forms are said already).
_FED = property(_engine, _set_engine, doc="The engine (`self.engine`), under the name an old-form class uses.")


def _mirrors(card: Card | None, capabilities: Capabilities | None) -> dict[str, Any]:
    """The card's and the capabilities' fields as the class attributes they were before cards."""
    values: dict[str, Any] = {}
    if card is not None:
        values.update({name: getattr(card, name) for name in LEGACY_CARD_ATTRIBUTES})
    if capabilities is not None:
        values.update({name: getattr(capabilities, field) for name, field in LEGACY_CAPABILITY_ATTRIBUTES.items()})
    return values


def _say_mirror_reads(cls: type) -> None:
    for klass in _user_classes(cls):
        try:
            lines, first = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        filename = inspect.getsourcefile(klass) or ""
        for offset, line in enumerate(lines):
            for match in MIRROR_READS.finditer(line.split("#", 1)[0]):
                attribute = match.group(2)
                field = LEGACY_CAPABILITY_ATTRIBUTES.get(attribute)
                new = f"self.capabilities.{field}" if field else f"self.card.{attribute}"
                deprecation.warn(f"algorithm class {klass.__qualname__}: {match.group(0)} is deprecated; read {new}",
                                 old=match.group(0), new=new, where=(filename, first + offset))


def _is_context(value: Any) -> bool:
    return isinstance(value, (Round, Serving))


def _new_call(args: tuple, kwargs: dict) -> bool:
    """Whether a hook was called in the new form (a Round or Serving first, or no argument at all)."""
    first = args[0] if args else kwargs.get("rnd", kwargs.get("serving"))
    return _is_context(first) or not (args or kwargs)


def _dispatch(name: str, impl: Callable) -> Callable:
    """`Adapted`'s hook: a call in either form reaches `impl` (the class's own) in its form."""
    old = getattr(impl, "__pflbench_adapted__", None) is None and _is_old_hook(name, impl)

    @functools.wraps(impl)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _new_call(args, kwargs) == old:  # a new-form call of an old hook, or an old-form call of a new one
            return _call_old(name, self, impl, *args) if old else _call_new(name, self, impl, *args, **kwargs)
        return impl(self, *args, **kwargs)

    hook.__pflbench_adapted__ = True  # type: ignore[attr-defined]
    return hook


def _old_call_of_new(name: str, box: list[type]) -> Callable:
    """`OldFormBase`'s hook: the user's `super().<hook>(...)` in the old form reaches the built-in's."""

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        new = getattr(super(box[0], self), name)
        if _new_call(args, kwargs):
            return new(*args, **kwargs)
        return _call_new(name, self, lambda _self, *a, **k: new(*a, **k), *args, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    hook.__pflbench_adapted__ = True  # type: ignore[attr-defined]
    return hook


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
    """The Round an old-form call means: the one a `RoundNumber` carries (for `clients`; the engine's
    `ClientRound`, with its download, where the call comes from a client-side hook), else a round
    outside the engine's local training (nothing cut, no download: a plain `Round`), as a plain number
    meant before."""
    if isinstance(rnd, RoundNumber):
        return dataclasses.replace(rnd.round, clients=clients)
    return Round(int(rnd), clients)


@contextmanager
def _serving(algorithm: Any, fed: Any) -> Iterator[None]:
    """`algorithm.fed` is `fed` while an old-form evaluation hook serves another population."""
    if fed is algorithm.fed or fed is getattr(algorithm.fed, "federation", None):
        yield
        return
    trained = algorithm.fed
    algorithm.fed = SaltedFederation(fed) if isinstance(trained, SaltedFederation) else fed
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
    fed = _federation(self.fed)
    if name == "evaluate":
        split = values["split"]
        serving = Serving(0, fed, adapt_epochs=fed.cell.finetune_epochs)
        return new(self, serving, values["personal"], (split,))[split]
    if name == "adapt_locally":
        return new(self, Serving(int(values["rnd"]), fed, adapt_epochs=values["epochs"]), values["personal"])
    return new(self, Serving(int(values["rnd"]), _federation(values["newcomers"]), newcomers=True,
                             adapt_epochs=fed.cell.finetune_epochs))


def _bind(name: str, args: tuple, kwargs: dict) -> dict:
    names = OLD_PARAMETERS[name]
    if len(args) > len(names):
        raise TypeError(f"{name}() takes {len(names)} arguments in its old form ({', '.join(names)})")
    values = dict(zip(names, args))
    values.update(kwargs)
    return values


def _routing_aggregate(inherited: Callable) -> Callable:
    """`aggregate` of a class that overrides the old `aggregate_arrived`: when uploads were lost, the
    arrived ones go to its `aggregate_arrived`, as the engine did."""

    @functools.wraps(inherited)
    def aggregate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and isinstance(args[0], Round) and len(args[1]) < len(args[0].clients):
            rnd, upload = args
            return self.aggregate_arrived(_number(rnd), rnd.clients, old_form(upload), upload.positions)
        return inherited(self, *args, **kwargs)

    return aggregate


def _evaluating_splits(old: Callable) -> Callable:
    """`evaluate` of a class that overrides the old `evaluate_splits(personal, splits)`: the engine's
    scoring reaches it, with `self.fed` the population served for the call."""

    @functools.wraps(old)
    def evaluate(self: Any, serving: Any, models: Any, splits: tuple[str, ...]) -> Any:
        with _serving(self, serving.clients):
            return old(self, models, splits)

    return evaluate


# ---- the old methods (OldFormBase's), for one release ------------------------------------------------------

def _deprecated(old: str, new: str) -> None:
    deprecation.warn(f"{old} is deprecated: use {new} {WHERE}", old=old, new=new)


def aggregate_arrived(self: Any, rnd: Any, clients: Any, upload: Any, positions: Any) -> None:
    """Deprecated: `aggregate(rnd, upload)` receives only the uploads that arrived."""
    _deprecated("Algorithm.aggregate_arrived(rnd, clients, upload, positions)", NEW_FORM["aggregate"])
    if len(positions):
        self.aggregate(rnd, clients[positions], upload)


def evaluate_splits(self: Any, personal: Any, splits: tuple[str, ...]) -> Any:
    """Deprecated: `evaluate(serving, models, splits)` scores every split."""
    _deprecated("Algorithm.evaluate_splits(personal, splits)", NEW_FORM["evaluate"])
    fed = _federation(self.fed)
    return self.evaluate(Serving(0, fed, adapt_epochs=fed.cell.finetune_epochs), personal, tuple(splits))


@contextmanager
def serving(self: Any, newcomers: Any) -> Iterator[Any]:
    """Deprecated: the evaluation hooks receive the population they serve (`Serving.clients`)."""
    _deprecated("Algorithm.serving(newcomers)", "the Serving the evaluation hooks receive (serving.clients)")
    with _serving(self, newcomers):
        yield self.fed


class _ModelOnly:
    """A cell that sets only `model` (for check_models)."""

    def __init__(self, model: str):
        self.model, self.unseen_fraction = model, 0.0
        self.system: dict[str, Any] = {}
        self.privacy: dict[str, Any] = {}


def check_models(cls: Any, model: str) -> None:
    _deprecated("Algorithm.check_models(model)", "Algorithm.check_cell(cell)")
    problem = refusal(cls.name, dataclasses.replace(cls.capabilities, refused_knobs={}, newcomers=""),
                      _ModelOnly(model), ((n, c.capabilities) for n, c in ALGORITHMS.items()))
    if problem is not None:
        raise problem


def check_knobs(cls: Any, cell: Any) -> None:
    _deprecated("Algorithm.check_knobs(cell)", "Algorithm.check_cell(cell)")
    cls.check_cell(cell.model_copy(update={"unseen_fraction": 0.0, "model": "auto"}))


def check_newcomers(cls: Any, cell: Any) -> None:
    _deprecated("Algorithm.check_newcomers(cell)", "Algorithm.check_cell(cell)")
    cls.check_cell(cell.model_copy(update={"system": {}, "privacy": {}, "model": "auto"}))


_OLD_METHODS: dict[str, Any] = {
    "aggregate_arrived": aggregate_arrived, "evaluate_splits": evaluate_splits, "serving": serving,
    "check_models": classmethod(check_models), "check_knobs": classmethod(check_knobs),
    "check_newcomers": classmethod(check_newcomers),
}


# ---- salt= ------------------------------------------------------------------------------------------------

def batch_stream(stream: streams.StreamLike | None, salt: int | None) -> streams.StreamLike:
    """The batch-order stream of a call that still passes the deprecated `salt=`."""
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
    found = {s.salt: s for s in streams.ENGINE.values() if s.salt is not None}
    for _, cls in ALGORITHMS.items():
        for owner in (*cls.__mro__, sys.modules.get(cls.__module__)):
            for value in vars(owner).values() if owner is not None else ():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(item, streams.Stream) and item.salt is not None:
                        found.setdefault(item.salt, item)
    return found


class SaltedFederation:
    """The Federation as an old-form plugin that passes `salt=` uses it: `train`, `local_plans` and
    `batch_generators` take it (with a deprecation notice); everything else is the Federation's."""

    def __init__(self, federation: Any):
        object.__setattr__(self, "federation", federation)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.federation, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.federation, name, value)

    def batch_generators(self, rnd: Any, clients: Any, salt: int | None = None, *, stream: Any = None) -> Any:
        return self.federation.batch_generators(rnd, clients, stream=batch_stream(stream, salt))

    def train(self, *args: Any, salt: int | None = None, stream: Any = None, **kwargs: Any) -> Any:
        return self.federation.train(*args, stream=batch_stream(stream, salt), **kwargs)

    def local_plans(self, *args: Any, salt: int | None = None, stream: Any = None, **kwargs: Any) -> Any:
        return self.federation.local_plans(*args, stream=batch_stream(stream, salt), **kwargs)


def _federation(fed: Any) -> Any:
    return fed.federation if isinstance(fed, SaltedFederation) else fed


def step_plan(fed: Any, *args: Any, salt: int | None = None, stream: Any = None, **kwargs: Any) -> Any:
    """`pflbench.steps.step_plan`, taking the deprecated `salt=` (in a module that passes it)."""
    return steps.step_plan(_federation(fed), *args, stream=batch_stream(stream, salt), **kwargs)


def step_ids(fed: Any, *args: Any, salt: int | None = None, stream: Any = None, **kwargs: Any) -> Any:
    """`pflbench.steps.step_ids`, taking the deprecated `salt=` (in a module that passes it)."""
    return steps.step_ids(_federation(fed), *args, stream=batch_stream(stream, salt), **kwargs)


def _salted_steps(cls: type) -> None:
    """In the modules of `cls`'s classes that imported them, `step_plan` / `step_ids` take `salt=`."""
    for klass in _user_classes(cls):
        module = sys.modules.get(klass.__module__)
        for name, salted in (("step_plan", step_plan), ("step_ids", step_ids)):
            if module is not None and vars(module).get(name) is getattr(steps, name):
                setattr(module, name, salted)
