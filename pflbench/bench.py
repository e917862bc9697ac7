"""`pflbench bench`: how close the federated simulation comes to the hardware's limit.

A fixed amount of FedAvg work (by default 10 clients x 512 samples of CIFAR shape, batch 32, one
local epoch, whole rounds including aggregation) is timed in one process four ways: the engine's
default path, the client loop, the batched path, and centralized training of one plain model on the
same samples, at batch 32 and at the combined batch (clients x 32). The faster centralized figure is
"the limit": no federated simulation trains the same samples faster on the same machine.
Each way is timed `repeats` times, interleaved with the others, one round (one epoch of the same
samples) at a time, and its best time is kept: on a shared machine the least disturbed measurement
is the one that tells what the code can do.
"""
from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

from pflbench.config import CellConfig
from pflbench.models import build_model


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
              rounds: int = 1, repeats: int = 8, device: str = "cpu", seed: int = 0) -> dict:
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
    for way in ways.values():  # warm-up: allocator, kernels, vmap tracing
        way()
    best = {name: math.inf for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            best[name] = min(best[name], way())
    work = rounds * clients * samples
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
    }


def format_bench(result: dict) -> str:
    cfg = result["config"]
    lines = [f"pflbench bench: FedAvg, {cfg['clients']} clients x {cfg['samples_per_client']} samples "
             f"{tuple(cfg['shape'])}, batch {cfg['batch_size']}, model {cfg['model']}, device {cfg['device']}, "
             f"{cfg['threads']} threads, best of {cfg['repeats']} x {cfg['rounds']} rounds",
             f"{'way':<26}{'samples/s':>12}{'/ limit':>10}"]
    for name, value in result["samples_per_second"].items():
        label = f"{name} ({result['default_path']})" if name == "default" else name
        lines.append(f"{label:<26}{value:>12.0f}{value / result['limit']:>10.2f}")
    lines.append(f"limit = {result['limit_way']}; batched / loop = {result['ratio_batched_to_loop']:.2f}")
    return "\n".join(lines)


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=2))
