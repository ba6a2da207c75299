"""The supervisor fails safe: a failed transition always puts the source back, whatever its
bookkeeping holds, and no request file (a directory, a FIFO, someone else's) stops the
counting of cycles. The exec backend with real processes; the supervisor in-process."""

import json
import os
import sys
import time

import pytest
from structlog.testing import capture_logs

from gpuguard.io.clock import boottime
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor import policy, state
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor
from tests.daemon.conftest import free_port
from tests.supervisor.conftest import fetch, wait

BAD = [Result("ecc.uncorrected", Status.CRITICAL, Status.CRITICAL, "2 DBE", GpuId(0, "u", "p"))]


def write_config(tmp_path, exec_section, probe, failover_after=3):
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "batch", "backend": "exec", "min_cpu_time": 0, "failover_after": failover_after,
        "probe": probe, "exec": exec_section}]}))
    [service] = load_services(config)
    return service


@pytest.fixture
def servers(tmp_path):
    """Each variant an HTTP server process; start_cpu fails while `cpu-broken` exists."""
    ports = {"gpu": free_port(), "cpu": free_port()}
    for v in ports:
        (tmp_path / v).mkdir()
        (tmp_path / v / "variant").write_text(v)

    def start(v):
        broken = f"[ ! -f {tmp_path}/{v}-broken ] || exit 1; "
        return ["sh", "-c", broken + f"{sys.executable} -m http.server {ports[v]} --bind "
                f"127.0.0.1 --directory {tmp_path / v} >/dev/null 2>&1 & "
                f"echo $! > {tmp_path}/{v}.pid"]

    def stop(v):
        return ["sh", "-c", f"[ -f {tmp_path}/{v}.pid ] && kill $(cat {tmp_path}/{v}.pid); "
                f"rm -f {tmp_path}/{v}.pid; true"]

    def running(v):
        return ["sh", "-c", f"[ -f {tmp_path}/{v}.pid ] && kill -0 $(cat {tmp_path}/{v}.pid)"]

    service = write_config(
        tmp_path,
        {f"{op}_{v}": cmd(v) for v in ports for op, cmd in
         (("start", start), ("stop", stop), ("running", running))},
        {"http": {v: f"http://127.0.0.1:{p}/variant" for v, p in ports.items()}, "timeout": 5})
    made = []

    def make():
        supervisor = Supervisor(service, tmp_path / "state", {"ecc.uncorrected"})
        made.append(supervisor)
        return supervisor

    def serving():
        return {v for v, p in ports.items() if fetch(f"http://127.0.0.1:{p}/variant") == v}

    yield {"make": make, "serving": serving, "path": state.path_for(tmp_path / "state", "batch")}
    for supervisor in made[-1:]:
        for v in ports:
            supervisor.backend.stop(v)


def write_state(path, **fields):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"active": "gpu", "since": time.time(), "reason": "test",
                                **fields}))


def test_a_failed_failover_with_1100_recorded_errors_still_puts_the_gpu_back(tmp_path,
                                                                             servers):
    # 1,100 errors: 10 * 2 ** 1099 is no float; that OverflowError used to skip the
    # rollback and leave nothing running and the state "moving to cpu" for good
    write_state(servers["path"], errors=1100)
    supervisor = servers["make"]()
    supervisor.recover()
    assert servers["serving"]() == {"gpu"}
    (tmp_path / "cpu-broken").touch()
    for _ in range(3):
        supervisor.handle_cycle(BAD, boottime())
    assert wait(lambda: servers["serving"]() == {"gpu"}, 10), servers["serving"]()
    on_disk = json.loads(servers["path"].read_text())
    assert on_disk["active"] == "gpu" and on_disk["transition"] is None
    assert on_disk["errors"] == 1101 and on_disk["failures_in_row"] == 1
    assert 0 < on_disk["next_retry"] - time.time() <= policy.BACKOFF_FIRST_S

    # a second failure in a row waits twice as long; a success resets the backoff count
    assert supervisor.transition("cpu", "again") is False
    assert supervisor.state.failures_in_row == 2
    assert supervisor.state.next_retry - time.time() > policy.BACKOFF_FIRST_S
    (tmp_path / "cpu-broken").unlink()
    assert supervisor.transition("cpu", "fixed") is True
    assert servers["serving"]() == {"cpu"}
    st = supervisor.state
    assert st.failures_in_row == 0 and st.next_retry == 0.0 and st.errors == 1102


