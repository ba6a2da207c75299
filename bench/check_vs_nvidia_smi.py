#!/usr/bin/env python3
"""Time `gpuguard check` against `nvidia-smi -q` on the same host, in the same run.

Whole processes, wall clock, interleaved so that both see the same machine state;
reports the median of --runs rounds after --warmup rounds, and the ratio. Writes
JSON to --out. Run it on a GPU host (the device tool for the H200 numbers in
docs/benchmarks.md); on a host without a driver it still times gpuguard's
"driver not loaded" path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - start) * 1000, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gpuguard", default=f"{sys.executable} -m gpuguard",
                        help="how to run gpuguard (e.g. /opt/gpuguard/bin/gpuguard)")
    args = parser.parse_args()

    gpuguard = shlex.split(args.gpuguard)
    python = gpuguard[0] if gpuguard[0].endswith(("python", "python3")) else sys.executable
    commands: dict[str, list[str]] = {
        "python_startup": [python, "-c", "pass"],
        "gpuguard_check_table": [*gpuguard, "check", "--format", "table"],
        "gpuguard_check_json": [*gpuguard, "check", "--format", "json"],
        "gpuguard_check_prometheus": [*gpuguard, "check", "--format", "prometheus"],
    }
    if shutil.which("nvidia-smi"):
        commands["nvidia_smi_q"] = ["nvidia-smi", "-q"]
        commands["nvidia_smi_L"] = ["nvidia-smi", "-L"]
    for _ in range(args.warmup):
        for cmd in commands.values():
            timed(cmd)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, int] = {}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            ms, code = timed(cmd)
            samples[name].append(ms)
            codes[name] = code
    result = {
        "machine": {"node": platform.node(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "runs": args.runs,
        "commands": {n: shlex.join(c) for n, c in commands.items()},
        "median_ms": {n: round(statistics.median(s), 1) for n, s in samples.items()},
        "min_ms": {n: round(min(s), 1) for n, s in samples.items()},
        "max_ms": {n: round(max(s), 1) for n, s in samples.items()},
        "exit_codes": codes,
    }
    if "nvidia_smi_q" in samples:
        ref = result["median_ms"]["nvidia_smi_q"]
        result["ratio_vs_nvidia_smi_q"] = {
            n: round(result["median_ms"][n] / ref, 2) for n in commands if n.startswith("gpuguard")
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
