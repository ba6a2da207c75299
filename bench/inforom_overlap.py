"""Does nvmlDeviceValidateInforom hold the device while it runs? (issue 32, the H200)

Three questions, for the early validation of `gpuguard check`'s worker:
1. One validation alone, and the other calls of a sweep alone (ms).
2. The same calls in a second thread while a validation runs on the same GPU: do they
   wait for it (NVML serialising one device's calls), or overlap?
3. The early path's own time from a fresh interpreter: `import ctypes`, dlopen,
   nvmlInit_v2, a handle, the validation, through ctypes alone (no pynvml).

    python3 bench/inforom_overlap.py --out OUT.json      (reads only)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from typing import Any

EARLY = r"""
import time
t0 = time.perf_counter()
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
t1 = time.perf_counter()
rc_init = lib.nvmlInit_v2()
t2 = time.perf_counter()
h = ctypes.c_void_p()
rc_h = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
t3 = time.perf_counter()
rc_v = lib.nvmlDeviceValidateInforom(h)
t4 = time.perf_counter()
# a second init and a temperature read while a validation runs in a thread (the early
# worker's main thread does both while its validation thread runs)
import threading
box = {}
def validating():
    box["start"] = time.perf_counter()
    box["rc"] = lib.nvmlDeviceValidateInforom(h)
    box["end"] = time.perf_counter()
th = threading.Thread(target=validating)
th.start()
time.sleep(0.002)
t5 = time.perf_counter()
rc_init2 = lib.nvmlInit_v2()
t6 = time.perf_counter()
temp = ctypes.c_uint()
rc_t = lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(temp))
t7 = time.perf_counter()
th.join()
print({"import_dlopen_ms": (t1 - t0) * 1e3, "init_ms": (t2 - t1) * 1e3,
       "handle_ms": (t3 - t2) * 1e3, "validate_ms": (t4 - t3) * 1e3,
       "rc": [rc_init, rc_h, rc_v, rc_init2, rc_t, box["rc"]],
       "init2_beside_ms": (t6 - t5) * 1e3, "temp_beside_ms": (t7 - t6) * 1e3,
       "validate2_ms": (box["end"] - box["start"]) * 1e3,
       "temp_ended_before_validation": t7 < box["end"]})
"""


def sweep_calls(nv: Any, h: Any) -> list[tuple[str, Any]]:
    """Calls of a sweep besides the validation (each a name and a no-argument call)."""
    return [
        ("temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("power", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        ("uuid", lambda: nv.nvmlDeviceGetUUID(h)),
        ("ecc_total", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
        ("remapped", lambda: nv.nvmlDeviceGetRemappedRows(h)),
        ("app_clock", lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM)),
        ("max_clock", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        ("threshold", lambda: nv.nvmlDeviceGetTemperatureThreshold(
            h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
        ("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h)),
        ("inforom_version", lambda: nv.nvmlDeviceGetInforomVersion(h, nv.NVML_INFOROM_OEM)),
        ("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
    ]


def timed(fn: Any) -> float:
    t = time.perf_counter()
    with contextlib.suppress(Exception):
        fn()
    return (time.perf_counter() - t) * 1e3


def run_calls(calls: list[tuple[str, Any]]) -> dict[str, float]:
    return {name: timed(fn) for name, fn in calls}


def beside_validation(nv: Any, h: Any, calls: list[tuple[str, Any]]) -> dict[str, Any]:
    """The calls in a second thread, started 5 ms into a validation of the same GPU."""
    box: dict[str, Any] = {}
    started = threading.Event()

    def validating() -> None:
        started.set()
        box["validate_ms"] = timed(lambda: nv.nvmlDeviceValidateInforom(h))
        box["validate_end"] = time.perf_counter()

    thread = threading.Thread(target=validating)
    thread.start()
    started.wait()
    time.sleep(0.005)
    t = time.perf_counter()
    beside = run_calls(calls)
    end = time.perf_counter()
    thread.join()
    return {"validate_ms": box["validate_ms"], "calls_ms": beside,
            "calls_total_ms": sum(beside.values()),
            "calls_ended_before_validation": end < box["validate_end"],
            "calls_wall_ms": (end - t) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    calls = sweep_calls(nv, h)
    result: dict[str, Any] = {"alone": [], "beside": [], "early": []}
    for _ in range(args.rounds):
        validate = timed(lambda: nv.nvmlDeviceValidateInforom(h))
        others = run_calls(calls)
        result["alone"].append({"validate_ms": validate, "calls_ms": others,
                                "calls_total_ms": sum(others.values())})
        result["beside"].append(beside_validation(nv, h, calls))
    nv.nvmlShutdown()
    for _ in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True,
                             timeout=30)
        result["early"].append(out.stdout.strip() or out.stderr[-400:])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    alone = sorted(r["calls_total_ms"] for r in result["alone"])
    beside_ = sorted(r["calls_total_ms"] for r in result["beside"])
    overlap = sum(r["calls_ended_before_validation"] for r in result["beside"])
    print(f"calls alone {alone[len(alone) // 2]:.1f} ms, beside a validation "
          f"{beside_[len(beside_) // 2]:.1f} ms; ended before the validation in "
          f"{overlap}/{args.rounds} rounds")


if __name__ == "__main__":
    main()
