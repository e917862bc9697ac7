"""Deprecation notices for code written against the method API (GUIDE, "Contracts"): a plugin written
against the documented API keeps working for one release after a change, with one visible warning naming
the user's file and the new form.

`warn(message, old=..., new=...)` is how pflbench says that a plugin uses an old form. It does two things:

- a `PluginDeprecationWarning` (a DeprecationWarning) through Python's `warnings`, attributed to the
  user's file and line (the plugin's hook, class or call), never to pflbench's own files; so tests
  (`pytest.warns`) and `python -W error::DeprecationWarning` see it as before;
- on the command line (`pflbench ...`, `command_line()`), one line on stderr per plugin file, naming the
  file and, for each old form it uses, the new one. Python's default filters hide DeprecationWarnings
  outside `__main__`, so without this line a plugin's author would never see them. While a plugin is
  imported (`gathering(path)`) its notices are gathered and printed as that one line when the import
  ends; a notice raised later (a deprecated call while a cell runs) prints its own line, once per form.

The user's file is the innermost frame of the call stack that is not pflbench's own code (its package,
the built-in algorithms and partitions) nor Python's import machinery; where the caller knows better (a
hook's function), it passes `where=`.
"""

from __future__ import annotations

import inspect
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

GUIDE = "docs/howto/own-method.md"


class PluginDeprecationWarning(DeprecationWarning):
    """A plugin uses a form of the method API that works for one more release (pflbench.deprecation)."""


@dataclass
class _Notices:
    """What this process has said about each user file on the command line."""

    stream: TextIO | None = None  # where the lines go: stderr under `command_line()`, else nowhere
    said: set[tuple[str, str]] = field(default_factory=set)  # (file, old form) already printed
    gathering: dict[str, list[tuple[int, str, str]]] | None = None  # file -> (line, old, new) while importing


_NOTICES = _Notices()


def _own_prefixes() -> tuple[str, ...]:
    """The folder of pflbench's own code: the package, the built-in algorithms and partitions included."""
    return (str(Path(__file__).resolve().parent) + "/",)


def _is_own(frame: FrameType, own: tuple[str, ...], stdlib: str) -> bool:
    filename = frame.f_code.co_filename
    module = frame.f_globals.get("__name__", "")
    if module == "pflbench" or module.startswith("pflbench."):
        return True
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, ...
        return True
    if stdlib and filename.startswith(stdlib) and "-packages" not in filename:  # Python's own (not installed packages)
        return True
    try:
        resolved = str(Path(filename).resolve())
    except OSError:
        return False
    return resolved.startswith(own)


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """The innermost frame, from `start` (default: the caller's) outwards, that is the user's code."""
    own, stdlib = _own_prefixes(), sysconfig.get_paths().get("stdlib", "")
    frame: FrameType | None = start if start is not None else sys._getframe(1)
    while frame is not None and _is_own(frame, own, stdlib):
        frame = frame.f_back
    return frame


def location_of(obj: Any) -> tuple[str, int] | None:
    """(file, line) where a function or class was written, if Python knows."""
    target = inspect.unwrap(obj) if callable(obj) else obj
    code = getattr(target, "__code__", None)
    if code is not None:
        return code.co_filename, code.co_firstlineno
    try:
        return inspect.getsourcefile(target) or inspect.getfile(target), inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return None


def warn(message: str, *, old: str, new: str, where: tuple[str, int] | None = None, owner: Any = None) -> None:
    """Say that user code uses the deprecated form `old` (module doc): `message` through `warnings`, and
    on the command line "`old` -> `new`" in the line of the user's file. `where`: (file, line) of the
    user's code when the caller knows it (a hook's function), else the innermost user frame of the call
    stack, else where `owner` (a class) was written."""
    module_globals: dict[str, Any] | None = None
    if where is None:
        frame = user_frame(sys._getframe(1))
        if frame is not None:
            where, module_globals = (frame.f_code.co_filename, frame.f_lineno), frame.f_globals
        elif owner is not None:
            where = location_of(owner)
    if where is None:
        warnings.warn(message, PluginDeprecationWarning, stacklevel=3)
        return
    filename, lineno = where
    module = (module_globals or {}).get("__name__") or Path(filename).stem
    registry = module_globals.setdefault("__warningregistry__", {}) if module_globals is not None else None
    warnings.warn_explicit(message, PluginDeprecationWarning, filename, lineno, module=module, registry=registry)
    _note(filename, lineno, old, new)


def _note(filename: str, lineno: int, old: str, new: str) -> None:
    if _NOTICES.stream is None or (filename, old) in _NOTICES.said:
        return
    if _NOTICES.gathering is not None:
        _NOTICES.gathering.setdefault(filename, []).append((lineno, old, new))
        return
    _say(filename, [(lineno, old, new)])


def _say(filename: str, forms: list[tuple[int, str, str]]) -> None:
    """One line: the user's file, and for each old form its line and the new form."""
    fresh = [(line, old, new) for line, old, new in forms if (filename, old) not in _NOTICES.said]
    if not fresh or _NOTICES.stream is None:
        return
    _NOTICES.said.update((filename, old) for _, old, _ in fresh)
    uses = "; ".join(f"line {line}: {old} -> {new}" for line, old, new in sorted(fresh))
    print(
        f"pflbench: {filename} uses the method API's old form, which works for one more release; "
        f"write the new one ({GUIDE}): {uses}",
        file=_NOTICES.stream,
        flush=True,
    )


@contextmanager
def gathering() -> Iterator[None]:
    """While a plugin is imported: its notices become one line per file when the import ends."""
    outer, _NOTICES.gathering = _NOTICES.gathering, {}
    try:
        yield
    finally:
        gathered, _NOTICES.gathering = _NOTICES.gathering, outer
        for filename, forms in gathered.items():
            if outer is not None:
                outer.setdefault(filename, []).extend(forms)
            else:
                _say(filename, forms)


@contextmanager
def command_line(stream: TextIO | None = None) -> Iterator[None]:
    """While a command runs: deprecation notices are lines on `stream` (default: stderr), once per file."""
    previous, said = _NOTICES.stream, _NOTICES.said
    _NOTICES.stream, _NOTICES.said = (stream if stream is not None else sys.stderr), set()
    try:
        yield
    finally:
        _NOTICES.stream, _NOTICES.said = previous, said
