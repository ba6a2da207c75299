"""`failback_probe: qualify` (issue 30, item 3) apart from the daemon: the file accepts it
on any host, the gate's decision as a pure function (supervisor/qualify_gate.decide), the
hardware test of a failover, and a run left by a SIGKILLed daemon stopped at the start.
The daemon end to end is tests/daemon/test_failback_qualify_daemon.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.config.yamlfile import ConfigError
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.qualify.records import Qualification
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.failback import hardware
from gpuguard.supervisor.qualify_gate import (
    MAX_RUNS,
    Facts,
    GpuNow,
    QualifyGate,
    QualifyHost,
    decide,
)
from tests.qualify.test_qualify_cli import FAKE_TARGETS

SERVICE = """\
services:
  - name: llm
    backend: exec
    gpus: [0]
    failback_probe: qualify
{extra}    probe: {{exec: ["true"]}}
    exec: {{start_gpu: [a], stop_gpu: [b], start_cpu: [c], stop_cpu: [d]}}
"""


def load_text(tmp_path: Path, extra: str = "") -> list:
    path = tmp_path / "gpuguard.yaml"
    path.write_text(SERVICE.format(extra=extra))
    return load_services(path)


def test_qualify_is_accepted_at_load_with_its_defaults_or_its_settings(tmp_path):
    # nothing here needs a GPU or CUDA: this host has neither
    [service] = load_text(tmp_path)
    assert service.failback_probe == "qualify"
    assert service.qualify is not None and service.qualify.level == "standard"
    assert service.qualify.args() == ()
    [service] = load_text(tmp_path, f"    qualify: {{level: long, seconds: 2, targets: "
                                    f"{FAKE_TARGETS}}}\n")
    assert service.qualify.level == "long"
    assert service.qualify.args() == ("--seconds", "2", "--targets", str(FAKE_TARGETS))


@pytest.mark.parametrize(("extra", "line", "problem"), [
    ("    qualify: {level: quick}\n", 6, "services[0].qualify: level must be one of `long`, "
     "`standard`, not 'quick'"),
    ("    qualify: {seconds: 0.1}\n", 6, "services[0].qualify.seconds: expected `float` >= 0.5"),
    ("    qualify: {secs: 2}\n", 6, "services[0].qualify.secs: unknown key"),
    ("    qualify: {targets: /nowhere}\n", 6, "llm: qualify.targets: /nowhere: no GPU target "
     "file found"),
])
def test_bad_qualify_settings_are_file_and_line(tmp_path, extra, line, problem):
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, extra)
    assert str(caught.value).startswith(f"{tmp_path / 'gpuguard.yaml'}:{line}: "), caught.value
    assert problem in str(caught.value), caught.value


def test_qualify_settings_without_the_qualify_probe_are_refused(tmp_path):
    text = SERVICE.format(extra="    qualify: {seconds: 2}\n").replace(
        "failback_probe: qualify", "failback_probe: active")
    (tmp_path / "gpuguard.yaml").write_text(text)
    with pytest.raises(ConfigError, match="qualify: is for `failback_probe: qualify`"):
        load_services(tmp_path / "gpuguard.yaml")


def test_a_failover_is_a_hardware_one_by_its_suggested_action():
    def failed(action: str) -> list[Result]:
        return [Result("xid.recent", Status.CRITICAL, Status.CRITICAL, "m", GpuId(0, "u", "p"),
                       action=action)]

    assert all(hardware(failed(a)) for a in ("reset_gpu", "reboot", "inspect_hardware"))
    assert not any(hardware(failed(a)) for a in ("restart_app", "update_software", "none"))


# --- the decision ---------------------------------------------------------------------

AFTER = 1_800_000_000.0
GPU0 = GpuNow(0, "GPU-a", "1654000000000", None)


def run(passed: bool, status: str = "pass", message: str = "standard: pass",
        started: float = AFTER + 5) -> Qualification:
    return Qualification(time=started + 40, started_at=started, uuid="GPU-a",
                         serial="1654000000000", index=0, level="standard", passed=passed,
                         drill=False, status=status, action="none", message=message,
                         bundle="/state/qualify-bundles/b.json")


def verdict(**facts: object) -> tuple[str, str]:
    base: dict[str, object] = {"gpus": [GPU0], "latest": {0: None}}
    step = decide(Facts(**{**base, **facts}), "standard", AFTER)  # type: ignore[arg-type]
    return step.verdict, step.why


def test_no_qualification_yet_starts_one_on_idle_gpus_with_the_variant_stopped():
    assert verdict()[0] == "start"


def test_a_pass_of_every_gpu_lets_the_failback_through_naming_its_bundle():
    got, why = verdict(latest={0: run(True)})
    assert got == "pass" and "GPU(s) 0 passed" in why and "/state/qualify-bundles/b.json" in why
    # two GPUs: both must have passed
    gpu1 = GpuNow(1, "GPU-b", "1654000000001", None)
    assert verdict(gpus=[GPU0, gpu1], latest={0: run(True), 1: None})[0] == "start"


def test_ours_running_waits_and_says_since_when():
    got, why = verdict(running_since=AFTER + 1)
    assert got == "wait" and why.startswith("qualifying since ")


def test_a_critical_finding_blocks_and_starts_no_run_of_ours():
    bad = run(False, "critical", "standard: no pass: qualify.memtest critical: 6 word(s) "
              "read back wrong")
    got, why = verdict(latest={0: bad})
    assert got == "block"
    assert why.startswith("the standard qualification of GPU 0 did not pass: qualify.memtest "
                          "critical: 6 word(s) read back wrong"), why
    assert "gpuguard qualify --gpu 0" in why


def test_a_run_that_could_not_measure_is_run_again_later_a_bounded_number_of_times():
    unknown = run(False, "unknown", "standard: no pass: qualify.run unknown: libcuda.so.1 "
                  "cannot be loaded")
    got, why = verdict(latest={0: unknown}, runs=1, retry_in=120.0, retry_at=AFTER + 300)
    assert got == "block" and "libcuda.so.1 cannot be loaded" in why and "next run at" in why
    assert verdict(latest={0: unknown}, runs=1)[0] == "start"
    got, why = verdict(latest={0: unknown}, runs=MAX_RUNS)
    assert got == "block" and f"{MAX_RUNS} runs started" in why


def test_never_while_the_gpu_variant_runs_or_a_gpu_is_held():
    got, why = verdict(variant_runs=True)
    assert got == "block" and "the GPU variant runs" in why
    busy = GpuNow(0, "GPU-a", "1654000000000", "held by 1 compute process(es): pid 42 (x)")
    got, why = verdict(gpus=[busy])
    assert got == "block" and "GPU 0 cannot be qualified now: held by 1 compute" in why


def test_a_gpu_the_sweep_lacks_blocks():
    assert verdict(gpus=[], latest={})[1] == \
        "none of the service's GPUs is in the daemon's last NVML sweep"
    assert verdict(missing=(1,))[1] == "GPU 1 is not in the daemon's last NVML sweep"


def test_a_run_that_ended_without_a_result_says_how():
    got, why = verdict(runs=1, last_ending="was killed by signal 9", retry_in=10.0,
                       retry_at=AFTER + 300)
    assert got == "block" and "(the last run was killed by signal 9)" in why


# --- a run left by a daemon that was SIGKILLed -----------------------------------------

class Log:
    def __init__(self) -> None:
        self.said: list[tuple[str, dict[str, object]]] = []

    def warning(self, event: str, **kw: object) -> None:
        self.said.append((event, kw))

    info = warning


def test_a_run_left_by_a_killed_daemon_is_stopped_when_it_starts_again(tmp_path):
    from gpuguard.supervisor.qualify_config import QualifySettings

    # a stand-in for the orphan: its own session, `gpuguard qualify` in its command line
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpuguard",
                             "qualify"], start_new_session=True)
    try:
        procfs, state = tmp_path / "proc", tmp_path / "state"
        # the daemon's --path.procfs is the test's own: the pid's command line as /proc has it
        (procfs / str(left.pid)).mkdir(parents=True)
        (procfs / str(left.pid) / "cmdline").write_bytes(
            b"\0".join([sys.executable.encode(), b"-c", b"x", b"gpuguard", b"qualify"]))
        state.mkdir()
        (state / "qualify-failback-llm.json").write_text(
            f'{{"pid": {left.pid}, "started_at": 1.0, "boot_id": "b1", "level": "standard"}}')
        host = QualifyHost(state, procfs, "b1", (), gpus=lambda: [GPU0])
        log = Log()
        QualifyGate("llm", QualifySettings(), host, log).recover()
        assert left.wait(10) == -signal.SIGTERM
        assert ("failback_qualify_left_stopped", {"pid": left.pid}) in log.said
        assert not (state / "qualify-failback-llm.json").exists()
    finally:
        if left.poll() is None:
            os.killpg(left.pid, signal.SIGKILL)
            left.wait()


# --- the supervisor: which failovers wait, and for a pass after which finding ----------

def record_pass(state_dir: Path, started_at: float) -> None:
    """A passing standard qualification of GPU 0, as `gpuguard qualify` records it."""
    from gpuguard.events import store
    from gpuguard.events.ack_command import flush_within
    from gpuguard.events.store import Event
    from gpuguard.events.writer import EventWriter

    writer = EventWriter(store.path_in(state_dir), "b1", integrity_check=False)
    writer.record(Event(kind="qualify", source="qualify", rule="qualify", gpu_index=0,
                        gpu_uuid="GPU-a", gpu_serial="1654000000000", status="pass",
                        action="none", message="standard: pass",
                        data={"passed": True, "level": "standard", "started_at": started_at}))
    assert flush_within(writer, 5)
    writer.close()


def supervised(tmp_path: Path, busy: str | None = "held by 1 compute process(es): pid 7"):
    """A `failback_probe: qualify` service whose GPU is held (so no qualify is started
    here: a pass must come from the store), marks for each variant."""
    from gpuguard.supervisor.qualify_config import QualifySettings
    from gpuguard.supervisor.service import Supervisor

    marks = {v: ["sh", "-c", f"touch {tmp_path}/{v}"] for v in ("gpu", "cpu")}
    (tmp_path / "gpuguard.yaml").write_text(f"""\
