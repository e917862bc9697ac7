"""`pflbench bench`: how close the federated simulation comes to the hardware's limit.

A fixed amount of FedAvg work (by default 10 clients x 512 samples of CIFAR shape, batch 32, one
local epoch, whole rounds including aggregation) is timed in one process several ways: the engine's
default path; `plain`, the same path without its CPU speed-ups (contiguous convolutions, one client
after another: the default before them); the client loop and the batched path; and centralized
training of one plain model on the same samples (torch.optim.SGD, the engine's memory layout), at
batch 32 and at the combined batch (clients x 32). The faster centralized figure is "the limit" of
the ratios: eager PyTorch training the same samples in one stream. Client threads (several clients
side by side, one torch thread each) can pass it: it is a reference, not a bound.
Each way is timed `repeats` times, interleaved with the others, one round (one epoch of the same
samples) at a time, and its best time is kept: on a shared machine the least disturbed measurement
is the one that tells what the code can do. How disturbed the others were is reported too: each way's
min/median/max time, its spread (median over best - 1) and the load average before and after; a way
whose spread exceeds NOISY_SPREAD marks the result "noisy: ratios unreliable".

The physical limit beside it: the FLOPs of one training step per sample (forward and backward,
counted from the model by torch.utils.flop_counter; the SGD update's few FLOPs per parameter are
left out) times each way's samples/s is its achieved GFLOP/s, compared with the machine's measured
peak, the best of a few large float32 matmuls in the same process with the same threads.
With `compiled=True` (the default) the engine's compiled step (pflbench.simulator.training) is timed as one more
way, "compiled", beside the eager default; its compile time is reported apart (warm-up).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable

import numpy as np
import torch

from pflbench.config import CellConfig
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.models import build_model

if TYPE_CHECKING:
    from pflbench.algorithm import AnyAlgorithm
    from pflbench.simulator.federation import Federation


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


def _bench_federation(
    clients: int,
    samples: int,
    batch_size: int,
    shape: tuple[int, ...],
    num_classes: int,
    model: str,
    execution: ExecutionOptions,
    seed: int,
) -> tuple[Federation, AnyAlgorithm]:
    """A FedAvg Federation over generated data that runs as `execution` says (one per way)."""
    from pflbench.algorithms.fedavg import FedAvg
    from pflbench.data.dataset import Dataset
    from pflbench.simulator.federation import Federation
    from pflbench.data.partitioning import ClientSplits

    gen = torch.Generator().manual_seed(seed)
    total = clients * samples
    dataset = Dataset.build(
        "bench",
        torch.randint(0, 256, (total, *shape), dtype=torch.uint8, generator=gen),
        torch.randint(0, num_classes, (total,), generator=gen),
        num_classes=num_classes,
        checksum="bench",
    )
    ids = np.arange(total).reshape(clients, samples)
    splits = ClientSplits(
        train=list(ids), val=[np.empty(0, np.int64)] * clients, test=[np.empty(0, np.int64)] * clients
    )
    cell = CellConfig.model_validate(
        dict(
            algorithm="fedavg",
            dataset="bench",
            clients=clients,
            batch_size=batch_size,
            local_epochs=1,
            lr=0.01,
            model=model,
            seed=seed,
        )
    )
    fed = Federation(cell, dataset, splits, execution)
    algorithm = FedAvg(fed, FedAvg.Hyperparams())
    algorithm.setup()
    return fed, algorithm


def training_flops_per_sample(model: str, shape: tuple[int, ...], num_classes: int, batch_size: int) -> float:
    """FLOPs of forward + backward of one cross-entropy step, per sample (torch.utils.flop_counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    module = build_model(model, shape, num_classes)
    x = torch.randn(batch_size, *shape)
    y = torch.randint(0, num_classes, (batch_size,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(module(x), y).backward()
    return counter.get_total_flops() / batch_size


def matmul_peak(size: int = 1024, repeats: int = 5, calls: int = 4, device: str | torch.device = "cpu") -> float:
    """The device's float32 peak as measured here: best GFLOP/s of `size`^3 matmuls (on CPU with the
    threads as set; on CUDA with torch's float32 matmul precision as the training runs it)."""
    device = torch.device(device)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    torch.mm(a, b, out=out)  # warm-up
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        _sync(device)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2 * size**3 / best / 1e9


def _time_federated(fed: Federation, algorithm: AnyAlgorithm, rounds: int) -> float:
    """Seconds of `rounds` whole FedAvg rounds of every client, as `fed` runs them."""
    from pflbench.simulator.rounds import run_round

    clients = torch.arange(fed.num_clients, device=fed.device)
    _sync(fed.device)
    start = time.perf_counter()
    for rnd in range(rounds):
        run_round(algorithm, rnd, clients)
    _sync(fed.device)
    return time.perf_counter() - start


def _time_centralized(fed: Federation, batch_size: int, rounds: int) -> float:
    """One plain nn.Module with torch.optim.SGD over all clients' samples, shuffled each epoch, in the
    engine's own memory layout (channels-last convolutions where `fed`, the default way, uses them)."""
    module = build_model(fed.model_name, tuple(fed.features.shape[1:]), fed.num_classes).to(fed.device)
    if fed.channels_last:
        module = module.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(module.parameters(), lr=fed.cell.lr)
    features, labels = fed.features, fed.labels
    _sync(fed.device)
    start = time.perf_counter()
    for _ in range(rounds):
        order = torch.randperm(len(labels), device=fed.device)
        for begin in range(0, len(order), batch_size):
            batch = order[begin : begin + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(module(features[batch]), labels[batch])
            loss.backward()
            optimizer.step()
    _sync(fed.device)
    return time.perf_counter() - start


def engine_ways(device: str, compiled: bool) -> dict[str, ExecutionOptions]:
    """The federated ways timed: each is the engine run with its own execution options."""
    return {
        "default": ExecutionOptions(device=device),
        **({"compiled": ExecutionOptions(device=device, compiled_training="on")} if compiled else {}),
        # the default path without its CPU speed-ups (contiguous convolutions, one client at a
        # time): what `default` was before them
        "plain": ExecutionOptions(device=device, channels_last="off", client_threads="off"),
        "loop": ExecutionOptions(device=device, client_batching="off"),
        "batched": ExecutionOptions(device=device, client_batching="on"),
    }


def _measure(
    ways: dict[str, Callable[[], float]], repeats: int, work: int, say: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """One warm-up of each way (allocator, kernels, vmap tracing, compilation), then `repeats` rounds of
    measurements, the ways interleaved: (warm-up seconds, measured seconds per way)."""
    warmup: dict[str, float] = {}
    for name, way in ways.items():
        warmup[name] = way()
        say(f"warm-up {name}: {warmup[name]:.2f} s")
    times: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(repeats):
        for name, way in ways.items():
            seconds = way()
            times[name].append(seconds)
            say(f"measurement {repeat + 1}/{repeats} {name}: {seconds:.3f} s ({work / seconds:.0f} samples/s)")
    return warmup, times


def run_bench(
    clients: int = 10,
    samples: int = 512,
    batch_size: int = 32,
    shape: tuple[int, ...] = (3, 32, 32),
    num_classes: int = 10,
    model: str = "cnn",
    rounds: int = 1,
    repeats: int = 8,
    device: str | torch.device = "cpu",
    seed: int = 0,
    compiled: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """`progress`, if given, gets one line per measurement (and per warm-up) while they run."""
    say = progress or (lambda line: None)
    load_before = load_average()
    device = torch.device(device)
    flops_per_sample = training_flops_per_sample(model, shape, num_classes, batch_size)
    # a GPU's matmuls are too short at 1024 to reach its peak: 4096 there (about 0.14 TFLOP per call)
    peak = matmul_peak(device=device) if device.type == "cpu" else matmul_peak(4096, repeats=5, calls=10, device=device)
    say(
        f"training step {flops_per_sample / 1e6:.2f} MFLOP per sample"
        + (f"; measured matmul peak {peak:.1f} GFLOP/s" if peak else "")
    )
    engines = {
        name: _bench_federation(clients, samples, batch_size, shape, num_classes, model, options, seed)
        for name, options in engine_ways(str(device), compiled).items()
    }
    fed = engines["default"][0]
    combined = clients * batch_size
    ways: dict[str, Callable[[], float]] = {
        **{
            name: partial(_time_federated, engine_fed, engine_algorithm, rounds)
            for name, (engine_fed, engine_algorithm) in engines.items()
        },
        f"centralized_batch{batch_size}": lambda: _time_centralized(fed, batch_size, rounds),
        f"centralized_batch{combined}": lambda: _time_centralized(fed, combined, rounds),
    }
    work = rounds * clients * samples
    warmup, times = _measure(ways, repeats, work, say)
    compile_seconds, compiled_ran = 0.0, False
    if compiled:
        compiled_model = engines["compiled"][0].model
        compile_seconds = compiled_model.compile_seconds
        compiled_ran = bool(compiled_model._compiled) and all(v is not None for v in compiled_model._compiled.values())
    best = {name: min(values) if values else math.inf for name, values in times.items()}
    spread = {
        name: {
            "min": min(values),
            "median": statistics.median(values),
            "max": max(values),
            "relative": statistics.median(values) / min(values) - 1,
        }
        for name, values in times.items()
        if values
    }
    noisy_ways = [name for name, s in spread.items() if s["relative"] > NOISY_SPREAD]
    throughput = {name: work / seconds for name, seconds in best.items()}
    limit_way = max((f"centralized_batch{batch_size}", f"centralized_batch{combined}"), key=lambda way: throughput[way])
    limit = throughput[limit_way]
    gflops = {name: value * flops_per_sample / 1e9 for name, value in throughput.items()}
    return {
        "config": {
            "clients": clients,
            "samples_per_client": samples,
            "batch_size": batch_size,
            "shape": list(shape),
            "num_classes": num_classes,
            "model": fed.model_name,
            "rounds": rounds,
            "repeats": repeats,
            "device": str(device),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        },
        "default_path": "batched" if fed.batched else "loop",
        "channels_last": bool(fed.channels_last),
        "client_threads": int(fed.client_threads),
        "samples_per_second": throughput,
        "limit": limit,
        "limit_way": limit_way,
        "ratio_default_to_limit": throughput["default"] / limit,
        "ratio_loop_to_limit": throughput["loop"] / limit,
        "ratio_batched_to_limit": throughput["batched"] / limit,
        "ratio_batched_to_loop": throughput["batched"] / throughput["loop"],
        "ratio_batched_to_centralized_combined": throughput["batched"] / throughput[f"centralized_batch{combined}"],
        # Against the physical limit: FLOPs per training sample, achieved GFLOP/s, measured peak.
        "flops_per_sample": flops_per_sample,
        "gflops": gflops,
        "peak_gflops": peak,
        "fraction_of_peak": {name: value / peak for name, value in gflops.items()} if peak else None,
        "compiled": compiled_ran,
        "compile_seconds": compile_seconds,
        "ratio_compiled_to_default": throughput["compiled"] / throughput["default"] if compiled else None,
        # against the default path without channels-last convolutions and client threads
        "ratio_default_to_plain": throughput["default"] / throughput["plain"],
        "ratio_compiled_to_plain": throughput["compiled"] / throughput["plain"] if compiled else None,
        "warmup_seconds": warmup,
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
    lines = [
        f"pflbench bench: FedAvg, {cfg['clients']} clients x {cfg['samples_per_client']} samples "
        f"{tuple(cfg['shape'])}, batch {cfg['batch_size']}, model {cfg['model']}, device {cfg['device']}, "
        f"{cfg['threads']} threads, best of {cfg['repeats']} x {cfg['rounds']} rounds",
        f"{'way':<26}{'samples/s':>12}{'/ limit':>10}{'GFLOP/s':>9}{'/ peak':>8}   seconds min / median / max  spread",
    ]
    spread = result.get("spread", {})
    peak = result.get("peak_gflops")
    for name, value in result["samples_per_second"].items():
        label = f"{name} ({result['default_path']})" if name in ("default", "compiled", "plain") else name
        gflops = result.get("gflops", {}).get(name)
        line = (
            f"{label:<26}{value:>12.0f}{value / result['limit']:>10.2f}"
            + (f"{gflops:>9.2f}" if gflops is not None else f"{'':>9}")
            + (f"{gflops / peak:>8.1%}" if gflops is not None and peak else f"{'':>8}")
        )
        if name in spread:
            s = spread[name]
            line += f"   {s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}  {s['relative']:>+6.0%}" + (
                "  noisy" if name in result.get("noisy_ways", ()) else ""
            )
        lines.append(line)
    lines.append(f"limit = {result['limit_way']}; batched / loop = {result['ratio_batched_to_loop']:.2f}")
    if "flops_per_sample" in result:
        lines.append(
            f"training step {result['flops_per_sample'] / 1e6:.2f} MFLOP per sample (forward + backward, "
            f"torch.utils.flop_counter); measured peak "
            + (f"{peak:.1f} GFLOP/s (float32 matmul, same process and threads)" if peak else "not measured")
        )
    if "ratio_default_to_plain" in result:
        layout = "channels-last" if result.get("channels_last") else "contiguous (no convolution or not a CPU)"
        threads = result.get("client_threads", 1)
        side_by_side = f"{threads} clients side by side" if threads > 1 else "one client at a time"
        lines.append(
            f"default ({layout}, {side_by_side}) / plain (contiguous, one client at a time) = "
            f"{result['ratio_default_to_plain']:.2f}"
            + (
                f"; compiled / plain = {result['ratio_compiled_to_plain']:.2f}"
                if result.get("ratio_compiled_to_plain") is not None
                else ""
            )
        )
    if result.get("ratio_compiled_to_default") is not None:
        state = "compiled" if result.get("compiled") else "NOT compiled (fell back to eager; see the note above)"
        lines.append(
            f"compiled / default = {result['ratio_compiled_to_default']:.2f} ({state}; compiling took "
            f"{result['compile_seconds']:.1f} s, in the warm-up, not in the measurements)"
        )
    before, after = result.get("loadavg_before"), result.get("loadavg_after")
    if before is not None and after is not None:
        lines.append(
            f"load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in before)}, after "
            f"{' '.join(f'{x:.2f}' for x in after)}, on {result.get('cpus')} CPUs"
        )
    if result.get("noisy"):
        lines.append(
            f"noisy: ratios unreliable: the median measurement of {', '.join(result['noisy_ways'])} was more "
            f"than {result['noisy_spread_threshold']:.0%} slower than its best (the machine was busy); "
            f"run again when it is idle, or with more --repeats"
        )
    elif cfg["repeats"] < 2:
        lines.append("one measurement per way: how noisy the machine was is unknown (use --repeats 3 or more)")
    else:
        lines.append(f"spread within {result['noisy_spread_threshold']:.0%} for every way: measurements consistent")
    return "\n".join(lines)


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=2))
