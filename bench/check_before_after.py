#!/usr/bin/env python3
"""Cold `gpuguard check` (and `gpuguard status` with no daemon) of two source trees on the
fake NVML, interleaved round by round: issue 27's "cold check must not get slower" (ratio
after/before <= 1.02).

    .venv/bin/python bench/check_before_after.py --before /tmp/before27 --after . \\
        --rounds 41 --out bench/results/issue27-run1.json
    .venv/bin/python bench/check_before_after.py --pool bench/results/issue27-run*.json

Each run is a whole process, `PYTHONPATH=<tree> python -m gpuguard ...` with one interpreter
for both trees (its venv holds the dependencies), started from an empty folder so that
neither tree's checkout shadows PYTHONPATH. The host is one of the bench's own, as the
tests' own_host() makes it, and NVML is tests/fake_nvml built here (1 GPU and 8 GPUs).

Two figures per run: wall time, and the CPU time (user + sys) of the whole process tree.
The latter comes from os.wait4's rusage of the child, which holds the descendants the child
reaped; this process is a child subreaper (prctl), so a worker the child leaves behind
(check ends with os._exit) is reparented here, reaped and added too. On a shared machine
the CPU time is the figure to trust; wall time includes waiting for the CPU.

The order of the trees rotates from round to round, so none always runs first. --candidate
adds a third tree (a proposed fix) to the same rounds. Reports per case and tree the median
of each figure, and for each tree but "before" the ratio of the medians to "before",
the median of the per-round ratios, and a bootstrap 95% interval of the ratio of medians.
The early NVML fork is checked from each check run's GPUGUARD_TIMING=1 line: the worker's
fork happened (sources in) - (worker elapsed) ms after main(), tens of ms before click's
import finishes where the fork is early, after "parent ready" where it is not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BOOT_ID = "7e570000-0000-4000-8000-000000000001"
PR_SET_CHILD_SUBREAPER = 36
TIMING = re.compile(r"parent ready ([\d.]+) ms, sources in ([\d.]+) ms, done ([\d.]+) ms; "
                    r"NVML worker ([\d.]+) s")


def build_fake_nvml(out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit("a C compiler is needed to build tests/fake_nvml/fake_nvml.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o",
                    str(out / "libnvidia-ml.so.1"), str(REPO / "tests/fake_nvml/fake_nvml.c")],
                   check=True)
    return out


def own_host(root: Path) -> list[str]:
    """As tests/conftest.py's own_host(): a procfs holding only a boot id, empty sysfs and
    rootfs, an empty kernel log, a state dir."""
    proc = root / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_ID + "\n")
    (root / "sys").mkdir(exist_ok=True)
    (root / "rootfs").mkdir(exist_ok=True)
    (root / "kmsg.log").write_text("")
    return ["--path.procfs", str(proc), "--path.sysfs", str(root / "sys"),
            "--path.rootfs", str(root / "rootfs"), "--kmsg-file", str(root / "kmsg.log"),
            "--state-dir", str(root / "state")]


def cpu_ms(usage: Any) -> float:  # a resource.struct_rusage
    return float(usage.ru_utime + usage.ru_stime) * 1000


def reap_orphans(limit_s: float = 5.0) -> tuple[float, int]:
    """CPU ms and count of the workers a run left behind, reparented to this subreaper."""
    total, count = 0.0, 0
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.002)
            continue
        total += cpu_ms(usage)
        count += 1
    return total, count


def run_once(cmd: list[str], env: dict[str, str], cwd: Path,
             capture: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out if capture else subprocess.DEVNULL,
                                stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = (time.perf_counter() - start) * 1000
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        orphan_cpu, orphans = reap_orphans()
        err.seek(0)
        out.seek(0)
        result: dict[str, Any] = {
            "wall_ms": round(wall, 2), "cpu_ms": round(cpu_ms(usage) + orphan_cpu, 2),
            "orphans": orphans, "rc": proc.returncode,
            "stderr": err.read().decode(errors="replace")}
        if capture:
            result["stdout"] = out.read().decode(errors="replace")
        return result


def timing_of(stderr: str) -> dict[str, float] | None:
    match = TIMING.search(stderr)
    if not match:
        return None
    ready, sources, done, worker_s = (float(x) for x in match.groups())
    return {"parent_ready_ms": ready, "sources_in_ms": sources, "done_ms": done,
            "fork_at_ms": round(sources - worker_s * 1000, 1)}


def same_work(case: str, before: str, after: str) -> bool:
    """Both trees gave the same verdict: the table's summary line, or the JSON's results."""
    if case.startswith("check_json"):
        def core(text: str) -> object:  # rule, GPU, status and action; messages hold times
            doc = json.loads(text)
            return ([(r["rule"], r["gpu"], r["status"], r["action"]) for r in doc["results"]],
                    doc["summary"])
        return core(before) == core(after)
    last = [t.strip().splitlines()[-1] if t.strip() else "" for t in (before, after)]
    return last[0] == last[1]


def bootstrap_ratio(before: list[float], after: list[float], n: int = 2000) -> list[float]:
    rng = random.Random(27)
    ratios = sorted(
        statistics.median(rng.choices(after, k=len(after)))
        / statistics.median(rng.choices(before, k=len(before))) for _ in range(n))
    return [round(ratios[int(0.025 * n)], 4), round(ratios[int(0.975 * n)], 4)]


def summarise(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per case and figure: each tree's median and minimum, and each later tree's ratios
    to "before"."""
    cases: dict[str, Any] = {}
    for case, trees in samples.items():
        entry: dict[str, Any] = {}
        for figure in ("wall_ms", "cpu_ms"):
            values = {t: [float(r[figure]) for r in rs] for t, rs in trees.items()}
            b = values["before"]
            later = {t: v for t, v in values.items() if t != "before"}
            entry[figure] = {
                "median": {t: round(statistics.median(v), 2) for t, v in values.items()},
                "min": {t: min(v) for t, v in values.items()},
                "ratio_of_medians": {t: round(statistics.median(a) / statistics.median(b), 4)
                                     for t, a in later.items()},
                "median_paired_ratio": {t: round(statistics.median(
                    x / y for x, y in zip(a, b, strict=True)), 4) for t, a in later.items()},
                "ratio_ci95": {t: bootstrap_ratio(b, a) for t, a in later.items()}}
        for tree in trees:
            timings = [t for r in trees[tree] if (t := timing_of(str(r["stderr"])))]
            if timings:
                entry[f"{tree}_timing_median"] = {
                    k: round(statistics.median(t[k] for t in timings), 1) for k in timings[0]}
            entry[f"{tree}_rc"] = sorted({int(r["rc"]) for r in trees[tree]})
            entry[f"{tree}_orphans_max"] = max(int(r["orphans"]) for r in trees[tree])
        cases[case] = entry
    return cases


