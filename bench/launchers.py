#!/usr/bin/env python3
"""`gpuguard status` by each way of launching it, against `python -c pass` (issue 32).

A daemon (a replay of the real H200's snapshot, or the live NVML with --live) serves its
verdict on a status socket; then, interleaved round by round, whole processes, output to
/dev/null: the venv's `python -c pass` (the interpreter's floor), pip's console script
(`VENV/bin/gpuguard`, which imports re), the packages' launcher (packaging/bin/gpuguard,
run by the same interpreter), and `python -m gpuguard` (runpy). Where gpuguard is not
installed in the interpreter's venv (a tree on PYTHONPATH), pip's console script is
written to a temporary folder in the exact text pip generates for it. Medians and the median of
the paired ratios to `python -c pass`, as JSON.

    python bench/launchers.py --runs 21 --warmup 3 --out F [--live]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "tests" / "fixtures" / "h200-live" / "idle-snapshot.json"


# pip's console script for `gpuguard = "gpuguard.cli.entry:main"` (pip 23-24, as in .venv)
PIP_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from gpuguard.cli.entry import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - start) * 1000


def wait_for(path: Path, proc: subprocess.Popen[bytes], seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode})")
        if path.exists():
            time.sleep(1.0)  # a first cycle judged
            return
        time.sleep(0.05)
    raise SystemExit("no status socket")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--live", action="store_true", help="the daemon reads NVML")
    args = parser.parse_args()
    python = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-launchers-"))
    script = Path(python).parent / "gpuguard"
    if not script.exists():
        script = tmp / "gpuguard"
        script.write_text(PIP_SCRIPT.format(python=python))
        script.chmod(0o755)
    sock = tmp / "status.sock"
    source = [] if args.live else ["--input", str(SNAPSHOT)]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    daemon = subprocess.Popen(
        [python, "-m", "gpuguard", "daemon", "--listen", f"127.0.0.1:{port}", "--no-udev",
         "--status-socket", str(sock), "--state-dir", str(tmp / "state"), *source],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        start_new_session=True)
    try:
        wait_for(sock, daemon)
        status = ["status", "--socket", str(sock)]
        ways = {"python -c pass": [python, "-c", "pass"],
                "pip console script": [str(script), *status],
                "packaged launcher": [python, str(REPO / "packaging" / "bin" / "gpuguard"),
                                      *status],
                "python -m gpuguard": [python, "-m", "gpuguard", *status]}
        times: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(args.warmup + args.runs):
            row = {name: timed(cmd) for name, cmd in ways.items()}
            if i >= args.warmup:
                for name, ms in row.items():
                    times[name].append(ms)
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=20)
    floor = times["python -c pass"]
    out = {"runs": args.runs, "python": sys.version.split()[0], "live": args.live,
           "median_ms": {n: round(statistics.median(t), 2) for n, t in times.items()},
           "ratio_to_python_pass": {
               n: round(statistics.median(a / b for a, b in zip(t, floor, strict=True)), 3)
               for n, t in times.items() if n != "python -c pass"},
           "times_ms": {n: [round(x, 2) for x in t] for n, t in times.items()}}
    print(json.dumps({k: out[k] for k in ("median_ms", "ratio_to_python_pass")}))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
