"""Declared dataset options and their checking, so a wrong option fails with what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.registry import echo


@dataclass(frozen=True)
class Option:
    """One option a dataset accepts."""

    default: Any
    type: type[Any]  # bool, int, float or str
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    changes_data: bool = True  # False for options (like `download`) that never change the loaded tensors
    default_text: str | None = None  # how to show a default that is decided at load time (None)

    def describe(self, name: str) -> str:
        """e.g. "split=balanced|byclass|letters|digits (default balanced)"."""
        if self.choices is not None:
            allowed = "|".join(str(c) for c in self.choices)
        elif self.minimum is not None:
            allowed = f"{self.type.__name__} >= {self.minimum:g}"
        else:
            allowed = self.type.__name__
        default = self.default_text if self.default_text is not None else self.default
        return f"{name}={allowed} (default {default})"

    def check(self, dataset: str, name: str, value: Any) -> Any:
        """`value` converted to the option's type; ValueError naming the option if it is not allowed."""
        if value is None and self.default is None:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # bool is an int in Python; an int option given `true` is still a mistake.
        if not isinstance(value, self.type) or (self.type is not bool and isinstance(value, bool)):
            raise ValueError(
                f"option {name!r} of dataset {dataset!r} must be {self.type.__name__}, got {echo(value)}; "
                f"allowed: {self.describe(name)}"
            )
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"option {name!r} of dataset {dataset!r} must be one of "
                f"{', '.join(map(str, self.choices))}; got {echo(value)}"
            )
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"option {name!r} of dataset {dataset!r} must be >= {self.minimum:g}; got {echo(value)}")
        return value


def resolve_options(dataset: str, declared: dict[str, Option], given: dict[str, Any]) -> dict[str, Any]:
    """Every declared option with its checked value (defaults filled in)."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        allowed = ", ".join(opt.describe(name) for name, opt in declared.items()) or "none"
        raise ValueError(f"unknown option {unknown[0]!r} for dataset {dataset!r}; allowed options: {allowed}")
    return {name: opt.check(dataset, name, given.get(name, opt.default)) for name, opt in declared.items()}
