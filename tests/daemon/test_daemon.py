"""The real daemon over real HTTP, on replayed H200 snapshots and the fake libnvidia-ml."""

import json
import re
import signal
import socket
import time

from tests.conftest import FIXTURES
from tests.daemon.conftest import host_snapshot, metric_lines, write_snapshot


def start_replay(start_daemon, tmp_path, *extra, gpus=8):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(gpus))
    profile = tmp_path / "profile.yaml"
    profile.write_text("gpu_count: 8\n")
    daemon = start_daemon("--input", str(snap), "--profile", str(profile),
                          "--fast-interval", "0.3", "--slow-interval", "1", *extra)
    return daemon, snap


def test_metrics_appear_change_and_disappear(start_daemon, tmp_path):
    daemon, snap = start_replay(start_daemon, tmp_path)
    text = daemon.metrics()
    temps = metric_lines(text, "gpuguard_gpu_temperature_celsius")
    assert len(temps) == 8 and all(line.endswith(" 40.0") for line in temps)
    assert 'gpuguard_rule_status{gpu="",pci_bus_id="",rule="gpu.count",severity="critical",' \
           'uuid=""} 0.0' in text
    assert len(metric_lines(text, "gpuguard_gpu_info")) == 8

    write_snapshot(snap, host_snapshot(8, {(2, "temperature_c"): 71}))
    daemon.wait_for(lambda: any('gpu="2"' in line and line.endswith(" 71.0") for line in
                                metric_lines(daemon.metrics(), "gpuguard_gpu_temperature_celsius")),
                    what="GPU 2 at 71 C")

    write_snapshot(snap, host_snapshot(7))  # GPU 7 is gone
    gpu7 = 'uuid="GPU-00000000-0000-0000-0000-000000000007"'

    def without_gpu7():
        text = daemon.metrics()
        return text if gpu7 not in text else None

    text = daemon.wait_for(without_gpu7, what="GPU 7's series to go")
    assert len(metric_lines(text, "gpuguard_gpu_temperature_celsius")) == 7
    count = daemon.result("gpu.count")
    assert count["status"] == "critical" and "7 GPU(s) visible, the profile expects 8" \
        in count["message"]
    failed = metric_lines(daemon.metrics(), "gpuguard_rule_failed_cycles")
    assert any('rule="gpu.count"' in line for line in failed)


def test_udev_remove_makes_gpu_count_critical_within_a_second(start_daemon, tmp_path):
    # A ten-minute schedule: only the event can start a cycle in time.
    daemon, snap = start_replay(start_daemon, tmp_path, "--fast-interval", "600",
                                "--slow-interval", "600")
    assert daemon.result("gpu.count")["status"] == "ok"
    write_snapshot(snap, host_snapshot(7))
    sent = time.monotonic()
    daemon.send_event("remove", {"PCI_ID": "10DE:2335", "PCI_SLOT_NAME": "0000:88:00.0",
                                 "SUBSYSTEM": "pci"})
    daemon.wait_for(lambda: daemon.result("gpu.count")["status"] == "critical",
                    timeout=5, what="gpu.count critical")
    took = time.monotonic() - sent
    assert took < 1.0, f"gpu.count went critical {took:.2f} s after the event"
    assert '"reason": "udev remove 0000:88:00.0"' in daemon.log.read_text()


def test_non_nvidia_event_starts_nothing(start_daemon, tmp_path):
    daemon, _ = start_replay(start_daemon, tmp_path, "--fast-interval", "600")
    daemon.send_event("remove", {"PCI_ID": "8086:1572", "PCI_SLOT_NAME": "0000:5e:00.0"})
    time.sleep(0.5)
    assert "udev remove 0000:5e:00.0" not in daemon.log.read_text()


def test_sighup_with_a_bad_rule_file_keeps_the_old_rules(start_daemon, tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    site = rules / "site.yaml"
    site.write_text("rules:\n  - id: site.hot\n    scope: gpu\n    severity: warning\n"
                    "    summary: hot\n    when: 'temperature_c > 30'\n    message: hot\n")
    daemon, _ = start_replay(start_daemon, tmp_path, "--rules", str(rules))
    assert daemon.result("site.hot", 0)["status"] == "warning"

    site.write_text("rules:\n  - id: site.hot\n    scope: gpu\n    severity: fatal\n"
                    "    summary: hot\n    when: 'temperature_c > 30'\n    message: hot\n")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "gpuguard_config_last_reload_successful 0.0" in daemon.metrics(),
                    what="reload failure gauge")
    assert "gpuguard_config_reloads_total 1.0" in daemon.metrics()
    log = daemon.log.read_text()
    failure = next(json.loads(line) for line in log.splitlines()
                   if "config_reload_failed" in line)
    assert failure["file"] == str(site) and failure["line"] == 4
    assert "severity must be one of" in failure["reason"]
    time.sleep(0.7)  # cycles go on with the old rules
    assert daemon.result("site.hot", 0)["status"] == "warning"

    site.write_text("overrides:\n  thermal.margin: {enabled: false}\n")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "gpuguard_config_last_reload_successful 1.0" in daemon.metrics(),
                    what="reload success")
    daemon.wait_for(lambda: daemon.result("site.hot", 0) is None, what="site.hot gone")
    assert daemon.result("thermal.margin", 0)["status"] == "skipped"


