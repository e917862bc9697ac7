"""What a cell cost besides its wall time: its peak memory; and the machine and code it ran on.

`measured(device, run)` runs `run()` (which returns a CellResult) and adds to the result's summary:

    peak_host_bytes    the peak resident set size (RSS) of the process running the cell, over the cell
    host_start_bytes   its RSS when the cell started (the interpreter, torch, Ray's worker...): the
                       cell's own share is the difference; the peak is what a machine must hold
    peak_host_method   how the peak was measured: "vmhwm" (Linux: the kernel's high-water mark VmHWM,
                       reset at the cell's start by writing 5 to /proc/self/clear_refs, so an earlier
                       cell of the same worker process does not count), "sampled" (Linux where that
                       reset is refused: RSS read every SAMPLE_SECONDS by a thread, which can miss a
                       spike shorter than that) or "process" (elsewhere: the process's lifetime peak,
                       getrusage, which includes earlier cells of the same process)
    peak_gpu_bytes     on CUDA only: torch.cuda.max_memory_allocated on the cell's device, reset at the
                       start: memory held by tensors; the caching allocator reserves more
    cpu_model, cpu_cores, gpu_model   the machine (gpu_model only on CUDA)
    code_commit, code_dirty           the pflbench git commit this process runs and whether its code
                       folders had uncommitted changes (read once per process: the code it imported
                       then is the code it runs); absent outside a git checkout

The runner calls it around `run_cell` (pflbench/run/cell.py, `execute_cell`); a failed cell's result
(an exception) carries none of these.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterator

if TYPE_CHECKING:
    from pflbench.api_types import CellResult

SAMPLE_SECONDS = 0.01  # the fallback sampler's period ("sampled")
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def reset_high_water_mark() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux 4.0+); False where that is not possible."""
    if _status_kib("VmHWM") is None:
        return False
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class HostPeak:
    """The peak RSS of this process from `start()` to `stop()`, by the best method available here."""

    def __init__(self) -> None:
        self.method = (
            "vmhwm" if reset_high_water_mark() else ("sampled" if _status_kib("VmRSS") is not None else "process")
        )
        self.start_bytes = self.current()
        self.peak = self.start_bytes
        self._stop = threading.Event()
        self._thread = None
        if self.method == "sampled":
            self._thread = threading.Thread(target=self._sample, daemon=True, name="pflbench-rss")
            self._thread.start()

    @staticmethod
    def current() -> int:
        kib = _status_kib("VmRSS")
        if kib is not None:
            return kib * 1024
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak if platform.system() == "Darwin" else peak * 1024

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, self.current())

    def so_far(self) -> int:
        """The peak until now, the sampler left running (`stop` ends it)."""
        if self.method == "sampled":
            return max(self.peak, self.current(), self.start_bytes)
        return max(self._peak_reading(), self.start_bytes)

    def stop(self) -> int:
        """The peak; never below the RSS at the start, which the span includes (the kernel's RSS
        counters are cached per thread and can lag a page behind, so a VmHWM reset just before the
        start reading once came out 4 KiB under it)."""
        return max(self._peak_reading(), self.start_bytes)

    def _peak_reading(self) -> int:
        if self.method == "vmhwm":
            return (_status_kib("VmHWM") or 0) * 1024
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            return max(self.peak, self.current())
        return self.current()  # "process": getrusage's lifetime peak (`current` falls back to it)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what `platform` says)."""
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels dispatch to here (e.g. AVX2, AVX512): two CPUs of
    one model name (a cloud's "AMD EPYC") can differ in it, and with it in their float rounding."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def machine(device: str | None = None) -> dict:
    """cpu_model, cpu_capability, cpu_cores (logical) and, for a CUDA device, gpu_model."""
    facts = {"cpu_model": cpu_model(), "cpu_capability": cpu_capability(), "cpu_cores": os.cpu_count()}
    if device is not None and str(device).startswith("cuda"):
        import torch

        facts["gpu_model"] = torch.cuda.get_device_name(torch.device(device))
    return facts


CODE_DIRS = ("pflbench",)
REPO = Path(__file__).resolve().parents[2]  # the checkout this pflbench runs from


def git_commit(repo: Path = REPO) -> tuple[str | None, bool]:
    """(commit, dirty): the checkout's HEAD and whether its code folders have uncommitted changes;
    (None, False) outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", *CODE_DIRS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, False
    return commit, bool(status.strip())


@lru_cache(maxsize=1)
def code_version() -> dict:
    """{code_commit, code_dirty} of the checkout this pflbench runs from; {} outside a git checkout."""
    commit, dirty = git_commit()
    return {} if commit is None else {"code_commit": commit, "code_dirty": dirty}


@contextmanager
def measuring(device: str) -> Iterator[Callable[[], dict]]:
    """The facts `measured` adds to a summary, over a span that several results share (a cell group's,
    pflbench/run/cell.py's `execute_group`): the function it yields gives them as of the moment it is
    called, the peaks being the span's so far (a cell that finishes early gets the peak until then)."""
    cuda = str(device).startswith("cuda")
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats(torch.device(device))
    code = code_version()  # before the cell: the code it starts with
    host = HostPeak()

    def facts() -> dict:
        found = {
            "peak_host_bytes": host.so_far(),
            "host_start_bytes": host.start_bytes,
            "peak_host_method": host.method,
            **machine(device),
            **code,
        }
        if cuda:
            found["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated(torch.device(device)))
        return found

    try:
        yield facts
    finally:
        host.stop()


def measured(device: str, run: Callable[[], CellResult]) -> CellResult:
    """`run()`'s CellResult with the cell's peak memory and machine added to its summary."""
    started = time.perf_counter()
    with measuring(device) as facts:
        result = run()
        result.summary.update(facts())
    result.summary.setdefault("wall_time", time.perf_counter() - started)
    return result
