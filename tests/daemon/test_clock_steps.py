"""Steps of the wall clock (issue 20, item 1): NTP correcting it, a VM restored from a
snapshot. The daemon runs with only its CLOCK_REALTIME shifted (tests/fake_clock, an
LD_PRELOAD shim; its monotonic and boot clocks, and this test's clock, are the real ones):
cycles go on, /healthz and the watchdog say what is true, a GPU that overheats meanwhile
turns critical in time, a window of samples survives, and a failover made under a clock
in the future fails back."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from gpuguard.daemon.freshness import Freshness
from gpuguard.supervisor import state
from tests.daemon.conftest import get, host_snapshot, metric_lines
from tests.daemon.test_fail_safe_daemon import in_process_daemon

HOUR = 3600.0
DAYS_100 = 100 * 86400.0
LEGACY_STATE = Path(__file__).resolve().parent.parent / "supervisor" / "data" / \
    "failover-batch-before-issue-20.json"


class NotifyReader:
    """A NOTIFY_SOCKET read as systemd reads it: every datagram, with when it came
    (this test's monotonic clock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.1)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._done.is_set():
            try:
                data = self._sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data))

    def times_of(self, word: str, after: float = 0.0) -> list[float]:
        return [t for t, m in list(self.messages) if word in m and t >= after]

    def close(self) -> None:
        self._done.set()
        self._thread.join(2)
        self._sock.close()


def fast_cycles(daemon: Any) -> int:
    [line] = [x for x in metric_lines(daemon.metrics(), "gpuguard_cycles_total")
              if 'cadence="fast"' in x]
    return int(float(line.split()[-1]))


def healthz(daemon: Any) -> tuple[int, dict[str, Any]]:
    code, body = get(daemon.url + "/healthz")
    return code, json.loads(body)


def status_of(daemon: Any, rule: str, gpu: int | None = 0) -> str | None:
    result = daemon.result(rule, gpu)
    return None if result is None else str(result["status"])


