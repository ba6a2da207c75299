#!/usr/bin/env python3
"""The status page's cost (issue 31): its size and render time for 1 and 8 GPUs with a
full hour of history, and what 100 requests a second to / do to /healthz and /metrics
(their latency with the flood against without it, in the same run: a ratio).

    .venv/bin/python bench/status_page.py [--seconds 10] [--json OUT]

Runs a real daemon on a replayed host (the H200 recording, copied into 8 GPUs) with
--status-page on loopback; the render is also timed in-process (build + render, the
history filled with an hour of points per GPU).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# the synthetic hosts and the free port of the daemon's cost bench (bench/ is on sys.path
# when a bench runs as a script)
from daemon_cost import host  # noqa: E402
from daemon_cost import port as free_port  # noqa: E402

from gpuguard.daemon.freshness import Freshness  # noqa: E402
from gpuguard.daemon.page_history import PageHistory  # noqa: E402
from gpuguard.daemon.page_model import PageParts, build  # noqa: E402
from gpuguard.daemon.verdict_view import fresh_results  # noqa: E402
from gpuguard.model.identity import GpuId  # noqa: E402
from gpuguard.model.results import Result, Status  # noqa: E402
from gpuguard.outputs.status_page import render  # noqa: E402
from gpuguard.sources import replay  # noqa: E402


def render_times(path: Path, rounds: int) -> tuple[float, int]:
    """Median ms of build + render with an hour of history (one point per 5 s)."""
    snap = replay.load(path)
    history = PageHistory()
    now = 10_000.0
    for i in range(720):
        history.add(snap, now - 3600 + i * 5)
    results = [(Result("thermal.margin", Status.OK, Status.CRITICAL, "47 C below T.Limit",
                       GpuId(g.index, g.uuid.value, g.pci_bus_id.value)), "fast", now)
               for g in snap.gpus]
    fresh, ages = fresh_results(results, Freshness({"fast": 5.0}), now)
    times = []
    body = ""
    for _ in range(rounds):
        started = time.perf_counter()
        body = render(build(PageParts(snap, fresh, ages, None, 5, history=history, now=now)))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), len(body.encode())


def latency(url: str, seconds: float) -> list[float]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in ("/healthz", "/metrics"):
            started = time.perf_counter()
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                resp.read()
            out.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)
    return out


def flood(url: str, seconds: float, done: Any) -> None:
    """In a process of its own (its threads never hold the measuring process's GIL): 100
    requests a second to / over 4 threads, for `seconds`."""
    count = [0]
    end = time.monotonic() + seconds

    def one() -> None:
        while time.monotonic() < end:
            started = time.monotonic()
            with urllib.request.urlopen(url + "/", timeout=5) as resp:
                resp.read()
            count[0] += 1
            time.sleep(max(0.0, 0.04 - (time.monotonic() - started)))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.value = count[0] / seconds


def daemon_run(path: Path, seconds: float) -> dict[str, Any]:
    port = free_port()  # daemon_cost.port
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuguard", "daemon", "--input", str(path), "--listen",
         f"127.0.0.1:{port}", "--status-page", "--no-udev", "--no-event-store",
         "--fast-interval", "5"], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        quiet = latency(url, seconds)
        rate = multiprocessing.Value("d", 0.0)
        flooder = multiprocessing.Process(target=flood, args=(url, seconds + 1.0, rate))
        flooder.start()
        time.sleep(0.5)
        loud = latency(url, seconds)
        flooder.join()
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        renders = next(float(line.split()[1]) for line in metrics.splitlines()
                       if line.startswith("gpuguard_status_page_renders_total"))
    finally:
        proc.terminate()
        proc.wait(10)
    return {"page_requests_per_s": round(rate.value, 1), "renders": renders,
            "probe_ms_quiet_median": round(statistics.median(quiet), 2),
            "probe_ms_flood_median": round(statistics.median(loud), 2),
            "ratio_median": round(statistics.median(loud) / statistics.median(quiet), 2),
            "probe_ms_quiet_p90": round(sorted(quiet)[int(len(quiet) * 0.9)], 2),
            "probe_ms_flood_p90": round(sorted(loud)[int(len(loud) * 0.9)], 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        for gpus in (1, 8):
            path = Path(tmp) / f"host-{gpus}.json"
            path.write_text(json.dumps(host(gpus)))
            ms, size = render_times(path, 50)
            out[f"render_ms_{gpus}_gpu"] = round(ms, 2)
            out[f"page_bytes_{gpus}_gpu"] = size
        out["flood_8_gpu"] = daemon_run(Path(tmp) / "host-8.json", args.seconds)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
