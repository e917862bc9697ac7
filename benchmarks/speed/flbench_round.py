"""Whole FedAvg rounds on FL-bench's own Fashion-MNIST split (../shared/crosscheck/), the engine as it
was at the start of the speed issue ("before": eager step, contiguous convolutions, one client after
another, evaluation 4096 samples a call) against the engine's defaults now ("after": channels-last
convolutions, client threads, evaluation EVAL_CHUNK samples a call), alternated in one process.

The setting of the cross-check's speed comparison: 10 clients, 4 classes each (FL-bench's generator,
seed 42), the `cnn` model, SGD lr 0.01, batch 32, one local epoch, all clients every round, every
client's model evaluated on its test split every round. A round is timed in its parts: local training
(`train`), the other hooks (`server`) and forming + scoring the personalized models (`eval`).
Modes alternate round by round (before, after, before, ...) on the same federation, so both see the
same load; a warm-up round of each mode comes first. `--compiled` adds a third mode, the compiled step
(compile time spent in its warm-up round and reported apart).

    PYTHONPATH=. PFLBENCH_DATA_MIRROR=../shared/data python benchmarks/speed/flbench_round.py \\
        --split ../shared/crosscheck/flbench-fmnist-10c-4cls/partition.pkl --repeats 3 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time

import numpy as np
import torch


def load_split(path: str):
    from pflbench.data.partitioning import ClientSplits

    with open(path, "rb") as f:
        partition = pickle.load(f)
    per_client = partition["data_indices"]
    as_ids = lambda values: np.asarray(values if values is not None else [], dtype=np.int64)  # noqa: E731
    return ClientSplits(train=[as_ids(c["train"]) for c in per_client],
                        val=[as_ids(c.get("val")) for c in per_client],
                        test=[as_ids(c["test"]) for c in per_client])


def timed_round(fed, algorithm, rnd: int) -> dict:
    from pflbench.simulator.rounds import run_round
    from pflbench.serving import Serving

    clients = torch.arange(fed.num_clients)
    timing: dict = {}
    start = time.perf_counter()
    run_round(algorithm, rnd, clients, timing)
    trained = time.perf_counter()
    accuracy, _ = algorithm.evaluate(Serving(rnd, fed), algorithm.personalized(), ("test",))["test"]
    end = time.perf_counter()
    return {"train": timing["train"], "server": trained - start - timing["train"], "eval": end - trained,
            "round": end - start, "accuracy": float(accuracy.mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="../shared/crosscheck/flbench-fmnist-10c-4cls/partition.pkl")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per mode (alternated)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--compiled", action="store_true", help="also time the compiled step")
    parser.add_argument("--modes", default="before,after", help="which modes to time (comma-separated)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from pflbench.algorithms.fedavg import FedAvg
    from pflbench.config import CellConfig
    from pflbench.data import load_dataset
    from pflbench.simulator.federation import Federation

    splits = load_split(args.split)
    dataset = load_dataset("fmnist")
    cell = CellConfig(algorithm="fedavg", dataset="fmnist", clients=splits.num_clients, batch_size=32,
                      local_epochs=1, lr=0.01, model="cnn", rounds=1000, seed=0)
    from pflbench.simulator import training
    from pflbench.simulator.execution import ExecutionOptions

    modes = args.modes.split(",") + (["compiled"] if args.compiled else [])
    # One engine per mode, each with its execution options: "before" is the path before the CPU
    # speed-ups (contiguous convolutions, one client at a time, evaluation in chunks of 4096).
    execution = {"before": ExecutionOptions(channels_last="off", client_threads="off"),
                 "after": ExecutionOptions(), "compiled": ExecutionOptions(compiled_training="on")}
    engines = {}
    for mode in modes:
        fed = Federation(cell, dataset, splits, execution[mode], FedAvg.capabilities.batched)
        algorithm = FedAvg(fed, FedAvg.Hyperparams())
        algorithm.setup()
        engines[mode] = (fed, algorithm)
    fed = engines[modes[0]][0]
    load = lambda: [round(x, 2) for x in os.getloadavg()]  # noqa: E731
    result = {"load_before": load(), "threads": args.threads, "train_samples": int(fed.train_sizes.sum()),
              "path": "batched" if fed.batched else "loop", "rounds": {mode: [] for mode in modes}}
    engine_threads = engines.get("after", engines[modes[0]])[0].client_threads

    def set_mode(mode: str):
        training.EVAL_CHUNK["cpu"] = 4096 if mode == "before" else 256
        return engines[mode]

    rnd = 0
    for mode in modes:  # warm-up: allocator, kernels, the client pool, compilation
        warm = timed_round(*set_mode(mode), rnd)
        rnd += 1
        print(f"warm-up {mode}: {warm['round']:.1f} s", file=sys.stderr, flush=True)
    compiled_model = engines["compiled"][0].model if "compiled" in engines else None
    result["compile_seconds"] = compiled_model.compile_seconds if compiled_model else 0.0
    result["compiled"] = bool(compiled_model and compiled_model._compiled) and all(
        v is not None for v in compiled_model._compiled.values())
    result["client_threads"] = engine_threads
    for repeat in range(args.repeats):
        for mode in modes:
            measured = timed_round(*set_mode(mode), rnd)
            rnd += 1
            result["rounds"][mode].append(measured)
            print(f"{mode} {repeat + 1}/{args.repeats}: " + ", ".join(f"{k} {v:.2f}" for k, v in measured.items())
                  + f"  (load {load()})", file=sys.stderr, flush=True)
    result["load_after"] = load()
    median = {mode: {part: statistics.median(r[part] for r in rows) for part in ("train", "server", "eval", "round")}
              for mode, rows in result["rounds"].items()}
    result["median"] = median
    print(f"FedAvg on FL-bench's Fashion-MNIST split ({result['train_samples']} train samples, {args.threads} thread(s), "
          f"{result['path']} path), median of {args.repeats} alternated rounds per mode; load {result['load_before']} "
          f"-> {result['load_after']}")
    for mode, parts in median.items():
        spread = [r["round"] for r in result["rounds"][mode]]
        print(f"  {mode:<7} round {parts['round']:6.2f} s (min {min(spread):.2f}, max {max(spread):.2f})  train "
              f"{parts['train']:6.2f}  server {parts['server']:5.2f}  eval {parts['eval']:5.2f}")
    for mode in (m for m in modes if m != "before" and "before" in modes):
        print(f"  before / {mode}: round {median['before']['round'] / median[mode]['round']:.2f}, train "
              f"{median['before']['train'] / median[mode]['train']:.2f}, eval "
              f"{median['before']['eval'] / median[mode]['eval']:.2f}")
    if args.compiled:
        print(f"  compiling took {result['compile_seconds']:.1f} s "
              f"({'compiled' if result['compiled'] else 'NOT compiled: fell back to eager'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
