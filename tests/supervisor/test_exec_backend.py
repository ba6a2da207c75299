"""The exec backend with real commands: each variant is an HTTP server process that the
user's start/stop commands launch and kill; the supervisor runs in-process."""

import contextlib
import json
import sys
import time

from gpuguard.io.clock import boottime
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor
from tests.daemon.conftest import free_port
from tests.supervisor.conftest import fetch, wait


def test_exec_backend_moves_the_service(tmp_path):
    ports = {"gpu": free_port(), "cpu": free_port()}
    for v in ports:
        (tmp_path / v).mkdir()
        (tmp_path / v / "variant").write_text(v)

    def start(v):
        return ["sh", "-c", f"{sys.executable} -m http.server {ports[v]} --bind 127.0.0.1 "
                f"--directory {tmp_path / v} >/dev/null 2>&1 & echo $! > {tmp_path}/{v}.pid"]

    def stop(v):
        return ["sh", "-c", f"[ -f {tmp_path}/{v}.pid ] && kill $(cat {tmp_path}/{v}.pid); "
                f"rm -f {tmp_path}/{v}.pid; true"]

    def running(v):
        return ["sh", "-c", f"[ -f {tmp_path}/{v}.pid ] && kill -0 $(cat {tmp_path}/{v}.pid)"]

    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "batch", "backend": "exec", "min_cpu_time": 0, "failback_after": 2,
        "probe": {"http": {v: f"http://127.0.0.1:{p}/variant" for v, p in ports.items()},
                  "timeout": 10},
        "exec": {"start_gpu": start("gpu"), "stop_gpu": stop("gpu"),
                 "start_cpu": start("cpu"), "stop_cpu": stop("cpu"),
                 "running_gpu": running("gpu"), "running_cpu": running("cpu")}}]}))
    [service] = load_services(config)
    supervisor = Supervisor(service, tmp_path / "state", {"ecc.uncorrected"})
    try:
        supervisor.recover()  # nothing runs: it starts the GPU variant
        assert fetch(f"http://127.0.0.1:{ports['gpu']}/variant") == "gpu"
        bad = [Result("ecc.uncorrected", Status.CRITICAL, Status.CRITICAL, "2 DBE",
                      GpuId(0, "u", "p"))]
        good = [Result("ecc.uncorrected", Status.OK, Status.CRITICAL, "ok", GpuId(0, "u", "p"))]
        for _ in range(3):
            supervisor.handle_cycle(bad, boottime())
        assert supervisor.state.active == "cpu"
        assert fetch(f"http://127.0.0.1:{ports['cpu']}/variant") == "cpu"
        assert wait(lambda: fetch(f"http://127.0.0.1:{ports['gpu']}/variant") is None, 5)
        for _ in range(2):
            supervisor.handle_cycle(good, boottime())
        assert supervisor.state.active == "gpu"
        assert fetch(f"http://127.0.0.1:{ports['gpu']}/variant") == "gpu"
    finally:
        for v in ports:
            supervisor.backend.stop(v)


