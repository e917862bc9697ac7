"""Name -> object registries filled by decorators (the timm pattern).

`algorithms/`, `partitions/`, datasets and models each keep one `Registry`; `pflbench list` reads them.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


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
        allowed = ", ".join(sorted(self._entries))
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; allowed: {allowed}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self):
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries
