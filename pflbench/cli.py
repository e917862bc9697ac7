"""The `pflbench` command. Each feature module contributes its subcommand through `add_parser`,
so this file only lists them."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define `add_parser(subparsers)`; those not present yet are skipped. They import only
# the standard library at module level: every `pflbench ... --help` builds all their parsers, so a
# heavy import here (torch, pandas, Ray, matplotlib, ...) makes every help screen wait seconds for it.
# Command functions import what they need when they run (tests/test_cli_friendly.py checks this).
COMMAND_MODULES = ("pflbench.commands", "pflbench.run_command", "pflbench.report", "pflbench.sweep_command",
                   "pflbench.publish_command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pflbench", description="Benchmark harness for personalized federated learning.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