def test_the_watchdog_is_not_pinged_when_no_cycle_comes(tmp_path, monkeypatch):
    """The main loop's watchdog, in-process: one cycle ends, then none comes (as when the
    schedule waited on a wall clock set back an hour). The pings stop once no cycle has
    ended for 3 x fast interval + 2 x timeout; between cycles is no excuse."""
    daemon, _ = in_process_daemon(tmp_path, host_snapshot(1))
    daemon.cfg.fast_interval = 0.2  # no cycle for 1.2 s: stuck
    daemon.cfg.inputs = dataclasses.replace(daemon.cfg.inputs, timeout=0.3)
    # the freshness rule the watchdog also reads, for these settings: 2 x (0.2 + 0.3)
    daemon.freshness = Freshness({"fast": 0.2, "slow": 60.0}, {"fast": 0.3, "slow": 0.3})
    reader = NotifyReader(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(reader.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # a ping every 50 ms while all is well
    loop = threading.Thread(target=daemon._loop, daemon=True)
    try:
        daemon.fast_cycle()
        ended = time.monotonic()
        loop.start()
        time.sleep(4)
    finally:
        daemon._stop.set()
        loop.join(5)
        reader.close()
    pings = reader.times_of("WATCHDOG=1")
    assert pings and pings[0] - ended < 1.0, "pinged while the last cycle was recent"
    late = [round(t - ended, 2) for t in pings if t - ended > 1.2 + 0.6]
    assert not late, f"pinged {len(late)} times with no cycle for that long: {late[:5]}"


def test_a_clock_set_back_an_hour_mid_run_stops_nothing(start_daemon, fake_env, wall_clock,
                                                        tmp_path):
    temperature = tmp_path / "temperature"
    temperature.write_text("40\n")
    reader = NotifyReader(tmp_path / "notify.sock")
    env = {**fake_env(temp_file=str(temperature)), **wall_clock.env,
           "NOTIFY_SOCKET": str(reader.path), "WATCHDOG_USEC": "1000000"}
    try:
        daemon = start_daemon("--fast-interval", "0.5", "--timeout", "2", env=env)
        daemon.wait_for(lambda: reader.times_of("READY=1"), what="READY=1")
        assert status_of(daemon, "thermal.margin") == "ok"

        wall_clock.set(-HOUR)
        stepped = time.monotonic()
        time.sleep(1)
        before = fast_cycles(daemon)
        time.sleep(4)
        # every 0.5 s: about 8 in 4 s; the scheduler of before ran none for an hour
        assert fast_cycles(daemon) >= before + 3, "cycles stopped after the clock stepped"
        code, health = healthz(daemon)
        age = health["last_successful_cycle_age_s"]
        assert code == 200 and 0 <= age < health["fresh_within_s"], health
        # pinged while cycles come (every 0.5 s for WatchdogSec=1 s)
        assert len(reader.times_of("WATCHDOG=1", after=stepped + 1)) >= 3

        temperature.write_text("95\n")  # overheats under the clock an hour back
        heated = time.monotonic()
        daemon.wait_for(lambda: status_of(daemon, "thermal.margin") == "critical", 15,
                        "thermal.margin critical after the clock stepped back")
        assert time.monotonic() - heated < 15

        text = daemon.log.read_text()
        [jump] = [json.loads(line) for line in text.splitlines()
                  if '"clock_jumped"' in line]
        assert jump["direction"] == "back" and abs(jump["step_s"] + HOUR) < 5, jump
        metrics = daemon.metrics()
        assert "gpuguard_clock_jumps_total 1.0" in metrics
        [last] = metric_lines(metrics, "gpuguard_clock_last_jump_seconds")
        assert abs(float(last.split()[-1]) + HOUR) < 5
        [age_line] = [x for x in metric_lines(metrics, "gpuguard_last_cycle_age_seconds")
                      if 'cadence="fast"' in x]
        assert 0 <= float(age_line.split()[-1]) < 5
    finally:
        reader.close()


def counters(path: Path, replay: int) -> None:
    """The fake NVML's NVLink counters: GPU 0 link 0 with `replay` replays."""
    path.write_text(f"0 0 {replay} 0 0 23\n")


def test_100_days_forward_for_a_few_seconds_loses_no_window(start_daemon, fake_env,
                                                            wall_clock, tmp_path):
    """The samples' window (nvlink.errors judges growth over 10 minutes) lives through a
    jump of 100 days and back: the growth seen before is still seen after, the cycles and
    /healthz never stop, and both steps are logged and counted. (What the event store
    keeps through such a jump is the store's retention: gpuguard/events, another part of
    issue 20.)"""
    file = tmp_path / "nvlink-counters"
    counters(file, 0)
    env = {**fake_env(nvlinks=2, nvlink_counter_file=str(file)), **wall_clock.env}
    daemon = start_daemon("--fast-interval", "0.5", "--timeout", "2", env=env)
    daemon.wait_for(lambda: status_of(daemon, "nvlink.errors") == "ok", 15,
                    "nvlink.errors ok with two samples")
    counters(file, 500)  # past max_replay_growth (100) within the window
    daemon.wait_for(lambda: status_of(daemon, "nvlink.errors") == "warning", 15,
                    "nvlink.errors warning on growth")

    wall_clock.set(DAYS_100)
    seen: list[tuple[str | None, int]] = []
    end = time.monotonic() + 3
    while time.monotonic() < end:
        seen.append((status_of(daemon, "nvlink.errors"), healthz(daemon)[0]))
        time.sleep(0.2)
    wall_clock.set(0)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        seen.append((status_of(daemon, "nvlink.errors"), healthz(daemon)[0]))
        time.sleep(0.2)
    # the growth is 10 minutes old at most: still in the window, through both steps
    assert {s for s, _ in seen} == {"warning"}, seen
    assert {code for _, code in seen} == {200}, seen
    before = fast_cycles(daemon)
    time.sleep(2)
    assert fast_cycles(daemon) >= before + 2
    steps = [json.loads(line) for line in daemon.log.read_text().splitlines()
             if '"clock_jumped"' in line]
    assert [s["direction"] for s in steps] == ["forward", "back"], steps
    assert "gpuguard_clock_jumps_total 2.0" in daemon.metrics()


def exec_service(tmp_path: Path, min_cpu_time: float) -> Path:
    """A service whose variants are marker files (the exec backend, real commands),
    moved by thermal.margin alone."""
    marks = tmp_path / "variants"
    marks.mkdir(exist_ok=True)
    commands: dict[str, list[str]] = {}
    for v in ("gpu", "cpu"):
        commands[f"start_{v}"] = ["touch", str(marks / v)]
        commands[f"stop_{v}"] = ["rm", "-f", str(marks / v)]
        commands[f"running_{v}"] = ["test", "-f", str(marks / v)]
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "batch", "backend": "exec", "rules": ["thermal.margin"],
        "failover_after": 2, "failback_after": 2, "min_cpu_time": min_cpu_time,
        "probe": {"exec": ["true"], "timeout": 10}, "exec": commands}]}))
    return config


