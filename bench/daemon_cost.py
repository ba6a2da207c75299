#!/usr/bin/env python3
"""Daemon cost: CPU time per cycle and memory, for hosts of N GPUs, and /metrics latency.

Synthetic hosts are replayed snapshots made from the real H200 recording (N copies of
its GPU), read again every cycle, so the cost measured is the daemon's own: reading
the source, judging every rule, history, logging, metrics. With --nvml the daemon reads
the real NVML through its worker instead (on a GPU host), and the worker's CPU counts.

CPU is the sum of user+system time of the daemon and its children (the NVML worker)
over a measured span after start-up, divided by the cycles run in it; at a 5 s cadence
the share of one core is cpu_per_cycle / 5. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "tests" / "fixtures" / "h200-live" / "idle-snapshot.json"


def host(gpus: int) -> dict:
    base = json.loads(LIVE.read_text())
    one = base["gpus"][0]
    base["gpus"] = []
    for i in range(gpus):
        gpu = copy.deepcopy(one)
        gpu.update(index=i, uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
                   pci_bus_id=f"{i // 256:08X}:{i % 256:02X}:00.0")
        base["gpus"].append(gpu)
    base["host"]["gpu_count"] = gpus
    return base


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_of(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def memory_of(proc: psutil.Process) -> dict[str, float]:
    """RSS and USS (pages no other process shares: what exiting would free) in MB."""
    out = {"rss_daemon_mb": 0.0, "uss_daemon_mb": 0.0, "rss_nvml_worker_mb": 0.0,
           "uss_nvml_worker_mb": 0.0}
    for p, who in [(proc, "daemon"), *((c, "nvml_worker") for c in
                                        proc.children(recursive=True))]:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        out[f"rss_{who}_mb"] += round(info.rss / 2**20, 1)
        out[f"uss_{who}_mb"] += round(info.uss / 2**20, 1)
    return out


def measure(gpus: int | None, interval: float, seconds: float, scrapes: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-bench-"))
    args = [sys.executable, "-m", "gpuguard", "daemon", "--no-udev", "--log-format", "json",
            "--fast-interval", str(interval), "--slow-interval", "60"]
    if gpus is not None:
        snap = tmp / "host.json"
        snap.write_text(json.dumps(host(gpus)))
        args += ["--input", str(snap)]
    listen = port()
    args += ["--listen", f"127.0.0.1:{listen}", "--state-dir", str(tmp / "state")]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=(tmp / "daemon.log").open("w"))
    ps = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{listen}"
    try:
        for _ in range(200):
            try:
                if urllib.request.urlopen(url + "/healthz", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        time.sleep(2 * interval)  # past start-up and the first slow cycle

        def cycles() -> int:
            text = urllib.request.urlopen(url + "/metrics").read().decode()
            for line in text.splitlines():
                if line.startswith('gpuguard_cycles_total{cadence="fast"}'):
                    return int(float(line.split()[-1]))
            return 0

        c0, cpu0, t0 = cycles(), cpu_of(ps), time.monotonic()
        time.sleep(seconds)
        c1, cpu1, t1 = cycles(), cpu_of(ps), time.monotonic()
        latencies = []
        size = 0
        for _ in range(scrapes):
            start = time.perf_counter()
            body = urllib.request.urlopen(url + "/metrics").read()
            latencies.append((time.perf_counter() - start) * 1000)
            size = len(body)
        series = sum(1 for line in body.decode().splitlines()
                     if line and not line.startswith("#"))
        memory = memory_of(ps)
        per_cycle = (cpu1 - cpu0) / max(1, c1 - c0)
        return {
            "gpus": gpus if gpus is not None else "nvml",
            "cycles": c1 - c0,
            "span_s": round(t1 - t0, 1),
            "cpu_s_per_cycle": round(per_cycle, 5),
            "core_share_at_5s_percent": round(per_cycle / 5 * 100, 3),
            **memory,
            "scrape_ms_median": round(statistics.median(latencies), 2),
            "scrape_ms_p95": round(sorted(latencies)[int(0.95 * len(latencies)) - 1], 2),
            "metrics_bytes": size,
            "series": series,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1,8,16,64")
    parser.add_argument("--nvml", action="store_true", help="real NVML instead of replay")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="fast cadence while measuring (cost is per cycle)")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    if args.nvml:
        runs.append(measure(None, args.interval, args.seconds, args.scrapes))
    else:
        for n in (int(x) for x in args.gpus.split(",")):
            runs.append(measure(n, args.interval, args.seconds, args.scrapes))
            print(json.dumps(runs[-1]), flush=True)
    result = {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "platform": platform.platform()},
              "interval_s": args.interval, "runs": runs}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
