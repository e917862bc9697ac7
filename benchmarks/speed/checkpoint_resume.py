"""Round checkpoints on a real cell: run one cell of a spec with the runner's checkpointer, printing a
line per round (round, the cell's wall time, seconds spent writing checkpoints, checkpoints written,
bytes of the last), so that a `kill -9` from outside shows how many rounds were lost and a rerun
shows where it resumed. The numbers in docs/measurements/index.md ("Round checkpoints") were measured with:

    python benchmarks/speed/checkpoint_resume.py benchmarks/table1.yaml --set dataset=fmnist \
        --set clients=10 --set algorithm=fedavg --set seed=0 --set resources.gpus=0 \
        --results /tmp/ckpt-measure --checkpoint-every 5 &
    # ... kill -9 it mid-run, then run the same command again: it resumes from the last checkpoint.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pflbench.run.cell import cell_checkpointer
from pflbench.run.options import RunOptions
from pflbench.run.spec import load_spec
from pflbench.run.spec_axes import parse_sets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--checkpoint-minutes", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    from pflbench.simulator.rounds import run_cell

    torch.set_num_threads(args.threads)
    plan = load_spec(args.spec, parse_sets(args.sets))
    if len(plan.cells) != 1:
        raise SystemExit(f"the spec with these --set gives {len(plan.cells)} cells; give one")
    cell = plan.cells[0]
    options = RunOptions(results=args.results, checkpoint_every=args.checkpoint_every,
                         checkpoint_minutes=args.checkpoint_minutes)
    checkpointer = cell_checkpointer(cell, options, note=lambda text: print(f"note: {text}", flush=True))
    started = time.perf_counter()

    def report(info: dict) -> None:
        print(f"round {info['round']} of {info['rounds']}: cell wall {time.perf_counter() - started:.1f} s "
              f"(this process), checkpoints {checkpointer.written} written in {checkpointer.seconds:.3f} s, "
              f"last {checkpointer.last_bytes} bytes", flush=True)

    print(f"cell {checkpointer.folder.name}: {cell.algorithm} {cell.dataset} {cell.clients} clients, "
          f"{cell.rounds} rounds x {cell.local_epochs} epochs, finetune {cell.finetune_epochs}", flush=True)
    result = run_cell(cell, on_round=report, checkpointer=checkpointer)
    print({k: v for k, v in result.summary.items() if "checkpoint" in k or k in ("wall_time", "status")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
