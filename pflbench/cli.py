"""The `pflbench` command. Each feature module contributes its subcommand through `add_parser`,
so this file only lists them."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define `add_parser(subparsers)`; those not present yet are skipped.
COMMAND_MODULES = ("pflbench.commands", "pflbench.runner", "pflbench.report", "pflbench.sweep")


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
