#!/usr/bin/env python3
"""Issue 32's parts of "the daemon does only what changed", before and after in one run:

  engine  CPU of the daemon's read of one engine page (vLLM V1 names, padded with
          histograms to 200 KiB, 1 MiB, 8 MiB): the GET, the cut and the parse of BASE's
          code against this tree's, each in fresh processes, interleaved; a page over the
          read's MAX_BYTES (the 8 MiB one: the daemon answers "more than ...") is not
          fetched, its cut and parse alone are timed. Against the daemon's own CPU per
          cycle on one replayed GPU (bench/daemon_cost.py, no engine): the issue's
          (cycle + read) / cycle.
  npd     CPU and wall time of one write of the NPD condition files (40 rules x 8 GPUs),
          main's code against this tree's, on tmpfs (/dev/shm) and on disk (/var/tmp).
  events  peak RSS and time of `events --since 90d --limit N --format F` for 1k and 100k
          rows, main's code (a `git archive` of BASE) against this tree's stream_events.

    python3 bench/issue32_cost.py --base 4be9071 --out bench/results/issue32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def page(size: int) -> str:
    text = (REPO / "tests" / "fixtures" / "engines" / "vllm-0.11.prom").read_text()
    out, i = [text], 0
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    while sum(map(len, out)) < size:
        name = f"vllm:pad_{i}_seconds"
        out.append(f"# HELP {name} padding\n# TYPE {name} histogram\n")
        out.extend(f'{name}_bucket{{{labels},le="{le}"}} 123.0\n' for le in
                   ("0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "+Inf"))
        out.append(f"{name}_count{{{labels}}} 123.0\n{name}_sum{{{labels}}} 12.0\n")
        i += 1
    return "".join(out)


# One tree's engine read, in a process of its own (PYTHONPATH=<tree>): the daemon's read as
# it runs each cycle (sources/engine_metrics.read: the GET under its MAX_BYTES bound, the
# cut, the parse), median CPU of this process; a page over MAX_BYTES the daemon refuses
# (the read is an error, nothing parsed), so for it only the cut and parse are timed, as
# an upper bound of what a bound raised to take it would cost.
ENGINE = """
import json, statistics, sys, time, urllib.request
from gpuguard.config.engine_profiles import load_catalog
from gpuguard.sources import engine_metrics as em
url, rounds = sys.argv[1], int(sys.argv[2])
catalog = load_catalog()
names = em.wanted(catalog, "vllm")
text = urllib.request.urlopen(url, timeout=30).read().decode()
def med(fn, n):
    times = []
    for _ in range(n):
        c = time.process_time(); fn(); times.append(time.process_time() - c)
    return statistics.median(times)
out = {"bytes": len(text), "max_bytes": em.MAX_BYTES, "get": len(text) <= em.MAX_BYTES}
if out["get"]:
    got = em.read(url, catalog, "vllm")
    assert "error" not in got, got
    out["values"] = got["values"]
    out["read_cpu_ms"] = round(med(lambda: em.read(url, catalog, "vllm"), rounds) * 1e3, 3)
else:
    out["read_error"] = em.read(url, catalog, "vllm").get("error", "")[:120]
