#!/usr/bin/env python3
"""An exec service's processes found each cycle: psutil's recursive children (every
process read) against supervisor/proc_tracker.py (issue 32 item 3), in the same run.

    .venv/bin/python bench/service_tree_cost.py --cycles 120 \\
        --out bench/results/issue32/service_tree_cost.json

A service tree (bash and 8 sleep children) among N extra idle processes (sleeps: N = 0,
500, 2000 by default), all started here and killed at the end, on error too. For each N,
--cycles cycles, each timing the old way then the tracker (one kept across the cycles, as
the daemon keeps one per service), the order swapped every other cycle; the tracker's
clock advances --interval seconds a cycle (the daemon's fast interval), so its full scan
every 60 s is in the figures at the rate it would run. Each cycle checks that both give
the same PIDs. --threads T makes each child a Python process with T threads (the
children files are read per thread). Reports, per N, the median and mean of each way's
time per cycle and the median of the per-cycle ratio old/new; the first 3 cycles (the
tracker's first full scan) are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gpuguard.supervisor.proc_tracker import ProcessTracker

WARMUP = 3


def old_way(main: int) -> list[int]:
    proc = psutil.Process(main)
    return sorted([main, *(child.pid for child in proc.children(recursive=True))])


def spawn_tree(children: int, threads: int) -> subprocess.Popen[bytes]:
    child = "sleep 3600" if not threads else (
        f"{sys.executable} -c 'import threading, time\n"
        f"for _ in range({threads}): threading.Thread(target=time.sleep, args=(3600,), "
        "daemon=True).start()\ntime.sleep(3600)'")
    script = " ".join([f"{child} &"] * children) + " wait"
    main = subprocess.Popen(["bash", "-c", script])
    end = time.monotonic() + 30
    while len(psutil.Process(main.pid).children()) < children:
        if time.monotonic() > end:
            raise RuntimeError("the service tree did not start")
        time.sleep(0.05)
    return main


def measure(main: int, cycles: int, interval: float, mode: str) -> dict[str, Any]:
    now = [0.0]
    tracker = ProcessTracker(psutil.PROCFS_PATH, prefer_children=(mode == "prefer-children"),
                             clock=lambda: now[0])
    old_s: list[float] = []
    new_s: list[float] = []
    for cycle in range(cycles):
        timings: dict[str, float] = {}
        answers: dict[str, list[int]] = {}
        order = ("old", "new") if cycle % 2 == 0 else ("new", "old")
        for way in order:
            started = time.perf_counter()
            answers[way] = old_way(main) if way == "old" else tracker.update(main, 2.0).pids
            timings[way] = time.perf_counter() - started
        if answers["old"] != answers["new"]:
            raise RuntimeError(f"cycle {cycle}: psutil {answers['old']} tracker "
                               f"{answers['new']}")
        if cycle >= WARMUP:
            old_s.append(timings["old"])
            new_s.append(timings["new"])
        now[0] += interval
    ratios = [o / n for o, n in zip(old_s, new_s, strict=True)]
    return {
        "tracker_mode": tracker.counts.mode,
        "old_median_ms": statistics.median(old_s) * 1e3,
        "old_mean_ms": statistics.mean(old_s) * 1e3,
        "new_median_ms": statistics.median(new_s) * 1e3,
        "new_mean_ms": statistics.mean(new_s) * 1e3,
        "median_ratio_old_over_new": statistics.median(ratios),
        "mean_ratio_old_over_new": statistics.mean(old_s) / statistics.mean(new_s),
        "full_scans": tracker.counts.full_scans,
        "probed_pids": tracker.counts.probed,
    }


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", default="0,500,2000")
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of each child (python instead of sleep)")
    parser.add_argument("--cycles", type=int, default=120)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    children_files = Path(f"/proc/self/task/{os.getpid()}/children").exists()
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
                   f"kernel {platform.release()}",
        "python": platform.python_version(), "psutil": psutil.__version__,
        "children_files": children_files, "cycles": args.cycles,
        "interval_s": args.interval, "runs": {},
        "tree": f"bash + {args.children} sleeps" if not args.threads else
                f"bash + {args.children} pythons of {args.threads} threads each",
    }
    started: list[subprocess.Popen[bytes]] = []
    try:
        tree = spawn_tree(args.children, args.threads)
        started.append(tree)
        idle: list[subprocess.Popen[bytes]] = []
        for extra in (int(x) for x in args.extra.split(",")):
            while len(idle) < extra:
                idle.append(subprocess.Popen(["sleep", "3600"]))
                started.append(idle[-1])
            time.sleep(0.5)
            host = len(psutil.pids())
            for mode in ("prefer-children", "scan") if children_files else ("scan",):
                run = measure(tree.pid, args.cycles, args.interval, mode)
                run["processes_on_host"] = host
                results["runs"][f"{extra} {mode}"] = run
                print(json.dumps({f"extra={extra} {mode}": run}), flush=True)
    finally:
        kill_all(started)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
