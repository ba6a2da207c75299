"""The supervisor in the real daemon, with real Docker containers and a real nginx."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.daemon.conftest import metric_lines
from tests.supervisor.conftest import fetch, settled_on, start_supervised, state_of, wait


def udev_cycle(daemon):
    """One cycle, now: the daemon runs a cycle per NVIDIA udev event."""
    before = daemon.metrics()
    count = next(float(line.split()[-1]) for line in
                 metric_lines(before, "gpuguard_cycles_total") if 'cadence="fast"' in line)
    daemon.send_event("change", {"PCI_ID": "10DE:2335", "PCI_SLOT_NAME": "0000:18:00.0"})
    daemon.wait_for(lambda: any('cadence="fast"' in line and float(line.split()[-1]) > count
                                for line in metric_lines(daemon.metrics(),
                                                         "gpuguard_cycles_total")),
                    what="a cycle")
    time.sleep(0.3)  # the supervisor thread takes the outcome


def test_three_strikes_then_cpu_and_back(start_daemon, service_setup):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"](), interval="600")
    assert wait(lambda: settled_on(setup, "gpu")), state_of(setup)

    setup["faulty"](True)
    udev_cycle(daemon)
    udev_cycle(daemon)
    assert settled_on(setup, "gpu") and state_of(setup)["failed_cycles"] == 2
    udev_cycle(daemon)  # the third strike
    assert wait(lambda: settled_on(setup, "cpu")), state_of(setup)
    st = state_of(setup)
    assert "memory.row_remap (GPU 0)" in st["reason"]

    # the CPU variant is truly GPU-free
    cpu = setup["client"].containers.get(setup["names"]["cpu"])
    host_config = cpu.attrs["HostConfig"]
    assert host_config["Runtime"] == "runc"
    assert not host_config.get("DeviceRequests")
    env = cpu.attrs["Config"]["Env"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in env and "CUDA_VISIBLE_DEVICES=" in env
    assert fetch(setup["nginx"]["url"] + "/env") == "void|"
    text = daemon.metrics()
    from tests.daemon.test_metrics_doc import documented, exported

    failover_doc = {n for n in documented("## The daemon") if n.startswith("gpuguard_failover_")}
    assert {n for n in exported(text) if n.startswith("gpuguard_failover_")} == failover_doc
    assert 'gpuguard_failover_active{service="llm"} 1.0' in text
    assert 'gpuguard_failover_transitions_total{direction="to_cpu",service="llm"} 1.0' in text

    setup["faulty"](False)
    for _ in range(3):
        udev_cycle(daemon)
    assert wait(lambda: settled_on(setup, "gpu")), state_of(setup)
    assert 'gpuguard_failover_active{service="llm"} 0.0' in daemon.metrics()
    log = daemon.log.read_text()
    assert log.count('"event": "failover_done"') == 2


def test_flapping_health_does_not_flap_the_service(start_daemon, service_setup):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"](), interval="600")
    assert wait(lambda: settled_on(setup, "gpu"))
    for _ in range(3):
        setup["faulty"](True)
        udev_cycle(daemon)
        udev_cycle(daemon)
        setup["faulty"](False)
        udev_cycle(daemon)
    assert settled_on(setup, "gpu")
    assert "failover_started" not in daemon.log.read_text()


def test_manual_failback_waits_for_the_command(start_daemon, service_setup):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"](failback="manual"))
    assert wait(lambda: settled_on(setup, "gpu"))
    setup["faulty"](True)
    assert wait(lambda: settled_on(setup, "cpu"))
    setup["faulty"](False)
    time.sleep(3)  # ten healthy cycles at 0.3 s: auto would have moved back by now
    assert settled_on(setup, "cpu")
    moved = subprocess.run(
        [sys.executable, "-m", "gpuguard", "failover", "to", "gpu", "llm", "--reason",
         "GPU replaced", "--state-dir", str(setup["state_dir"]), "--wait", "60"],
        cwd=REPO, capture_output=True, text=True, check=False)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert settled_on(setup, "gpu")
    assert state_of(setup)["reason"] == "manual: GPU replaced"
    status = subprocess.run([sys.executable, "-m", "gpuguard", "failover", "status",
                             "--state-dir", str(setup["state_dir"])], cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert "llm: GPU since" in status.stdout and "manual: GPU replaced" in status.stdout
    assert daemon.proc.poll() is None


@pytest.mark.parametrize("broken", ["cpu image missing", "cpu never ready"])
def test_a_failed_failover_leaves_the_gpu_variant_and_retries(start_daemon, service_setup,
                                                              broken):
    setup = service_setup
    if broken == "cpu image missing":
        config = setup["write"](cpu_image="gpuguard-test/no-such-image:1")
    else:
        config = setup["write"](cpu_probe_port=9)  # nothing answers there
    daemon = start_supervised(start_daemon, setup, config)
    assert wait(lambda: settled_on(setup, "gpu"))
    setup["faulty"](True)
    daemon.wait_for(lambda: '"event": "failover_failed"' in daemon.log.read_text(),
                    timeout=40, what="failover_failed")
    assert wait(lambda: settled_on(setup, "gpu"), 15), (state_of(setup), setup["running"]())
    st = state_of(setup)
    assert st["errors"] >= 1 and st["next_retry"] > time.time() - 60
    assert 'gpuguard_failover_errors_total{service="llm"}' in daemon.metrics()
    failure = next(json.loads(line) for line in daemon.log.read_text().splitlines()
                   if '"failover_failed"' in line)
    assert failure["keeping"] == "gpu" and failure["retry_in_s"] == 10.0


def test_docker_down_is_logged_not_a_crash(start_daemon, service_setup, tmp_path):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"](),
                              env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    setup["faulty"](True)
    daemon.wait_for(lambda: '"failover_failed"' in daemon.log.read_text(), timeout=30,
                    what="failover_failed")
    assert daemon.proc.poll() is None
    assert daemon.metrics()
    # the failure was taken as one: nothing left half done, an error counted, a retry set
    st = daemon.wait_for(lambda: (s := state_of(setup)) and s["transition"] is None and s,
                         what="no transition left in progress")
    assert st["active"] == "gpu" and st["errors"] >= 1 and st["next_retry"] > 0


def test_corrupt_state_is_reported_and_not_reset_to_gpu(start_daemon, service_setup):
    setup = service_setup
    config = setup["write"]()
    # the service already runs on CPU, routed there, and its state file is garbage
    first = start_supervised(start_daemon, setup, config)
    setup["faulty"](True)
    assert wait(lambda: settled_on(setup, "cpu"))
    first.stop()
    path = setup["state_dir"] / "failover-llm.json"
    path.write_text('{"active": "cpu", "since": 17')
    daemon = start_supervised(start_daemon, setup, config)
    daemon.wait_for(lambda: '"failover_state_corrupt"' in daemon.log.read_text(),
                    what="corrupt state reported")
    moved = list(setup["state_dir"].glob("failover-llm.json.corrupt-*"))
    assert len(moved) == 1
    assert wait(lambda: settled_on(setup, "cpu"))


@pytest.mark.parametrize("step", ["start", "ready", "route", "stop_source"])
def test_sigkill_at_each_step_then_restart(start_daemon, service_setup, step):
    setup = service_setup
    config = setup["write"]()
    daemon = start_supervised(start_daemon, setup, config,
                              env={"GPUGUARD_FAILOVER_PAUSE_AT": step})
    assert wait(lambda: settled_on(setup, "gpu"))
    setup["faulty"](True)
    daemon.wait_for(lambda: '"failover_paused_for_test"' in daemon.log.read_text(),
                    timeout=30, what=f"the pause at {step}")
    assert state_of(setup)["transition"]["step"] == step
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)
    # restarted: it finishes the transition from its first step
    start_supervised(start_daemon, setup, config)
    assert wait(lambda: settled_on(setup, "cpu"), 40), (state_of(setup), setup["running"]())
    assert setup["running"]() == {"cpu"}


def test_dry_run_logs_and_changes_nothing(start_daemon, service_setup):
    setup = service_setup
    # something must serve before we start: a first daemon converges to the GPU variant
    first = start_supervised(start_daemon, setup, setup["write"]())
    assert wait(lambda: settled_on(setup, "gpu"))
    first.stop()
    daemon = start_supervised(start_daemon, setup, setup["write"](), "--dry-run")
    setup["faulty"](True)
    daemon.wait_for(lambda: '"failover_dry_run"' in daemon.log.read_text(), timeout=20,
                    what="failover_dry_run")
    time.sleep(1)
    assert settled_on(setup, "gpu")
    assert '"failover_started"' not in daemon.log.read_text()
