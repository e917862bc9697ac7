"""A paper-scale slice on the GPU, and the projected time of `make reproduce-table1` from it.

Runs the first `--rounds` rounds of Table 1's Fashion-MNIST 10-client cell (the paper's settings:
600 rounds x 10 local epochs, evaluation with 10 epochs of adaptation every 10 rounds) for each
algorithm in turn (FedAvg, pFedLA, pFedMe first, then the other rows while `--seconds` lasts), on the
engine's default path for the device (batched across clients on CUDA), each for at most
`--max-seconds-each`. Per algorithm: seconds per round after the first (warm-up), and seconds per
sample-epoch (one sample through one local step, adaptation included).

The projection: every cell of `make reproduce-table1` at full scale (benchmarks/table1.yaml: 10 rows x
4 datasets x 2 client counts x 3 seeds) costs its sample-epochs (rounds x joining clients x train
samples x local epochs, plus every evaluation's adaptation of all clients) times its algorithm's
measured seconds per sample-epoch (FedAvg's for a row not measured), times the ratio of its model's
training FLOPs per sample to the Fashion-MNIST CNN's (a GPU runs a larger model closer to its peak,
so this overestimates the CIFAR cells); divided by the measured throughput gain of 8 cells sharing
the GPU (`--sharing`: the sharing step's JSON; 1 where not given).

    python benchmarks/gpu/paper_slice.py --device cuda --rounds 20 --sharing sharing.json --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sharing.py's table1_cell (PYTHONSAFEPATH leaves the script's folder out)
from sharing import REPO  # noqa: E402

# Table 1's datasets without loading them (EMNIST and CIFAR-100 are not on offline machines):
# (sample shape, classes); EMNIST is the `balanced` split, as table1.yaml sets it.
SHAPES = {"emnist": ((1, 28, 28), 47), "fmnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10),
          "cifar10-jpeg": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100)}
ORDER = ["fedavg", "pfedla", "pfedme", "local", "pfedhn", "perfedavg", "fedrep", "fedfomo", "heurpfedla", "fedbn"]


class Enough(Exception):
    """Raised from the round callback once an algorithm has had its time."""


def table1_cell(algorithm: str, samples: int | None, epochs: int | None):
    from pflbench.spec import load_spec

    sets = {"dataset": "fmnist", "clients": 10, "seed": 0, "algorithm": algorithm, "resources.gpus": 0}
    cell = load_spec(REPO / "benchmarks" / "table1.yaml", sets=sets).cells[0]
    update = {}
    if samples:
        update["partition_params"] = {**cell.partition_params, "samples_per_client": samples}
    if epochs:
        update.update(local_epochs=epochs, finetune_epochs=epochs)
    return cell.model_copy(update=update)


def sample_epochs(cell, rounds: float, train_per_client: float) -> float:
    """Local training work of `rounds` rounds of `cell`: joining clients' samples x local epochs, plus
    the adaptation of every client at each evaluation (finetune_epochs)."""
    joining = max(1, round(cell.clients * cell.participation))
    work = rounds * joining * train_per_client * cell.local_epochs
    if cell.finetune_epochs:
        work += rounds / cell.eval_every * cell.clients * train_per_client * cell.finetune_epochs
    return work


def train_samples(cell) -> float:
    per_client = cell.partition_params.get("samples_per_client") or 0
    return per_client * cell.train_fraction * (1 - cell.val_fraction)


def measure(algorithm: str, args) -> dict:
    from pflbench.execution import ExecutionOptions
    from pflbench.resolve import resolve
    from pflbench.rounds import prepare_cell, run_cell

    cell = resolve(table1_cell(algorithm, args.samples, args.epochs))
    prepare_cell(cell)  # decoded and cached before the clock starts
    stamps: list[float] = []
    began = time.time()

    def on_round(info):
        stamps.append(time.time())
        if len(stamps) >= 3 and stamps[-1] - began > args.max_seconds_each:
            raise Enough

    import torch

    from pflbench.algorithm import get_algorithm

    execution = ExecutionOptions(device=args.device)
    path = "batched" if execution.batched(torch.device(args.device), get_algorithm(algorithm).capabilities.batched) else "loop"
    try:
        run_cell(cell, execution=execution, on_round=on_round, stop_after=args.rounds)
    except Enough:
        pass
    rounds = len(stamps) - 1
    seconds = stamps[-1] - stamps[0]
    per_round = seconds / rounds
    work = sample_epochs(cell, rounds, train_samples(cell))
    return {"rounds_timed": rounds, "seconds": seconds, "seconds_per_round": per_round,
            "projected_cell_seconds": per_round * cell.rounds, "seconds_per_sample_epoch": seconds / work,
            "first_round_seconds": stamps[0] - began, "path": path, "cell_rounds": cell.rounds}


def project(measured: dict, speedup: float, device: str) -> dict:
    """The whole of table1.yaml at full scale from the measured costs (module doc)."""
    from pflbench.bench import training_flops_per_sample
    from pflbench.spec import load_spec

    plan = load_spec(REPO / "benchmarks" / "table1.yaml")
    base = measured["fedavg"]["seconds_per_sample_epoch"]
    flops: dict = {}

    def flops_of(cell) -> float:
        shape, classes = SHAPES[cell.dataset]
        model = cell.model  # "auto": the model the engine picks for the shape (BatchNorm CNN for CIFAR)
        key = (model, shape, classes)
        if key not in flops:
            flops[key] = training_flops_per_sample(model, shape, classes, cell.batch_size)
        return flops[key]

    reference = None
    seconds_by = {"algorithm": {}, "dataset": {}, "clients": {}}
    total = 0.0
    for cell in plan.cells:
        if reference is None:
            reference = flops_of(table1_cell("fedavg", None, None))
        cost = measured.get(cell.algorithm, {}).get("seconds_per_sample_epoch", base)
        seconds = sample_epochs(cell, cell.rounds, train_samples(cell)) * cost * flops_of(cell) / reference
        total += seconds
        for axis, key in (("algorithm", cell.algorithm), ("dataset", cell.dataset), ("clients", str(cell.clients))):
            seconds_by[axis][key] = seconds_by[axis].get(key, 0.0) + seconds
    hours = {axis: {k: round(v / speedup / 3600, 2) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}
             for axis, values in seconds_by.items()}
    return {"cells": len(plan.cells), "device": device, "sharing_speedup": speedup,
            "hours_one_cell_at_a_time": round(total / 3600, 2), "hours": round(total / speedup / 3600, 2),
            "hours_by": hours, "unmeasured_rows_take": "fedavg",
            "measured_rows": sorted(measured)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--algorithms", default=",".join(ORDER))
    parser.add_argument("--seconds", type=float, default=100.0, help="for all the algorithms")
    parser.add_argument("--max-seconds-each", type=float, default=25.0)
    parser.add_argument("--samples", type=int, default=None, help="samples per client (default: the spec's)")
    parser.add_argument("--epochs", type=int, default=None, help="local epochs (default: the spec's)")
    parser.add_argument("--sharing", default=None, help="the sharing step's JSON (8 processes' speedup)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    speedup = 1.0
    if args.sharing and Path(args.sharing).exists():
        runs = json.loads(Path(args.sharing).read_text())["runs"]
        speedup = max(run["speedup_over_one"] for run in runs)
    start = time.time()
    measured: dict = {}
    result = {"device": args.device, "cell": "table1 fmnist 10 clients (600 rounds x 10 epochs)", "rows": measured}
    for algorithm in args.algorithms.split(","):
        if measured and time.time() - start > args.seconds:
            break
        measured[algorithm] = measure(algorithm, args)
        m = measured[algorithm]
        print(f"{algorithm}: {m['seconds_per_round']:.3f} s a round ({m['path']}), the 600-round cell in "
              f"{m['projected_cell_seconds'] / 60:.1f} min", flush=True)
        result["projection"] = project(measured, speedup, args.device)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    p = result["projection"]
    print(f"make reproduce-table1 ({p['cells']} cells) on this {args.device}: {p['hours']} h with cells sharing it "
          f"({p['sharing_speedup']:.2f}x), {p['hours_one_cell_at_a_time']} h one at a time; by dataset "
          f"{p['hours_by']['dataset']}, by clients {p['hours_by']['clients']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
