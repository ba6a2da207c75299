#!/usr/bin/env python3
"""Cold `gpuguard check` of two trees against `nvidia-smi -q`, interleaved round by round
(issue 32): whole processes, wall clock, output to /dev/null, --warmup rounds first; the
median of each and of the paired ratios (each tree's time over nvidia-smi's in the same
round). Each tree runs as `python -m gpuguard check` with its own folder first on the path.

    python bench/check_trees.py --tree before=DIR --tree after=DIR --runs 21 --out F

--state-dir gives every run that --state-dir (each tree its own folder under it), and
--miss NAME=DIR adds a tree that runs with its kept InfoROM validity removed before each
run (issue 32: the first check of a boot, or one after the kept answer was dropped).
--command NAME=EXE and --miss-command NAME=EXE do the same for an installed command (a
wheel's console script: `EXE check`, no PYTHONPATH), the issue's "wheel installed".
With --state-dir, each run's kept InfoROM line ("at seq" of the file after the run) is
recorded too: a run whose "at" moved validated anew (a miss), one whose stayed reused it.
--timing records each gpuguard run's GPUGUARD_TIMING line (where its time went), and
--pin CPU runs every command, nvidia-smi too, on that CPU alone (taskset: a placement of
our own processes, no setting of the host or the GPU). --rotate starts each round's trees
one further on; without it the order is fixed (nvidia-smi, then the trees as given: the
runs recorded up to issue 32's run i).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    """The run's wall ms, and its last "gpuguard timing:" line ("" without one)."""
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          cwd=cwd, check=False)
    ms = (time.perf_counter() - start) * 1000
    lines = [line for line in done.stderr.decode(errors="replace").splitlines()
             if line.startswith("gpuguard timing:")]
    return ms, lines[-1] if lines else ""


def kept_line(state: Path) -> str:
    """The "at seq" of the first GPU kept in `state`'s inforom-valid, or "-" for none."""
    try:
        lines = (state / "inforom-valid").read_text().splitlines()
    except OSError:
        return "-"
    gpus = [line.split() for line in lines if line.startswith("gpu ")]
    return f"{gpus[0][4]} {gpus[0][5]}" if gpus and len(gpus[0]) == 6 else "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--miss", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--command", action="append", default=[], help="NAME=EXE")
    parser.add_argument("--miss-command", action="append", default=[], help="NAME=EXE")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--pin", help="a CPU number for taskset -c")
    parser.add_argument("--rotate", action="store_true",
                        help="start each round's trees one further on (nvidia-smi stays "
                             "first), so no tree always runs right after nvidia-smi")
    args = parser.parse_args()
    pin = ["taskset", "-c", args.pin] if args.pin else []
    trees = dict(t.split("=", 1) for t in args.tree + args.miss)
    commands = dict(t.split("=", 1) for t in args.command + args.miss_command)
    missing = {t.split("=", 1)[0] for t in args.miss + args.miss_command}
    runs = {**{n: ("tree", d) for n, d in trees.items()},
            **{n: ("command", e) for n, e in commands.items()}}
    times: dict[str, list[float]] = {"nvidia-smi": [], **{n: [] for n in runs}}
    kept: dict[str, list[str]] = {n: [] for n in runs}
    timing: dict[str, list[str]] = {n: [] for n in runs}
    for i in range(args.warmup + args.runs):
        row = {"nvidia-smi": timed([*pin, "nvidia-smi", "-q"], dict(os.environ), "/")[0]}
        order = list(runs.items())
        if args.rotate:
            order = order[i % len(order):] + order[:i % len(order)]
        for name, (kind, where) in order:
            if kind == "tree":
                env, folder = {**os.environ, "PYTHONPATH": where}, where
                cmd = [sys.executable, "-m", "gpuguard", "check"]
            else:
                env, folder = dict(os.environ), "/"
                cmd = [where, "check"]
            cmd = [*pin, *cmd]
            if args.timing:
                env["GPUGUARD_TIMING"] = "1"
            if args.state_dir is not None:
                state = args.state_dir / name
                cmd += ["--state-dir", str(state)]
                if name in missing:
                    (state / "inforom-valid").unlink(missing_ok=True)
            row[name], line = timed(cmd, env, folder)
            if args.state_dir is not None and i >= args.warmup:
                kept[name].append(kept_line(args.state_dir / name))
            if i >= args.warmup:
                timing[name].append(line)
        if i >= args.warmup:
            for name, ms in row.items():
                times[name].append(ms)
    smi = times["nvidia-smi"]
    out = {"runs": args.runs, "median_ms": {n: round(statistics.median(t), 1)
                                            for n, t in times.items()},
           "ratio_median": {n: round(statistics.median(a / b for a, b in zip(times[n], smi,
                                                                             strict=True)), 3)
                            for n in runs},
           "times_ms": {n: [round(x, 1) for x in t] for n, t in times.items()},
           "kept_at_seq": kept if args.state_dir is not None else None,
           "timing": timing if args.timing else None, "pinned_cpu": args.pin}
    text = json.dumps(out, indent=1)
    print(json.dumps({k: out[k] for k in ("median_ms", "ratio_median")}))
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
