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


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False, env=env)
    return (time.perf_counter() - start) * 1000, proc.returncode, proc.stderr


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    # GPUGUARD_TIMING=1: each check's stderr says where its time went (parent ready, sources
    # in, done, the NVML worker's own time), kept per run to find where the spread is
    env = {**os.environ, "GPUGUARD_TIMING": "1"}
    for _ in range(args.warmup):
        for cmd in commands.values():
            timed(cmd, env)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, int] = {}
    phases: list[dict[str, float | str]] = []
    for _ in range(args.runs):
        for name, cmd in commands.items():
            ms, code, err = timed(cmd, env)
            samples[name].append(ms)
            codes[name] = code
            if name == "gpuguard_check_json":
                line = next((x for x in err.splitlines() if x.startswith("gpuguard timing")), "")
                phases.append({"wall_ms": round(ms, 1), "timing": line})
    result = {
        "machine": {"node": platform.node(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "runs": args.runs,
        "commands": {n: shlex.join(c) for n, c in commands.items()},
        "median_ms": {n: round(statistics.median(s), 1) for n, s in samples.items()},
        "min_ms": {n: round(min(s), 1) for n, s in samples.items()},
        "max_ms": {n: round(max(s), 1) for n, s in samples.items()},
        "p90_ms": {n: round(percentile(s, 0.9), 1) for n, s in samples.items()},
        "samples_ms": {n: [round(x, 1) for x in s] for n, s in samples.items()},
        "check_json_timing": phases,
        "exit_codes": codes,
    }
    if "nvidia_smi_q" in samples:
        ref = result["median_ms"]["nvidia_smi_q"]
        result["ratio_vs_nvidia_smi_q"] = {
            n: round(result["median_ms"][n] / ref, 2) for n in commands if n.startswith("gpuguard")
        }
        result["p90_ratio_vs_nvidia_smi_q_median"] = {
            n: round(result["p90_ms"][n] / ref, 2) for n in commands if n.startswith("gpuguard")
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