# Run in the child as `python -c PROBE check ...`: gpuguard's own entry point, with every
# NVML worker's fork noted (was click imported yet?) and the worker check used named.
PROBE = """
import sys, time
sys.argv = ["gpuguard", *sys.argv[1:]]
from gpuguard.sources import nvml
forks = []
class Noted(nvml.NvmlSweep):
    def __init__(self, *a, **k):
        forks.append(("click" in sys.modules, time.monotonic()))
        super().__init__(*a, **k)
        self.nth = len(forks)
nvml.NvmlSweep = Noted
plain = nvml.start_sweep
def start_sweep(*a, **k):
    from gpuguard.cli import timing
    used = plain(*a, **k)
    print("early-fork-probe", [{"click_loaded": c, "at_ms": timing.ms_since_start(t)}
          for c, t in forks], "used", used.nth, file=sys.stderr, flush=True)
    return used
nvml.start_sweep = start_sweep
from gpuguard.cli.entry import main
main()
"""


def early_fork(python: str, env: dict[str, str], host: list[str], cwd: Path) -> str:
    run = run_once([python, "-c", PROBE, "check", *host], env, cwd)
    return next((line for line in str(run["stderr"]).splitlines()
                 if line.startswith("early-fork-probe")), "no NVML worker was started")


# `python -c IMPORTS check ...`: the modules the parent imported after the sources were in
# (on the critical path: nothing overlaps them), and every module it imported.
IMPORTS = """
import os, sys
sys.argv = ["gpuguard", *sys.argv[1:]]
from gpuguard.sources import collect
seen = {}
plain = collect.Collection.result
def result(self, *a, **k):
    got = plain(self, *a, **k)
    seen["in"] = set(sys.modules)
    return got
collect.Collection.result = result
real_exit, parent = os._exit, os.getpid()
def _exit(code):
    if os.getpid() == parent:
        late = sorted(set(sys.modules) - seen.get("in", set()))
        print("imports-probe", " ".join(late), "|", " ".join(sorted(sys.modules)),
              file=sys.stderr, flush=True)
    real_exit(code)
os._exit = _exit
from gpuguard.cli.entry import main
main()
"""


def imports(python: str, envs: dict[str, dict[str, str]], hosts: dict[str, list[str]],
            cwd: Path) -> dict[str, Any]:
    """Per tree: the modules imported after the sources were in, and those its parent
    imports that the "before" tree's does not."""
    found: dict[str, tuple[list[str], set[str]]] = {}
    for tree, env in envs.items():
        err = str(run_once([python, "-c", IMPORTS, "check", *hosts[tree]], env, cwd)["stderr"])
        line = next((x for x in err.splitlines() if x.startswith("imports-probe")), "")
        late, _, everything = line.removeprefix("imports-probe").partition("|")
        found[tree] = (late.split(), set(everything.split()))
    return {t: {"after_sources_in": late, "beyond_before": sorted(alls - found["before"][1])}
            for t, (late, alls) in found.items()}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    return {"node": platform.node(), "nproc": os.cpu_count(), "cpu_model": model,
            "python": platform.python_version()}


