"""Fail safe (issue 9), daemon side: a failed cycle is never served as fresh, an old ok
is never shown as current, SIGTERM is honoured whatever a source does, and what the
daemon remembers of the kernel log stays bounded."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gpuguard.daemon.app import Daemon
from gpuguard.daemon.metrics import DaemonCollector
from gpuguard.daemon.settings import DAEMON_INPUTS, DaemonConfig
from gpuguard.daemon.xid_counter import XidMarks
from gpuguard.model.results import Status
from gpuguard.sources.host import HostOptions
from tests.conftest import REPO
from tests.daemon.conftest import LIVE, get, host_snapshot, metric_lines, write_snapshot
from tests.test_config_safety import alias_bomb, user_rule


def in_process_daemon(tmp_path: Path, snapshot: dict) -> tuple[Daemon, Path]:
    path = tmp_path / "host.json"
    write_snapshot(path, snapshot)
    host = HostOptions(state_dir=tmp_path, kernel_log=False, procfs=False, sysfs=False,
                       rootfs=False)
    daemon = Daemon(DaemonConfig(inputs=dataclasses.replace(DAEMON_INPUTS, input_path=path),
                                 host=host, udev=False))
    daemon._config = daemon.load_config()
    return daemon, path


def test_a_cycle_that_fails_turns_its_results_unknown_and_stale(tmp_path):
    """Whatever makes a cycle raise (here: the replayed file's reader itself), the rules it
    owned are unknown, /healthz says so, the metrics say so, until a cycle succeeds."""
    daemon, _ = in_process_daemon(tmp_path, host_snapshot(1))
    daemon.fast_cycle()
    assert daemon.health()[0]
    margin = next(r for r in daemon.store.results() if r.rule == "thermal.margin")
    assert margin.status is Status.OK

    broken = daemon._collect_nvml

    def fail() -> None:
        raise RuntimeError("source exploded")

    daemon._collect_nvml = fail  # a source fault, injected below every rule
    daemon.fast_cycle()
    healthy, detail = daemon.health()
    assert not healthy and detail["last_cycle_failed"]
    assert "source exploded" in detail["stale_reason"]
    margin = next(r for r in daemon.store.results() if r.rule == "thermal.margin")
    assert margin.status is Status.UNKNOWN and "stale" in margin.message
    assert margin.observed["last_status"] == "ok"
    assert daemon.status_document()["stale"] is True
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon.store, daemon.stats, lambda: daemon._last))
    text = generate_latest(registry).decode()
    assert 'gpuguard_last_cycle_successful{cadence="fast"} 0.0' in text
    assert "gpuguard_results_stale 1.0" in text
    assert not metric_lines(text, "gpuguard_gpu_temperature_celsius")  # no old telemetry
    assert 'rule="thermal.margin"' in text and "} 3.0" in "".join(
        line for line in metric_lines(text, "gpuguard_rule_status") if "thermal.margin" in line)

    daemon._collect_nvml = broken
    daemon.fast_cycle()
    assert daemon.health()[0] and not daemon.store.stale


def test_inputs_that_used_to_crash_a_cycle_are_judged_like_check(start_daemon, tmp_path):
    """A string clock mask, a NaN, and a kernel-log line with a 5,000-digit number: the
    daemon stays fresh and judges the rest, as `check` does on the same files."""
    snap = host_snapshot(2, {(0, "clock_event_reasons"): "0x1",
                             (1, "temperature_tlimit_margin_c"): -5})
    path = tmp_path / "host.json"
    write_snapshot(path, snap)
    log = tmp_path / "dmesg.txt"
    log.write_text("[  1.000000] NVRM: Xid (PCI:0000:18:00): " + "9" * 5000 + ", x\n")
    daemon = start_daemon("--input", str(path), "--kmsg-file", str(log),
                          "--fast-interval", "0.3", "--slow-interval", "1")
    daemon.wait_for(lambda: daemon.result("thermal.margin", 1), what="first results")
    assert daemon.result("thermal.margin", 1)["status"] == "critical"
    assert daemon.result("clocks.hw_slowdown", 0)["status"] == "unknown"
    assert get(daemon.url + "/healthz")[0] == 200
    assert "cycle_failed" not in daemon.log.read_text()


def test_two_gpus_with_one_uuid_stay_two(start_daemon, tmp_path):
    snap = host_snapshot(2)
    snap["gpus"][1]["uuid"] = snap["gpus"][0]["uuid"]
    snap["gpus"][1]["temperature_tlimit_margin_c"] = -5
    path = tmp_path / "host.json"
    write_snapshot(path, snap)
    daemon = start_daemon("--input", str(path), "--fast-interval", "0.2", "--slow-interval", "1")
    daemon.wait_for(lambda: daemon.result("gpu.identity"), what="gpu.identity")
    for _ in range(5):  # never one flapping between the two
        assert daemon.result("thermal.margin", 0)["status"] == "ok"
        assert daemon.result("thermal.margin", 1)["status"] == "critical"
        time.sleep(0.25)
    assert daemon.result("gpu.identity")["status"] == "critical"
    assert len([line for line in metric_lines(daemon.metrics(), "gpuguard_rule_status")
                if 'rule="thermal.margin"' in line]) == 2


def test_sigterm_is_honoured_while_a_source_waits_on_a_fifo(start_daemon, tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    daemon = start_daemon("--input", str(LIVE), "--kmsg-file", str(fifo), "--timeout", "4",
                          "--fast-interval", "0.5", healthy=False)
    daemon.wait_for(lambda: "daemon_started" in daemon.log.read_text(), what="start")
    time.sleep(1.0)  # a cycle is now waiting on the FIFO
    daemon.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    daemon.proc.wait(timeout=12)
    assert time.monotonic() - started < 9  # the unit's TimeoutStopSec is 15


def test_the_fifo_kernel_log_is_unknown_and_the_rest_fresh(start_daemon, tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    daemon = start_daemon("--input", str(LIVE), "--kmsg-file", str(fifo), "--timeout", "1",
                          "--fast-interval", "0.5")
    xid = daemon.wait_for(lambda: daemon.result("xid.recent"), what="xid.recent")
    assert xid["status"] == "unknown" and "no end of data" in xid["message"]
    assert daemon.result("thermal.margin", 0)["status"] == "ok"


def test_the_xids_the_daemon_remembers_stay_bounded():
    marks = XidMarks()
    events = [{"xid": 13, "pci": "0000:18:00.0", "seq": i, "usec": i * 10, "text": "x"}
              for i in range(300_000)]
    tracemalloc.start()
    assert len(marks.new_events(events)) == 300_000
    assert marks.new_events(events) == []  # counted once
    assert len(marks.new_events([*events, {**events[-1], "seq": 300_000}])) == 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(marks.unnumbered) == 0 and peak < 50 * 1024 * 1024
    # lines without a sequence or a time (dmesg -t) are remembered only while present
    plain = [{"xid": 79, "pci": None, "seq": None, "usec": None, "text": f"t{i}"}
             for i in range(3)]
    assert len(marks.new_events(plain)) == 3
    assert marks.new_events(plain[1:]) == [] and len(marks.unnumbered) == 2


def test_status_json_lists_stale_reason(start_daemon, tmp_path):
    daemon = start_daemon("--input", str(LIVE), "--fast-interval", "0.3")
    doc = daemon.status()
    assert doc["stale"] is False and doc["stale_reason"] is None
    assert json.loads(get(daemon.url + "/healthz")[1])["last_cycle_failed"] is False


def test_the_daemon_refuses_a_bad_rule_at_start_and_keeps_good_rules_on_reload(
        start_daemon, tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "a.yaml").write_text(user_rule('"temperature_c > 1000"'))
    bad = user_rule('""')

    # At start: exit 3 with the file and line, not a crash systemd would loop on.
    (tmp_path / "bad.d").mkdir()
    (tmp_path / "bad.d" / "a.yaml").write_text(bad)
    proc = subprocess.run([sys.executable, "-m", "gpuguard", "daemon", "--input", str(LIVE),
                           "--rules", str(tmp_path / "bad.d"), "--no-udev", "--listen",
                           "127.0.0.1:1", "--log-format", "json"], capture_output=True,
                          text=True, cwd=REPO, timeout=30, check=False)
    assert proc.returncode == 3 and "the condition is empty" in proc.stderr, proc.stderr

    daemon = start_daemon("--input", str(LIVE), "--rules", str(rules), "--fast-interval", "0.3")
    daemon.wait_for(lambda: daemon.result("site.x", 0), what="site.x")
    for text in (bad, alias_bomb()):
        (rules / "a.yaml").write_text(text)
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: "gpuguard_config_last_reload_successful 0.0" in daemon.metrics(),
                        what="reload refused")
        assert daemon.proc.poll() is None
        assert daemon.result("site.x", 0)["status"] == "ok"  # the last good rule still runs
        (rules / "a.yaml").write_text(user_rule('"temperature_c > 1000"'))
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: "gpuguard_config_last_reload_successful 1.0" in daemon.metrics(),
                        what="reload accepted")


def test_an_input_that_cannot_be_read_is_stale_not_fresh(tmp_path):
    daemon, path = in_process_daemon(tmp_path, host_snapshot(1))
    daemon.fast_cycle()
    assert not daemon.store.stale
    path.write_text('{"kind": "x"')  # the replayed file, cut off
    daemon.fast_cycle()
    assert daemon.store.stale and "the NVML sweep failed" in daemon.store.stale_reason()
    assert daemon.status_document()["stale"] is True
