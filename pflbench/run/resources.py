"""Files shipped with pflbench: the specs, reference numbers and tuned configurations of benchmarks/.

They stay in the repository's benchmarks/ folder, where users run them by path and published studies
name them; that folder is installed as the data package `pflbench.benchmarks` (pyproject.toml's
[tool.setuptools]: from a checkout's editable install it is the checkout's folder, from a wheel its copy). So `pflbench run table1` (a spec by name) and
`pflbench run benchmarks/table1.yaml` work from any directory; a spec file that exists where it is
given is always used first.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

SHIPPED_PREFIX = "benchmarks"


def benchmarks_dir() -> Path:
    """The folder of the specs shipped with pflbench."""
    spec = importlib.util.find_spec("pflbench.benchmarks")
    assert spec is not None and spec.origin is not None, "pflbench is installed without its benchmarks package"
    return Path(spec.origin).parent


def resolve_spec(text: str) -> str:
    """`text` where that file exists; else the shipped spec it names (`table1`, `table1.yaml`,
    `benchmarks/sweeps/default.yaml`); else `text` unchanged (loading it then says what is missing)."""
    given = Path(text).expanduser()
    if given.is_file():
        return text
    parts = given.parts
    if len(parts) == 1:
        candidate = benchmarks_dir() / (text if given.suffix in (".yaml", ".yml") else f"{text}.yaml")
    elif parts[0] == SHIPPED_PREFIX and not given.is_absolute():
        candidate = benchmarks_dir().joinpath(*parts[1:])
    else:
        return text
    return str(candidate) if candidate.is_file() else text


def shipped_specs() -> list[str]:
    """The names of the specs shipped with pflbench (`pflbench run NAME`): benchmarks/*.yaml."""
    return sorted(p.stem for p in benchmarks_dir().glob("*.yaml"))


def missing_spec_message(path: Path) -> str:
    """What to say of a spec file that does not exist: the nearest name (difflib) among the spec files in its
    folder, where it names one, else among the shipped specs; and the shipped specs."""
    import difflib

    from pflbench.registry import echo

    folder = path.parent
    nearby = sorted(str(p) for p in folder.glob("*.yaml")) if str(folder) != "." and folder.is_dir() else []
    shipped = shipped_specs()
    short = len(str(path)) <= 200  # difflib is quadratic in the length
    close = (
        (
            difflib.get_close_matches(str(path), nearby, n=1)
            if nearby
            else difflib.get_close_matches(path.stem, shipped, n=1)
        )
        if short
        else []
    )
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown spec file {echo(str(path))}{hint}"
        + (f"; spec files in {folder}: {', '.join(nearby)}" if nearby else "")
        + f"; the specs shipped with pflbench, run by name (pflbench run NAME): {', '.join(shipped) or 'none'}"
    )


def resolve_spec_argument(args: argparse.Namespace) -> None:
    """A command's `spec` argument (run's positional, sweep's --spec), resolved by `resolve_spec`."""
    value = getattr(args, "spec", None)
    if isinstance(value, (str, Path)):
        resolved = resolve_spec(str(value))
        args.spec = type(value)(resolved) if isinstance(value, Path) else resolved
