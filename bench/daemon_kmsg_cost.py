#!/usr/bin/env python3
"""Daemon CPU against the kernel log's size (issue 32): the daemon on the fake NVML (1 GPU,
tests/fake_nvml built here) with a --kmsg-file of 0, 10k, 30k and 100k /dev/kmsg-format
records (kernel noise, the driver's load, an Xid 13 every 5,000 records; with --same-events the load
and 20 Xid 13s in every log, the 0-line one too, then the noise), two source trees
(before, after) interleaved round by round, the order rotated.

    .venv/bin/python bench/daemon_kmsg_cost.py --before /tmp/before32 --after . \\
        --rounds 3 --out bench/results/issue32/daemon_kmsg_cost.json

Each run is `PYTHONPATH=<tree> python -m gpuguard daemon` (one interpreter, this venv), fast
cadence --interval, slow cadence an hour (the slow cycle reads no kernel log), measured for
--seconds after a warm-up of three fast cycles: CPU (user + system) of the daemon and its
children (the NVML worker) divided by the fast cycles run. Reports each tree's median CPU
per cycle at each size and its ratio to the same tree's 0-line figure (goal: <= 1.2 at
100k).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_before_after import build_fake_nvml, own_host
from daemon_cost import cpu_of, port

LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")
NOISE = ["usb 1-1: new high-speed USB device number {i} using xhci_hcd",
         "eth0: Link is Up - 25Gbps/Full - flow control rx/tx",
         'audit: type=1400 audit(1700000000.{i}:42): apparmor="STATUS" operation="profile_load"',
         "EXT4-fs (nvme0n1p2): re-mounted {i}. Quota mode: none.",
         "IPv6: ADDRCONF(NETDEV_CHANGE): veth{i}: link becomes ready"]
XID = "NVRM: Xid (PCI:0000:10:00): 13, pid={i}, name=python3, Graphics SM Warp Exception"


def kernel_log(lines: int, same_events: bool = False) -> str:
    """`lines` records; with `same_events`, the driver's load and 20 Xid 13s first in every
    log (the 0-line one too), then `lines` of noise: the rules judge the same lines at
    every size, and only the log's size changes."""
    head = [LOAD, *(XID.format(i=i) for i in range(20))] if same_events else []
    out = []
    for i in range(len(head) + lines):
        text = head[i] if i < len(head) else "" if same_events else \
            LOAD if i == 1 else XID.format(i=i) if i % 5000 == 4999 else ""
        text = text or NOISE[i % len(NOISE)].format(i=i)
        out.append(f"6,{i},{1_000_000 + i * 1000},-;{text}\n")
    return "".join(out)


def cycles(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith('gpuguard_cycles_total{cadence="fast"}'):
            return int(float(line.split()[-1]))
    return 0


def measure(tree: Path, lines: int, fake: Path, interval: float, seconds: float,
            same_events: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpuguard-kmsg-bench-"))
    args = own_host(work)
    (work / "kmsg.log").write_text(kernel_log(lines, same_events))
    listen = port()
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "LD_LIBRARY_PATH": str(fake),
           "FAKE_NVML_GPUS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuguard", "daemon", "--no-udev", "--log-format", "json",
         "--fast-interval", str(interval), "--slow-interval", "3600", "--listen",
         f"127.0.0.1:{listen}", *args], cwd=work, env=env, stdout=subprocess.DEVNULL,
        stderr=(work / "daemon.log").open("w"))
    ps = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{listen}"
    try:
        for _ in range(400):
            try:
                if cycles(url) >= 3:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        c0, cpu0 = cycles(url), cpu_of(ps)
        time.sleep(seconds)
        c1, cpu1 = cycles(url), cpu_of(ps)
        return {"tree": str(tree), "lines": lines, "cycles": c1 - c0,
                "cpu_ms_per_cycle": round((cpu1 - cpu0) * 1000 / max(1, c1 - c0), 3)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--lines", default="0,10000,30000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--same-events", action="store_true",
                        help="the load and 20 Xids in every log, the 0-line one too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fake = build_fake_nvml(Path(tempfile.mkdtemp(prefix="gpuguard-fake-nvml-")))
    trees = {"before": args.before, "after": args.after}
    sizes = [int(x) for x in args.lines.split(",")]
    runs = []
    for r in range(args.rounds):
        order = list(trees.items())[r % 2:] + list(trees.items())[:r % 2]
        for lines in sizes:
            for name, tree in order:
                run = {"round": r, "name": name, **measure(
                    tree, lines, fake, args.interval, args.seconds, args.same_events)}
                runs.append(run)
                print(json.dumps(run), flush=True)
    summary: dict[str, dict[str, object]] = {}
    for name in trees:
        med = {n: statistics.median(x["cpu_ms_per_cycle"] for x in runs
                                    if x["name"] == name and x["lines"] == n) for n in sizes}
        summary[name] = {"cpu_ms_per_cycle_median": med,
                         "ratio_to_0_lines": {n: round(med[n] / med[sizes[0]], 2)
                                              for n in sizes}}
    result = {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "platform": platform.platform()},
              "interval_s": args.interval, "seconds": args.seconds, "rounds": args.rounds,
              "same_events": args.same_events,
              "summary": summary, "runs": runs}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