def pool(files: list[Path]) -> dict[str, Any]:
    """Several runs' results as one: per case and tree, the median over all their rounds of
    the per-round CPU ratio and difference to "before", and of the time from the sources
    being in to done (GPUGUARD_TIMING: what nothing overlaps)."""
    runs = [json.loads(f.read_text()) for f in files]
    pooled: dict[str, Any] = {}
    for case in runs[0]["samples"]:
        entry: dict[str, Any] = {}
        for tree in runs[0]["samples"][case]:
            pairs = [(a, b) for d in runs for a, b in zip(
                d["samples"][case][tree], d["samples"][case]["before"], strict=True)]
            tail = [a["timing"]["done_ms"] - a["timing"]["sources_in_ms"]
                    for a, _ in pairs if a.get("timing")]
            entry[tree] = {
                "rounds": len(pairs),
                "cpu_ms_median": round(statistics.median(a["cpu_ms"] for a, _ in pairs), 2),
                "cpu_paired_ratio": round(statistics.median(
                    a["cpu_ms"] / b["cpu_ms"] for a, b in pairs), 4),
                "cpu_paired_delta_ms": round(statistics.median(
                    a["cpu_ms"] - b["cpu_ms"] for a, b in pairs), 2),
                "wall_paired_ratio": round(statistics.median(
                    a["wall_ms"] / b["wall_ms"] for a, b in pairs), 4)}
            if tail:
                entry[tree]["sources_in_to_done_ms"] = round(statistics.median(tail), 1)
        pooled[case] = entry
    return pooled


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool", type=Path, nargs="+",
                        help="only pool these results files (no runs)")
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--candidate", type=Path,
                        help="a third tree (a proposed fix), timed in the same rounds")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpus", default="1,8")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.pool:
        print(json.dumps(pool(args.pool), indent=1))
        return 0
    if args.before is None or args.after is None:
        parser.error("--before and --after are needed (or --pool)")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    load_at_start = os.getloadavg()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    if args.candidate:
        trees["candidate"] = args.candidate.resolve()
    work = Path(tempfile.mkdtemp(prefix="gpuguard-bench27-"))
    try:
        fake = build_fake_nvml(work)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "PYTHON"))}
        base.update({"LD_LIBRARY_PATH": str(fake), "NO_COLOR": "1", "GPUGUARD_TIMING": "1"})
        hosts = {t: own_host(work / f"host-{t}") for t in trees}  # no state shared between trees
        gm = [args.python, "-m", "gpuguard"]
        cases: dict[str, tuple[dict[str, str], list[str], bool]] = {}
        for n in args.gpus.split(","):
            for fmt in ("table", "json"):
                cases[f"check_{fmt}_{n}gpu"] = ({"FAKE_NVML_GPUS": n}, ["check", "--format", fmt],
                                                True)
        cases["status_no_daemon"] = ({}, ["status", "--socket", str(work / "no-daemon.sock")],
                                     False)
        cwd = work / "cwd"
        cwd.mkdir()

        def cmd_env(tree: str, case: str) -> tuple[list[str], dict[str, str]]:
            extra, words, on_host = cases[case]
            env = {**base, **extra, "PYTHONPATH": str(trees[tree])}
            return [*gm, *words, *(hosts[tree] if on_host else [])], env

        equal: dict[str, bool] = {}
        for case in cases:  # one captured run each: the same verdict from both trees
            outs = {t: str(run_once(*cmd_env(t, case), cwd, capture=True)["stdout"])
                    for t in trees}
            equal[case] = all(same_work(case, outs["before"], outs[t]) for t in trees)
        forks = {t: early_fork(args.python, cmd_env(t, "check_table_1gpu")[1], hosts[t], cwd)
                 for t in trees}
        print(json.dumps(forks, indent=1))
        modules = {f"{fmt}_{n}gpu": imports(
            args.python, {t: cmd_env(t, f"check_{fmt}_{n}gpu")[1] for t in trees},
            {t: [*hosts[t], "--format", fmt] for t in trees}, cwd)
            for n in args.gpus.split(",") for fmt in ("table", "json")}
        for _ in range(args.warmup):
            for case in cases:
                for tree in trees:
                    run_once(*cmd_env(tree, case), cwd)
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {
            c: {t: [] for t in trees} for c in cases}
        started = time.time()
        for i in range(args.rounds):
            names = list(trees)
            order = names[i % len(names):] + names[:i % len(names)]  # each tree first in turn
            for case in cases:
                for tree in order:
                    samples[case][tree].append(run_once(*cmd_env(tree, case), cwd))
        result = {
            "machine": machine(), "loadavg_at_start": load_at_start,
            "loadavg_at_end": os.getloadavg(),
            "rounds": args.rounds, "warmup": args.warmup,
            "seconds": round(time.time() - started, 1),
            "trees": {t: str(p) for t, p in trees.items()},
            "commands": {c: " ".join(cmd_env("after", c)[0]).replace(str(work), "$WORK")
                         for c in cases},
            "same_verdict": equal, "early_fork_probe": forks,
            "imports_probe": modules, "cases": summarise(samples),
            "samples": {c: {t: [{k: v for k, v in r.items() if k != "stderr"}
                                | {"timing": timing_of(str(r["stderr"]))} for r in rs]
                            for t, rs in trees_.items()} for c, trees_ in samples.items()},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: result[k] for k in ("same_verdict", "imports_probe", "cases")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