def active_of(tmp_path: Path) -> str | None:
    try:
        current = state.read(state.path_for(tmp_path / "state", "batch"))
    except state.Unreadable:
        return None
    return None if current is None or current.transition else current.active


def test_a_failover_under_a_clock_an_hour_ahead_fails_back_once_it_is_corrected(
        start_daemon, fake_env, wall_clock, tmp_path):
    temperature = tmp_path / "temperature"
    temperature.write_text("95\n")
    wall_clock.set(HOUR)  # the daemon starts an hour ahead, and fails over there
    env = {**fake_env(temp_file=str(temperature)), **wall_clock.env}
    daemon = start_daemon("--fast-interval", "0.5", "--config",
                          str(exec_service(tmp_path, min_cpu_time=2)), env=env)
    daemon.wait_for(lambda: active_of(tmp_path) == "cpu", 20, "the failover to CPU")
    assert (tmp_path / "variants" / "cpu").exists()

    wall_clock.set(0)  # NTP corrects the clock: an hour back
    temperature.write_text("40\n")
    cooled = time.monotonic()
    # min_cpu_time 2 s, then 2 healthy cycles: was never (on_cpu_since an hour ahead)
    daemon.wait_for(lambda: active_of(tmp_path) == "gpu", 30, "the failback to GPU")
    assert time.monotonic() - cooled < 30
    assert (tmp_path / "variants" / "gpu").exists()


def test_a_state_file_of_before_written_an_hour_ahead_fails_back_after_a_restart(
        start_daemon, fake_env, tmp_path):
    """The daemon starts an hour behind the clock a failover was made under, and the
    state file is one that gpuguard wrote before issue 20 (wall times only). Its time on
    CPU cannot be told: it counts from the restart (state.rebase), so the service fails
    back after min_cpu_time, not an hour later."""
    (tmp_path / "variants").mkdir()
    config = exec_service(tmp_path, min_cpu_time=2)
    legacy = json.loads(LEGACY_STATE.read_text())
    assert "boot_id" not in legacy and "on_cpu_boottime" not in legacy  # wall times only
    ahead = time.time() + HOUR - legacy["on_cpu_since"]
    for name in ("since", "on_cpu_since", "last_transition"):
        legacy[name] += ahead  # written under a clock an hour ahead of ours
    path = state.path_for(tmp_path / "state", "batch")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(legacy))
    (tmp_path / "variants" / "cpu").touch()  # what it left running

    started = time.monotonic()
    daemon = start_daemon("--fast-interval", "0.5", "--config", str(config),
                          env=fake_env(temp=40))
    daemon.wait_for(lambda: active_of(tmp_path) == "gpu", 30, "the failback to GPU")
    assert time.monotonic() - started >= 2  # min_cpu_time, counted from the restart
    assert '"failover_time_on_cpu_from_restart"' in daemon.log.read_text()
    on_disk = json.loads(path.read_text())
    assert on_disk["boot_id"] and on_disk["on_cpu_boottime"] is None


def test_the_shim_shifts_only_the_wall_clock(wall_clock, tmp_path):
    """The tool of the tests above: the wall clock of a preloaded process moves, its
    monotonic and boot clocks do not (else the tests would prove nothing)."""
    import subprocess
    import sys

    code = ("import time; print(time.time(), time.monotonic(), "
            "time.clock_gettime(time.CLOCK_BOOTTIME))")
    wall_clock.set(-HOUR)
    ours = (time.time(), time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME))
    out = subprocess.run([sys.executable, "-c", code], env={**wall_clock.env},
                         capture_output=True, text=True, check=True).stdout
    theirs = [float(x) for x in out.split()]
    assert abs(theirs[0] - ours[0] + HOUR) < 5
    assert abs(theirs[1] - ours[1]) < 5 and abs(theirs[2] - ours[2]) < 5
    date = shutil.which("date")
    assert date
    shown = subprocess.run([date, "+%s"], env={**wall_clock.env}, capture_output=True,
                           text=True, check=True).stdout
    assert abs(int(shown) - time.time() + HOUR) < 5  # time() and the C library too
    assert re.fullmatch(r"\d+\n", shown)