services:
  - name: llm
    backend: exec
    gpus: [0]
    failback_after: 2
    min_cpu_time: 0
    failback_probe: qualify
    probe: {{exec: ["true"], timeout: 5}}
    exec: {{start_gpu: {marks['gpu']}, start_cpu: {marks['cpu']},
            stop_gpu: [rm, -f, {tmp_path}/gpu], stop_cpu: [rm, -f, {tmp_path}/cpu],
            running_gpu: [test, -f, {tmp_path}/gpu], running_cpu: [test, -f, {tmp_path}/cpu]}}
""")
    [service] = load_services(tmp_path / "gpuguard.yaml")
    assert service.qualify == QualifySettings()
    state_dir = tmp_path / "state"
    host = QualifyHost(state_dir, tmp_path / "proc", "b1", (),
                       gpus=lambda: [GpuNow(0, "GPU-a", "1654000000000", busy)])
    supervisor = Supervisor(service, state_dir, {"xid.recent"}, qualify_host=host)
    supervisor.recover()
    return supervisor


def cycle(supervisor, action: str | None, n: int = 1) -> None:
    from gpuguard.io.clock import boottime

    ref = GpuId(0, "GPU-a", "p")
    results = [Result("xid.recent", Status.CRITICAL, Status.CRITICAL, "Xid", ref,
                      action=action)] if action else \
        [Result("xid.recent", Status.OK, Status.CRITICAL, "ok", ref)]
    for _ in range(n):
        supervisor.handle_cycle(results, boottime())


def test_a_failover_for_an_application_fault_fails_back_without_a_qualification(tmp_path):
    supervisor = supervised(tmp_path)
    cycle(supervisor, "restart_app", 3)
    assert supervisor.state.active == "cpu" and supervisor.state.qualify_after is None
    cycle(supervisor, None, 2)
    assert supervisor.state.active == "gpu"


def test_a_hardware_failover_waits_for_a_pass_started_after_its_finding(tmp_path):
    supervisor = supervised(tmp_path)
    cycle(supervisor, "reset_gpu", 3)
    st = supervisor.state
    assert st.active == "cpu" and st.qualify_after == st.on_cpu_since
    first = st.qualify_after
    cycle(supervisor, None, 4)  # healthy, but the GPU is held: nothing can qualify it
    assert supervisor.state.active == "cpu"
    assert "GPU 0 cannot be qualified now: held by 1" in supervisor.state.failback_blocked
    record_pass(supervisor.state_dir, started_at=first - 10)  # from before it
    cycle(supervisor, None)
    assert supervisor.state.active == "cpu"
    record_pass(supervisor.state_dir, started_at=time.time())
    time.sleep(0.01)
    # a new hardware finding while on CPU: the pass before it proves nothing about it
    cycle(supervisor, "inspect_hardware")
    assert supervisor.state.qualify_after > first
    cycle(supervisor, None, 3)
    assert supervisor.state.active == "cpu"
    record_pass(supervisor.state_dir, started_at=time.time())
    cycle(supervisor, None)
    assert supervisor.state.active == "gpu"
    assert "the standard qualification of GPU(s) 0 passed" in supervisor.state.reason
    assert supervisor.state.qualify_after is None and supervisor.state.failback_blocked is None


def test_no_run_starts_once_the_daemon_has_stopped_the_gate(tmp_path):
    """A cycle still in the supervisor's thread while the daemon stops must not start a
    qualification the stop has already missed (it would outlive the daemon)."""
    from gpuguard.supervisor.qualify_config import QualifySettings

    host = QualifyHost(tmp_path / "state", tmp_path / "proc", "b1", (), gpus=lambda: [GPU0])
    gate = QualifyGate("llm", QualifySettings(), host, Log())
    gate.stop("the daemon stops", close=True)
    step = gate.check(AFTER, AFTER, [0], lambda: False)
    assert (step.verdict, step.why) == ("block", "the daemon stops")
    assert not (tmp_path / "state" / "qualify-failback-llm.json").exists()
