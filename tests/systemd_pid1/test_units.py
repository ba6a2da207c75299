"""The promises of systemd/gpuguard.service and systemd/inference-preflight.conf, kept under a
real systemd as PID 1 (a Debian container, see conftest.py) with the project's .deb installed:
Type=notify readiness, the watchdog, the preflight gate, and the supervisor's systemd backend.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.daemon.conftest import free_port
from tests.systemd_pid1.conftest import FAKE_NVML_DIR, Machine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap and dockerd need root")

DROP_IN = "/etc/systemd/system/gpuguard.service.d/test.conf"
# Outside /tmp: the unit has PrivateTmp=yes. Read-only for the daemon (ProtectSystem=strict).
TEST_DIR = "/var/lib/gpuguard-test"


def set_daemon(box: Machine, port: int, *args: str, extra: str = "") -> None:
    """A drop-in that keeps the packaged unit but listens on a free port (never 9412)."""
    box.write(DROP_IN, "[Service]\nExecStart=\n"
              f"ExecStart=/usr/bin/gpuguard daemon --log-format json "
              f"--listen 127.0.0.1:{port} {' '.join(args)}\n{extra}")
    box.ok("systemctl", "daemon-reload")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def daemon_port(machine: Machine) -> Any:
    port = free_port()
    yield port
    machine.run("systemctl", "stop", "gpuguard.service")
    # each test's daemon sees other GPUs (the fake NVML's, a replay's): the GPUs the last
    # one saw in this boot would be "gone" for the next (assess/gpus_seen.py)
    machine.run("rm", "-rf", "/etc/systemd/system/gpuguard.service.d", TEST_DIR,
                "/var/lib/gpuguard/gpus-seen.json")
    machine.run("systemctl", "daemon-reload")
    machine.run("systemctl", "reset-failed")


def test_active_only_after_ready(machine: Machine, daemon_port: int) -> None:
    # A GPU whose NVML hangs at init (the fake, while a file exists) holds back the first
    # cycle; READY=1 comes after it, so until then the unit must stay `activating`.
    hang = f"{TEST_DIR}/nvml-hangs"
    machine.write(hang, "")
    set_daemon(machine, daemon_port, "--timeout", "60", extra=(
        f"Environment=LD_LIBRARY_PATH={FAKE_NVML_DIR} FAKE_NVML_HANG=nvmlInit "
        f"FAKE_NVML_HANG_FILE={hang}\n"))
    machine.ok("systemctl", "start", "--no-block", "gpuguard.service")
    machine.wait_for("the daemon's process runs", lambda: machine.show(
        "gpuguard.service", "MainPID")["MainPID"] != "0")
    for _ in range(6):  # about three seconds of a hung first cycle
        state = machine.show("gpuguard.service", "ActiveState", "SubState")
        assert state == {"ActiveState": "activating", "SubState": "start"}, state
        machine.ok("sleep", "0.5")
    machine.ok("rm", hang)
    machine.wait_for("gpuguard.service active", lambda: machine.show(
        "gpuguard.service", "ActiveState")["ActiveState"] == "active")
    # READY=1 came with the first cycle's STATUS=, and that cycle is served already
    status_text = machine.show("gpuguard.service", "StatusText")["StatusText"]
    assert re.fullmatch(r"1 GPU\(s\): \d+ critical, \d+ warning, \d+ unknown.*", status_text)
    served = get_json(f"http://127.0.0.1:{daemon_port}/status")
    rules = {r["rule"]: r["status"] for r in served["results"]}
    assert rules["driver.loaded"] == "ok" and rules["gpu.count"] == "ok", rules


def test_watchdog_restarts_a_frozen_daemon(machine: Machine, daemon_port: int) -> None:
    # WatchdogSec=5 instead of the shipped 30 keeps the test short; the mechanism is the
    # same, and a shorter limit is the harder one for the daemon's pings to meet.
    set_daemon(machine, daemon_port, extra="WatchdogSec=5\n")
    machine.ok("systemctl", "start", "gpuguard.service")
    first = machine.show("gpuguard.service", "MainPID", "NRestarts", "WatchdogUSec")
    assert first["WatchdogUSec"] == "5s" and first["NRestarts"] == "0"
    # a live daemon pings: three watchdog periods later it is the same process
    machine.ok("sleep", "15")
    assert machine.show("gpuguard.service", "MainPID", "NRestarts", "WatchdogUSec") == first
    # a real hang: the main process frozen by SIGSTOP sends no more pings
    machine.ok("kill", "-STOP", first["MainPID"])
    machine.wait_for("a new gpuguard process after the watchdog", lambda: (lambda s: (
        s["ActiveState"] == "active" and s["MainPID"] not in ("0", first["MainPID"])))(
        machine.show("gpuguard.service", "ActiveState", "MainPID")))
    assert machine.show("gpuguard.service", "NRestarts")["NRestarts"] == "1"
    journal = machine.journal("gpuguard.service")
    assert "Watchdog timeout (limit 5s)" in journal
    assert "Failed with result 'watchdog'" in journal


def test_reload_rereads_rules_in_the_same_process(machine: Machine, daemon_port: int) -> None:
    # ExecReload= sends SIGHUP; the daemon reloads its rules and profile and stays the
    # same process, still active
    set_daemon(machine, daemon_port)
    machine.ok("systemctl", "start", "gpuguard.service")
    before = machine.show("gpuguard.service", "MainPID", "NRestarts", "ActiveState")
    machine.ok("systemctl", "reload", "gpuguard.service")
    machine.wait_for("config_reloaded in the journal", lambda: '"event": "config_reloaded"'
                     in machine.journal("gpuguard.service"))
    assert machine.show("gpuguard.service", "MainPID", "NRestarts", "ActiveState") == before
    assert before["ActiveState"] == "active"


LLM_UNIT = """[Unit]
Description=a stand-in inference service
[Service]
ExecStart=/bin/sleep infinity
"""


@pytest.fixture
def llm_unit(machine: Machine) -> Any:
    machine.write("/etc/systemd/system/llm.service", LLM_UNIT)
    # the drop-in as the package ships it
    machine.ok("mkdir", "-p", "/etc/systemd/system/llm.service.d")
    machine.ok("cp", "/usr/share/gpuguard/inference-preflight.conf",
               "/etc/systemd/system/llm.service.d/gpuguard-preflight.conf")
    machine.ok("systemctl", "daemon-reload")
    yield "llm.service"
    machine.run("systemctl", "stop", "llm.service")
    machine.run("rm", "-rf", "/etc/systemd/system/llm.service",
                "/etc/systemd/system/llm.service.d")
    machine.run("systemctl", "daemon-reload")
    machine.run("systemctl", "reset-failed")


def test_preflight_blocks_on_critical_and_starts_when_healthy(machine: Machine,
                                                              llm_unit: str) -> None:
    # no NVIDIA driver in the container: driver.loaded is critical, the start must fail
    started = machine.run("systemctl", "start", llm_unit)
    assert started.returncode != 0
    assert machine.run("systemctl", "is-active", llm_unit).stdout.strip() == "failed"
    status = machine.run("systemctl", "status", "--no-pager", "--full", llm_unit).stdout
    assert re.search(r"ExecStartPre=/usr/bin/gpuguard check .*status=2", status), status
    journal = machine.journal(llm_unit)
    assert "CRITICAL  driver.loaded" in journal, journal
    assert machine.show(llm_unit, "ExecMainPID")["ExecMainPID"] == "0"  # never ran
    # a healthy (fake) GPU lets it start
    machine.write(f"/etc/systemd/system/{llm_unit}.d/fake-nvml.conf",
                  f"[Service]\nEnvironment=LD_LIBRARY_PATH={FAKE_NVML_DIR}\n")
    machine.ok("systemctl", "daemon-reload")
    machine.ok("systemctl", "reset-failed", llm_unit)
    started = machine.run("systemctl", "start", llm_unit)
    assert started.returncode == 0, started.stderr
    assert machine.run("systemctl", "is-active", llm_unit).stdout.strip() == "active"


def variant_unit(port: int) -> str:
    # a variant that really serves HTTP, so the supervisor's probe has something to ask
    return ("[Service]\nExecStart=/usr/bin/python3 -m http.server --bind 127.0.0.1 "
            f"--directory /usr/share/doc {port}\n")


SUPERVISOR_CONFIG = """services:
  - name: llm
    failover_after: 3
    failback_after: 3
    min_cpu_time: 0
    probe:
      http: {{gpu: "http://127.0.0.1:{gpu}/", cpu: "http://127.0.0.1:{cpu}/"}}
      status: 200
      timeout: 60
    backend: systemd
    systemd: {{gpu: llm-gpu.service, cpu: llm-cpu.service}}
