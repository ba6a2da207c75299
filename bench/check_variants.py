#!/usr/bin/env python3
"""Time several ways of running `gpuguard check` against `nvidia-smi -q`, interleaved in one
run so that all see the same machine state (issue 19: the ratio of the day is in question,
so an old and a new gpuguard are compared against one nvidia-smi, round by round).

    python3 bench/check_variants.py --runs 31 --out result.json \\
        --variant 'new=/tmp/new/bin/gpuguard check --format json' \\
        --variant 'old=/tmp/old/bin/gpuguard check --format json' \\
        --variant 'new_apart=GPUGUARD_CHILD_APART=1 /tmp/new/bin/gpuguard check --format json'

A variant is NAME=[VAR=VALUE ...] COMMAND. Each run of a gpuguard variant is made with
GPUGUARD_TIMING=1, whose line (where the time went) is kept per run. Reports median, 90th
percentile and each one's ratio to nvidia-smi -q's median.
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


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str]]:
    name, _, rest = text.partition("=")
    words = shlex.split(rest)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith(("/", ".")):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return name, env, words


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, check=False)
    return (time.perf_counter() - start) * 1000, proc.stderr


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    variants = {"python_startup": ({}, [sys.executable, "-c", "pass"])}
    if shutil.which("nvidia-smi"):
        variants["nvidia_smi_q"] = ({}, ["nvidia-smi", "-q"])
    for text in args.variant:
        name, env, cmd = parse_variant(text)
        variants[name] = (env, cmd)
    base = {**os.environ, "GPUGUARD_TIMING": "1"}
    for _ in range(args.warmup):
        for env, cmd in variants.values():
            timed(cmd, {**base, **env})
    samples: dict[str, list[float]] = {name: [] for name in variants}
    timing: dict[str, list[str]] = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, (env, cmd) in variants.items():
            ms, err = timed(cmd, {**base, **env})
            samples[name].append(round(ms, 1))
            line = next((x for x in err.splitlines() if x.startswith("gpuguard timing")), "")
            if line:
                timing[name].append(line)
    median = {n: round(statistics.median(s), 1) for n, s in samples.items()}
    p90 = {n: round(percentile(s, 0.9), 1) for n, s in samples.items()}
    result = {
        "machine": {"node": platform.node(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version()},
        "runs": args.runs,
        "variants": {n: " ".join([*(f"{k}={v}" for k, v in e.items()), *c])
                     for n, (e, c) in variants.items()},
        "median_ms": median, "p90_ms": p90,
        "min_ms": {n: min(s) for n, s in samples.items()},
        "samples_ms": samples, "timing": timing,
    }
    if "nvidia_smi_q" in median:
        ref = median["nvidia_smi_q"]
        result["median_ratio"] = {n: round(m / ref, 2) for n, m in median.items()}
        result["p90_ratio"] = {n: round(m / ref, 2) for n, m in p90.items()}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    summary = {k: result[k] for k in ("median_ms", "p90_ms", "median_ratio", "p90_ratio")
               if k in result}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