out["parse_cpu_ms"] = round(med(lambda: em.parse(text, names), rounds) * 1e3, 3)
print(json.dumps(out))
"""


def serve_pages(pages: dict[str, str]):
    """The pages on loopback (a thread of this process: its CPU is not the reader's)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = {f"/{k}": v.encode() for k, v in pages.items()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = bodies.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def engine(base: Path, rounds: int, daemon_s: float) -> dict:
    """Each tree's read of each page, interleaved (base, after) `rounds` times in fresh
    processes; against the daemon's own cycle on one replayed GPU with no engine
    (bench/daemon_cost.py, this tree): (cycle + read) / cycle, the issue's ratio."""
    from gpuguard.sources import engine_metrics as em

    sizes = {"200KiB": 200 * 1024, "1MiB": 1024 * 1024, "8MiB": 8 * 1024 * 1024}
    pages = {k: page(v) for k, v in sizes.items()}
    server = serve_pages(pages)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    out: dict = {"max_bytes": em.MAX_BYTES, "pages": []}
    try:
        for key, text in pages.items():
            inner = 9 if len(text) < 4 * 2**20 else 3
            got: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(rounds):
                for who, tree in (("before", base), ("after", REPO)):
                    got[who].append(json.loads(run_in(tree, ENGINE, f"{url}/{key}",
                                                      str(inner))))
            row = {"page": key, "bytes": len(text), "get": got["after"][0]["get"]}
            if not row["get"]:
                row["daemon_answers"] = got["after"][0]["read_error"]
            for who, runs in got.items():
                for field in ("read_cpu_ms", "parse_cpu_ms"):
                    if field in runs[0]:
                        row[f"{who}_{field}"] = round(statistics.median(
                            r[field] for r in runs), 3)
                if "values" in runs[0]:
                    row[f"{who}_values"] = runs[0]["values"]
            out["pages"].append(row)
    finally:
        server.shutdown()
    if daemon_s:
        sys.path.insert(0, str(REPO / "bench"))
        import daemon_cost

        run = daemon_cost.measure(1, 5.0, daemon_s, 5)
        cycle = run["cpu_s_per_cycle"] * 1e3
        out["daemon_one_gpu_cpu_ms_per_cycle"] = cycle
        for row in out["pages"]:
            field = "read_cpu_ms" if row["get"] else "parse_cpu_ms"
            for who in ("before", "after"):
                row[f"{who}_daemon_ratio"] = round((cycle + row[f"{who}_{field}"]) / cycle, 3)
    return out


NPD = """
import sys, time, tempfile, statistics
from pathlib import Path
from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.verdict_files import VerdictFiles
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status, Verdict
rs = [Result(f"gpu.r{i}", Status.OK, Status.CRITICAL, "fine",
             GpuId(g, f"GPU-{g}", f"00000000:{g + 0x18:02X}:00.0"))
      for i in range(40) for g in range(8)]
v, fr = Verdict(rs), Freshness({"fast": 5.0, "slow": 60.0})
out = {}
for where in sys.argv[1:]:
    files = VerdictFiles(Path(tempfile.mkdtemp(dir=where)) / "npd")
    files.write_verdict(v, {"fast": 1.0}, fr)
    cpu, wall = [], []
    for _ in range(300):
        c, w = time.process_time(), time.perf_counter()
        files.write_verdict(v, {"fast": 1.0}, fr)
        cpu.append(time.process_time() - c); wall.append(time.perf_counter() - w)
    out[where] = {"cpu_ms": round(statistics.median(cpu) * 1e3, 3),
                  "wall_ms": round(statistics.median(wall) * 1e3, 3)}
print(__import__("json").dumps(out))
"""

EVENTS = """
import resource, sys, time
from pathlib import Path
state, fmt, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
from gpuguard.events import commands
start = time.perf_counter()
with open("/dev/null", "w") as sink:
    if hasattr(commands, "stream_events"):
        commands.stream_events(state, 90 * 86400.0, None, None, (), fmt, limit, sink.write)
    else:
        sink.write(commands.list_events(state, 90 * 86400.0, None, None, (), fmt, limit))
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run_in(tree: Path, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd="/",
                          capture_output=True, text=True, check=True).stdout


def npd(base: Path, rounds: int) -> dict:
    places = ["/dev/shm", "/var/tmp"]
    before, after = [], []
    for _ in range(rounds):  # interleaved
        before.append(json.loads(run_in(base, NPD, *places)))
        after.append(json.loads(run_in(REPO, NPD, *places)))
    out = {}
    for where in places:
        for key in ("cpu_ms", "wall_ms"):
            b = statistics.median(r[where][key] for r in before)
            a = statistics.median(r[where][key] for r in after)
            out[f"{where} {key}"] = {"before": b, "after": a, "ratio": round(a / b, 3)}
    return out


def events(base: Path, rounds: int) -> dict:
    from gpuguard.events import store as eventstore
    from gpuguard.events.store import Event
    from gpuguard.events.writer import EventWriter

    state = Path(tempfile.mkdtemp(prefix="gpuguard-events-"))
    writer = EventWriter(eventstore.path_in(state), "bench", max_bytes=2**31)
    now = time.time()
    for chunk in range(100):
        writer.record_all([Event(kind="rule", source="daemon", time=now - 80 * 86400 + i,
                                 rule="pcie.replays", status="warning", old_status="ok",
                                 gpu_index=i % 8, gpu_uuid=f"GPU-{i % 8}", action="none",
                                 message=f"PCIe replays rose by {i} in the last hour")
                           for i in range(chunk * 1000, chunk * 1000 + 1000)])
        writer.flush()
    writer.close()
    out = {}
    for fmt in ("table", "json"):
        for limit in (1000, 100_000):
            got: dict[str, list[tuple[float, int]]] = {"before": [], "after": []}
            for _ in range(rounds):
                for who, tree in (("before", base), ("after", REPO)):
                    s, kb = run_in(tree, EVENTS, str(state), fmt, str(limit)).split()
                    got[who].append((float(s), int(kb)))
            out[f"{fmt} {limit}"] = {who: {"s": round(statistics.median(t for t, _ in v), 3),
                                           "peak_rss_mib": round(statistics.median(
                                               k for _, k in v) / 1024, 1)}
                                     for who, v in got.items()}
    for fmt in ("table", "json"):
        for who in ("before", "after"):
            peak = [out[f"{fmt} {n}"][who]["peak_rss_mib"] for n in (100_000, 1000)]
            out[f"{fmt} {who}: peak at 100k / at 1k"] = round(peak[0] / peak[1], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="4be9071", help="the commit measured as before")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "issue32")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--daemon-s", type=float, default=30.0)
    parser.add_argument("--only", choices=["engine", "npd", "events"], action="append")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpuguard-base-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "gpuguard", "rules"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    machine = {"machine": platform.node(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "base": args.base,
               "after": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {"engine": lambda: engine(base, min(args.rounds, 5), args.daemon_s),
             "npd": lambda: npd(base, args.rounds), "events": lambda: events(base, 3)}
    for name in args.only or list(parts):
        result = {**machine, name: parts[name]()}
        name_out = {"engine": "engine_page", "npd": "npd_files", "events": "events_stream"}[name]
        (args.out / f"{name_out}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
