"""Round checkpoints on Ray, where they go: the driver's store through the keeper actor (now,
pflbench/run/checkpoint_relay.py) against the worker's own disk (before issue 45), on the same cell, run
alternately as Ray tasks of one local Ray instance. Prints, per run: checkpoints written, bytes per
checkpoint, seconds per checkpoint and their share of the cell's wall time. docs/measurements/index.md
("A Ray cluster: cost of a checkpoint") quotes:

    python benchmarks/speed/checkpoint_relay.py benchmarks/table1.yaml --set dataset=fmnist \
        --set clients=10 --set algorithm=fedavg --set seed=0 --set resources.gpus=0 \
        --set rounds=6 --set local_epochs=1 --results /tmp/ckpt-relay
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pflbench.config import cell_hash
from pflbench.run.cell import execute_cell
from pflbench.run.options import RunOptions
from pflbench.run.spec import load_spec
from pflbench.run.spec_axes import parse_sets

MODES = ("worker-disk", "driver-store")


def one_run(cell, resources, options: RunOptions, mode: str, keeper):
    from pflbench.run.checkpoint_relay import RelayedCheckpointFile

    files = None if mode == "worker-disk" else RelayedCheckpointFile(keeper, cell_hash(cell), 0)
    started = time.perf_counter()
    result = execute_cell(cell, resources, options, checkpoint_files=files)
    return {"status": result.status, "error": result.error, "cell_seconds": time.perf_counter() - started,
            **{k: result.summary.get(k) for k in ("checkpoints_written", "checkpoint_bytes", "checkpoint_seconds")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    import ray

    from pflbench.run.checkpoint_relay import start_keeper
    from pflbench.data import data_mirror, data_root

    plan = load_spec(args.spec, parse_sets(args.sets))
    if len(plan.cells) != 1:
        raise SystemExit(f"the spec with these --set gives {len(plan.cells)} cells; give one")
    [cell] = plan.cells
    shutil.rmtree(args.results, ignore_errors=True)
    ray.init(num_cpus=max(1, int(plan.resources.cpus)), include_dashboard=False, log_to_driver=False)
    task = ray.remote(one_run).options(num_cpus=plan.resources.cpus)
    rows = []
    for repeat in range(args.repeats):
        for mode in MODES:
            root = (args.results / f"{mode}-{repeat}").absolute()
            options = RunOptions(results=root, data_root=data_root(None), mirror=data_mirror(None),
                                 checkpoint_every=1, checkpoint_minutes=0, keep_checkpoints=True)
            keeper = start_keeper(root)
            ray.get(keeper.open.remote(cell_hash(cell), 0))
            row = {"mode": mode, "repeat": repeat, **ray.get(task.remote(cell, plan.resources, options, mode, keeper))}
            written = row["checkpoints_written"] or 0
            if written:
                row["seconds_per_checkpoint"] = row["checkpoint_seconds"] / written
                row["share_of_cell"] = row["checkpoint_seconds"] / row["cell_seconds"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            ray.kill(keeper)
    print(json.dumps({"cell": cell_hash(cell), "algorithm": cell.algorithm, "dataset": cell.dataset,
                      "clients": cell.clients, "rounds": cell.rounds, "load_average": os.getloadavg()}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
