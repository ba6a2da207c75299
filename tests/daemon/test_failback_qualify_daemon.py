"""`failback_probe: qualify` through the real daemon (issue 30, items 3 and 4), on the fake
NVML and the fake libcuda: an exec service on GPU 0 is failed over by an Xid 48 line in
the kernel log the daemon reads (a hardware finding: reset_gpu); a reset line clears it;
the failback then waits for the `standard` qualification the daemon starts (its
`qualify:` settings shorten the load and point at the fakes' targets), and fails back on
its pass. A failing run, a missing libcuda, a GPU another process holds and a GPU variant
that still runs keep the service on CPU, saying why in `failover status` and the events;
a stop of the daemon stops its qualification."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpuguard.io.clock import utc
from gpuguard.qualify import records
from gpuguard.supervisor import state
from tests.conftest import gpuguard
from tests.daemon.test_repairs_daemon import write_log
from tests.qualify.test_qualify_cli import FAKE_TARGETS, environment

UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"  # the fake NVML's GPU 0, at bus 10
XID_48 = ("NVRM: Xid (PCI:0000:10:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
          "double bit error (DBE) has been detected on GPU in the framebuffer.")
RESET = f"GPU reset occurred: {UUID0}"


class Setup:
    def __init__(self, tmp: Path, daemon: Any) -> None:
        self.tmp, self.daemon = tmp, daemon
        self.state_dir = tmp / "state"
        self.kmsg = tmp / "kmsg.log"

    def state(self) -> state.ServiceState:
        found = state.read(state.path_for(self.state_dir, "llm"))
        assert found is not None
        return found

    def wait_state(self, test: Any, what: str, timeout: float = 60) -> state.ServiceState:
        return self.daemon.wait_for(lambda: (st := self._state()) is not None and test(st)
                                    and st, timeout, what)

    def _state(self) -> state.ServiceState | None:
        try:
            return state.read(state.path_for(self.state_dir, "llm"))
        except state.Unreadable:
            return None  # never: writes are atomic; a test must not die on it anyway

    def reset(self) -> float:
        """The GPU reset line appended: xid.recent clears on the next cycle."""
        write_log(self.kmsg, XID_48, RESET)
        return time.time()

    def qualifications(self) -> list[records.Qualification]:
        return records.qualifications(self.state_dir)

    def status(self) -> str:
        out = gpuguard("failover", "status", "--state-dir", str(self.state_dir))
        assert out.returncode == 0, out.stderr
        return out.stdout

    def log_events(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.daemon.log.read_text().splitlines()
                if f'"event": "{name}"' in line]


def start(start_daemon: Any, tmp: Path, fake_nvml: Path, fake_cuda: Path,
          cuda: bool = True, stop_gpu: list[str] | None = None, seconds: float = 1,
          **switches: Any) -> Setup:
    marks = tmp / "marks"
    marks.mkdir()
    config = tmp / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "rules": ["xid.recent"], "gpus": [0],
        "failover_after": 2, "failback_after": 2, "min_cpu_time": 0,
        "failback_probe": "qualify",
        "qualify": {"seconds": seconds, "targets": str(FAKE_TARGETS)},
        "probe": {"exec": ["true"], "timeout": 5},
        "exec": {"start_gpu": ["touch", str(marks / "gpu")],
                 "stop_gpu": stop_gpu or ["rm", "-f", str(marks / "gpu")],
                 "running_gpu": ["test", "-f", str(marks / "gpu")],
                 "start_cpu": ["touch", str(marks / "cpu")],
                 "stop_cpu": ["rm", "-f", str(marks / "cpu")],
                 "running_cpu": ["test", "-f", str(marks / "cpu")]}}]}))
    env = environment(fake_nvml, fake_cuda, switches)
    if not cuda:
        env["LD_LIBRARY_PATH"] = str(fake_nvml)  # no libcuda.so.1 anywhere it looks
    setup = Setup(tmp, None)
    write_log(setup.kmsg, XID_48)
    setup.daemon = start_daemon("--config", str(config), "--kmsg-file", str(setup.kmsg),
                                "--fast-interval", "0.3", "--slow-interval", "600",
                                "--no-docker", env=env)
    setup.wait_state(lambda st: st.active == "cpu", "the hardware failover")
    return setup


def test_the_failback_waits_for_the_qualification_and_follows_its_pass(
        start_daemon, tmp_path, fake_nvml, fake_cuda):
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda)
    failed_over = setup.state()
    assert failed_over.qualify_after == failed_over.on_cpu_since  # a hardware failover
    time.sleep(2)  # the Xid still critical: nothing is qualified, nothing fails back
    assert setup.qualifications() == [] and setup.state().active == "cpu"
    assert not setup.log_events("failback_qualify_started")
    reset_at = setup.reset()
    waiting = setup.wait_state(lambda st: st.active == "gpu" or (st.failback_blocked or "")
                               .startswith("qualifying since"), "the qualification")
    assert waiting.active == "cpu", "failed back before its qualification"
    back = setup.wait_state(lambda st: st.active == "gpu", "the failback after the pass")
    [run] = setup.qualifications()  # GPU 0 only: the service's GPUs, never GPU 1
    assert (run.index, run.uuid, run.level, run.passed) == (0, UUID0, "standard", True)
    assert run.started_at >= reset_at > failed_over.on_cpu_since
    assert run.purpose == f"failback of llm after the failover at {utc(failed_over.on_cpu_since)}"
    assert run.bundle and Path(run.bundle).is_file()
    assert run.bundle in back.reason and back.qualify_after is None
    # item 4: the pair in `gpuguard events`: the qualification names the failover it
    # ended, the failback names the qualification (its start and bundle)
    table = gpuguard("events", "--state-dir", str(setup.state_dir), "--kind", "qualify",
                     "--kind", "supervisor", env={"COLUMNS": "400"}).stdout
    assert f"standard: pass; for failback of llm after the failover at " \
           f"{utc(failed_over.on_cpu_since)}" in table, table
    assert f"passed (started {utc(run.started_at)}; bundle {run.bundle})" in table, table
    moves = gpuguard("events", "--state-dir", str(setup.state_dir), "--kind", "supervisor",
                     "--format", "json")
    assert [e["status"] for e in reversed(json.loads(moves.stdout)["events"])] == \
        ["done:cpu", "qualifying:gpu", "done:gpu"]
    assert "llm: GPU since" in setup.status()


def test_a_failing_qualification_keeps_the_service_on_cpu_with_its_finding(
        start_daemon, tmp_path, fake_nvml, fake_cuda):
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda, fake_cuda_corrupt="memtest")
    setup.reset()
    held = setup.wait_state(lambda st: "did not pass" in (st.failback_blocked or ""),
                            "the failed qualification's reason")
    assert held.failback_blocked.startswith(
        "the standard qualification of GPU 0 did not pass: qualify.memtest critical: ")
    status = setup.status()
    assert "llm: CPU since" in status
    assert "failback held: the standard qualification of GPU 0 did not pass: " \
           "qualify.memtest critical" in status, status
    time.sleep(2)  # more healthy cycles: still on CPU, and no second run (a hardware finding)
    assert setup.state().active == "cpu" and len(setup.qualifications()) == 1
    recorded = gpuguard("events", "--state-dir", str(setup.state_dir), "--kind", "supervisor",
                        "--format", "json")
    blocked = [e for e in json.loads(recorded.stdout)["events"] if e["status"] == "blocked:gpu"]
    assert blocked and "qualify.memtest critical" in blocked[0]["message"]


def test_without_a_cuda_library_the_service_stays_on_cpu_saying_so(
        start_daemon, tmp_path, fake_nvml, fake_cuda):
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda, cuda=False)
    setup.reset()
    held = setup.wait_state(lambda st: "did not pass" in (st.failback_blocked or ""),
                            "the reason of a run that cannot load libcuda")
    assert "qualify.run unknown" in held.failback_blocked
    assert "libcuda.so.1 cannot be loaded" in held.failback_blocked
    assert "the next run at" in held.failback_blocked  # not a board's fault: tried again
    assert "libcuda.so.1 cannot be loaded" in setup.status()
    assert setup.state().active == "cpu"


def test_a_gpu_another_process_holds_is_not_qualified_until_it_is_idle(
        start_daemon, tmp_path, fake_nvml, fake_cuda):
    procs = tmp_path / "procs"
    procs.write_text("0 4242 300\n")
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda,
                  fake_nvml_procs_file=str(procs))
    setup.reset()
    held = setup.wait_state(lambda st: "cannot be qualified now" in (st.failback_blocked or ""),
                            "the busy GPU's reason")
    assert "GPU 0 cannot be qualified now: held by 1 compute process(es): pid 4242" in \
        held.failback_blocked
    time.sleep(1)
    assert not setup.log_events("failback_qualify_started") and setup.qualifications() == []
    procs.write_text("")  # the other process ends
    setup.wait_state(lambda st: st.active == "gpu", "the failback once the GPU is idle")
    assert [q.passed for q in setup.qualifications()] == [True]


def test_never_while_the_gpu_variant_runs(start_daemon, tmp_path, fake_nvml, fake_cuda):
    # a stop command that stops nothing: the GPU variant still runs on CPU's watch
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda, stop_gpu=["true"])
    setup.reset()
    held = setup.wait_state(lambda st: "the GPU variant runs" in (st.failback_blocked or ""),
                            "the reason: the variant serves")
    assert held.active == "cpu"
    time.sleep(1)
    assert not setup.log_events("failback_qualify_started")


def test_a_stop_of_the_daemon_stops_its_qualification(start_daemon, tmp_path, fake_nvml,
                                                      fake_cuda):
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda, seconds=60)
    setup.reset()
    [started] = setup.daemon.wait_for(lambda: setup.log_events("failback_qualify_started"),
                                      60, "the qualification to start")
    pid = started["pid"]
    time.sleep(1)  # its workers are up
    assert os.getsid(pid) == pid and _group_alive(pid, 0)  # in a session of its own
    took = setup.daemon.stop()
    assert took < 10
    assert not _group_alive(pid), "a process of the qualification outlived the daemon"
    assert not (setup.state_dir / "qualify-failback-llm.json").exists()
    # it ended as a stopped run: unknown, never a pass
    assert [q.passed for q in setup.qualifications()] in ([], [False])


def test_a_move_to_gpu_by_hand_stops_the_qualification_first(start_daemon, tmp_path,
                                                               fake_nvml, fake_cuda):
    setup = start(start_daemon, tmp_path, fake_nvml, fake_cuda, seconds=60)
    setup.reset()
    [started] = setup.daemon.wait_for(lambda: setup.log_events("failback_qualify_started"),
                                      60, "the qualification to start")
    moved = gpuguard("failover", "to", "gpu", "llm", "--reason", "board replaced",
                     "--state-dir", str(setup.state_dir), "--wait", "30")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert not _group_alive(started["pid"]), "the qualification held the GPU it starts on"
    log = [json.loads(line)["event"] for line in setup.daemon.log.read_text().splitlines()
           if line.startswith("{")]
    stopping = log.index("failback_qualify_stopping")
    assert stopping < max(i for i, e in enumerate(log) if e == "failover_started")
    [stop] = setup.log_events("failback_qualify_stopping")
    assert stop["why"] == "the GPU variant starts"


def _group_alive(pgid: int, wait_s: float = 5.0) -> bool:
    """Whether any process of the group is left after `wait_s`: the qualification leads
    its own session and group, and its forked workers are in it (signal 0 tests, sends
    nothing). The wait is for the exit of what was SIGKILLed to be reaped (a killed
    process holds no GPU, but answers signal 0 until it is)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() >= end:
            return True
        time.sleep(0.1)
