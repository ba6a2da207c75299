#!/usr/bin/env python3
"""Does NVML serve one GPU's calls concurrently? Times the same calls sequentially and
split over N threads (median of --runs). Read-only calls only. Decides whether the
worker should split a GPU's reads over threads (docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time

import pynvml as nv


def calls(h):  # the slower reads of the gpuguard sweep
    return [
        lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        lambda: nv.nvmlDeviceGetPowerUsage(h),
        lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda: nv.nvmlDeviceGetEccMode(h),
        lambda: nv.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        lambda: nv.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        lambda: nv.nvmlDeviceGetMemoryInfo(h),
        lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        lambda: nv.nvmlDeviceGetRemappedRows(h),
    ]


def run_threads(work, n):
    chunks = [work[i::n] for i in range(n)]

    def go(chunk):
        for fn in chunk:
            with contextlib.suppress(nv.NVMLError):
                fn()

    threads = [threading.Thread(target=go, args=(c,)) for c in chunks]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - start) * 1000


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    t0 = time.perf_counter()
    nv.nvmlInit()
    init_ms = (time.perf_counter() - t0) * 1000
    h = nv.nvmlDeviceGetHandleByIndex(0)
    work = calls(h)
    out = {"nvmlInit_ms": round(init_ms, 1), "calls": len(work)}
    for n in (1, 2, 4, 8):
        times = [run_threads(work, n) for _ in range(runs)]
        out[f"threads_{n}_ms"] = round(statistics.median(times), 2)
    nv.nvmlShutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
