"""A paper-scale slice on the GPU, and the projected time of `make reproduce-table1` from it.

Runs the first `--rounds` rounds of Table 1's Fashion-MNIST 10-client cell (the paper's settings:
600 rounds x 10 local epochs, evaluation with 10 epochs of adaptation every 10 rounds) for each
algorithm in turn (FedAvg, pFedMe, pFedHN, Per-FedAvg first: the rows whose cost a sample-step differs
most from FedAvg's batched step, pFedHN's width-1 client loop and the custom steps, which the step count
cannot carry; then the other rows while `--seconds` lasts), on the
engine's default path for the device (batched across clients on CUDA), each for at most
`--max-seconds-each`. Per algorithm: seconds per round after the first (warm-up), and seconds per
sample-epoch (one sample through one local step, adaptation included).

The projection: every cell of `make reproduce-table1` (or `--spec table2`) at full scale (10 rows x 4
datasets x 2 client counts x 3 seeds) costs its work times its row's measured seconds per unit of work
(FedAvg's for a row not measured), times the ratio of its model's training FLOPs per sample to the
Fashion-MNIST CNN's (a GPU runs a larger model closer to its peak, so this overestimates the CIFAR
cells); divided by the measured throughput gain of 8 cells sharing the GPU (`--sharing`: the sharing
step's JSON; 1 where not given). A cell's work is counted, per row and setting, by step_count.py
(`--counts`, default step_counts.json beside this file): samples through a training step, plus a third
of the samples scored without one (a forward is about a third of a training step), over its rounds
(joining clients) and its evaluations (every client adapted and scored). A setting without a count
falls back to its sample-epochs (rounds x joining clients x train samples x local epochs, plus every
evaluation's adaptation of all clients), and the projection lists it as uncounted.

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
from step_count import at_epochs, setting_key  # noqa: E402

COUNTS = HERE / "step_counts.json"
FORWARD_SHARE = 1 / 3  # a forward without autograd, in training steps (forward + backward ~ 3 forwards)

# Table 1's datasets without loading them (EMNIST and CIFAR-100 are not on offline machines):
# (sample shape, classes); EMNIST is the `balanced` split, as table1.yaml sets it.
SHAPES = {"emnist": ((1, 28, 28), 47), "fmnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10),
          "cifar10-jpeg": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100)}
ORDER = ["fedavg", "pfedme", "pfedhn", "perfedavg", "pfedla", "local", "fedrep", "fedfomo", "heurpfedla", "fedbn"]


class Enough(Exception):
    """Raised from the round callback once an algorithm has had its time."""


def table1_cell(algorithm: str, samples: int | None, epochs: int | None):
    from pflbench.run.spec import load_spec

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


def load_counts(path: str | Path | None) -> dict:
    """step_count.py's counts by setting (empty where the file is missing)."""
    path = Path(path) if path else COUNTS
    return json.loads(path.read_text())["counts"] if path.exists() else {}


def counted_work(cell, rounds: float, counts: dict, evaluations: float | None = None) -> float | None:
    """`rounds` rounds of `cell` with `evaluations` evaluations (default: one every `eval_every` rounds) in
    training steps of one sample (module doc); None: no count for its setting."""
    count = counts.get(setting_key(cell))
    if count is None:
        return None
    joining = max(1, round(cell.clients * cell.participation))
    local, adapt = cell.local_epochs, cell.finetune_epochs
    per_round = at_epochs(count["round_grad"], local) + FORWARD_SHARE * at_epochs(count["round_forward"], local)
    per_eval = at_epochs(count["eval_grad"], adapt) + FORWARD_SHARE * at_epochs(count["eval_forward"], adapt)
    evaluations = rounds / cell.eval_every if evaluations is None else evaluations
    return rounds * joining * per_round + evaluations * cell.clients * per_eval


def train_samples(cell) -> float:
    per_client = cell.partition_params.get("samples_per_client") or 0
    return per_client * cell.train_fraction * (1 - cell.val_fraction)


