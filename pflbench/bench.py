"""`pflbench bench`: how close the federated simulation comes to the hardware's limit.

A fixed amount of FedAvg work (by default 10 clients x 512 samples of CIFAR shape, batch 32, one
local epoch, whole rounds including aggregation) is timed in one process four ways: the engine's
default path, the client loop, the batched path, and centralized training of one plain model on the
same samples, at batch 32 and at the combined batch (clients x 32). The faster centralized figure is
"the limit": no federated simulation trains the same samples faster on the same machine.
Each way is timed `repeats` times, interleaved with the others, one round (one epoch of the same
samples) at a time, and its best time is kept: on a shared machine the least disturbed measurement
is the one that tells what the code can do. How disturbed the others were is reported too: each way's
min/median/max time, its spread (median over best - 1) and the load average before and after; a way
whose spread exceeds NOISY_SPREAD marks the result "noisy: ratios unreliable".
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from pflbench.config import CellConfig
from pflbench.models import build_model


# A way whose median measurement is this much slower than its best was disturbed by something else on
# the machine: the ratios between ways (each from its own best) may then compare different conditions.
NOISY_SPREAD = 0.10


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bench_federation(clients: int, samples: int, batch_size: int, shape: tuple[int, ...],
                      num_classes: int, model: str, device: torch.device, seed: int):
    from algorithms.fedavg import FedAvg
    from pflbench.data.dataset import Dataset
    from pflbench.federation import Federation
    from pflbench.partitioning import ClientSplits

    gen = torch.Generator().manual_seed(seed)
    total = clients * samples
    dataset = Dataset.build("bench", torch.randint(0, 256, (total, *shape), dtype=torch.uint8, generator=gen),
                            torch.randint(0, num_classes, (total,), generator=gen), num_classes=num_classes,
                            checksum="bench")
    ids = np.arange(total).reshape(clients, samples)
    splits = ClientSplits(train=list(ids), val=[np.empty(0, np.int64)] * clients, test=[np.empty(0, np.int64)] * clients)
    cell = CellConfig(algorithm="fedavg", dataset="bench", clients=clients, batch_size=batch_size,
                      local_epochs=1, lr=0.01, model=model, seed=seed)
    fed = Federation(cell, dataset, splits, device)
    algorithm = FedAvg(fed, FedAvg.Hyperparams())
    algorithm.setup()
    return fed, algorithm


def _time_federated(fed, algorithm, batched: bool, rounds: int) -> float:
    from pflbench.federation import run_round

    fed.batched = batched
    clients = torch.arange(fed.num_clients, device=fed.device)
    _sync(fed.device)
    start = time.perf_counter()
    for rnd in range(rounds):
        run_round(algorithm, rnd, clients)
    _sync(fed.device)
    return time.perf_counter() - start


def _time_centralized(fed, batch_size: int, rounds: int) -> float:
    """One plain nn.Module with torch.optim.SGD over all clients' samples, shuffled each epoch."""
    module = build_model(fed.model_name, tuple(fed.features.shape[1:]), fed.num_classes).to(fed.device)
    optimizer = torch.optim.SGD(module.parameters(), lr=fed.cell.lr)
    features, labels = fed.features, fed.labels
    _sync(fed.device)
    start = time.perf_counter()
    for _ in range(rounds):
        order = torch.randperm(len(labels), device=fed.device)
        for begin in range(0, len(order), batch_size):
            batch = order[begin:begin + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(module(features[batch]), labels[batch])
            loss.backward()
            optimizer.step()
    _sync(fed.device)
    return time.perf_counter() - start


def run_bench(clients: int = 10, samples: int = 512, batch_size: int = 32,
              shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10, model: str = "cnn",
              rounds: int = 1, repeats: int = 8, device: str = "cpu", seed: int = 0,
              progress: Callable[[str], None] | None = None) -> dict:
    """`progress`, if given, gets one line per measurement (and per warm-up) while they run."""
    say = progress or (lambda line: None)
    load_before = load_average()
    device = torch.device(device)
    fed, algorithm = _bench_federation(clients, samples, batch_size, shape, num_classes, model, device, seed)
    default_batched = fed.batched  # the engine's own choice for this device
    combined = clients * batch_size
    ways = {
        "default": lambda: _time_federated(fed, algorithm, default_batched, rounds),
        "loop": lambda: _time_federated(fed, algorithm, False, rounds),
        "batched": lambda: _time_federated(fed, algorithm, True, rounds),
        f"centralized_batch{batch_size}": lambda: _time_centralized(fed, batch_size, rounds),
        f"centralized_batch{combined}": lambda: _time_centralized(fed, combined, rounds),
    }
    work = rounds * clients * samples
    for name, way in ways.items():  # warm-up: allocator, kernels, vmap tracing
        say(f"warm-up {name}: {way():.2f} s")
    times: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(repeats):
        for name, way in ways.items():
            seconds = way()
            times[name].append(seconds)
            say(f"measurement {repeat + 1}/{repeats} {name}: {seconds:.3f} s ({work / seconds:.0f} samples/s)")
    best = {name: min(values) if values else math.inf for name, values in times.items()}
    spread = {name: {"min": min(values), "median": statistics.median(values), "max": max(values),
                     "relative": statistics.median(values) / min(values) - 1}
              for name, values in times.items() if values}
    noisy_ways = [name for name, s in spread.items() if s["relative"] > NOISY_SPREAD]
    throughput = {name: work / seconds for name, seconds in best.items()}
    limit_way = max((f"centralized_batch{batch_size}", f"centralized_batch{combined}"), key=throughput.get)
    limit = throughput[limit_way]
    return {
        "config": {"clients": clients, "samples_per_client": samples, "batch_size": batch_size,
                   "shape": list(shape), "num_classes": num_classes, "model": fed.model_name,
                   "rounds": rounds, "repeats": repeats, "device": str(device),
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "machine": platform.processor() or platform.machine()},
        "default_path": "batched" if default_batched else "loop",
        "samples_per_second": throughput,
        "limit": limit,
        "limit_way": limit_way,
        "ratio_default_to_limit": throughput["default"] / limit,
        "ratio_loop_to_limit": throughput["loop"] / limit,
        "ratio_batched_to_limit": throughput["batched"] / limit,
        "ratio_batched_to_loop": throughput["batched"] / throughput["loop"],
        "ratio_batched_to_centralized_combined": throughput["batched"] / throughput[f"centralized_batch{combined}"],
        # How noisy the machine was: every measurement (seconds), per way min/median/max and the
        # relative spread (median / min - 1), the load average before and after.
        "seconds": times,
        "spread": spread,
        "noisy_spread_threshold": NOISY_SPREAD,
        "noisy_ways": noisy_ways,
        "noisy": bool(noisy_ways),
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "cpus": os.cpu_count(),
    }


def format_bench(result: dict) -> str:
    cfg = result["config"]
    lines = [f"pflbench bench: FedAvg, {cfg['clients']} clients x {cfg['samples_per_client']} samples "
             f"{tuple(cfg['shape'])}, batch {cfg['batch_size']}, model {cfg['model']}, device {cfg['device']}, "
             f"{cfg['threads']} threads, best of {cfg['repeats']} x {cfg['rounds']} rounds",
             f"{'way':<26}{'samples/s':>12}{'/ limit':>10}   seconds min / median / max  spread"]
    spread = result.get("spread", {})
    for name, value in result["samples_per_second"].items():
        label = f"{name} ({result['default_path']})" if name == "default" else name
        line = f"{label:<26}{value:>12.0f}{value / result['limit']:>10.2f}"
        if name in spread:
            s = spread[name]
            line += (f"   {s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}  {s['relative']:>+6.0%}"
                     + ("  noisy" if name in result.get("noisy_ways", ()) else ""))
        lines.append(line)
    lines.append(f"limit = {result['limit_way']}; batched / loop = {result['ratio_batched_to_loop']:.2f}")
    before, after = result.get("loadavg_before"), result.get("loadavg_after")
    if before is not None and after is not None:
        lines.append(f"load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in before)}, after "
                     f"{' '.join(f'{x:.2f}' for x in after)}, on {result.get('cpus')} CPUs")
    if result.get("noisy"):
        lines.append(f"noisy: ratios unreliable: the median measurement of {', '.join(result['noisy_ways'])} was more "
                     f"than {result['noisy_spread_threshold']:.0%} slower than its best (the machine was busy); "
                     f"run again when it is idle, or with more --repeats")
    elif cfg["repeats"] < 2:
        lines.append("one measurement per way: how noisy the machine was is unknown (use --repeats 3 or more)")
    else:
        lines.append(f"spread within {result['noisy_spread_threshold']:.0%} for every way: measurements consistent")
    return "\n".join(lines)


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=2))
