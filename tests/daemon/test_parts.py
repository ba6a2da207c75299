"""The daemon's parts as plain functions: notify, udev handler, result store, history rules."""

import dataclasses
import os
import socket

import pytest

from gpuguard.daemon import notify
from gpuguard.daemon import triggers as events
from gpuguard.daemon.latest import LatestResults
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.model.samples import Samples
from gpuguard.model.snapshot import Reading
from tests.conftest import set_gpu


def test_notify_to_an_abstract_socket(monkeypatch):
    name = f"gpuguard-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.notify("READY=1", "STATUS=8 GPU(s): 0 critical")
        assert sock.recv(4096) == b"READY=1\nSTATUS=8 GPU(s): 0 critical"
        assert notify.reloading()
        lines = sock.recv(4096).decode().split("\n")
        assert lines[0] == "RELOADING=1" and lines[1].startswith("MONOTONIC_USEC=")


def test_notify_outside_systemd(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False


def test_watchdog_interval(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert notify.watchdog_interval() is None


@pytest.mark.parametrize(("action", "props", "fires"), [
    ("remove", {"PCI_ID": "10DE:2335", "PCI_SLOT_NAME": "0000:3b:00.0"}, True),
    ("add", {"PCI_ID": "10de:2335", "PCI_SLOT_NAME": "0000:3b:00.0"}, True),
    ("unbind", {"DRIVER": "nvidia", "PCI_SLOT_NAME": "0000:3b:00.0"}, True),
    ("remove", {"PCI_ID": "8086:1572", "PCI_SLOT_NAME": "0000:5e:00.0"}, False),  # a NIC
    ("move", {"PCI_ID": "10DE:2335"}, False),
])
def test_udev_handler(action, props, fires):
    reasons = []
    assert events.handle_udev(action, props, reasons.append) is fires
    assert bool(reasons) is fires
    if fires:
        assert reasons == [f"udev {action} {props['PCI_SLOT_NAME']}"]


def result(status, rule="ecc.uncorrected", gpu=0):
    return Result(rule, status, Status.CRITICAL, "m", GpuId(gpu, f"GPU-{gpu}", None))


def test_store_counts_consecutive_failures_and_unknown_neither_counts_nor_resets():
    store = LatestResults()
    for status, expected in ((Status.CRITICAL, 1), (Status.CRITICAL, 2),
                             (Status.UNKNOWN, 2), (Status.WARNING, 3), (Status.OK, 0)):
        store.update([result(status)], "fast")
        [entry] = store.entries()
        assert entry.failed_cycles == expected, status


def test_store_drops_a_gpu_that_left_and_marks_a_failed_cycle_stale():
    store = LatestResults()
    store.update([result(Status.OK, gpu=0), result(Status.OK, gpu=1)], "fast")
    store.update([result(Status.OK, gpu=0)], "fast")
    assert {e.result.gpu.index for e in store.entries()} == {0}
    store.update([result(Status.CRITICAL, gpu=0)], "fast",
                 source_failed="NVML did not answer in time")
    assert store.stale and "NVML did not answer" in store.stale_reason()
    store.mark_failed("fast", "RuntimeError: boom")
    [entry] = store.entries()
    assert entry.result.status is Status.UNKNOWN and entry.failed_cycles == 1
    store.mark_failed("fast", "again")  # a second failure keeps the first stale text
    assert "boom" in store.entries()[0].result.message
    store.update([result(Status.OK, gpu=0)], "fast")
    assert not store.stale and store.entries()[0].failed_cycles == 0


def history_of(h200, values, field, start=0.0, step=5.0):
    history = Samples()
    for i, value in enumerate(values):
        set_gpu(h200, **{field: value})
        history.add(h200, start + i * step)
    return history


def run_with_history(rule, snapshot, history, default_rules):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    [res] = evaluate(snapshot, default_rules, Profile(), only=[rule], samples=history)
    return res


def test_ecc_growth_and_counter_reset(h200, default_rules):
    grew = history_of(h200, [0, 0, 3], "ecc_volatile_corrected")
    res = run_with_history("ecc.corrected", h200, grew, default_rules)
    assert res.status is Status.WARNING and "grew by 3 in the last 5 s" in res.message
    reset = history_of(h200, [50, 0], "ecc_volatile_corrected")  # driver reloaded
    assert run_with_history("ecc.corrected", h200, reset, default_rules).status is Status.OK


def test_replay_rate_against_dcgm_limit(h200, default_rules):
    # Gen5 x16: DCGM's limit is 1e-12 x 32e9 x 60 x 16 = 30.72 replays per minute.
    slow = history_of(h200, [0, 5, 10, 15, 20], "pcie_replay_counter", step=30)  # 10/min
    res = run_with_history("pcie.replays", h200, slow, default_rules)
    assert res.status is Status.OK and res.observed["limit_per_minute"] == 30.72
    fast = history_of(h200, [0, 40, 80, 120], "pcie_replay_counter", step=30)  # 80/min
    res = run_with_history("pcie.replays", h200, fast, default_rules)
    assert res.status is Status.WARNING and "80.00/min" in res.message


def test_hw_slowdown_needs_most_minutes_of_the_window(h200, default_rules):
    # one blip: active now, in 1 of 10 minutes
    blip = history_of(h200, [0x1] * 110 + [0x8], "clock_event_reasons")
    res = run_with_history("clocks.hw_slowdown", h200, blip, default_rules)
    assert res.status is Status.OK and "not yet persistent" in res.message
    # slowdown in 7 of the last 10 minutes
    values = ([0x8] * 12 + [0x1] * 12) * 2 + [0x8] * 12 * 5
    persistent = history_of(h200, values, "clock_event_reasons")
    res = run_with_history("clocks.hw_slowdown", h200, persistent, default_rules)
    assert res.status is Status.CRITICAL and res.observed["minutes_with_slowdown"] >= 6


def test_history_forgets_a_gpu_that_left(h200):
    history = Samples()
    history.add(h200, 0.0)
    assert history.of(h200.gpus[0])
    gone = h200.gpus.pop()
    history.add(h200, 5.0)
    assert history.of(gone) == []


def test_aer_growth_warns(h200, default_rules):
    def chain(n):
        return Reading.ok([{"address": "0000:00:06.0", "role": "gpu",
                            "correctable": {"TOTAL": n}, "fatal": {"TOTAL": 0},
                            "nonfatal": {"TOTAL": 0}}])
    history = Samples()
    for t, n in ((0.0, 2), (5.0, 9)):
        set_gpu(h200, pcie_aer=chain(n))
        history.add(h200, t)
    res = run_with_history("pcie.aer", h200, history, default_rules)
    assert res.status is Status.WARNING and "grew by 7" in res.message


def test_the_history_is_as_long_as_the_longest_window_a_rule_judges(tmp_path):
    from gpuguard.daemon.app import Daemon
    from gpuguard.daemon.settings import DAEMON_INPUTS, DaemonConfig

    profile = tmp_path / "profile.yaml"
    profile.write_text("rules:\n  nvlink.errors:\n    thresholds: {window_s: 3600}\n")
    daemon = Daemon(DaemonConfig(inputs=dataclasses.replace(DAEMON_INPUTS,
                                                            profile_path=profile)))
    daemon.use_config(daemon.load_config())
    assert daemon.samples.keep_s == 3660.0
    profile.write_text("")
    daemon.use_config(daemon.load_config())
    assert daemon.samples.keep_s == 660.0