def measure(algorithm: str, args) -> dict:
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell, run_cell

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
    # rounds 2..len(stamps) timed: the evaluations among them
    counted = counted_work(cell, rounds, load_counts(args.counts), len(stamps) // cell.eval_every)
    return {"rounds_timed": rounds, "seconds": seconds, "seconds_per_round": per_round,
            "projected_cell_seconds": per_round * cell.rounds, "seconds_per_sample_epoch": seconds / work,
            "seconds_per_step_sample": None if counted is None else seconds / counted,
            "first_round_seconds": stamps[0] - began, "path": path, "cell_rounds": cell.rounds}


def project(measured: dict, speedup: float, device: str, spec: str = "table1", counts: dict | None = None) -> dict:
    """The whole of `spec` (table1 or table2) at full scale from the measured costs (module doc)."""
    from pflbench.run.bench import training_flops_per_sample
    from pflbench.run.spec import load_spec

    plan = load_spec(REPO / "benchmarks" / f"{spec}.yaml")
    counts = load_counts(None) if counts is None else counts
    base = measured["fedavg"]["seconds_per_sample_epoch"]
    base_counted = measured["fedavg"].get("seconds_per_step_sample")
    flops: dict = {}
    uncounted: set[str] = set()

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
        row = measured.get(cell.algorithm, {})
        work = counted_work(cell, cell.rounds, counts)
        if work is not None and base_counted is not None:
            seconds = work * (row.get("seconds_per_step_sample") or base_counted)
        else:
            uncounted.add(setting_key(cell))
            seconds = sample_epochs(cell, cell.rounds, train_samples(cell)) * row.get("seconds_per_sample_epoch", base)
        seconds *= flops_of(cell) / reference
        total += seconds
        for axis, key in (("algorithm", cell.algorithm), ("dataset", cell.dataset), ("clients", str(cell.clients))):
            seconds_by[axis][key] = seconds_by[axis].get(key, 0.0) + seconds
    hours = {axis: {k: round(v / speedup / 3600, 2) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}
             for axis, values in seconds_by.items()}
    return {"cells": len(plan.cells), "device": device, "sharing_speedup": speedup,
            "hours_one_cell_at_a_time": round(total / 3600, 2), "hours": round(total / speedup / 3600, 2),
            "hours_by": hours, "unmeasured_rows_take": "fedavg", "spec": spec, "seeds": sorted({c.seed for c in plan.cells}),
            "measured_rows": sorted(measured), "uncounted_settings": sorted(uncounted)}


def reproject(path: str, counts: dict) -> dict:
    """A stored slice's rows (its JSON, or a GPU check's whose `paper_slice` step holds it) projected again
    with `counts`: each row's seconds per counted unit of work from its timed rounds (2..rounds_timed + 1,
    at the spec's settings), then both tables."""
    stored = json.loads(Path(path).read_text())
    if "steps" in stored:  # a GPU check's JSON
        stored = stored["steps"]["paper_slice"]["figures"]
    rows = {}
    for algorithm, row in stored["rows"].items():
        cell = table1_cell(algorithm, None, None)
        last = row["rounds_timed"] + 1
        work = counted_work(cell, row["rounds_timed"], counts, last // cell.eval_every)
        rows[algorithm] = {**row, "seconds_per_step_sample": None if work is None else row["seconds"] / work}
    speedup = stored["projection"]["sharing_speedup"]
    return {"device": stored["device"], "from": str(path), "rows": rows,
            "projection": project(rows, speedup, stored["device"], "table1", counts),
            "projection_table2": project(rows, speedup, stored["device"], "table2", counts)}


def summary_line(p: dict, device: str) -> str:
    seeds = len(p["seeds"])
    return (f"make reproduce-{p['spec']} ({p['cells']} cells, {seeds} seeds) on this {device}: {p['hours']} h with cells "
            f"sharing it ({p['sharing_speedup']:.2f}x; {p['hours'] / seeds:.2f} h a seed), "
            f"{p['hours_one_cell_at_a_time']} h one at a time; by algorithm {p['hours_by']['algorithm']}; by dataset "
            f"{p['hours_by']['dataset']}; by clients {p['hours_by']['clients']}; settings without a step count: "
            f"{len(p['uncounted_settings'])}")


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
    parser.add_argument("--counts", default=None, help="step_count.py's JSON (default: step_counts.json here)")
    parser.add_argument("--reproject", default=None, metavar="JSON",
                        help="run nothing: project a stored slice (its JSON or a GPU check's) again with the counts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.reproject:
        result = reproject(args.reproject, load_counts(args.counts))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        for p in (result["projection"], result["projection_table2"]):
            print(summary_line(p, result["device"]))
        return 0
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
        result["projection"] = project(measured, speedup, args.device, counts=load_counts(args.counts))
        result["projection_table2"] = project(measured, speedup, args.device, "table2", load_counts(args.counts))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for p in (result["projection"], result["projection_table2"]):
        print(summary_line(p, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