"""


@pytest.fixture
def llm_variants(machine: Machine) -> Any:
    gpu_port, cpu_port = free_port(), free_port()
    machine.write("/etc/systemd/system/llm-gpu.service", variant_unit(gpu_port))
    machine.write("/etc/systemd/system/llm-cpu.service", variant_unit(cpu_port))
    machine.write("/etc/gpuguard/gpuguard.yaml",
                  SUPERVISOR_CONFIG.format(gpu=gpu_port, cpu=cpu_port))
    machine.ok("systemctl", "daemon-reload")
    yield
    machine.run("systemctl", "stop", "gpuguard.service", "llm-gpu.service", "llm-cpu.service")
    machine.write("/etc/gpuguard/gpuguard.yaml", "services: []\n")
    machine.run("rm", "-rf", "/etc/systemd/system/llm-gpu.service",
                "/etc/systemd/system/llm-cpu.service", "/var/lib/gpuguard/failover-llm.json")
    machine.run("systemctl", "daemon-reload")


def active(box: Machine, unit: str) -> str:
    return box.run("systemctl", "is-active", unit).stdout.strip()


def test_supervisor_switches_systemd_units(machine: Machine, daemon_port: int,
                                           llm_variants: None) -> None:
    snapshot = json.loads((FIXTURES / "h200-live" / "idle-snapshot.json").read_text())
    machine.write(f"{TEST_DIR}/snapshot.json", json.dumps(snapshot))
    # the snapshot is read again every cycle: editing it changes the GPU's health
    set_daemon(machine, daemon_port, "--fast-interval", "1", "--input",
               f"{TEST_DIR}/snapshot.json")
    machine.ok("systemctl", "start", "gpuguard.service")
    machine.wait_for("llm-gpu.service started by the supervisor", lambda: (
        active(machine, "llm-gpu.service"), active(machine, "llm-cpu.service"))
        == ("active", "inactive"))

    snapshot["gpus"][0]["remapped_rows_failure"] = True  # critical, tagged failover
    machine.write(f"{TEST_DIR}/snapshot.json", json.dumps(snapshot))
    machine.wait_for("llm failed over to llm-cpu.service", lambda: (
        active(machine, "llm-gpu.service"), active(machine, "llm-cpu.service"))
        == ("inactive", "active"))
    status = machine.ok("gpuguard", "failover", "status")
    assert status.startswith("llm: CPU since") and "memory.row_remap" in status, status
    # STATUS= is sent with each cycle, so the one after the switch names the CPU variant
    machine.wait_for("STATUS= says llm on CPU", lambda: "llm on CPU" in machine.show(
        "gpuguard.service", "StatusText")["StatusText"])

    snapshot["gpus"][0]["remapped_rows_failure"] = False
    machine.write(f"{TEST_DIR}/snapshot.json", json.dumps(snapshot))
    try:
        machine.wait_for("llm back on llm-gpu.service", lambda: (
            active(machine, "llm-gpu.service"), active(machine, "llm-cpu.service"))
            == ("active", "inactive"))
    except AssertionError as exc:  # the daemon's own account of why it stayed on CPU
        raise AssertionError(f"{exc}\n{machine.journal('gpuguard.service')[-4000:]}") from None
    assert machine.show("gpuguard.service", "NRestarts")["NRestarts"] == "0"


JOURNAL_READ = r'''
import json, pathlib, subprocess, time
from gpuguard.config.engine_profiles import load_catalog
from gpuguard.sources.service_logs import JournalTail, matches
say = pathlib.Path("/var/lib/gpuguard-journal/say")
def told(line):
    say.write_text(line + "\n")
    for _ in range(50):
        if not say.exists():
            break
        time.sleep(0.1)
    time.sleep(1.0)  # journald has it by now
tail = JournalTail("llm-journal.service")
told("before gpuguard watched: CUDA error: an illegal memory access was encountered")
out = {"first": tail.read(5.0)}
# review 4, item 20: a variant the daemon saw start is read from its run's start
out["from_start"] = JournalTail("llm-journal.service", from_start=True).read(5.0)
told("CUDA error: unspecified launch failure")
told("an ordinary line")
out["second"] = tail.read(5.0)
out["third"] = tail.read(5.0)
out["found"] = matches(out["second"], load_catalog().error_kind)
# review 4, item 9: an error after 5000 characters (-o json gives a field over 4096 bytes
# as null without --all), then more entries in one cycle than a read takes: the first
# 2000 after the cursor, the rest at the next read, none skipped
told("x" * 5000 + " CUDA error: an illegal memory access was encountered")
out["long"] = [kind for kind, _ in matches(tail.read(5.0), load_catalog().error_kind)]
told("\n".join(f"flood {i}" for i in range(2100)))
out["flood"] = [[len(x), x[0], x[-1], getattr(tail, "skipped", None)]
                for x in (tail.read(5.0), tail.read(5.0))]
print(json.dumps(out))
'''


def test_the_journal_of_a_unit_is_read_incrementally(machine: Machine) -> None:
    """Issue 23: service.gpu_errors reads a systemd service's own log through journalctl
    (gpuguard/sources/service_logs.JournalTail): the first read only marks where the
    journal ends, each later one takes the lines after its cursor."""
    machine.ok("mkdir", "-p", "/var/lib/gpuguard-journal")
    machine.ok("systemd-run", "--unit", "llm-journal", "sh", "-c",
               "while true; do if [ -f /var/lib/gpuguard-journal/say ]; then "
               "cat /var/lib/gpuguard-journal/say; rm /var/lib/gpuguard-journal/say; fi; "
               "sleep 0.1; done")
    try:
        seen = json.loads(machine.ok("/opt/gpuguard/venv/bin/python", "-c", JOURNAL_READ))
        assert seen["first"] == [], seen
        assert seen["from_start"] == [
            "before gpuguard watched: CUDA error: an illegal memory access was encountered"]
        assert seen["second"] == ["CUDA error: unspecified launch failure",
                                  "an ordinary line"], seen
        assert seen["third"] == [], seen
        assert seen["found"] == [["launch_failure", "CUDA error: unspecified launch failure"]]
        assert seen["long"] == ["illegal_memory_access"], seen["long"]
        assert seen["flood"] == [[2000, "flood 0", "flood 1999", None],
                                 [100, "flood 2000", "flood 2099", None]], seen["flood"]
    finally:
        machine.run("systemctl", "stop", "llm-journal.service")
