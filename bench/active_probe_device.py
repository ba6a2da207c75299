#!/usr/bin/env python3
"""The active probe on a real GPU host (issue 12, docs/benchmarks.md), all in one run:

1. `gpuguard check` and `gpuguard check --active`, --runs times each, interleaved: wall
   time of the whole process, the JSON (phase timings in gpu.compute's observed);
2. PyTorch copies of the same size on each GPU, in the same run: pinned host to device,
   device to host, device to device (bytes read + written), and peer copies both ways
   when there are two GPUs or more: the reference for the probe's bandwidths;
3. 1 and 2's probe again with a bf16 matmul (bench/gpu_load.py) running on the last GPU:
   on one GPU that GPU must be skipped (busy); on several the others are probed and the
   loaded one skipped.

Writes everything into --out (default $OUT/active). Run from the repo root with gpuguard
installed (from a wheel): `python3 bench/active_probe_device.py --gpuguard /tmp/gv/bin/gpuguard`.
Reads only: no GPU setting is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20


def run_check(gpuguard: list[str], args: list[str], out: Path, name: str) -> dict[str, Any]:
    began = time.perf_counter()
    proc = subprocess.run([*gpuguard, "check", "--format", "json", *args],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "GPUGUARD_TIMING": "1"})
    wall_ms = (time.perf_counter() - began) * 1000
    (out / f"{name}.json").write_text(proc.stdout)
    (out / f"{name}.stderr").write_text(proc.stderr)
    phases: dict[str, Any] = {}
    statuses: dict[str, str] = {}
    try:
        for result in json.loads(proc.stdout)["results"]:
            gpu = result["gpu"]["index"] if result["gpu"] else "host"
            if result["rule"] == "gpu.compute":
                phases[str(gpu)] = result["observed"].get("phases_ms")
            if result["rule"] in PROBE_RULES:
                statuses[f"{result['rule']}/{gpu}"] = \
                    f"{result['status']}: {result['message'][:160]}"
    except (ValueError, KeyError, TypeError):
        pass
    return {"wall_ms": round(wall_ms, 1), "rc": proc.returncode, "phases_ms": phases,
            "probe_results": statuses}


PROBE_RULES = ("gpu.compute", "memory.pattern", "memory.bandwidth", "pcie.bandwidth",
               "nvlink.bandwidth")


def torch_reference(size_mib: int, repeats: int = 3) -> dict[str, Any]:
    """PyTorch copies of the probe's size, timed as the probe times them (best of the
    host copies, CUDA events for device copies)."""
    try:
        import torch
    except ImportError as exc:
        return {"error": f"no PyTorch: {exc}"}
    size = size_mib * MIB
    out: dict[str, Any] = {"torch": torch.__version__, "size_mib": size_mib, "gpus": {}}
    count = torch.cuda.device_count()
    for gpu in range(count):
        torch.cuda.set_device(gpu)
        host = torch.empty(size, dtype=torch.uint8).pin_memory()
        dev_a = torch.empty(size, dtype=torch.uint8, device=f"cuda:{gpu}")
        dev_b = torch.empty(size, dtype=torch.uint8, device=f"cuda:{gpu}")
        best = {"h2d": 0.0, "d2h": 0.0}
        for _ in range(repeats + 1):
            for name, dst, src in (("h2d", dev_a, host), ("d2h", host, dev_a)):
                torch.cuda.synchronize()
                began = time.perf_counter()
                dst.copy_(src)
                torch.cuda.synchronize()
                best[name] = max(best[name], size / (time.perf_counter() - began) / 1e9)
        dev_b.copy_(dev_a)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dev_b.copy_(dev_a)
        stop.record()
        stop.synchronize()
        d2d = 2 * size * repeats / (start.elapsed_time(stop) / 1e3) / 1e9
        out["gpus"][gpu] = {"h2d_gbps": round(best["h2d"], 2), "d2h_gbps": round(best["d2h"], 2),
                            "d2d_rw_gbps": round(d2d, 1)}
        del host, dev_a, dev_b
        torch.cuda.empty_cache()
    if count > 1:
        a = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(size, dtype=torch.uint8, device="cuda:1")
        peer: dict[str, float] = {}
        for name, dst, src in (("0->1", b, a), ("1->0", a, b)):
            torch.cuda.set_device(src.device)
            dst.copy_(src)
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                dst.copy_(src)
            stop.record()
            stop.synchronize()
            peer[name] = round(size * repeats / (start.elapsed_time(stop) / 1e3) / 1e9, 1)
        out["peer_gbps"] = peer
        out["can_access_peer_0_1"] = torch.cuda.can_device_access_peer(0, 1)
    return out


def gpu_count() -> int:
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=30, check=False)
        return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.TimeoutExpired):
        return 0


def rounds(gpuguard: list[str], runs: int, active: list[str], out: Path, tag: str
           ) -> dict[str, Any]:
    plain, probed = [], []
    for i in range(runs):
        plain.append(run_check(gpuguard, [], out, f"{tag}-check-{i}"))
        probed.append(run_check(gpuguard, active, out, f"{tag}-active-{i}"))

    def median(rows: list[dict[str, Any]]) -> float:
        return round(statistics.median(r["wall_ms"] for r in rows), 1)

    return {"check_ms_median": median(plain), "active_ms_median": median(probed),
            "check": plain, "active": probed}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--buffer-mib", type=int, default=256)
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("OUT", "./out")) / "active")
    parser.add_argument("--gpuguard", default=f"{sys.executable} -m gpuguard",
                        help="how to run gpuguard (e.g. /tmp/gv/bin/gpuguard)")
    parser.add_argument("--load-seconds", type=float, default=0,
                        help="how long the matmul runs (default: long enough for the rounds)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpuguard = args.gpuguard.split()
    active = ["--active", "--active-buffer-mib", str(args.buffer_mib)]
    summary: dict[str, Any] = {"gpus": gpu_count(), "runs": args.runs}

    # the first --active pays the driver's PTX cache; it is kept apart from the rounds
    summary["first_active"] = run_check(gpuguard, active, args.out, "first-active")
    summary["idle"] = rounds(gpuguard, args.runs, active, args.out, "idle")
    summary["torch_idle"] = torch_reference(args.buffer_mib)

    load_gpu = max(0, summary["gpus"] - 1)
    seconds = args.load_seconds or 30 + args.runs * 8
    load = subprocess.Popen([sys.executable, "bench/gpu_load.py", "--seconds", str(seconds),
                             "--gpus", str(load_gpu)],
                            stdout=(args.out / "load.txt").open("w"), stderr=subprocess.STDOUT)
    try:
        time.sleep(10)  # the matmul up to speed, NVML's utilization caught up
        summary["busy_gpu"] = load_gpu
        summary["busy"] = rounds(gpuguard, args.runs, active, args.out, "busy")
        summary["torch_busy"] = torch_reference(args.buffer_mib)
    finally:
        load.terminate()
        load.wait(30)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    brief = {k: summary[k] for k in ("gpus", "runs", "busy_gpu")}
    for tag in ("idle", "busy"):
        brief[tag] = {k: summary[tag][k] for k in ("check_ms_median", "active_ms_median")}
        brief[tag]["last_active_phases_ms"] = summary[tag]["active"][-1]["phases_ms"]
        brief[tag]["last_active_results"] = summary[tag]["active"][-1]["probe_results"]
    brief["torch_idle"] = summary["torch_idle"]
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