def test_hanging_nvml_is_reported_and_the_daemon_recovers(start_daemon, tmp_path, fake_env):
    wedge = tmp_path / "wedge"
    env = fake_env(gpus=2, hang="nvmlDeviceGetTemperature", hang_gpu=1, hang_file=str(wedge))
    daemon = start_daemon("--fast-interval", "0.5", "--slow-interval", "5", "--timeout", "1",
                          env=env)
    assert daemon.result("driver.responsive")["status"] == "ok"
    assert len(metric_lines(daemon.metrics(), "gpuguard_gpu_temperature_celsius")) == 2

    wedge.touch()
    responsive = daemon.wait_for(
        lambda: (r := daemon.result("driver.responsive"))["status"] == "critical" and r,
        what="driver.responsive critical")
    assert "nvmlDeviceGetTemperature (GPU 1)" in responsive["message"]
    started = time.monotonic()
    text = daemon.metrics()  # still answering; the hung GPU's rules unknown, naming the hang
    assert time.monotonic() - started < 1.0
    assert "gpuguard_results_stale 1.0" in text
    hung = daemon.result("thermal.margin", 1)
    assert hung["status"] == "unknown" and "nvmlDeviceGetTemperature (GPU 1)" in hung["message"]
    # GPU 0 answers: fresh (waited for: on a loaded machine the cycle that first met the
    # hang may have run out of its deadline before GPU 0 too)
    daemon.wait_for(lambda: daemon.result("thermal.margin", 0)["status"] == "ok",
                    what="GPU 0 ok while GPU 1 hangs")
    assert daemon.status()["stale"] is True
    assert "gpuguard_check_deadline_exceeded_total" in text

    wedge.unlink()
    daemon.wait_for(lambda: daemon.result("driver.responsive")["status"] == "ok",
                    timeout=15, what="recovery")
    assert "gpuguard_results_stale 0.0" in daemon.metrics()
    assert '"event": "nvml_call_hung"' in daemon.log.read_text()


def test_notify_protocol_and_sigterm(start_daemon, tmp_path):
    import threading

    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0.2)
        messages: list[str] = []
        done = threading.Event()

        def drain():  # as systemd does: read every datagram as it comes
            while not done.is_set():
                try:
                    messages.append(sock.recv(4096).decode())
                except TimeoutError:
                    continue

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        snap = tmp_path / "host.json"
        write_snapshot(snap, host_snapshot(2))
        daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                              env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"},
                              healthy=False)

        def seen(word, after=0):
            return next((m for m in messages[after:] if word in m), None)

        ready = daemon.wait_for(lambda: seen("READY=1"), what="READY=1")
        assert re.search(r"STATUS=2 GPU\(s\): \d+ critical, \d+ warning", ready)
        daemon.wait_for(lambda: seen("WATCHDOG=1"), what="WATCHDOG=1")
        mark = len(messages)
        daemon.proc.send_signal(signal.SIGHUP)
        reloading = daemon.wait_for(lambda: seen("RELOADING=1", mark), what="RELOADING=1")
        assert "MONOTONIC_USEC=" in reloading
        daemon.wait_for(lambda: seen("READY=1", mark + 1), what="READY=1 after reload")
        took = daemon.stop()
        daemon.wait_for(lambda: seen("STOPPING=1"), what="STOPPING=1")
        done.set()
        assert took < 5, f"SIGTERM took {took:.1f} s"
        assert daemon.proc.returncode == 0


def test_a_notify_reader_that_falls_behind_never_stalls_the_daemon(start_daemon, tmp_path):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))  # bound, never read: the queue fills after a few messages
        snap = tmp_path / "host.json"
        write_snapshot(snap, host_snapshot(2))
        daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2",
                              env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000"})
        time.sleep(3)  # dozens of pings against a queue of ten
        assert daemon.metrics()
        assert daemon.stop() < 5


def test_healthz_and_bad_config(start_daemon, tmp_path):
    daemon, _ = start_replay(start_daemon, tmp_path)
    from tests.daemon.conftest import get

    code, body = get(daemon.url + "/healthz")
    assert code == 200 and json.loads(body)["alive"] is True
    assert get(daemon.url + "/nope")[0] == 404
    profile = tmp_path / "bad-profile.yaml"
    profile.write_text("gpu_count: many\n")
    bad = start_daemon("--input", str(FIXTURES / "h200" / "nvidia-smi-q.xml"), "--profile",
                       str(profile), healthy=False)
    assert bad.proc.wait(timeout=10) == 3
    assert "gpu_count must be a whole number" in bad.log.read_text()