# A variant: GET /health answers 200 and says which variant it is. It logs every request
# to stderr, as servers do (the output a start command's background child holds).
SERVE = """
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = sys.argv[2].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def documented_exec_service(tmp_path, ports):
    """The exec example of docs/supervisor.md as printed, with its server, ports and
    /run replaced: the test runs the form the doc shows."""
    import re

    import yaml

    from tests.conftest import REPO

    doc = (REPO / "docs" / "supervisor.md").read_text()
    section = doc.split("## The exec backend", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    assert "& echo $! > /run/llm-gpu.pid" in block  # the form this test is about
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    run = tmp_path / "run"
    run.mkdir()
    text = block.replace("/run/", f"{run}/")
    text = text.replace("/opt/llm/serve --port 8001", f"{sys.executable} {script} "
                        f"{ports['gpu']} gpu")
    text = text.replace("/opt/llm/serve --port 8002 --cpu", f"{sys.executable} {script} "
                        f"{ports['cpu']} cpu")
    for variant, port in (("gpu", 8001), ("cpu", 8002)):
        text = text.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{ports[variant]}/")
    assert "/opt/llm" not in text and "8001" not in text and "8002" not in text
    doc = yaml.safe_load(text)
    doc["services"][0].update(min_cpu_time=0, failback="manual")
    doc["services"][0]["probe"]["timeout"] = 20
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps(doc))
    return config, run


def test_the_documented_start_command_returns_at_once_end_to_end(tmp_path, start_daemon):
    """`server & echo $! > pid` (docs/supervisor.md): the server it leaves running holds
    the command's stdout and stderr. gpuguard used to read them to their end, so each
    start waited out its 300 s deadline: the daemon never settled on the GPU variant and
    a move to CPU never finished. Now: the daemon starts the GPU variant, `gpuguard
    failover to cpu` moves it within seconds, and the servers outlive the commands."""
    import os
    import signal
    import subprocess

    from tests.conftest import REPO
    from tests.daemon.conftest import host_snapshot, write_snapshot

    ports = {"gpu": free_port(), "cpu": free_port()}
    config, run = documented_exec_service(tmp_path, ports)
    snapshot = tmp_path / "host.json"
    write_snapshot(snapshot, host_snapshot(2))
    state_file = tmp_path / "state" / "failover-llm.json"

    def settled_on(variant):
        try:
            st = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return False
        return st["active"] == variant and st["transition"] is None

    started = time.monotonic()
    daemon = start_daemon("--input", str(snapshot), "--config", str(config),
                          "--fast-interval", "0.5", "--slow-interval", "600")
    try:
        assert wait(lambda: fetch(f"http://127.0.0.1:{ports['gpu']}/health") == "gpu", 30)
        # the supervisor is past the start command (it waited 300 s for it before)
        assert wait(lambda: settled_on("gpu") and daemon.result("service.inference"), 30), \
            daemon.log.read_text()[-2000:]
        to_gpu_s = time.monotonic() - started
        moved = subprocess.run(
            [sys.executable, "-m", "gpuguard", "failover", "to", "cpu", "llm", "--reason",
             "test", "--state-dir", str(tmp_path / "state"), "--wait", "30"],
            cwd=REPO, capture_output=True, text=True, check=False)
        assert moved.returncode == 0, moved.stdout + moved.stderr + daemon.log.read_text()
        assert fetch(f"http://127.0.0.1:{ports['cpu']}/health") == "cpu"
        assert wait(lambda: fetch(f"http://127.0.0.1:{ports['gpu']}/health") is None, 10)
        assert not (run / "llm-gpu.pid").exists()  # the documented stop command ran
        to_cpu_s = time.monotonic() - started - to_gpu_s
        print(f"\nGPU variant settled {to_gpu_s:.1f} s after the daemon started; "
              f"moved to CPU in {to_cpu_s:.1f} s")
    finally:
        daemon.stop()
        for pid_file in run.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _backend(tmp_path, **commands):
    from gpuguard.supervisor.backends.exec import ExecBackend

    base = {"start_gpu": ["true"], "stop_gpu": ["true"], "start_cpu": ["true"],
            "stop_cpu": ["true"]}
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "probe": {"exec": ["true"]},
        "exec": {**base, **commands}}]}))
    [service] = load_services(config)
    return ExecBackend(service)


def _gone(pid):
    """The process has ended (reaped, or a zombie waiting for its parent)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_command_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    """A start that hangs fails its step (BackendError, so the transition puts the source
    back) and leaves nothing behind: its whole process group is killed."""
    import pytest

    from gpuguard.supervisor.backends import BackendError

    child = tmp_path / "child.pid"
    backend = _backend(tmp_path, start_cpu=[
        "sh", "-c", f"sleep 600 & echo $! > {child}; sleep 600"])
    backend.deadline_s = 1.0  # 300 s by default
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"start_cpu \(sh -c .*\) did not exit within 1 s"):
        backend.start("cpu")
    assert time.monotonic() - started < 10
    pid = int(child.read_text())
    assert wait(lambda: _gone(pid), 5), "the command's background child outlived its deadline"


def test_a_failing_stop_says_why_and_a_missing_command_is_a_backend_error(tmp_path):
    import pytest

    from gpuguard.supervisor.backends import BackendError

    backend = _backend(tmp_path, stop_gpu=["sh", "-c", "echo 'no such unit: llm' >&2; exit 5"],
                       running_gpu=["/nonexistent/is-running"])
    with pytest.raises(BackendError, match=r"stop_gpu \(.*\) exited 5: no such unit: llm$"):
        backend.stop("gpu")
    with pytest.raises(BackendError, match=r"running_gpu \(/nonexistent/is-running\) could "
                                           r"not start: .*No such file"):
        backend.running("gpu")