def test_the_backoff_is_bounded_for_any_count():
    assert [policy.backoff_s(n) for n in (1, 2, 3, 4, 5, 6, 7)] == \
        [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    for n in (0, 1100, 10**6, 10**18):
        assert 0 < policy.backoff_s(n) <= policy.BACKOFF_MAX_S


def test_a_retry_time_far_ahead_does_not_block_failover_for_ever(servers):
    write_state(servers["path"], next_retry=1e18, errors=3)
    supervisor = servers["make"]()
    supervisor.recover()
    assert supervisor.state.next_retry <= time.time() + policy.BACKOFF_MAX_S


@pytest.fixture
def quiet_service(tmp_path):
    """A service whose commands do nothing: only the counting and the requests matter."""
    service = write_config(
        tmp_path, {"start_gpu": ["true"], "stop_gpu": ["true"], "start_cpu": ["true"],
                   "stop_cpu": ["true"], "running_gpu": ["true"], "running_cpu": ["false"]},
        {"exec": ["true"], "timeout": 5}, failover_after=100)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    return service, state_dir


def make_bad_request(kind, path):
    evil = json.dumps({"to": "cpu", "reason": "not yours to ask"})
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        target = path.parent.parent / "elsewhere.json"
        target.write_text(evil)
        path.symlink_to(target)
    elif kind == "other user's":
        path.write_text(evil)
        os.chown(path, 65534, 65534)
    elif kind == "world-writable":
        path.parent.chmod(0o1777)
        path.write_text(evil)
        path.chmod(0o666)
    elif kind == "huge":
        path.write_text(" " * 100_000 + evil)
    elif kind == "not json":
        path.write_text("to: cpu\n")
    elif kind == "a list":
        path.write_text('["cpu"]')


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink", "other user's",
                                  "world-writable", "huge", "not json", "a list"])
def test_a_bad_request_path_never_stops_the_cycles(quiet_service, kind):
    if kind == "other user's" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    service, state_dir = quiet_service
    path = state.request_path(state_dir, service.name)
    make_bad_request(kind, path)
    supervisor = Supervisor(service, state_dir, {"ecc.uncorrected"})
    with capture_logs() as logs:
        supervisor.start()
        try:
            for _ in range(3):
                supervisor.on_cycle(BAD)
            assert wait(lambda: supervisor.view().state.failed_cycles == 3, 10), \
                supervisor.view()
            time.sleep(1.2)  # two more idle turns of the loop: still logged only once
        finally:
            supervisor.stop()
    assert supervisor.view().state.active == "gpu"  # nothing it said was done
    assert not os.path.lexists(path)
    assert len(list(state_dir.glob(f"{path.name}.rejected-*"))) == 1
    rejected = [e for e in logs if e["event"] == "failover_request_rejected"]
    assert len(rejected) == 1, rejected


def test_a_good_request_still_moves_the_service(quiet_service):
    service, state_dir = quiet_service
    supervisor = Supervisor(service, state_dir, {"ecc.uncorrected"})
    supervisor.recover()
    state.write_request(state_dir, service.name, "cpu", "driver upgrade")
    supervisor.start()
    try:
        assert wait(lambda: state.move_done(state_dir, service.name, "cpu"), 10)
    finally:
        supervisor.stop()
    assert supervisor.view().state.reason == "manual: driver upgrade"
