"""service.* in the real daemon with real processes: services started by the exec
backend, their memory read by psutil, their GPU memory through the fake NVML's
per-process accounting, an inference probe against an HTTP server on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import free_port, get, metric_lines
from tests.daemon.test_metrics_doc import documented, exported

MIB = 1024 * 1024

# Grows its resident memory by 1 MiB every 0.1 s, for as long as it runs (a leak).
LEAK = """
import time
blocks = []
while True:
    blocks.append(b"\\x01" * (1024 * 1024))
    time.sleep(0.1)
"""

# Takes 64 MiB in its first two seconds (a warm-up), then holds it.
WARMUP = """
import time
blocks = []
for _ in range(8):
    blocks.append(b"\\x01" * (8 * 1024 * 1024))
    time.sleep(0.25)
while True:
    time.sleep(1)
"""

# GET /health is always 200; POST /v1/completions is 500 while the file `broken` beside
# the script exists, else a one-token completion.
SERVER = """
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

BROKEN = sys.argv[2]
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)  # loading its model

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200, {"status": "ok"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if os.path.exists(BROKEN):
            self._send(500, {"error": "CUDA error: an illegal memory access"})
        else:
            self._send(200, {"choices": [{"text": "hi"}]})

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _exec_variant(tmp: Path, name: str, argv: list[str]) -> dict[str, Any]:
    """start/stop/running commands of one variant and its pid file."""
    pid = tmp / f"{name}.pid"
    command = " ".join(argv)
    return {
        "start": ["sh", "-c", f"{command} >/dev/null 2>&1 & echo $! > {pid}"],
        "stop": ["sh", "-c", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}; true"],
        "running": ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"],
        "pid_file": str(pid),
    }


def _service(name: str, gpu: dict[str, Any], cpu: dict[str, Any], probe: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    return {"name": name, "backend": "exec", "probe": probe, **extra,
            "exec": {"start_gpu": gpu["start"], "stop_gpu": gpu["stop"],
                     "running_gpu": gpu["running"], "pid_file_gpu": gpu["pid_file"],
                     "start_cpu": cpu["start"], "stop_cpu": cpu["stop"],
                     "running_cpu": cpu["running"], "pid_file_cpu": cpu["pid_file"]}}


def _pid(path: str, timeout: float = 10.0) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = Path(path).read_text().strip() if Path(path).exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def service_metrics_documented() -> set[str]:
    return {n for n in documented("## The daemon") if n.startswith("gpuguard_service_")}


def _kill(tmp: Path, names: list[str]) -> None:
    """The services the daemon's stop left running (it never stops them: they outlive it)."""
    for name in names:
        pid = tmp / f"{name}.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid.read_text()), signal.SIGKILL)


def _rules_dir(tmp: Path) -> Path:
    rules = tmp / "rules.d"
    rules.mkdir()
    # seconds, not minutes: a 20 s window sampled every 0.3 s; the first second after a
    # start is warm-up (the warm-up service ramps for two: the rest must be told apart
    # by its growth stopping)
    (rules / "fast.yaml").write_text(textwrap.dedent("""\
        overrides:
          service.memory_growth:
            thresholds: {window_s: 20, warmup_s: 1, min_samples: 10, min_r2: 0.8,
                         recent_ratio: 0.5, horizon_s: 1000000}
        """))
    return rules


def test_a_leak_is_flagged_and_a_warmup_is_not_and_gpu_memory_names_the_process(
        tmp_path: Path, start_daemon: Any, fake_env: Any) -> None:
    scripts = {}
    for name, code in (("leak", LEAK), ("warmup", WARMUP)):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(code)
    idle = _exec_variant(tmp_path, "idle", ["sleep", "600"])
    services = [
        _service(name, _exec_variant(tmp_path, name, [sys.executable, str(scripts[name])]),
                 idle, {"exec": ["true"], "timeout": 10})
        for name in ("leak", "warmup")]
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": services}))
    procs = tmp_path / "procs"
    procs.write_text("")
    daemon = start_daemon("--fast-interval", "0.3", "--slow-interval", "60", "--timeout", "2",
                          "--config", str(config), "--rules", str(_rules_dir(tmp_path)),
                          env=fake_env(procs_file=procs, mem_total_mib=10000))
    try:
        leak_pid, warmup_pid = _pid(str(tmp_path / "leak.pid")), _pid(str(tmp_path / "warmup.pid"))
        # NVML lists the processes by pid; the daemon names them from its --path.procfs (the
        # test's own host: its processes' names written there as /proc shows them)
        for pid in (leak_pid, warmup_pid):
            (tmp_path / "own-host" / "proc" / str(pid)).mkdir()
            (tmp_path / "own-host" / "proc" / str(pid) / "comm").write_text("python\n")
        started = time.monotonic()
        warmup_statuses: set[str] = set()
        warmup_said: set[bool] = set()
        flagged = None
        gpu_mib = 100
        while time.monotonic() - started < 40:
            # the leak's GPU memory grows too; the warm-up holds 9,600 of 10,000 MiB
            gpu_mib += 30
            procs.write_text(f"0 {leak_pid} {gpu_mib}\n0 {warmup_pid} 9900\n")
            result = daemon.result("service.memory_growth")
            per = (result or {}).get("observed", {}).get("service_status", {})
            if "warmup" in per:
                warmup_statuses.add(per["warmup"])
                rss = result["observed"]["services"]["warmup"].get("host RSS", {})
                warmup_said.add((rss.get("slope_bytes_per_s") or 0) > 0
                                and "growth stopped" in result["message"])
            if per.get("leak") == "warning" and flagged is None:
                flagged = time.monotonic() - started
                leak_result = result
            if flagged is not None and time.monotonic() - started > flagged + 5:
                break
            time.sleep(0.3)
        assert flagged is not None, daemon.log.read_text()[-3000:]
        assert warmup_statuses == {"ok"}, warmup_statuses
        # it was judged, rising over the window, and let go because it stopped rising
        assert True in warmup_said
        assert leak_result["status"] == "warning"
        assert "leak: host RSS grows" in leak_result["message"]
        assert "GPU memory grows" in leak_result["message"]
        seen = leak_result["observed"]["services"]["leak"]["host RSS"]
        # 1 MiB every 0.1 s is about 10 MiB/s (psutil's RSS, so not exact)
        assert 3 * MIB < seen["slope_bytes_per_s"] < 20 * MIB

        gpu = daemon.result("service.gpu_memory")
        assert gpu is not None and gpu["status"] == "warning"
        assert gpu["observed"]["service_status"] == {"leak": "ok", "warmup": "warning"}
        assert f"{warmup_pid} python" in gpu["message"] and "9900 MiB" in gpu["message"]

        metrics = daemon.metrics()
        assert metric_lines(metrics, "gpuguard_service_rss_bytes")
        assert any('gpu="0",service="warmup"' in line and line.endswith(f" {9900 * MIB:.8e}")
                   for line in metric_lines(metrics, "gpuguard_service_gpu_memory_bytes")), \
            metric_lines(metrics, "gpuguard_service_gpu_memory_bytes")
        assert any('memory="host",service="leak"' in line for line in
                   metric_lines(metrics, "gpuguard_service_memory_exhaustion_seconds"))
        # every service metric docs/metrics.md lists is exported (inference: the next test;
        # the engine's: tests/daemon/test_engine_services.py)
        assert {n for n in service_metrics_documented()
                if "inference" not in n and "_engine_" not in n} <= \
            exported(metrics)
    finally:
        daemon.stop()
        _kill(tmp_path, ["leak", "warmup", "idle"])


def test_health_answers_but_inference_fails_so_the_service_fails_over(
        tmp_path: Path, start_daemon: Any, fake_env: Any) -> None:
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    ports = {"gpu": free_port(), "cpu": free_port()}
    variants = {v: _exec_variant(tmp_path, f"llm-{v}", [
        sys.executable, str(server), str(ports[v]), str(tmp_path / f"broken-{v}")])
        for v in ports}
    probe = {"http": {v: f"http://127.0.0.1:{p}/v1/completions" for v, p in ports.items()},
             "body": {"model": "m", "prompt": "hi", "max_tokens": 1},
             "json_path": "choices.0.text", "request_timeout": 5, "timeout": 15}
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [_service(
        "llm", variants["gpu"], variants["cpu"], probe, failover_after=2,
        failback="manual", rules=["service.inference"])]}))
    daemon = start_daemon("--fast-interval", "0.3", "--slow-interval", "60", "--timeout", "2",
                          "--config", str(config), env=fake_env())
    try:
        ok = daemon.wait_for(lambda: (daemon.result("service.inference") or {}).get("status")
                             == "ok", 20, "the inference probe to pass")
        assert ok
        (tmp_path / "broken-gpu").write_text("")
        # /health still answers 200 ...
        assert get(f"http://127.0.0.1:{ports['gpu']}/health")[0] == 200

        def failed() -> dict[str, Any] | None:
            r = daemon.result("service.inference")
            return r if r and r["status"] == "critical" else None

        result = daemon.wait_for(failed, 10, "service.inference to fail")
        assert "answered 500, expected 200" in result["message"]
        assert result["observed"]["service_status"] == {"llm": "critical"}
        metrics = daemon.metrics()
        assert 'gpuguard_service_inference_success{service="llm"} 0.0' in metrics
        assert metric_lines(metrics, "gpuguard_service_inference_latency_seconds")
        assert {n for n in service_metrics_documented() if "inference" in n} <= \
            exported(metrics)
        # ... but the supervisor counts the failed inference and moves to the CPU variant
        daemon.wait_for(lambda: 'gpuguard_failover_active{service="llm"} 1.0'
                        in daemon.metrics(), 30, "the failover to CPU")
        daemon.wait_for(lambda: (daemon.result("service.inference") or {}).get("status")
                        == "ok", 10, "the CPU variant's inference to pass")
    finally:
        daemon.stop()
        _kill(tmp_path, [f"llm-{v}" for v in ports])


