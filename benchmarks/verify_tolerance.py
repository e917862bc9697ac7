"""How far a cell's per-round mean accuracy moves when only the kernels change: the evidence for
`pflbench.studies.verify.ACCURACY_TOLERANCE` (what `pflbench verify` allows across kinds of machines).

Each cell of a spec runs twice on this machine, with the same configuration, seed and data, through
different kernels: the client loop with contiguous convolutions, and the batched path (torch.func vmap:
batched matrix products) with channels-last convolutions. Float rounding differs between the two the
way it differs between CPUs or between a CPU and a GPU, and SGD carries the difference on. Prints, per
cell, the largest gap of each round's mean accuracy (test, validation, and after adaptation where the
cell has it) over the evaluated rounds, then the largest over all cells.

    .venv/bin/python benchmarks/verify_tolerance.py benchmarks/ci.yaml --set seed=[0]
"""
from __future__ import annotations

import argparse

import torch

from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.rounds import run_cell
from pflbench.run.spec import load_spec
from pflbench.run.spec_axes import parse_sets
from pflbench.studies.verify import MEAN_COLUMNS, per_round_means

VARIANTS = ({"client_batching": "off", "channels_last": "off"}, {"client_batching": "on", "channels_last": "on"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--scale")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan = load_spec(args.spec, parse_sets(args.sets), scale=args.scale)
    worst, compared = 0.0, 0
    for cell in plan.cells:
        runs = [run_cell(cell, execution=ExecutionOptions(device="cpu", client_threads="off", **variant))
                for variant in VARIANTS]
        if runs[0].status != runs[1].status or runs[0].summary["client_batching"] == runs[1].summary["client_batching"]:
            print(f"{cell.algorithm:<13} {cell.partition:<13} skipped (statuses {runs[0].status}/{runs[1].status}, "
                  f"paths {runs[0].summary['client_batching']}/{runs[1].summary['client_batching']})")
            continue
        gaps = {}
        for column in MEAN_COLUMNS:  # what `verify` holds to the tolerance
            a, b = (per_round_means(r.metrics, column) for r in runs)
            if len(a) and len(a) == len(b) and a.notna().any():
                gaps[column] = float((a - b).abs().max())
        compared += 1
        worst = max(worst, *gaps.values())
        print(f"{cell.algorithm:<13} {cell.partition:<13} rounds {cell.rounds:>3}  largest gap: "
              + ", ".join(f"{column} {gap * 100:.2f} pp" for column, gap in gaps.items()), flush=True)
    print(f"{compared} cells compared; largest gap of a round's mean accuracy: {worst * 100:.2f} percentage points")


if __name__ == "__main__":
    main()
