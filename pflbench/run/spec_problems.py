"""A spec's problems, gathered: every problem of a spec file is found before anything runs and reported at once (`SpecError`), each line short, and a spec too large to expand refused first."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from pflbench.registry import echo, unknown_message  # noqa: F401  (unknown_message: used by others via spec)


class SpecError(ValueError):
    """A spec that cannot run: every problem, one per line, each naming its file and field."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [_shortened(f"{source}: {where}: {message}") for where, message in problems]
        header = f"invalid spec {source} ({len(problems)} problems):\n  " if len(problems) > 1 else ""
        super().__init__(header + "\n  ".join(lines))


MAX_MESSAGE = 2000  # a last guard on any one problem line


MAX_SPEC_VALUES = 100_000  # entries a spec (or a --set value) may expand to; real specs have a few hundred


def _shortened(line: str) -> str:
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE] + f"... ({len(line):,} characters, shortened)"


def count_values(data: Any, limit: int = MAX_SPEC_VALUES) -> int:
    """Scalars, lists and mappings in `data`, counted as YAML's aliases expand them; stops past `limit`
    (a 300-byte "billion laughs" file expands to millions of entries but costs nothing to count this way)."""
    stack, count = [data], 0
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def check_size(data: Any, source: str, where: str) -> None:
    if count_values(data) > MAX_SPEC_VALUES:
        raise SpecError(
            source,
            [
                (
                    where,
                    f"expands to more than {MAX_SPEC_VALUES:,} values (YAML anchors and "
                    f"aliases repeated?); a spec is a few hundred settings at most",
                )
            ],
        )


class Problems:
    """Collects (where, message) pairs, without repeats, in the order found."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], None] = {}

    def add(self, where: str, message: str) -> None:
        self.items[(where, message)] = None

    def add_validation(self, where: str, error: ValidationError) -> None:
        for e in error.errors(include_url=False):
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
            if e["type"] == "value_error":
                message = str(e["ctx"]["error"])
            else:
                message = f"{e['msg']} (got {echo(e['input'])})"
            self.add(where + loc, message)

    def check(self, adapter: TypeAdapter[Any], value: Any, where: str) -> Any:
        """`value` validated by `adapter`; None (and a problem) when it is not valid."""
        try:
            return adapter.validate_python(value)
        except ValidationError as error:
            self.add_validation(where, error)
            return None

    def __bool__(self) -> bool:
        return bool(self.items)
