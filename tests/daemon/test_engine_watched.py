"""An engine is watched whether or not its service has a pid file (issue 28, item 6).

The exec example of docs/supervisor.md, as printed, with its pid_file_* lines taken out
(or kept), run by the real daemon: each variant is a real HTTP server on loopback
(tests/engines/engine_replay.py) whose GET /health answers 200 whatever it does and whose
/metrics is a vLLM page. The engine hangs (requests running and waiting, the token counter
flat, /health still 200): it fails over within stuck_after and failover_after (3) cycles.
Before, without a pid file, service.engine stayed skipped "no engine gpuguard knows" and
the hung engine was never failed over; with one, the CPU variant's engine read "no engine
gpuguard knows" right after the failover, before it was ever tried."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.io.atomic import write_text
from tests.conftest import FIXTURES, REPO
from tests.daemon.conftest import free_port, host_snapshot, write_snapshot
from tests.daemon.test_engine_services import (
    INTERVAL,
    REPLAY,
    STUCK_AFTER,
    _cycles,
    _per,
    _rules,
)

FIXTURE = FIXTURES / "engines" / "vllm-0.11.prom"


def documented_example(tmp: Path, ports: dict[str, int], pid_file: bool
                       ) -> tuple[Path, dict[str, Path]]:
    """The exec block of docs/supervisor.md with its server, ports and /run replaced, and
    its `pid_file_*` keys taken out unless `pid_file` (the start and stop commands still
    write and read their own pid files: only gpuguard is not told of them)."""
    doc = (REPO / "docs" / "supervisor.md").read_text()
    section = doc.split("## The exec backend", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert match is not None
    text = match.group(1)
    run = tmp / "run"
    run.mkdir()
    controls = {v: tmp / f"{v}.control.json" for v in ports}
    for variant, (old, port) in {"gpu": ("/opt/llm/serve --port 8001", 8001),
                                 "cpu": ("/opt/llm/serve --port 8002 --cpu", 8002)}.items():
        write_text(controls[variant], json.dumps({"mode": "rising"}))
        serve = (f"{sys.executable} {REPLAY} {ports[variant]} {FIXTURE} vllm "
                 f"{controls[variant]} >/dev/null 2>&1")
        assert old in text, old
        text = text.replace(old, serve).replace(f"127.0.0.1:{port}/",
                                                f"127.0.0.1:{ports[variant]}/")
    text = text.replace("/run/", f"{run}/")
    assert "/opt/llm" not in text and "8001" not in text and "8002" not in text
    config = yaml.safe_load(text)
    service = config["services"][0]
    assert service["probe"]["http"]["gpu"].endswith("/health")  # a plain health URL
    assert "engine" not in service  # the default, auto
    for variant in ("gpu", "cpu"):
        assert f"pid_file_{variant}" in service["exec"]  # what the doc shows
        if not pid_file:
            del service["exec"][f"pid_file_{variant}"]
    service.update(failback="manual", min_cpu_time=0)
    service["probe"]["timeout"] = 20
    path = tmp / "gpuguard.yaml"
    path.write_text(json.dumps(config))
    return path, controls


def _engine_message(daemon: Any) -> str:
    return str((daemon.result("service.engine") or {}).get("message") or "")


@pytest.mark.parametrize("pid_file", [False, True], ids=["no-pid-file", "pid-file"])
def test_a_stuck_engine_of_the_documented_exec_example_fails_over(
        tmp_path: Path, start_daemon: Any, pid_file: bool) -> None:
    ports = {"gpu": free_port(), "cpu": free_port()}
    config, controls = documented_example(tmp_path, ports, pid_file)
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2))
    daemon = start_daemon("--input", str(snap), "--config", str(config), "--rules",
                          str(_rules(tmp_path)), "--fast-interval", str(INTERVAL),
                          "--slow-interval", "600")
    messages: list[str] = []
    try:
        def read_ok() -> bool:
            messages.append(_engine_message(daemon))
            return _per(daemon, "service.engine")[0] == "ok"

        daemon.wait_for(read_ok, 30, "the engine to be recognised, read and ok")
        _, seen = _per(daemon, "service.engine")
        assert seen["engine"] == "vllm" and seen["state"] == "ok", seen
        message = _engine_message(daemon)
        # without a run identity it says how a restart is seen; with one it does not
        no_identity = "no run identity (exec.pid_file_gpu is not configured"
        assert (no_identity in message) is not pid_file, message
        # before its first read the engine was never "no engine gpuguard knows"
        assert not any("no engine gpuguard knows" in m for m in messages), messages

        # the hang: requests held, the counter flat, /health still 200
        write_text(controls["gpu"], json.dumps({"mode": "flat"}))
        cycles_then = _cycles(daemon.metrics())
        daemon.wait_for(lambda: "failover_started" in daemon.log.read_text(), 60,
                        "the failover of the stuck engine")
        cycles = _cycles(daemon.metrics()) - cycles_then
        started = [json.loads(line) for line in daemon.log.read_text().splitlines()
                   if "failover_started" in line]
        assert "service.engine" in started[0]["reason"] and "stuck" in started[0]["reason"]
        # stuck_after of cycles (a cycle lasts at least the interval, so no more fit in
        # it), failover_after (3) critical cycles, a cycle for the first flat read and one
        # for the scrape of the counter after the log line
        print(f"\nstuck -> failover_started in {cycles} fast cycles "
              f"(stuck_after {STUCK_AFTER} s, interval {INTERVAL} s)")
        assert cycles <= STUCK_AFTER / INTERVAL + 3 + 2, cycles

        # the CPU variant's engine, right after the failover: never "no engine gpuguard
        # knows" before it was tried; then it is found and read
        after: list[str] = []

        def cpu_read() -> bool:
            after.append(_engine_message(daemon))
            status, seen = _per(daemon, "service.engine")
            return 'gpuguard_failover_active{service="llm"} 1.0' in daemon.metrics() \
                and status == "ok" and seen.get("engine") == "vllm"

        daemon.wait_for(cpu_read, 40, "the CPU variant's engine to be read")
        assert not any("no engine gpuguard knows" in m for m in after), after
    finally:
        daemon.stop()
        for pid in (tmp_path / "run").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGKILL)


def _server(tmp: Path, name: str, port: int, files: dict[str, str] | None = None,
            mode: str | None = None) -> list[str]:
    """A start command that leaves a real HTTP server on loopback: the replayed vLLM
    engine in `mode`, or a plain file server holding `files` (GET /health, /metrics)."""
    pid = tmp / f"{name}.pid"
    if mode is not None:
        control = tmp / f"{name}.control.json"
        write_text(control, json.dumps({"mode": mode}))
        argv = f"{sys.executable} {REPLAY} {port} {FIXTURE} vllm {control}"
    else:
        root = tmp / name
        root.mkdir()
        for file, text in (files or {}).items():
            (root / file).write_text(text)
        argv = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {root}"
    return ["sh", "-c", f"{argv} >/dev/null 2>&1 & echo $! > {pid}"]


def test_every_engine_message_says_what_is_true(tmp_path: Path, start_daemon: Any) -> None:
    """service.engine's message for each reason an engine is not judged, none of them a
    false "no engine gpuguard knows" (issue 28): trying (a /metrics that answers 503),
    no engine gpuguard knows on this page (a Prometheus page of no engine), no metrics
    URL (an exec probe, no engine.metrics), not read (`engine: none`, as a scalar). Exec
    services without pid files, run by the real daemon."""
    ports = {name: free_port() for name in ("loading", "other", "plain")}
    stop = ["sh", "-c", "true"]

    def service(name: str, start: list[str], probe: dict[str, Any], **extra: Any
                ) -> dict[str, Any]:
        pid = tmp_path / f"{name}.pid"
        running = ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"]
        return {"name": name, "backend": "exec", "failback": "manual", "probe": probe,
                "exec": {"start_gpu": start, "stop_gpu": stop, "start_cpu": stop,
                         "stop_cpu": stop, "running_gpu": running, "running_cpu": running},
                **extra}

    def health(name: str) -> dict[str, Any]:
        return {"http": f"http://127.0.0.1:{ports[name]}/health", "timeout": 20}

    page = "# TYPE other_requests_total counter\nother_requests_total 5\n"
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [
        service("loading", _server(tmp_path, "loading", ports["loading"], mode="down"),
                health("loading")),
        service("other", _server(tmp_path, "other", ports["other"],
                                 {"health": "ok", "metrics": page}), health("other")),
        service("noprobe", _server(tmp_path, "noprobe", free_port(), {}),
                {"exec": ["true"], "timeout": 20}),
        service("plain", _server(tmp_path, "plain", ports["plain"], {"health": "ok"}),
                health("plain"), engine="none"),
    ]}))
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2))
    daemon = start_daemon("--input", str(snap), "--config", str(config), "--fast-interval",
                          str(INTERVAL), "--slow-interval", "600")
    url = "http://127.0.0.1:{}/metrics".format
    expected = [
        f"loading: trying: 1 of 5 tries at {url(ports['loading'])} found no Prometheus "
        "page (the last: answered 503); the next in",
        f"other: no engine gpuguard knows on {url(ports['other'])} (llamacpp, sglang, tgi, "
        "triton, vllm): judged by its probe alone",
        "noprobe: no metrics URL for its gpu variant (its probe has no http URL: set "
        "engine.metrics): judged by its probe alone",
        "plain: not read (`engine: none`): judged by its probe alone",
    ]
    try:
        seen: list[str] = []

        def all_said() -> bool:
            seen.append(_engine_message(daemon))
            return all(part in seen[-1] for part in expected)

        try:
            daemon.wait_for(all_said, 40, "every service's engine message")
        except AssertionError as exc:
            raise AssertionError(f"the last message: {seen[-1:]}") from exc
        result = daemon.result("service.engine") or {}
        assert result.get("status") == "skipped", result
        # "no engine gpuguard knows" only ever of the page that holds none
        for message in seen:
            for part in message.split("; "):
                assert "no engine gpuguard knows" not in part or part.startswith("other: "), \
                    message
    finally:
        daemon.stop()
        for pid in tmp_path.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGKILL)
