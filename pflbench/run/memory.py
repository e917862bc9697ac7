"""Out of memory: a cell that cannot allocate, and a worker that Ray or the kernel ended for memory, named as such with the peak (pflbench/run/runner.py has the story)."""

from __future__ import annotations


def peak_mb() -> int:
    """This process's largest resident set so far, in MB (Linux reports ru_maxrss in KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def out_of_memory(peak: int | None) -> str:
    """The reason a cell that ran out of memory is given (one line)."""
    return f"out of memory (peak {peak} MB)" if peak is not None else "out of memory (peak not reported)"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: MemoryError, torch's OutOfMemoryError (CUDA) or its
    CPU allocator's RuntimeError (what a memory limit, e.g. RLIMIT_AS or an overcommit policy, gives)."""
    import torch

    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


ENDED_BY_THE_SIGNAL = "its worker was ended by the same signal"


def worker_lost(error: Exception, peak: int | None, oom_killed: bool = False) -> str:
    """Why a cell's Ray worker was lost, in words: out of memory (Ray's memory monitor killed it, or,
    `oom_killed`, the kernel's OOM killer: pflbench/run/oom_kills.py) or lost."""
    import ray

    if isinstance(error, ray.exceptions.OutOfMemoryError):
        return out_of_memory(peak)
    if oom_killed:
        return f"{out_of_memory(peak)}: the kernel's OOM killer ended its worker ({type(error).__name__})"
    return f"Ray worker lost ({type(error).__name__}" + (
        f"; last reported peak {peak} MB)" if peak is not None else ")"
    )


def cause_of(error: BaseException) -> BaseException:
    """The exception a Ray error wraps, through every task and actor it crossed (a RayTaskError's
    text is its traceback; the cause's is the one line)."""
    while (cause := getattr(error, "cause", None)) is not None and cause is not error:
        error = cause
    return error
