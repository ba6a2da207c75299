"""When the command began, for GPUGUARD_TIMING=1 (docs/benchmarks.md): set first thing by
the console entry point, read by `check` when it prints where its time went."""

from __future__ import annotations

import time

STARTED = 0.0


def start() -> None:
    global STARTED
    STARTED = time.monotonic()


def ms_since_start(t: float) -> float:
    return round((t - STARTED) * 1000, 1)
