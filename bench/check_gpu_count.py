#!/usr/bin/env python3
"""Cold `gpuguard check` at 1 GPU against 64 GPUs on the fake NVML (issue 32: "check at 64
GPUs / at 1 GPU, goal <= 1.3"), and where the 64-GPU run's time goes.

    .venv/bin/python bench/check_gpu_count.py --tree after=. --tree before=/tmp/before \\
        --rounds 15 --out bench/results/issue32/check_gpu_count.json

Both GPU counts have 18 NVLinks a GPU (FAKE_NVML_NVLINKS=18, an H200 board's), so the ratio
is the GPU count's alone. Each run is a whole process (`PYTHONPATH=<tree> python -c PHASES
check ...`, from an empty folder), timed as bench/check_before_after.py times it: wall, and
the CPU of the process tree (its NVML worker included, reaped here as a subreaper). Rounds
are interleaved (every tree and GPU count once a round, the order rotating); the figure is
the median over rounds of the round's 64-GPU / 1-GPU ratio, per tree.

The phase split comes from the same runs: PHASES wraps the check's three steps in the
parent, waiting for the snapshot (the NVML sweep, and the host sources beside it), judging
and printing, and notes the NVML worker's own elapsed time (snapshot.nvml.elapsed_s, from
its fork to its last line).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_before_after import (  # bench/ is not a package: by its folder, as above
    PR_SET_CHILD_SUBREAPER,
    build_fake_nvml,
    machine,
    own_host,
    run_once,
)

PHASES = """
import json, sys, time
sys.argv = ["gpuguard", *sys.argv[1:]]
from gpuguard.assess import once
from gpuguard.outputs import render as render_module
phases = {}
def timed(name, fn):
    def wrapper(*a, **k):
        start = time.perf_counter()
        got = fn(*a, **k)
        if name in phases:  # verdict() asks snapshot() again: the first call waited
            return got
        phases[name] = round((time.perf_counter() - start) * 1000, 2)
        if name == "snapshot_ms":
            phases["nvml_worker_ms"] = round((got.nvml.elapsed_s or 0.0) * 1000, 2)
        if name == "print_ms":
            print("phases-probe", json.dumps(phases), file=sys.stderr, flush=True)
        return got
    return wrapper
once.Judgement.snapshot = timed("snapshot_ms", once.Judgement.snapshot)
once.Judgement.verdict = timed("judge_ms", once.Judgement.verdict)
plain_renderer = render_module.renderer
render_module.renderer = lambda fmt: timed("print_ms", plain_renderer(fmt))
from gpuguard.cli.entry import main
main()
"""

GPU_COUNTS = (1, 64)


def phases_of(stderr: str) -> dict[str, float]:
    line = next((x for x in stderr.splitlines() if x.startswith("phases-probe")), None)
    if line is None:
        return {}
    parsed: dict[str, float] = json.loads(line.removeprefix("phases-probe"))
    return parsed


def summarise(samples: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tree, by_count in samples.items():
        one, many = by_count[GPU_COUNTS[0]], by_count[GPU_COUNTS[1]]
        entry: dict[str, Any] = {}
        for figure in ("wall_ms", "cpu_ms"):
            entry[figure] = {
                "median_1gpu": round(statistics.median(r[figure] for r in one), 2),
                "median_64gpu": round(statistics.median(r[figure] for r in many), 2),
                "median_paired_ratio": round(statistics.median(
                    b[figure] / a[figure] for a, b in zip(one, many, strict=True)), 4)}
        for count, runs in by_count.items():
            phases = [r["phases"] for r in runs if r["phases"]]
            if phases:
                entry[f"phases_{count}gpu_median_ms"] = {
                    k: round(statistics.median(p[k] for p in phases), 2) for k in phases[0]}
        entry["rc"] = sorted({int(r["rc"]) for rs in by_count.values() for r in rs})
        out[tree] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True,
                        help="NAME=PATH of a source tree (repeat to compare trees)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = {name: Path(path).resolve() for name, _, path in
             (t.partition("=") for t in args.tree)}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    work = Path(tempfile.mkdtemp(prefix="gpuguard-bench-gpus-"))
    fake = build_fake_nvml(work)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "PYTHON"))}
    base.update({"LD_LIBRARY_PATH": str(fake), "NO_COLOR": "1", "FAKE_NVML_NVLINKS": "18"})
    host = own_host(work / "host")  # one host for all trees: its paths are in the output
    cwd = work / "cwd"
    cwd.mkdir()
    jobs = [(t, n) for t in trees for n in GPU_COUNTS]
    samples: dict[str, dict[int, list[dict[str, Any]]]] = {t: {n: [] for n in GPU_COUNTS}
                                                          for t in trees}
    outputs: dict[tuple[str, int], str] = {}
    for round_no in range(args.warmup + args.rounds):
        shift = round_no % len(jobs)
        for tree, count in jobs[shift:] + jobs[:shift]:
            env = {**base, "PYTHONPATH": str(trees[tree]), "FAKE_NVML_GPUS": str(count)}
            run = run_once([args.python, "-c", PHASES, "check", *host], env, cwd,
                           capture=True)
            outputs.setdefault((tree, count), str(run.pop("stdout")))
            run["phases"] = phases_of(str(run.pop("stderr")))
            if round_no >= args.warmup:
                samples[tree][count].append(run)
    same = {str(n): len({outputs[(t, n)] for t in trees}) == 1 for n in GPU_COUNTS}
    result = {"machine": machine(), "rounds": args.rounds, "trees": {k: str(v) for k, v in
                                                                    trees.items()},
              "same_output_across_trees": same, "summary": summarise(samples),
              "samples": {t: {str(n): r for n, r in by.items()} for t, by in samples.items()}}
    print(json.dumps({k: result[k] for k in ("machine", "same_output_across_trees",
                                              "summary")}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
