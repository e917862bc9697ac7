"""The method API's retired forms: a plugin class that still uses one is refused with one line naming
its file and the new form (CHANGELOG.md, "Removed": why they are refused rather than adapted).

Installed by the plugin loader (pflbench.loader.plugins) as the algorithms' registry adapter: `check(cls)` runs
when a class registers; nothing in the core imports this module. It reads signatures and class
attributes, never source text:

- a hook whose positional parameters are those of its form before the round context
  (`configure(self, rnd, clients)`, `evaluate(self, personal, split)`, ...);
- an override of a retired method (`aggregate_arrived`, `evaluate_splits`, `serving`, `check_models`,
  `check_knobs`, `check_newcomers`);
- the card's or the capabilities' fields as class attributes (`display_name = ...`, `batched = ...`);
- a class that extends `Algorithm` and leaves a hook that FedAvg defines to it (when `Algorithm` was
  FedAvg; the base class is now only the hooks).

What a class only reads (`self.fed`, `self.display_name`, `self.check_models(...)`, FedAvg's helpers on a
class that is not a FedAvg) cannot be seen at registration without reading source: on a plugin's
class such a name, where nothing defines it, answers an AttributeError with the same kind of line.
Checkpoint state is declared (pflbench.algorithm: an undeclared attribute fails the cell at the end of
the round that set it), and a batch order is a named stream (`stream=`; the engine's calls refuse
`salt=` as an unexpected keyword, Python's TypeError).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, NoReturn

GUIDE = "docs/howto/own-method.md"

# hook -> (positional parameters of the retired form, of the current one), `self` not counted
FORMS = {
    "configure": (2, 1),
    "receive": (3, 2),
    "local_train": (3, 2),
    "send": (3, 2),
    "aggregate": (3, 2),
    "evaluate": (2, 3),
    "adapt_locally": (3, 2),
    "newcomer_models": (2, 1),
}
OLD_PARAMETERS = {
    "configure": "rnd, clients",
    "receive": "rnd, clients, download",
    "local_train": "rnd, clients, state",
    "send": "rnd, clients, state",
    "aggregate": "rnd, clients, upload",
    "evaluate": "personal, split",
    "adapt_locally": "personal, rnd, epochs",
    "newcomer_models": "rnd, newcomers",
}
NEW_FORM = {
    "configure": "configure(self, rnd: Round) -> Payload",
    "receive": "receive(self, rnd: ClientRound, download: Payload) -> state",
    "local_train": "local_train(self, rnd: ClientRound, state) -> state",
    "send": "send(self, rnd: ClientRound, state) -> Payload",
    "aggregate": "aggregate(self, rnd: ClientRound, upload: Payload) -> None",
    "evaluate": "evaluate(self, serving: Serving, models, splits) -> Scores",
    "adapt_locally": "adapt_locally(self, serving: Serving, models) -> Models",
    "newcomer_models": "newcomer_models(self, serving: Serving) -> Models",
}
RETIRED_METHODS = {
    "aggregate_arrived": f"{NEW_FORM['aggregate']} (it receives only the uploads that arrived)",
    "evaluate_splits": f"{NEW_FORM['evaluate']} (it is called with every split)",
    "serving": "the Serving the evaluation hooks receive (serving.clients)",
    "check_models": "Capabilities(...) and cell_refusal(cls, cell)",
    "check_knobs": "Capabilities(...) and cell_refusal(cls, cell)",
    "check_newcomers": "Capabilities(...) and cell_refusal(cls, cell)",
}
CARD_ATTRIBUTES = ("display_name", "family", "paper", "personalizes", "reference", "row_order", "reduces_to")
CAPABILITY_ATTRIBUTES = {
    "batched": "batched",
    "heterogeneous_models": "heterogeneous_models",
    "refused_knobs": "refused_knobs",
    "newcomers_refused": "newcomers",
}
FEDAVG_HOOKS = ("setup", "configure", "receive", "send", "aggregate", "personalized")
FEDAVG_HELPERS = ("is_local", "stays_on_client", "shared_names", "weighted_mean", "fit_local_part")


class OldFormError(TypeError):
    """A plugin class uses a retired form of the method API (module doc)."""


def _is_own(klass: type) -> bool:
    return klass is object or klass.__module__ == "pflbench" or klass.__module__.startswith("pflbench.")


def _user_classes(cls: type) -> list[type]:
    """`cls` and the classes above it that are the user's (before the first of pflbench's own)."""
    return list(cls.__mro__[: next(i for i, klass in enumerate(cls.__mro__) if _is_own(klass))])


def _positional(fn: Callable[..., Any]) -> int | None:
    """Positional parameters after `self`; None where *args makes the form unknowable."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def where(klass: type, fn: Any = None) -> str:
    """`file:line` of a hook, or the file of a class, as Python knows them."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    return str(getattr(sys.modules.get(klass.__module__), "__file__", None) or klass.__module__)


def old_forms(cls: type) -> list[str]:
    """What `cls` uses of the retired forms (module doc): one 'where: old -> new' per use."""
    from pflbench.algorithm import Algorithm
    from pflbench.fedavg import FedAvg

    found = []
    for klass in _user_classes(cls):
        own = {name: value for name, value in vars(klass).items() if not isinstance(value, Retired)}
        for name, (old, new) in FORMS.items():
            fn = own.get(name)
            if inspect.isfunction(fn) and old != new and _positional(fn) == old:
                found.append(
                    f"{where(klass, fn)}: {klass.__name__}.{name}(self, {OLD_PARAMETERS[name]}) -> {NEW_FORM[name]}"
                )
        for name, new_form in RETIRED_METHODS.items():
            if name in own:
                found.append(f"{where(klass, own[name])}: {klass.__name__}.{name} -> {new_form}")
        card = [name for name in CARD_ATTRIBUTES if name in own]
        if card:
            fields = ", ".join(f"{name}={own[name]!r}" for name in card)
            found.append(
                f"{where(klass)}: class attributes {', '.join(card)} -> @ALGORITHMS.register(name, card=Card({fields}))"
            )
        capabilities = [name for name in CAPABILITY_ATTRIBUTES if name in own]
        if capabilities:
            fields = ", ".join(f"{CAPABILITY_ATTRIBUTES[n]}={own[n]!r}" for n in capabilities)
            found.append(
                f"{where(klass)}: class attributes {', '.join(capabilities)} -> capabilities = Capabilities({fields})"
            )
    if _user_classes(cls) and not issubclass(cls, FedAvg):
        left = [name for name in FEDAVG_HOOKS if getattr(cls, name) is getattr(Algorithm, name)]
        if left:
            found.append(
                f"{where(cls)}: class {cls.__name__}(Algorithm) leaves {', '.join(left)} to Algorithm, "
                f"which is only the hooks -> define them, or class {cls.__name__}(FedAvg) "
                f"(from pflbench.fedavg import FedAvg)"
            )
    return found


def refuse(cls: type, found: list[str]) -> NoReturn:
    raise OldFormError(
        f"algorithm class {cls.__qualname__} uses the method API's retired forms (see {GUIDE}): {'; '.join(found)}"
    )


class Retired:
    """A name a plugin's class reads that the method API no longer has: reading it raises one line
    naming the new form. A non-data descriptor: an instance attribute of that name wins."""

    def __init__(self, name: str, new: str):
        self.name, self.new = name, new

    def __get__(self, instance: Any, owner: type) -> NoReturn:
        raise AttributeError(
            f"algorithm class {owner.__qualname__} ({where(owner)}): {self.name} was retired "
            f"from the method API; use {self.new} (see {GUIDE})"
        )


def retired_names(cls: type) -> dict[str, str]:
    """Names a class of `cls`'s kind might still read (module doc) -> their new form."""
    from pflbench.fedavg import FedAvg

    names = {"fed": "self.engine (pflbench.engine.Engine)"}
    names.update({name: f"self.card.{name}" for name in CARD_ATTRIBUTES})
    names.update({name: f"self.capabilities.{field}" for name, field in CAPABILITY_ATTRIBUTES.items()})
    names.update(RETIRED_METHODS)
    if not issubclass(cls, FedAvg):
        names.update({name: f"FedAvg's (class {cls.__name__}(FedAvg), pflbench.fedavg)" for name in FEDAVG_HELPERS})
    return names


def check(cls: Any, card: Any = None, capabilities: Any = None) -> Any:
    """The algorithms' registry adapter: `cls` as it is, else OldFormError (module doc). On a plugin's
    class, the retired names it does not define read as one line (`Retired`)."""
    found = old_forms(cls)
    if found:
        refuse(cls, found)
    if _user_classes(cls):
        for name, new in retired_names(cls).items():
            if not any(name in klass.__dict__ for klass in cls.__mro__):
                setattr(cls, name, Retired(name, new))
    return cls