def test_a_service_still_starting_is_not_failed_over(tmp_path: Path, start_daemon: Any,
                                                     fake_env: Any) -> None:
    """Its inference fails for 3 s while it loads: those cycles are unknown, not failed."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    ports = {"gpu": free_port(), "cpu": free_port()}
    variants = {v: _exec_variant(tmp_path, f"slow-{v}", [
        sys.executable, str(server), str(ports[v]), str(tmp_path / "never"), "3"])
        for v in ports}
    probe = {"http": {v: f"http://127.0.0.1:{p}/v1/completions" for v, p in ports.items()},
             "body": {"prompt": "hi"}, "json_path": "choices.0.text",
             "request_timeout": 2, "timeout": 20}
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [_service(
        "slow", variants["gpu"], variants["cpu"], probe, failover_after=2,
        failback="manual", rules=["service.inference"])]}))
    daemon = start_daemon("--fast-interval", "0.3", "--slow-interval", "60", "--timeout", "2",
                          "--config", str(config), env=fake_env())
    try:
        seen = daemon.wait_for(lambda: (daemon.result("service.inference") or {}).get("status")
                               == "unknown", 10, "the starting service to be unknown")
        assert seen
        daemon.wait_for(lambda: (daemon.result("service.inference") or {}).get("status")
                        == "ok", 20, "the service to answer")
        time.sleep(1.5)  # the cycles queued while it started are handled by now
        metrics = daemon.metrics()
        assert 'gpuguard_failover_active{service="slow"} 0.0' in metrics
        assert 'gpuguard_failover_transitions_total{direction="to_cpu",service="slow"} 0.0' \
            in metrics
    finally:
        daemon.stop()
        _kill(tmp_path, [f"slow-{v}" for v in ports])


def test_a_server_that_trickles_its_answer_does_not_hold_the_fast_cycle(
        tmp_path: Path, h200: Any) -> None:
    """The review's slowloris: Content-Length 100,000, then one byte every 0.2 s. Each
    read is quick, so only the request's overall deadline (request_timeout 1 s) ends it;
    the cycle's sample returns soon after, the request timed out."""
    import socket
    import threading

    from gpuguard.daemon.services import ServiceWatch
    from gpuguard.supervisor.config import load_services
    from gpuguard.supervisor.service import Supervisor

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        with sock:
            conn, _ = sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                with contextlib.suppress(OSError):
                    while not stop.wait(0.2):
                        conn.sendall(b" ")

    threading.Thread(target=trickle, daemon=True).start()
    idle = _exec_variant(tmp_path, "idle", ["sleep", "600"])
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [_service("llm", idle, idle, {
        "http": f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions",
        "body": {"prompt": "hi"}, "json_path": "choices.0.text", "request_timeout": 1})]}))
    [service] = load_services(config)
    supervisor = Supervisor(service, tmp_path / "state", set())
    supervisor.settled.set()  # running, not moving: the request is sent
    watch = ServiceWatch([supervisor])
    done = threading.Event()
    started = time.monotonic()
    thread = threading.Thread(target=lambda: (watch.sample(h200, time.monotonic()), done.set()),
                              daemon=True)
    thread.start()
    thread.join(10)
    stop.set()
    assert done.is_set(), "the cycle still waits for the request after 10 s"
    assert time.monotonic() - started < 5  # does not hang
    answer = h200.host.services.get()["llm"]["inference"]
    assert answer["ok"] is False and answer["timed_out"] is True, answer


