"""First light of qualify's kernels on a real GPU (issue 29): the worker of
gpuguard/sources/qualify/child.py run in this process on GPU 0, power sampled beside it
with pynvml, then the drill (one SM's bit flipped), then PyTorch's bf16 GEMM for the
same time. Writes one JSON file: python bench/qualify_smoke.py OUT.json [burn_s]."""

from __future__ import annotations

import io
import json
import sys
import tempfile
import threading
import time

import pynvml

from gpuguard.sources.qualify import child, kernels, plan

SAMPLES: list[dict[str, float]] = []
STOP = threading.Event()


def sample(handle: object) -> None:
    while not STOP.is_set():
        row = {"mono": time.monotonic()}
        for name, fn in (("w", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3),
                         ("sm", lambda: pynvml.nvmlDeviceGetClockInfo(handle, 1)),
                         ("mem", lambda: pynvml.nvmlDeviceGetClockInfo(handle, 2)),
                         ("temp", lambda: pynvml.nvmlDeviceGetTemperature(handle, 0)),
                         ("reasons",
                          lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))):
            try:
                row[name] = fn()
            except Exception:
                row[name] = -1
        SAMPLES.append(row)
        time.sleep(0.1)


def window(t0: float, t1: float) -> dict[str, float]:
    rows = sorted(r["w"] for r in SAMPLES if t0 <= r["mono"] <= t1)
    sm = sorted(r["sm"] for r in SAMPLES if t0 <= r["mono"] <= t1)
    reasons = 0
    for r in SAMPLES:
        if t0 <= r["mono"] <= t1:
            reasons |= int(r["reasons"])
    if not rows:
        return {}
    return {"n": len(rows), "w_median": rows[len(rows) // 2], "w_max": rows[-1],
            "sm_median": sm[len(sm) // 2], "reasons_or": reasons}


def qualify(bus: str, burn_s: float, flip: int | None, blocks_per_sm: int,
            copies: int = kernels.COPIES, copy_mib: int = 256) -> dict[str, object]:
    kernels.COPIES, kernels.PTX = copies, kernels.build_ptx(copies)
    opts = plan.options("standard", seed=7, burn_s=burn_s, flip_sm=flip)
    opts.blocks_per_sm = blocks_per_sm
    opts.copy_bytes = copy_mib << 20
    out = io.StringIO()
    began = time.monotonic()
    with tempfile.TemporaryFile() as lock:
        child.run(out, 0, bus, [], opts, lock.fileno())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    load = [m["mono"] for m in lines if m.get("t") in ("load", "unload")]
    power = window(load[0] + 3, load[1]) if len(load) == 2 else {}
    return {"wall_s": round(time.monotonic() - began, 2), "lines": lines, "power": power}


def torch_gemm(seconds: float) -> dict[str, object]:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        for _ in range(20):
            a @ b
        n += 20
        torch.cuda.synchronize()
    spent = time.monotonic() - began
    return {"tflops": round(n * 2 * 8192 ** 3 / spent / 1e12, 1),
            "power": window(began + 3, began + spent)}


def main() -> None:
    out_path, burn_s = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
    threading.Thread(target=sample, args=(handle,), daemon=True).start()
    result: dict[str, object] = {"limit_w": limit, "bus": bus}
    for name, copies, bps, mib in (("c1_bps4", 1, 4, 64), ("c2_bps4", 2, 4, 256),
                                   ("c2_bps2", 2, 2, 256), ("c3_bps3", 3, 3, 256),
                                   ("c2_bps6", 2, 6, 256)):
        result[f"qualify_{name}"] = qualify(bus, burn_s, None, bps, copies, mib)
        save(out_path, result)
    result["drill_sm5"] = qualify(bus, 4.0, 5, 4)
    save(out_path, result)
    result["torch"] = torch_gemm(burn_s)
    STOP.set()
    result["samples"] = SAMPLES
    save(out_path, result)


def save(path: str, result: dict[str, object]) -> None:
    with open(path, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
