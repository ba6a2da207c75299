#!/usr/bin/env python3
"""Where the NVML worker's time goes on a real GPU: importing pynvml, nvmlInit, and each
call of gpuguard's sweep (timed through the progress board every call passes through).
Runs the sweep --runs times in fresh processes (as `gpuguard check` does: cold NVML) and
prints the median of each phase and the slowest calls. Reads only."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run() -> dict:
    t0 = time.perf_counter()
    import pynvml

    t1 = time.perf_counter()
    pynvml.nvmlInit()
    t2 = time.perf_counter()
    from gpuguard.sources import nvml_read
    from gpuguard.sources.nvml_progress import Progress

    marks: list[tuple[float, int, str]] = []

    class Timed(Progress):
        def set(self, slot: int, text: str) -> None:
            marks.append((time.perf_counter(), slot, text))

    t3 = time.perf_counter()
    nvml_read.sweep(pynvml, lambda obj: None, Timed(), "/proc")
    t4 = time.perf_counter()
    calls: dict[str, float] = {}
    last: dict[int, tuple[float, str]] = {}
    for t, slot, text in marks:
        if slot in last and last[slot][1]:
            name = last[slot][1].split(" (GPU")[0]
            calls[name] = calls.get(name, 0.0) + (t - last[slot][0]) * 1000
        last[slot] = (t, text)
    pynvml.nvmlShutdown()
    return {"import_pynvml_ms": (t1 - t0) * 1000, "nvmlInit_ms": (t2 - t1) * 1000,
            "import_nvml_read_ms": (t3 - t2) * 1000, "sweep_ms": (t4 - t3) * 1000,
            "calls_ms": calls}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run()))
        return
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [json.loads(subprocess.run([sys.executable, __file__, "--child"], env=env,
                                      capture_output=True, text=True, check=True).stdout)
            for _ in range(args.runs)]
    summary = {k: round(statistics.median(r[k] for r in runs), 1)
               for k in ("import_pynvml_ms", "nvmlInit_ms", "import_nvml_read_ms", "sweep_ms")}
    names = runs[0]["calls_ms"].keys()
    calls = {n: round(statistics.median(r["calls_ms"].get(n, 0.0) for r in runs), 2)
             for n in names}
    summary["slowest_calls_ms"] = dict(sorted(calls.items(), key=lambda kv: -kv[1])[:15])
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