@pytest.mark.parametrize("kind", ["request", "health"])
def test_the_warmup_starts_when_the_service_first_answers(tmp_path: Path, h200: Any,
                                                          kind: str) -> None:
    """A service that loads its model for 2 s before it listens: its run's warm-up anchor
    (`answered_at`) is the cycle its probe (an inference request, or a plain health URL)
    first passed, not the process start, and it stays there."""
    import subprocess

    from gpuguard.daemon.services import ServiceWatch
    from gpuguard.supervisor.config import load_services
    from gpuguard.supervisor.service import Supervisor

    server = tmp_path / "server.py"
    server.write_text(SERVER)
    port = free_port()
    variant = _exec_variant(tmp_path, "llm", [sys.executable, str(server), str(port),
                                              str(tmp_path / "never"), "2"])
    url = f"http://127.0.0.1:{port}"
    probe = ({"http": f"{url}/v1/completions", "body": {"prompt": "hi"},
              "json_path": "choices.0.text", "request_timeout": 1}
             if kind == "request" else {"http": f"{url}/health"})
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [_service("llm", variant, variant, probe)]}))
    [service] = load_services(config)
    supervisor = Supervisor(service, tmp_path / "state", set())
    supervisor.settled.set()
    watch = ServiceWatch([supervisor])
    subprocess.run(variant["start"], check=True)
    try:
        _pid(variant["pid_file"])
        seen: list[tuple[float, Any]] = []
        end = time.monotonic() + 15
        while time.monotonic() < end and (not seen or seen[-1][1] is None
                                          or len([s for s in seen if s[1]]) < 3):
            now = time.monotonic()  # as the daemon feeds it
            watch.sample(h200, now)
            entry = h200.host.services.get()["llm"]
            assert not entry.get("error"), entry
            seen.append((now, entry["answered_at"]))
            time.sleep(0.3)
        assert seen[0][1] is None, seen  # still loading: no answer, no warm-up yet
        first = next(now for now, answered in seen if answered is not None)
        assert {answered for _, answered in seen if answered is not None} == {first}, seen
        started = time.monotonic() - (time.time() - entry["started_at"])  # wall, on our clock
        assert first > started + 1  # later than the process start
    finally:
        subprocess.run(variant["stop"], check=False)
