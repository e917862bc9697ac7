"""Several cells sharing one GPU: 1, 4, 8 processes side by side, each running the first rounds of
Table 1's Fashion-MNIST 10-client cell (FedAvg, the paper's settings: 700 samples a client, 10 local
epochs, batch 32, lr 0.005) in-process. Per process: training samples per second over its rounds after
the first (warm-up: CUDA context, kernels) and its peak GPU memory (allocated by torch, and reserved
by its caching allocator); per count: the total throughput while they run together, against one
process alone. What `resources.gpus` fractions should be follows from it (docs/howto/gpu.md; measured: docs/measurements/gpu.md).

    python benchmarks/gpu/sharing.py --device cuda --processes 1,4,8 --rounds 5 --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def table1_cell(algorithm: str, rounds: int, samples: int | None, epochs: int | None, seed: int = 0):
    """Table 1's Fashion-MNIST 10-client cell of `algorithm` as the spec gives it, with `rounds` (no
    evaluation until the last) and, for a rehearsal, fewer samples or epochs."""
    from pflbench.run.spec import load_spec

    sets = {"dataset": "fmnist", "clients": 10, "seed": seed, "algorithm": algorithm, "resources.gpus": 0}
    cell = load_spec(REPO / "benchmarks" / "table1.yaml", sets=sets).cells[0]
    update = {"rounds": rounds, "eval_every": rounds, "finetune_epochs": 0}
    if samples:
        update["partition_params"] = {**cell.partition_params, "samples_per_client": samples}
    if epochs:
        update["local_epochs"] = epochs
    return cell.model_copy(update=update)


def worker(device: str, rounds: int, samples: int | None, epochs: int | None, start_at: float) -> dict:
    """One process: the cell's rounds, timed after its first; its peak GPU memory."""
    import torch

    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell, run_cell

    cell = resolve(table1_cell("fedavg", rounds, samples, epochs))
    _, splits = prepare_cell(cell)  # the data decoded and cached before the clock starts
    per_round = sum(len(train) for train in splits.train) * cell.local_epochs
    stamps: list[float] = []
    while time.time() < start_at:  # every process starts its rounds together, after its own imports
        time.sleep(0.01)
    began = time.time()
    result = run_cell(cell, execution=ExecutionOptions(device=device), on_round=lambda info: stamps.append(time.time()))
    timed = stamps[-2] - stamps[0] if len(stamps) > 2 else stamps[-1] - began  # the last round evaluates too
    timed_rounds = len(stamps) - 2 if len(stamps) > 2 else len(stamps)
    facts = {"samples_per_round": per_round, "timed_rounds": timed_rounds, "seconds": timed,
             "samples_per_second": per_round * timed_rounds / timed, "began": began, "ended": stamps[-1],
             "path": result.summary.get("client_batching")}
    if torch.device(device).type == "cuda":
        facts["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
        facts["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2 ** 20
    return facts


def run_count(count: int, args) -> dict:
    start_at = time.time() + 8 + count  # the processes' imports and CUDA contexts first
    command = [sys.executable, __file__, "--worker", "--device", args.device, "--rounds", str(args.rounds),
               "--start-at", str(start_at)]
    if args.samples:
        command += ["--samples", str(args.samples)]
    if args.epochs:
        command += ["--epochs", str(args.epochs)]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    workers = []
    for process in processes:
        output, _ = process.communicate()
        lines = [line for line in output.splitlines() if line.startswith("WORKER ")]
        if process.returncode != 0 or not lines:
            raise SystemExit(f"concurrent: a worker of {count} failed (exit {process.returncode})")
        workers.append(json.loads(lines[-1].removeprefix("WORKER ")))
    # Together: every sample of the timed rounds over the span in which they ran
    span = max(w["ended"] for w in workers) - min(w["began"] for w in workers)
    total = sum(w["samples_per_second"] for w in workers)
    return {"processes": count, "workers": workers, "total_samples_per_second": total, "span_seconds": span,
            "peak_allocated_mib_max": max((w.get("peak_allocated_mib", 0) for w in workers), default=0),
            "peak_reserved_mib_max": max((w.get("peak_reserved_mib", 0) for w in workers), default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--processes", default="1,4,8", help="comma-separated process counts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=None, help="samples per client (default: the spec's 700)")
    parser.add_argument("--epochs", type=int, default=None, help="local epochs (default: the spec's 10)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("WORKER " + json.dumps(worker(args.device, args.rounds, args.samples, args.epochs, args.start_at)),
              flush=True)
        return 0
    runs = []
    result = {"device": args.device, "cell": "table1 fmnist 10 clients, fedavg", "rounds": args.rounds, "runs": runs}
    for count in [int(c) for c in args.processes.split(",")]:
        runs.append(run_count(count, args))
        alone = runs[0]["total_samples_per_second"]
        runs[-1]["speedup_over_one"] = runs[-1]["total_samples_per_second"] / alone
        print(f"{count} process(es): {runs[-1]['total_samples_per_second']:.0f} samples/s in all "
              f"({runs[-1]['speedup_over_one']:.2f}x one alone), peak GPU memory per process "
              f"{runs[-1]['peak_allocated_mib_max']:.0f} MiB allocated / {runs[-1]['peak_reserved_mib_max']:.0f} MiB reserved",
              flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
