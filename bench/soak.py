#!/usr/bin/env python3
"""Soak: the daemon at a 1 s cadence on a replayed 8-GPU host, with a scraper and a
hostile local client, for --minutes; RSS and open files sampled, growth reported.

The scraper reads /metrics, /status and /healthz once a second. The hostile client, in a
loop: opens idle connections (up to 200 held, recycled), trickles a request a byte at a
time, sends 40 KiB headers, sends garbage and closes early. The kernel log gets one Xid line
a second and keeps the last 300, as the kernel's ring buffer does, so the Xid marks and the
history are exercised and what the daemon holds is steady: growth is a leak.
Writes JSON to --out and prints a summary; it asserts nothing (docs/reliability.md reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from daemon_cost import host  # noqa: E402  (the same synthetic 8-GPU host)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scraper(url: str, stop: threading.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        for path in ("/metrics", "/status", "/healthz"):
            try:
                with urllib.request.urlopen(url + path, timeout=5) as resp:
                    resp.read()
                    counts["ok" if resp.status == 200 else "not_200"] += 1
            except Exception:
                counts["failed"] += 1
        stop.wait(1.0)


def hostile(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    held: list[socket.socket] = []
    rng = random.Random(9)
    while not stop.is_set():
        try:
            kind = rng.choice(["idle", "idle", "trickle", "big", "garbage"])
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
            if kind == "idle":
                held.append(sock)
                if len(held) > 200:
                    held.pop(0).close()
            elif kind == "trickle":
                for ch in b"GET /metrics HTTP/1.1\r\n":
                    sock.send(bytes([ch]))
                    time.sleep(0.01)
                sock.close()
            elif kind == "big":
                sock.sendall(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 40_000 + b"\r\n\r\n")
                sock.recv(100)
                sock.close()
            else:
                sock.sendall(os.urandom(rng.randint(1, 4000)))
                sock.close()
            counts[kind] += 1
        except OSError:
            counts["refused"] += 1
        stop.wait(0.02)
    for sock in held:
        sock.close()


RING = 300  # kernel-log lines kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-soak-"))
    snap = tmp / "host.json"
    snap.write_text(json.dumps(host(8)))
    kmsg = tmp / "dmesg.txt"
    kmsg.write_text("")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ}
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuguard", "daemon", "--input", str(snap), "--kmsg-file",
         str(kmsg), "--listen", f"127.0.0.1:{port}", "--no-udev", "--log-format", "json",
         "--state-dir", str(tmp / "state"), "--fast-interval", "1", "--slow-interval", "10"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "daemon.log").open("w"))
    daemon = psutil.Process(proc.pid)
    time.sleep(3)
    stop = threading.Event()
    counts: dict[str, int] = {k: 0 for k in ("ok", "not_200", "failed", "idle", "trickle",
                                             "big", "garbage", "refused")}
    threads = [threading.Thread(target=scraper, args=(url, stop, counts)),
               threading.Thread(target=hostile, args=(port, stop, counts))]
    for thread in threads:
        thread.start()

    samples = []
    started = time.monotonic()
    seq = 0
    ring: list[str] = []
    tmp_log = tmp / "dmesg.txt.new"
    end = started + args.minutes * 60
    next_sample = started
    while time.monotonic() < end and proc.poll() is None:
        seq += 1
        # One Xid line a second, in kmsg format, the last RING lines kept (as the kernel's
        # ring buffer does): what the daemon holds is then steady, and growth is a leak.
        ring.append(f"4,{seq},{seq * 1_000_000},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, "
                    f"name=python3, Graphics SM Warp Exception\n")
        del ring[:-RING]
        tmp_log.write_text("".join(ring))
        os.replace(tmp_log, kmsg)
        if time.monotonic() >= next_sample:
            mem = daemon.memory_full_info()
            samples.append({"t_s": round(time.monotonic() - started, 1),
                            "rss_mb": round(mem.rss / 2**20, 2),
                            "uss_mb": round(mem.uss / 2**20, 2),
                            "open_files": daemon.num_fds(), "threads": daemon.num_threads()})
            next_sample += args.sample_s
        time.sleep(1)
    stop.set()
    for thread in threads:
        thread.join()
    alive = proc.poll() is None
    cycles = None
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith('gpuguard_cycles_total{cadence="fast"}'):
                    cycles = float(line.split()[-1])
    except OSError:
        pass
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    log_text = (tmp / "daemon.log").read_text()
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    # After the history window (11 minutes) has filled, what the daemon holds is steady.
    settled = next((s for s in samples if s["t_s"] >= 12 * 60), first)
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "python": platform.python_version()},
        "minutes": args.minutes, "alive_at_end": alive, "fast_cycles": cycles,
        "requests": counts, "samples": samples,
        "growth_after_warmup": {k: round(last[k] - first[k], 2)
                                for k in ("rss_mb", "uss_mb", "open_files", "threads")},
        "growth_after_12_min": {k: round(last[k] - settled[k], 2)
                                for k in ("rss_mb", "uss_mb", "open_files", "threads")},
        "cycle_failed_lines": log_text.count('"cycle_failed"'),
        "log_lines": len(log_text.splitlines()),
        "non_json_log_lines": sum(1 for line in log_text.splitlines()
                                  if not line.startswith("{")),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
