"""Name -> object registries filled by decorators (the timm pattern).

`algorithms/`, `partitions/`, datasets and models each keep one `Registry`; `pflbench list` reads them.
"""
from __future__ import annotations

import difflib
import reprlib
from typing import Any, Callable, Generic, TypeVar

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


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        return unknown_message(self.kind, name, sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self):
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries
