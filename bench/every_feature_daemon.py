#!/usr/bin/env python3
"""Issue 32's every-feature daemon: its CPU as a share of one core.

The set-up of the issue: 5 s fast cadence, the active probe every 30 s, the event store,
host resources, NPD files and the status socket on, one exec service with a pid file, a
POST inference probe and an engine page of vLLM V1 names with histograms
(bench/vllm_v1_page.py, served by a plain http.server process the bench starts; the page's
size is in the output); the status page off, and DCGM compat off (no --metrics-compat: its
default).

Measured over --span seconds after a --warmup: CPU (user + system, from /proc through
psutil) of the daemon process and of its NVML worker, as % of one core: the issue's
figure. Apart from it: the children the daemon reaped in the span (its cutime + cstime:
the active probe's forked workers, any command the supervisor runs), with a
split by kind from polling its children every 0.2 s (a lower bound: a child's last
0.2 s before it exits is not seen). Then the daemon's USS, /metrics' series and its
scrape latency, and what shows the features ran (results of service.inference,
service.engine and the active probe's rules, the NPD files, the socket, events.db).

    python3 bench/every_feature_daemon.py --nvml-lib /tmp/fn --warmup 10 --span 30 \\
        --out bench/results/issue32/every_feature_daemon.json        # the fake NVML
    python3 bench/every_feature_daemon.py --gpuguard /opt/gv/bin/gpuguard --rounds 2  # a GPU host

Every process it starts (engine server, daemon, their descendants) is stopped on exit,
error or signal included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
PAGE = Path(__file__).resolve().parent / "vllm_v1_page.py"
FEATURE_RULES = ("service.inference", "service.engine", "service.memory_growth",
                 "gpu.compute", "pcie.bandwidth")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return bytes(answer.read())


def wait_until(what: str, ready: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError):
            if ready():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {seconds} s")


def service_config(tmp: Path, port: int, pid_file: Path) -> Path:
    """One exec service whose GPU variant is the engine server the bench started (its pid
    file written by the bench), a POST probe and its vLLM engine read from /metrics."""
    alive = ["sh", "-c", f"kill -0 $(cat {pid_file})"]
    url = f"http://127.0.0.1:{port}/v1/completions"
    config = {"services": [{
        "name": "llm", "backend": "exec", "failback": "manual", "min_cpu_time": 0,
        "probe": {"http": {"gpu": url, "cpu": url}, "method": "POST",
                  "body": {"model": "bench", "prompt": "ping", "max_tokens": 1},
                  "status": 200, "json_path": "choices.0.text", "request_timeout": 10,
                  "timeout": 30},
        "engine": {"name": "vllm", "timeout": 2},
        "exec": {"start_gpu": alive, "stop_gpu": ["true"], "running_gpu": alive,
                 "pid_file_gpu": str(pid_file),
                 "start_cpu": ["true"], "stop_cpu": ["true"], "running_cpu": ["false"]},
    }]}
    path = tmp / "gpuguard.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


class Children:
    """The daemon's descendants by kind, polled: the NVML worker (its own interpreter),
    active-probe workers (forks: the daemon's own command line), anything else (exec
    commands) by name. Keeps each pid's last user+system seen."""

    def __init__(self, daemon: psutil.Process) -> None:
        self.daemon = daemon
        self.cmdline = daemon.cmdline()
        self.seen: dict[int, tuple[str, float]] = {}
        self.everything: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def kind(self, proc: psutil.Process) -> str:
        cmd = proc.cmdline()
        if any("gpuguard.sources.nvml_worker" in part for part in cmd):
            return "nvml_worker"
        if cmd == self.cmdline:
            return "active_probe_or_fork"
        return f"other:{proc.name()}"

    def poll(self) -> None:
        with contextlib.suppress(psutil.Error):
            for proc in self.daemon.children(recursive=True):
                self.everything.add(proc.pid)
                with contextlib.suppress(psutil.Error):
                    kind = self.seen.get(proc.pid, ("", 0.0))[0] or self.kind(proc)
                    t = proc.cpu_times()
                    self.seen[proc.pid] = (kind, t.user + t.system)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            self.poll()

    def worker(self) -> psutil.Process | None:
        self.poll()
        for pid, (kind, _) in self.seen.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if kind == "nvml_worker" and proc.is_running() and proc.status() != "zombie":
                    return proc
        return None


def cpu(proc: psutil.Process | None) -> dict[str, float]:
    if proc is None:
        return {"self": 0.0, "children": 0.0}
    t = proc.cpu_times()
    return {"self": t.user + t.system, "children": t.children_user + t.children_system}


def threads(proc: psutil.Process) -> dict[int, tuple[str, float]]:
    """Each thread's name (/proc/PID/task/TID/comm) and user+system seconds."""
    out = {}
    with contextlib.suppress(psutil.Error):
        for t in proc.threads():
            try:
                name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
            except OSError:
                name = "?"
            out[t.id] = (name, t.user_time + t.system_time)
    return out


def thread_split(start: dict[int, tuple[str, float]], end: dict[int, tuple[str, float]]
                 ) -> list[str]:
    """The daemon's threads by CPU in the span, most first: where a share comes from."""
    rows = sorted(((cpu_s - start.get(tid, (name, 0.0))[1], tid, name)
                   for tid, (name, cpu_s) in end.items()), reverse=True)
    return [f"{tid} {name}: {seconds:.2f} s" for seconds, tid, name in rows[:8] if seconds > 0]


def scrape(url: str, count: int) -> dict[str, Any]:
    latencies, body = [], b""
    for _ in range(count):
        start = time.perf_counter()
        body = get(url + "/metrics")
        latencies.append((time.perf_counter() - start) * 1e3)
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    ordered = sorted(latencies)
    return {"scrape_ms_median": round(statistics.median(latencies), 2),
            "scrape_ms_p95": round(ordered[max(0, int(0.95 * len(ordered)) - 1)], 2),
            "metrics_bytes": len(body), "series": series, "text": body.decode()}


def metric(text: str, prefix: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[-1])
    return None


def evidence(url: str, tmp: Path, text: str) -> dict[str, Any]:
    """What shows the features ran: the rules' results, the files, the socket."""
    status = json.loads(get(url + "/status"))
    results = status.get("results", []) if isinstance(status, dict) else []
    rules: dict[str, list[str]] = {}
    for r in results:
        if isinstance(r, dict) and r.get("rule") in FEATURE_RULES:
            rules.setdefault(r["rule"], []).append(
                f"{r.get('status')}: {str(r.get('message'))[:120]}")
    failover = tmp / "state" / "failover-llm.json"
    return {
        "rules": rules,
        "active_probe_source_success": metric(
            text, 'gpuguard_source_success{source="active_probe"}'),
        "inference_success": metric(text, 'gpuguard_service_inference_success{service="llm"}'),
        "npd_files": sorted(p.name for p in (tmp / "npd").glob("*")),
        "status_socket": (tmp / "status.sock").is_socket(),
        "events_db_bytes": (tmp / "state" / "events.db").stat().st_size
        if (tmp / "state" / "events.db").exists() else None,
        "failover_state": json.loads(failover.read_text()).get("active")
        if failover.exists() else None,
    }


def stop_all(procs: list[subprocess.Popen[bytes]], extra: set[int]) -> None:
    """SIGTERM each (the daemon stops its worker and children), then SIGKILL of its group
    and of any descendant seen that is still there."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    for pid in extra:
        with contextlib.suppress(psutil.Error):
            child = psutil.Process(pid)
            if child.status() != psutil.STATUS_ZOMBIE:
                child.kill()


def daemon_command(args: argparse.Namespace, tmp: Path, listen: int, config: Path) -> list[str]:
    base = shlex.split(args.gpuguard) if args.gpuguard else [sys.executable, "-m", "gpuguard"]
    cmd = [*base, "daemon", "--listen", f"127.0.0.1:{listen}", "--log-format", "json",
           "--fast-interval", str(args.fast_interval),
           "--active-probe-interval", str(args.active_probe_interval),
           "--event-store", "--host-resources", "--npd-dir", str(tmp / "npd"),
           "--status-socket", str(tmp / "status.sock"), "--config", str(config),
           "--state-dir", str(tmp / "state")]
    return cmd + shlex.split(args.daemon_args)


def one_round(args: argparse.Namespace, n: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-every-"))
    engine_port, listen = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    children: Children | None = None
    env = dict(os.environ)
    if args.nvml_lib:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [args.nvml_lib,
                                                         env.get("LD_LIBRARY_PATH")]))
        # the fake NVML reports memory only when told: without it the active probe
        # leaves its GPUs alone ("cannot tell how much memory is in use")
        env.setdefault("FAKE_NVML_MEM_TOTAL_MIB", "143771")
    if args.tree:
        env["PYTHONPATH"] = args.tree
    cwd = args.tree or (str(REPO) if not args.gpuguard else str(tmp))
    try:
        engine = subprocess.Popen([sys.executable, str(PAGE), str(engine_port),
                                   str(args.engines)], start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(engine)
        pid_file = tmp / "llm-gpu.pid"
        pid_file.write_text(f"{engine.pid}\n")
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_until("engine server", lambda: get(engine_url + "/health", 1) == b"", 20)
        page_bytes = len(get(engine_url + "/metrics"))
        cmd = daemon_command(args, tmp, listen, service_config(tmp, engine_port, pid_file))
        log = (tmp / "daemon.log").open("wb")
        daemon = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=log)
        procs.insert(0, daemon)
        url = f"http://127.0.0.1:{listen}"

        def healthy() -> bool:
            if daemon.poll() is not None:  # gone at start: say why, not "not ready"
                raise RuntimeError(f"the daemon exited {daemon.returncode}: "
                                   f"{(tmp / 'daemon.log').read_text()[-2000:]}")
            return get(url + "/healthz", 1) is not None

        wait_until("daemon /healthz", healthy, 90)
        ps = psutil.Process(daemon.pid)
        children = Children(ps)
        children.thread.start()
        time.sleep(args.warmup)

        worker = children.worker()
        cycles0 = metric(get(url + "/metrics").decode(), 'gpuguard_cycles_total{cadence="fast"}')
        procs0 = len(psutil.pids())  # the service's tree is looked for among them each cycle
        d0, w0, t0, th0 = cpu(ps), cpu(worker), time.monotonic(), threads(ps)
        before = set(children.seen)
        time.sleep(args.span)
        d1, w1, t1, th1 = cpu(ps), cpu(worker), time.monotonic(), threads(ps)
        cycles1 = metric(get(url + "/metrics").decode(), 'gpuguard_cycles_total{cadence="fast"}')
        worker_after = children.worker()
        span = t1 - t0

        by_kind: dict[str, float] = {}
        for pid, (kind, seconds) in children.seen.items():
            if pid not in before and kind != "nvml_worker":
                by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        daemon_s, worker_s = d1["self"] - d0["self"], w1["self"] - w0["self"]
        reaped_s = d1["children"] - d0["children"]
        scraped = scrape(url, args.scrapes)
        mem = ps.memory_full_info()
        worker_mem = worker_after.memory_full_info() if worker_after else None
        result = {
            "round": n, "span_s": round(span, 1), "warmup_s": args.warmup,
            "fast_cycles": (cycles1 or 0) - (cycles0 or 0),
            "engine_page_bytes": page_bytes,
            "daemon_cpu_s": round(daemon_s, 3), "nvml_worker_cpu_s": round(worker_s, 3),
            "core_percent_daemon_and_worker": round((daemon_s + worker_s) / span * 100, 3),
            "core_percent_daemon": round(daemon_s / span * 100, 3),
            "core_percent_nvml_worker": round(worker_s / span * 100, 3),
            "daemon_threads_cpu_in_span": thread_split(th0, th1),
            # the exec service's process tree is a psutil children() walk of every
            # /proc/PID/stat each fast cycle: its cost grows with this count
            "host_processes_at_start_and_end": [procs0, len(psutil.pids())],
            "nvml_worker_same_pid": worker is not None and worker_after is not None
            and worker.pid == worker_after.pid,
            "reaped_children_cpu_s": round(reaped_s, 3),
            "core_percent_reaped_children": round(reaped_s / span * 100, 3),
            "children_started_in_span_cpu_s_by_kind_polled": {
                k: round(v, 3) for k, v in sorted(by_kind.items())},
            "children_started_in_span": sum(1 for p in children.seen if p not in before),
            "uss_daemon_mib": round(mem.uss / 2**20, 1),
            "rss_daemon_mib": round(mem.rss / 2**20, 1),
            "uss_nvml_worker_mib": round(worker_mem.uss / 2**20, 1) if worker_mem else None,
            **{k: v for k, v in scraped.items() if k != "text"},
            "evidence": evidence(url, tmp, scraped["text"]),
        }
        return result
    finally:
        if children is not None:
            children.stop.set()
            children.poll()
        stop_all(procs, children.everything if children else set())
        if args.keep_logs:
            print(f"round {n}: logs in {tmp}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--span", type=float, default=120.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--fast-interval", type=float, default=5.0)
    p.add_argument("--active-probe-interval", type=float, default=30.0)
    p.add_argument("--engines", type=int, default=1,
                   help="vLLM engines on the page (data parallel): its size")
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--nvml-lib", help="folder put first on LD_LIBRARY_PATH (the fake NVML "
                   "and fake libcuda)")
    p.add_argument("--gpuguard", help="command that runs gpuguard (default: this "
                   "interpreter's `-m gpuguard` in this tree), e.g. /opt/venv/bin/gpuguard")
    p.add_argument("--tree", help="a source tree run on PYTHONPATH (and as cwd)")
    p.add_argument("--daemon-args", default="", help="more daemon options, e.g. --no-udev")
    p.add_argument("--label", default="", help="a name for this run in the JSON")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--out", type=Path)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    # a SIGTERM of the bench runs the rounds' finally blocks too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rounds = []
    for n in range(1, args.rounds + 1):
        rounds.append(one_round(args, n))
        r = rounds[-1]
        print(f"round {n}: daemon+worker {r['core_percent_daemon_and_worker']} % of a core "
              f"(daemon {r['core_percent_daemon']}, worker {r['core_percent_nvml_worker']}); "
              f"reaped children {r['core_percent_reaped_children']} %; "
              f"{r['fast_cycles']} cycles; page {r['engine_page_bytes']} B", flush=True)
    shares = [r["core_percent_daemon_and_worker"] for r in rounds]
    out = {
        "machine": platform.node(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "label": args.label,
        "fake_nvml": bool(args.nvml_lib), "gpuguard": args.gpuguard or "python -m gpuguard",
        "tree": args.tree or str(REPO),
        "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
        "settings": {"fast_interval_s": args.fast_interval,
                     "active_probe_interval_s": args.active_probe_interval,
                     "warmup_s": args.warmup, "span_s": args.span, "engines": args.engines,
                     "daemon_args": args.daemon_args},
        "median_core_percent_daemon_and_worker": statistics.median(shares),
        "rounds": rounds,
    }
    text = json.dumps(out, indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
