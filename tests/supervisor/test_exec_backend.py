"""The exec backend with real commands: each variant is an HTTP server process that the
user's start/stop commands launch and kill; the supervisor runs in-process."""

import sys

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

    import json

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
