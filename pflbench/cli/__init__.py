"""The `pflbench` command. Each module of this package contributes its subcommands through
`add_parser`, so this file only lists them; the work is done by the engine's modules."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import cast

# Modules that define `add_parser(subparsers)`. They import only
# the standard library at module level: every `pflbench ... --help` builds all their parsers, so a
# heavy import here (torch, pandas, Ray, matplotlib, ...) makes every help screen wait seconds for it.
# Command functions import what they need when they run (tests/test_cli_friendly.py checks this).
COMMAND_MODULES = (
    "pflbench.cli.commands",
    "pflbench.cli.run",
    "pflbench.cli.report",
    "pflbench.cli.sweep",
    "pflbench.cli.publish",
    "pflbench.cli.scaffold",
)


class VersionAction(argparse.Action):
    """`pflbench --version`: the installed distribution's version (read when asked, not at every start)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=cast(str, kwargs.get("help")))

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("pflbench")
        except PackageNotFoundError:  # run from a checkout that was never installed
            text = "unknown (not installed: pip install -e .)"
        print(f"pflbench {text}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pflbench", description="Benchmark harness for personalized federated learning."
    )
    parser.add_argument("--version", action=VersionAction, help="print pflbench's version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    from pflbench.loader.plugins import PLUGIN_COMMANDS, add_plugin_option

    for name in PLUGIN_COMMANDS:  # --plugin: the user's own algorithms, datasets, schemes, models
        if name in subparsers.choices:
            add_plugin_option(subparsers.choices[name])
    return parser


# Commands whose start-up a SIGTERM or Ctrl-C ends with one line and exit 75 (pflbench/run/preemption.py's
# `startup_signals`), until their run installs its own handlers; the others keep Python's defaults.
STOPPABLE = ("run", "sweep")


def main(argv: list[str] | None = None) -> int:
    from pflbench.run.preemption import PREEMPTED_EXIT, StartupStop, restore_signals, startup_signals

    previous = startup_signals()  # first: from here on a signal gets its line, never a silent exit 143
    try:
        args = build_parser().parse_args(argv)
        if args.command not in STOPPABLE:
            restore_signals(previous)
            previous = {}
        return _run(args)
    except StartupStop as stop:
        print(
            f"{stop.signal} as the command ended: what it ran is in the store; run the same command again to "
            f"continue anything left"
            if stop.started
            else f"{stop.signal} during start-up: nothing was started; run the same command again",
            file=sys.stderr,
        )
        return PREEMPTED_EXIT
    finally:
        restore_signals(previous)


def _run(args: argparse.Namespace) -> int:
    from pflbench.loader.plugins import load_requested
    from pflbench.run.resources import resolve_spec_argument

    resolve_spec_argument(args)  # `pflbench run table1`: a spec shipped with pflbench
    problem = load_requested(args) if hasattr(args, "plugins") else None  # and installed packages' plugins
    if problem:
        print(f"pflbench {args.command}: {problem}; nothing was run", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pflbench list algorithms | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the Python docs' recipe)
        return 141
