"""Seconds per step of a timed call, the GPU check's one way to time: CUDA events around the call on a GPU
(then one synchronisation), the host's clock on a CPU."""
from __future__ import annotations

import time
from collections.abc import Callable


def seconds_per_step(call: Callable[[], object], steps: int, cuda: bool) -> float:
    """The wall time of `call()` (which makes `steps` steps) divided by `steps`."""
    if cuda:
        import torch  # (imported where a GPU is timed: the check's scripts import torch late)

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) / 1000 / steps
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) / steps
