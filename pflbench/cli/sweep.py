"""`pflbench sweep --algo NAME`: the subcommand (the work is done by `pflbench.tuning.sweep`, which imports
Ray Tune and Optuna when a sweep runs; building this parser imports only the standard library)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pflbench.cli.run import add_checkpoint_options, add_grace_option, checkpoint_problem, run_settings

DEFAULT_BASE = Path("benchmarks/sweeps/default.yaml")  # pflbench.tuning.trial.DEFAULT_BASE


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pflbench.cli.commands import add_data_options, add_set_option
    from pflbench.simulator.execution import add_execution_arguments

    sweep = subparsers.add_parser(
        "sweep",
        help="tune an algorithm's hyperparameters (Ray Tune + Optuna + ASHA, "
        "validation split only); write the best to benchmarks/tuned/",
    )
    sweep.add_argument("--algo", required=True, help="the algorithm to tune (pflbench list algorithms)")
    sweep.add_argument(
        "--spec",
        type=Path,
        default=DEFAULT_BASE,
        help=f"base spec; with --set/--scale it must give one cell (default {DEFAULT_BASE})",
    )
    sweep.add_argument("--scale", help="a scale of the base spec (e.g. quick)")
    add_set_option(sweep, help="as for `pflbench run` (repeatable)")
    sweep.add_argument("--dataset", help="shortcut for --set dataset=NAME")
    sweep.add_argument("--partition", help="shortcut for --set partition=SCHEME")
    sweep.add_argument("--clients", type=int, help="shortcut for --set clients=N")
    sweep.add_argument("--rounds", type=int, help="shortcut for --set rounds=N")
    sweep.add_argument(
        "--trials", type=int, default=20, help="trials (the same budget for every algorithm; default 20)"
    )
    sweep.add_argument(
        "--no-lr",
        dest="tune_lr",
        action="store_false",
        help="tune only the algorithm's own hyperparameters, not the learning rate",
    )
    sweep.add_argument(
        "--grace-rounds",
        type=int,
        help="ASHA: rounds before a trial may be stopped (default rounds/4, at least eval_every)",
    )
    sweep.add_argument("--seed", type=int, default=0, help="Optuna sampler seed")
    sweep.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="results store; the sweep goes to RESULTS/sweeps/ (default: results)",
    )
    sweep.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/tuned"),
        help="folder for the best configuration, <out>/<algo>.yaml (default benchmarks/tuned)",
    )
    sweep.add_argument("--workers", type=int, help="trials at once (default: as many as Ray's CPUs allow)")
    sweep.add_argument("--ray-address", help="an existing Ray cluster (default: $RAY_ADDRESS, else a local instance)")
    add_execution_arguments(sweep, device_help="torch device (default: cuda for cells given GPUs, else cpu)")
    add_checkpoint_options(
        sweep,
        retried="rerun a trial",
        unit="trial",
        resumed="kept on the driver's disk (whichever node runs the trial), so a retried trial, "
        "or one continued by --resume, resumes from its last checkpoint",
    )
    add_grace_option(sweep, "the running trials stop", "--resume <sweep folder> continues them")
    sweep.add_argument(
        "--resume",
        type=Path,
        metavar="FOLDER",
        help="continue the sweep in FOLDER (RESULTS/sweeps/<algo>-<hash>-<time>/, stopped or with "
        "errored trials), given the command that started it: its trials, sampler and scheduler "
        "as saved; unfinished and errored trials resume from their checkpoints",
    )
    add_data_options(sweep)
    sweep.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from pflbench.run.options import RunStopped
    from pflbench.run.spec_axes import parse_sets
    from pflbench.tuning.sweep import run_sweep
    from pflbench.tuning.trial import SweepOptions, base_cell

    if checkpoint_problem(args):
        print(f"sweep: {checkpoint_problem(args)}", file=sys.stderr)
        return 2
    sets = parse_sets(args.sets)
    for key in ("dataset", "partition", "clients", "rounds"):
        if getattr(args, key) is not None:
            sets[key] = getattr(args, key)
    try:
        base, resources = base_cell(args.algo, args.spec, sets, args.scale)
        options = SweepOptions(
            trials=args.trials,
            results=args.results,
            out=args.out,
            tune_lr=args.tune_lr,
            grace_rounds=args.grace_rounds,
            seed=args.seed,
            resume=args.resume,
            **run_settings(args),
        )
        run_sweep(args.algo, base, resources, options)
    except RunStopped as stop:  # preempted: the one line says where each trial stopped and how to continue
        print(stop.line, file=sys.stderr)
        return stop.exit_code
    except (ValueError, FileNotFoundError) as error:  # SpecError, SweepError, a partition or dataset problem
        print(f"sweep: {error}", file=sys.stderr)
        return 2
    return 0
