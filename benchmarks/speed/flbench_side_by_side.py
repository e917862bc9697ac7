"""Whole FedAvg rounds, FL-bench against pflbench, on FL-bench's own Fashion-MNIST split, alternated.

The setting of the speed issue: FL-bench's split in ../shared/crosscheck/flbench-fmnist-10c-4cls/ (10
clients, 4 classes each, 49,004 train samples), pflbench's `cnn`, SGD lr 0.01, batch 32, one local
epoch, all clients every round, each client's model scored on its test split every round (one
evaluation per round in both: FL-bench's `test.client.interval: 1` with `client_side_evaluation:
false`, so it does not also score before and after training inside the round).

FL-bench's per-round time is measured from outside, as (wall time of a run of 1 + R rounds - wall time
of a run of 1 round) / R: its start-up (Hydra, reading the data set, building clients) cancels out,
the first round's warm-up too. pflbench's is the median of R rounds after a warm-up round, timed in
its own process by flbench_round.py (`--modes after`: the engine's defaults). The suites alternate
(FL-bench 1 round, pflbench, FL-bench 1 + R rounds) for each torch thread count, so they see the same
load; the load average is printed with every measurement.

Setting FL-bench up (KarhouTam/FL-bench at commit 06e658b, the commit the split was made with; Python
3.11 venv with torch==2.14.1, torchvision==0.29.1, hydra-core==1.3.2, ray==2.60.0, pandas,
matplotlib, rich, pyyaml, scikit-learn, scipy, pynvml):
1. Data, no download: decompress ../shared/data/fashion-mnist/*.gz into
   FLBENCH/data/fmnist/FashionMNIST/raw/ (torchvision looks for the decompressed IDX files there) and
   copy ../shared/crosscheck/flbench-fmnist-10c-4cls/{partition.pkl,args.json} to FLBENCH/data/fmnist/.
2. The model: in FLBENCH/src/utils/models.py add a DecoupledModel subclass whose `base` is
   Conv2d(1, 16, 5), ReLU, MaxPool2d(2), Conv2d(16, 32, 5), ReLU, MaxPool2d(2), Flatten, Linear(512,
   120), ReLU, Linear(120, 84), ReLU and whose `classifier` is Linear(84, 10) (pflbench's `cnn`, layers
   created in the same order), registered in its MODELS dict as "pflcnn".
3. This script writes FLBENCH/config/pflbench_speed.yaml itself (the settings above).

    PYTHONPATH=. PFLBENCH_DATA_MIRROR=../shared/data python benchmarks/speed/flbench_side_by_side.py \\
        --flbench /path/to/FL-bench --flbench-python /path/to/flbench-venv/bin/python --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """\
method: fedavg
dataset: {{name: fmnist}}
model: {{name: pflcnn, use_torchvision_pretrained_weights: false}}
optimizer: {{name: sgd, lr: 0.01, momentum: 0, weight_decay: 0}}
mode: serial
common:
  seed: 0
  join_ratio: 1.0
  global_epoch: {rounds}
  local_epoch: 1
  batch_size: 32
  client_side_evaluation: false
  test:
    client: {{interval: 1, finetune_epoch: 0, train: false, val: false, test: true}}
    server: {{interval: -1}}
  verbose_gap: 1000
  monitor: null
  use_cuda: false
  save_log: false
  save_model: false
  save_learning_curve_plot: false
  save_metrics: false
  delete_useless_run: true
"""


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def thread_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def flbench_run(flbench: Path, python: str, rounds: int, threads: int) -> float:
    """Wall seconds of one FL-bench FedAvg run of `rounds` rounds."""
    (flbench / "config" / "pflbench_speed.yaml").write_text(CONFIG.format(rounds=rounds))
    start = time.perf_counter()
    done = subprocess.run([python, "main.py", "--config-name", "pflbench_speed.yaml"], cwd=flbench,
                          env=thread_env(threads), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"FL-bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def pflbench_rounds(split: str, rounds: int, threads: int) -> dict:
    """Median seconds per round (round, train, eval) of pflbench's defaults, timed in-process."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "rounds.json"
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("flbench_round.py")), "--split", split,
                               "--repeats", str(rounds), "--threads", str(threads), "--modes", "after",
                               "--json", str(out)], env=thread_env(threads), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"flbench_round.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())["median"]["after"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flbench", required=True, type=Path, help="the prepared FL-bench checkout")
    parser.add_argument("--flbench-python", required=True, help="the Python of FL-bench's environment")
    parser.add_argument("--split", default="../shared/crosscheck/flbench-fmnist-10c-4cls/partition.pkl")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per suite and thread count")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    results = {"rounds": args.rounds, "load_before": load(), "by_threads": {}}
    for threads in [int(t) for t in args.threads.split(",")]:
        short = flbench_run(args.flbench, args.flbench_python, 1, threads)
        print(f"{threads} thread(s): FL-bench 1 round {short:.1f} s (load {load()})", file=sys.stderr, flush=True)
        ours = pflbench_rounds(args.split, args.rounds, threads)
        print(f"{threads} thread(s): pflbench round {ours['round']:.2f} s, train {ours['train']:.2f}, eval "
              f"{ours['eval']:.2f} (load {load()})", file=sys.stderr, flush=True)
        long = flbench_run(args.flbench, args.flbench_python, 1 + args.rounds, threads)
        theirs = (long - short) / args.rounds
        print(f"{threads} thread(s): FL-bench {1 + args.rounds} rounds {long:.1f} s -> {theirs:.2f} s a round "
              f"(load {load()})", file=sys.stderr, flush=True)
        results["by_threads"][threads] = {"flbench_round": theirs, "flbench_runs": [short, long],
                                          "pflbench": ours, "ratio": theirs / ours["round"], "load": load()}
    results["load_after"] = load()
    print(f"FedAvg on FL-bench's Fashion-MNIST split, whole rounds (training + one test evaluation), "
          f"{args.rounds} timed rounds per suite; load {results['load_before']} -> {results['load_after']}")
    for threads, row in results["by_threads"].items():
        print(f"  {threads} thread(s): FL-bench {row['flbench_round']:.2f} s a round, pflbench "
              f"{row['pflbench']['round']:.2f} s (train {row['pflbench']['train']:.2f}, eval "
              f"{row['pflbench']['eval']:.2f}): FL-bench / pflbench = {row['ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
