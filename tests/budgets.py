"""Time budgets of the tests that must bound a wait on another process (a cluster's start, a subprocess
that may hang): scaled by the machine's load, so that a busy machine gives a slow but healthy run the time
it needs, while a hang is still caught. Where a test can wait on an event instead, it does."""

from __future__ import annotations

import os


def load_factor() -> float:
    """How many times over the machine's cores are asked for (the 1-minute load average per core), at least 1."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:  # no load average on this system
        return 1.0


def scaled(seconds: float) -> float:
    """`seconds` (what the wait takes on a quiet machine, with room) times the load factor, capped at 8x."""
    return seconds * min(8.0, load_factor())
