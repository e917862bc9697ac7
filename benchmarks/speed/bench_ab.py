"""`pflbench bench`'s default way in two checkouts, alternated in one run: is one slower than the other?

    python benchmarks/speed/bench_ab.py BEFORE_PYTHON AFTER_PYTHON [--pairs 12] [--threads 2]

Each PYTHON is a checkout's interpreter (its `pflbench` is that checkout's: e.g. a worktree made with
its own virtual environment). One worker process per checkout builds the bench's FedAvg federation
(`pflbench.run.bench._bench_federation`: 10 clients x 512 samples of CIFAR shape, batch 32, the engine's
default execution options) and times one whole round (`_time_federated`) each time the driver asks;
the driver asks them in turn, A B A B ..., so that both see the same machine load, after one warm-up
round each. Printed: per checkout the best, median and worst round in seconds and samples/s, the
ratios after/before (speed) of the best and of the medians, the median of the pairs' ratios (each
pair ran back to back: the least disturbed comparison on a busy machine) and how many pairs the
second checkout won, and the load average before and after. Only the
default way is timed (the full `pflbench bench` times five ways and takes ten times as long on a busy
machine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import sys, torch
from pflbench.run.bench import _bench_federation, _time_federated
from pflbench.simulator.execution import ExecutionOptions
torch.set_num_threads(int(sys.argv[1]))
fed, algorithm = _bench_federation(10, 512, 32, (3, 32, 32), 10, "cnn", ExecutionOptions(device="cpu"), 0)
print("ready", flush=True)
for line in sys.stdin:
    print(_time_federated(fed, algorithm, 1), flush=True)
"""

SAMPLES = 10 * 512  # one round of the bench: every client's 512 samples, one local epoch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="the first checkout's python")
    parser.add_argument("after", help="the second checkout's python")
    parser.add_argument("--pairs", type=int, default=12, help="timed rounds of each, alternated (default 12)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each worker (default 2)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    workers = {}
    for name, python in (("before", args.before), ("after", args.after)):
        workers[name] = subprocess.Popen([python, "-c", WORKER, str(args.threads)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
        assert workers[name].stdout.readline().strip() == "ready"

    def once(name: str) -> float:
        worker = workers[name]
        worker.stdin.write("go\n")
        worker.stdin.flush()
        return float(worker.stdout.readline())

    for name in workers:  # warm-up
        once(name)
    times: dict[str, list[float]] = {name: [] for name in workers}
    for pair in range(args.pairs):
        order = ("before", "after") if pair % 2 == 0 else ("after", "before")
        for name in order:
            times[name].append(once(name))
        print(f"pair {pair + 1}/{args.pairs}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in workers),
              file=sys.stderr, flush=True)
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()
    result = {name: {"best_s": min(t), "median_s": statistics.median(t), "worst_s": max(t),
                     "best_samples_per_s": SAMPLES / min(t), "median_samples_per_s": SAMPLES / statistics.median(t)}
              for name, t in times.items()}
    result["ratio_best_after_over_before"] = result["after"]["best_samples_per_s"] / result["before"]["best_samples_per_s"]
    result["ratio_median_after_over_before"] = (result["after"]["median_samples_per_s"]
                                                / result["before"]["median_samples_per_s"])
    pairs = [b / a for b, a in zip(times["before"], times["after"])]  # each pair ran back to back
    result["pair_ratios_median"] = statistics.median(pairs)
    result["pairs_after_faster"] = sum(r > 1 for r in pairs)
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["times_s"] = times
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
