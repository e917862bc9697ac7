"""`pflbench run SPEC`: the subcommand (the work is done by `pflbench.run.runner`).

Only the standard library is imported here: `pflbench --help` and `pflbench run --help` build every
parser, and the runner's imports (torch, pandas, Ray, ...) take seconds; they are imported by
`cmd_run` when a spec is actually run. Machine-readable output (`--dry-run --json`) is alone on
stdout: warnings and notes go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pflbench.run.spec import Plan


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pflbench.cli.commands import add_data_options, add_set_option
    from pflbench.simulator.execution import add_execution_arguments

    run = subparsers.add_parser(
        "run",
        help="run a spec's matrix (resuming: cells with results are skipped)",
        description="Run every cell of a spec's matrix that has no result yet, in parallel "
        "on Ray (or in this process), and record each in the results store.",
    )
    run.add_argument(
        "spec",
        help="a spec file, e.g. benchmarks/demo.yaml, or a shipped spec's name, e.g. demo "
        "(format: benchmarks/README.md)",
    )
    what = run.add_argument_group("what to run")
    add_set_option(
        what,
        help="override a value for every cell (rounds=2, hp.mu=0.1), replace or add a matrix axis "
        "(seed=[0,1], algorithm=fedavg), pick the spec's entries of its clients axis "
        "(clients=100: the spec's 100-client setting, participation included) or of its "
        "variants (variant=NAME), or set a resource (resources.gpus=0.5); values are YAML; "
        "repeatable",
    )
    what.add_argument(
        "--scale",
        default=None,
        help="one of the spec's scales (e.g. quick: benchmarks/README.md); default full, the spec as written",
    )
    what.add_argument("--dry-run", action="store_true", help="print the cells and which have results; run nothing")
    what.add_argument("--json", action="store_true", help="with --dry-run: the resolved cells as a JSON list")
    what.add_argument("--force", action="store_true", help="rerun cells that already have a result")
    stored = run.add_argument_group("results and data")
    stored.add_argument("--results", type=Path, default=Path("results"), help="results store (default: results)")
    add_data_options(cast(argparse.ArgumentParser, stored))
    where = run.add_argument_group("where and how the cells run")
    where.add_argument(
        "--workers", type=int, help="cells at once (default: as many as Ray's CPUs allow); 1 runs in-process"
    )
    where.add_argument("--ray-address", help="an existing Ray cluster (default: $RAY_ADDRESS, else a local instance)")
    where.add_argument("--no-ray", action="store_true", help="run the cells one by one in this process")
    add_execution_arguments(
        cast(argparse.ArgumentParser, where),
        device_help="torch device for every cell (default: cuda for cells given GPUs, else cpu)",
        cell_groups=True,
    )
    faults = run.add_argument_group("checkpoints, retries and preemption")
    add_checkpoint_options(faults, retried="Ray: rerun a cell")
    add_grace_option(faults, "the running cells stop", "the next run resumes them")
    faults.add_argument(
        "--keep-checkpoints-from",
        type=int,
        default=0,
        metavar="ROUND",
        help="also keep a copy of every checkpoint written at ROUND or later, in <results>/_kept/<cell>/ "
        "(e.g. to branch a cell from chosen rounds: benchmarks/analysis/branch.py; default 0: none)",
    )
    tracking = run.add_argument_group("experiment trackers")
    tracking.add_argument(
        "--tracker",
        dest="trackers",
        action="append",
        nargs="?",
        const="tensorboard",
        default=[],
        metavar="KIND",
        help="stream each cell's per-round metrics, configuration and id to an "
        "experiment tracker: tensorboard (the default KIND: event files, no server), wandb (offline "
        "mode) or mlflow (a local file store); repeatable; each needs its package "
        "(pip install 'pflbench[KIND]')",
    )
    tracking.add_argument(
        "--tracker-dir",
        type=Path,
        metavar="DIR",
        help="where the trackers write: DIR/tensorboard/<cell id>/, DIR/wandb/, DIR/mlruns "
        "(default: the results store)",
    )
    run.set_defaults(func=cmd_run)


def add_checkpoint_options(
    parser: argparse._ActionsContainer,
    retried: str,
    unit: str = "cell",
    resumed: str = "a killed cell continues from its last checkpoint on the next run",
) -> None:
    """Round checkpoints (pflbench/storage/checkpoint.py) and retries of a lost worker's cell (`retried`: what is
    rerun, in words; `unit`: what writes checkpoints, a cell or a sweep's trial; `resumed`: how a killed
    one continues): execution options, not part of a cell's identity."""
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help=f"{retried} whose worker was lost up to N times, from its checkpoint (default 2)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="ROUNDS",
        help=f"write a running {unit}'s checkpoint every ROUNDS rounds (default 0: by time only)",
    )
    parser.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=5.0,
        metavar="M",
        help=f"and at least every M minutes of a {unit}'s wall time (default 5; 0: not by time); {resumed}",
    )
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help=f"keep a {unit}'s last checkpoint after it finished (default: removed)",
    )


