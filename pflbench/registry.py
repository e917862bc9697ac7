"""Name -> object registries filled by decorators (the timm pattern).

`pflbench/algorithms/`, `pflbench/partitions/`, datasets and models each keep one `Registry`; `pflbench list` reads them.

Built-ins and plugins (a user's own algorithms, datasets, partition schemes and models: pflbench/loader/plugins.py)
go into the same registries. Each entry remembers where it came from (`origin`: None for a built-in,
else the plugin's id), so that a cell using a plugin can record the plugin's source hash, and a name
registered twice is one error that says by whom. `register` also sets `name` and the presentation
attributes a registry declares (`own_attributes`, e.g. an algorithm's `display_name`) on the entry,
from the entry's own definition or the registry's defaults, never inherited from a parent class: a
method derived from FedAvg is not shown as FedAvg.
"""

from __future__ import annotations

import contextlib
import difflib
import reprlib
from typing import Any, Generic, TypeVar
from collections.abc import Callable, Iterator

T = TypeVar("T")

# How a user's value is quoted in an error message: short, whatever was written (a 200,000-character
# name, a list that YAML aliases expand to half a million entries), so a message stays one readable line.
_ECHO = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_ECHO.maxstring = _ECHO.maxother = 160  # long enough for a path
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 4
_ECHO.maxlevel = 2


def echo(value: Any) -> str:
    """`value`'s repr as quoted in an error message, shortened (with the length of a long string)."""
    text = _ECHO.repr(value)
    if isinstance(value, str) and len(value) > _ECHO.maxstring:
        text += f" ({len(value):,} characters)"
    return text


def unknown_message(what: str, name: Any, allowed: list[str]) -> str:
    """`unknown algorithm 'fedavgg' (did you mean 'fedavg'?); allowed: ...`"""
    # difflib is quadratic in the length: a name of hundreds of characters is no typo of a known one
    close = difflib.get_close_matches(str(name), allowed, n=1) if len(str(name)) <= 200 else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {echo(name)}{hint}; allowed: {', '.join(allowed) or 'none'}"


class UnknownNameError(ValueError):
    """A user asked for a name that is not registered."""


# A default of `own_attributes` that stands for the registered name (display_name: the name itself).
NAME = object()
# The plugin being loaded (its id), innermost last; entries registered meanwhile are attributed to it.
_LOADING: list[str] = []


@contextlib.contextmanager
def loading(origin: str) -> Iterator[None]:
    """Attribute every entry registered while the block runs to the plugin `origin`."""
    _LOADING.append(origin)
    try:
        yield
    finally:
        _LOADING.pop()


def _describe_origin(origin: str | None) -> str:
    return "pflbench (built-in)" if origin is None else f"plugin {origin!r}"


class NameClashError(ValueError):
    """Two definitions (built-in or plugin) of one name in one registry."""


# The loader of the built-ins and the installed packages' plugins (pflbench.loader.plugins.load_builtins),
# run before a registry is read. The loader installs itself when pflbench is imported, so reading a
# registry never imports it, and it is free to import the registries it fills.
_FILL: list[Callable[[], None]] = []


def fill_with(loader: Callable[[], None]) -> None:
    """Run `loader` before any registry is read (it must return at once once it has run)."""
    _FILL[:] = [loader]


def _fill() -> None:
    for loader in _FILL:
        loader()


# What registering does to an entry first, by kind of registry: the algorithms' registries refuse a class
# written against a retired form of the method API (pflbench.loader.retired.check). The
# adapter is installed, as the loader is, when pflbench is imported (pflbench.loader.plugins), so a registry's
# module never imports its adapter, which is free to import that module.
_ADAPTERS: dict[str, Callable[..., Any]] = {}


def adapt_with(kind: str, adapter: Callable[..., Any]) -> None:
    """Registering an entry in a registry of `kind` first makes it `adapter(entry, ...)`."""
    _ADAPTERS[kind] = adapter


def adapter(kind: str) -> Callable[..., Any]:
    """The adapter installed for `kind` (`adapt_with`); else one that returns the entry as it is."""
    return _ADAPTERS.get(kind, _as_it_is)


def _as_it_is(entry: Any, *args: Any, **kwargs: Any) -> Any:
    return entry


class Registry(Generic[T]):
    def __init__(self, kind: str, own_attributes: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str | None] = {}
        # Attributes every entry has as its own (set by `register` when the entry does not define them).
        self.own_attributes = dict(own_attributes or {})

    def register(self, name: str, **attributes: Any) -> Callable[[T], T]:
        """Decorator: register `obj` as `name`; `attributes` are set on it (e.g. a model's display_name)."""

        def decorator(obj: T) -> T:
            origin = _LOADING[-1] if _LOADING else None
            if name in self._entries:
                if origin is None and self._origins[name] is None:
                    raise NameClashError(f"{self.kind} {name!r} is registered twice")
                raise NameClashError(
                    f"{_describe_origin(origin)} registers the {self.kind} {name!r}, a name that "
                    f"{_describe_origin(self._origins[name])} already registered; give it another name "
                    f"(taken: {', '.join(self.names())})"
                )
            own = getattr(obj, "__dict__", {})
            for key, default in self.own_attributes.items():
                if key not in own and key not in attributes:
                    _set(obj, key, name if default is NAME else default)
            for key, value in {**attributes, "name": name}.items():
                _set(obj, key, value)
            self._entries[name] = obj
            self._origins[name] = origin
            return obj

        return decorator

    def origin(self, name: str) -> str | None:
        """The id of the plugin that registered `name`; None for a built-in (or an unknown name)."""
        return self._origins.get(name)

    def forget(self, origin: str) -> list[str]:
        """Remove every entry the plugin `origin` registered (before it is loaded again, changed)."""
        names = [n for n, o in self._origins.items() if o == origin]
        for n in names:
            del self._entries[n], self._origins[n]
        return names

    def get(self, name: str) -> T:
        _fill()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        _fill()
        return unknown_message(self.kind, name, sorted(self._entries))

    def names(self) -> list[str]:
        _fill()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        _fill()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        _fill()
        return name in self._entries


def _set(obj: Any, key: str, value: Any) -> None:
    try:
        setattr(obj, key, value)
    except (AttributeError, TypeError):  # a builtin or slotted object: it keeps what it has
        pass
