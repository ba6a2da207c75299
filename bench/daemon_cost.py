#!/usr/bin/env python3
"""Daemon cost: CPU time per cycle and memory, for hosts of N GPUs, and /metrics latency.

Synthetic hosts are replayed snapshots made from the real H200 recording (N copies of
its GPU), read again every cycle, so the cost measured is the daemon's own: reading
the source, judging every rule, history, logging, metrics. With --nvml the daemon reads
the real NVML through its worker instead (on a GPU host), and the worker's CPU counts.

CPU is the sum of user+system time of the daemon and its children (the NVML worker)
over a measured span after start-up, divided by the cycles run in it; at a 5 s cadence
the share of one core is cpu_per_cycle / 5. Writes JSON to --out.

--event-store on,off measures each host with the event store on and off in the same run
(alternating); --flap flips GPU 0's recovery action every cycle, so that every cycle
records a transition (the store's worst steady case). --year simulates a year of a rule
flapping every 5 minutes on 8 GPUs through the store's writer (its own clock) and reports
the file's size under the default bounds (docs/events.md).
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


def measure(gpus: int | None, interval: float, seconds: float, scrapes: int,
            store: bool = True, flap: bool = False) -> dict:
    import threading

    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-bench-"))
    args = [sys.executable, "-m", "gpuguard", "daemon", "--no-udev", "--log-format", "json",
            "--fast-interval", str(interval), "--slow-interval", "60"]
    if not store:
        args.append("--no-event-store")
    stop_flap = threading.Event()
    if gpus is not None:
        snap = tmp / "host.json"
        snap.write_text(json.dumps(host(gpus)))
        args += ["--input", str(snap)]
        if flap:
            def flapper() -> None:
                bad = host(gpus)
                bad["gpus"][0]["recovery_action"] = "gpu_reset"
                texts = [json.dumps(host(gpus)), json.dumps(bad)]
                i = 0
                while not stop_flap.wait(interval):
                    (tmp / "next.json").write_text(texts[i % 2])
                    os.replace(tmp / "next.json", snap)
                    i += 1
            threading.Thread(target=flapper, daemon=True).start()
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
            "event_store": store,
            "flap": flap,
            "events_written": _metric(body.decode(), "gpuguard_event_store_written_total"),
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
        stop_flap.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def year(gpus: int = 8, every_s: float = 300.0) -> dict:
    """A rule flapping (warning, ok, ...) every `every_s` on each GPU for a simulated year,
    through the store's own writer and retention at their defaults; one flush per
    simulated minute, as the daemon's thread would (it flushes every second)."""
    sys.path.insert(0, str(REPO))
    from gpuguard.events.store import Event
    from gpuguard.events.writer import EventWriter

    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-year-"))
    path = tmp / "events.db"
    now = [time.time() - 365 * 86400]
    writer = EventWriter(path, boot_id="bench", clock=lambda: now[0])
    started = time.monotonic()
    steps = int(365 * 86400 / every_s)
    flush_every = max(1, int(60 / every_s))
    biggest = 0
    for i in range(steps):
        now[0] += every_s
        for gpu in range(gpus):
            status = "warning" if i % 2 == 0 else "ok"
            writer.record(Event(
                kind="rule", source="daemon", time=now[0], rule="pcie.replays", gpu_index=gpu,
                gpu_uuid=f"GPU-{gpu:08d}-1111-2222-3333-444444444444",
                gpu_serial=f"16540000{gpu:05d}", gpu_bus_id=f"00000000:{0x18 + gpu:02X}:00.0",
                old_status="ok" if status == "warning" else "warning", status=status,
                action="none", message=f"{100 + i % 900} PCIe replays in the last 10m "
                                       "(limit 100)"))
        if i % flush_every == 0:
            writer.flush()
            biggest = max(biggest, path.stat().st_size)
    writer.flush()
    writer.close()
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kept = conn.execute("SELECT count(*), min(time), max(time) FROM events").fetchone()
    conn.close()
    return {"gpus": gpus, "flap_every_s": every_s, "events_recorded": steps * gpus,
            "events_kept": kept[0], "days_kept": round((kept[2] - kept[1]) / 86400, 1),
            "file_bytes": path.stat().st_size, "largest_file_bytes_seen": biggest,
            "wall_s": round(time.monotonic() - started, 1),
            "dropped": dict(writer.stats.dropped)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1,8,16,64")
    parser.add_argument("--nvml", action="store_true", help="real NVML instead of replay")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="fast cadence while measuring (cost is per cycle)")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--event-store", default="on",
                        help="on, off, or on,off: each host with the store on and off")
    parser.add_argument("--flap", action="store_true",
                        help="flip GPU 0's recovery action every cycle (a transition each)")
    parser.add_argument("--year", action="store_true",
                        help="also simulate a year of a flapping rule on 8 GPUs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    stores = [mode == "on" for mode in args.event_store.split(",")]
    if args.nvml:
        for store in stores:
            runs.append(measure(None, args.interval, args.seconds, args.scrapes, store))
    else:
        for n in (int(x) for x in args.gpus.split(",")):
            for store in stores:
                runs.append(measure(n, args.interval, args.seconds, args.scrapes, store,
                                    args.flap))
                print(json.dumps(runs[-1]), flush=True)
    result = {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "platform": platform.platform()},
              "interval_s": args.interval, "runs": runs}
    if args.year:
        result["year"] = year()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