def add_grace_option(parser: argparse._ActionsContainer, who: str, continued: str) -> None:
    """--grace-seconds (pflbench/run/preemption.py): `who` stops on a signal, in words; `continued`: how after."""
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=25.0,
        metavar="S",
        help=f"on SIGTERM (preemption) or a first Ctrl-C: {who} at the end of the round in progress "
        f"with a checkpoint, or at once where that round has not ended S seconds after the "
        f"signal (default 25); exit status 75 and {continued}",
    )


def checkpoint_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the checkpoint options, or None (checked before any work)."""
    if args.checkpoint_every < 0:
        return f"--checkpoint-every must be 0 (by time only) or a number of rounds >= 1, got {args.checkpoint_every}"
    if not args.checkpoint_minutes >= 0:
        return f"--checkpoint-minutes must be >= 0 (0: not by time), got {args.checkpoint_minutes}"
    if getattr(args, "keep_checkpoints_from", 0) < 0:
        return f"--keep-checkpoints-from must be a round >= 1 (0: keep none), got {args.keep_checkpoints_from}"
    if getattr(args, "retries", 0) < 0:
        return f"--retries must be >= 0, got {args.retries}"
    if not getattr(args, "grace_seconds", 0) >= 0:
        return f"--grace-seconds must be >= 0, got {args.grace_seconds}"
    return None


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What `pflbench run` and `pflbench sweep` both pass on from their shared options (where to run, the
    data, execution, checkpoints, retries, the grace period), by the names RunOptions and SweepOptions give."""
    from pflbench.simulator.execution import execution_options

    return {
        "workers": args.workers,
        "ray_address": args.ray_address,
        "data_root": args.root,
        "mirror": args.mirror,
        "execution": execution_options(args),
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_minutes": args.checkpoint_minutes,
        "keep_checkpoints": args.keep_checkpoints,
        "retries": args.retries,
        "grace_seconds": args.grace_seconds,
    }


def missing_gpus(plan: Plan, ray_address: str | None, device: str | None) -> str | None:
    """Why the plan's GPU request cannot be met here (no cluster named, no CUDA device), or None.
    Without this, Ray would wait forever for a GPU and an in-process run would fail cell by cell."""
    if plan.resources.gpus <= 0 or ray_address:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"resources.gpus is {plan.resources.gpus:g} per cell but torch sees no CUDA device on this machine"
        + (f" (and --device {device} was given)" if device else "")
        + "; run with --set resources.gpus=0 (a CPU run), a spec scale made for CPUs (e.g. --scale quick), "
        "or on a Ray cluster with GPUs (--ray-address)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    if args.json and not args.dry_run:
        raise SystemExit("--json goes with --dry-run")
    if checkpoint_problem(args):
        raise SystemExit(checkpoint_problem(args))
    from pflbench.run.trackers import TrackerOptions
    from pflbench.run.trackers import problems as tracker_problems

    if tracker_problems(args.trackers):  # before anything runs
        raise SystemExit("; ".join(tracker_problems(args.trackers)))
    from rich.markup import escape

    from pflbench.run.display import make_console
    from pflbench.run.summary import print_plan
    from pflbench.run.options import PrepareError, RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets
    from pflbench.run.spec_problems import SpecError
    from pflbench.storage.store import DiskFull, Store

    console = make_console()
    try:
        plan = load_spec(args.spec, parse_sets(args.sets), scale=args.scale)
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    kinds = tuple(dict.fromkeys((*plan.trackers, *args.trackers)))  # the spec's trackers, and --tracker's
    tracker_problem = "; ".join(p.replace("--tracker ", "the spec's trackers: ") for p in tracker_problems(kinds))
    gpu_problem = missing_gpus(plan, args.ray_address or os.environ.get("RAY_ADDRESS"), args.device)
    if args.dry_run:
        print_plan(console, plan, Store(args.results), as_json=args.json)
        for problem in filter(None, (gpu_problem, tracker_problem)):
            make_console(stderr=True).print(f"[yellow]warning:[/] {escape(problem)}", highlight=False)
        return 0
    if gpu_problem or tracker_problem:
        print(f"cannot run {args.spec}, nothing was run: {gpu_problem or tracker_problem}", file=sys.stderr)
        return 2
    trackers = TrackerOptions(kinds, args.tracker_dir.absolute() if args.tracker_dir else None)
    options = RunOptions(
        results=args.results,
        use_ray=not args.no_ray,
        force=args.force,
        keep_checkpoints_from=args.keep_checkpoints_from,
        trackers=trackers,
        **run_settings(args),
    )
    try:
        return run_plan(plan, options, console).exit_code
    except PrepareError as error:
        print(f"cannot run {args.spec}, nothing was run:\n{error}", file=sys.stderr)
        return 2
    except DiskFull as full:  # before any cell ran (the runner stops on one while cells run: DISK_FULL_EXIT)
        print(f"{full}; free space and run the same command again", file=sys.stderr)
        return 74
