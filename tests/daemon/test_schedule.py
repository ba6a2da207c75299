"""The daemon's schedule (daemon/schedule.py, on the monotonic clock since issue 20) keeps
what APScheduler did for it: first runs at once, fast first; one cycle at a time; a
late cycle runs once; a cycle at once on an event; the probe on a thread of its own. Real
threads and sleeps; the bounds are generous (others' tests load this machine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpuguard.daemon.schedule import Schedule


class Jobs:
    """Records each run: (job, reason, start, end) on the monotonic clock, and the most
    cycles that ever ran at once."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, float, float]] = []
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.took = {"fast": 0.0, "slow": 0.0, "probe": 0.0}
        self.first_fast: float | None = None  # how long the first fast run takes

    def job(self, name: str) -> Callable[..., None]:
        def run(reason: str = "schedule") -> None:
            started = time.monotonic()
            if name != "probe":
                with self.lock:
                    self.running += 1
                    self.most_at_once = max(self.most_at_once, self.running)
            took = self.took[name]
            if name == "fast" and self.first_fast is not None:
                took, self.first_fast = self.first_fast, None
            time.sleep(took)
            if name != "probe":
                with self.lock:
                    self.running -= 1
            with self.lock:
                self.runs.append((name, reason, started, time.monotonic()))

        return run

    def of(self, name: str) -> list[tuple[str, str, float, float]]:
        with self.lock:
            return [r for r in self.runs if r[0] == name]


@pytest.fixture
def schedule() -> Iterator[Callable[..., tuple[Schedule, Jobs]]]:
    made: list[Schedule] = []

    def make(fast_s: float = 0.2, slow_s: float = 1.0, probe_s: float | None = None,
             **took: float) -> tuple[Schedule, Jobs]:
        jobs = Jobs()
        jobs.took.update(took)
        sched = Schedule(jobs.job("fast"), fast_s, jobs.job("slow"), slow_s,
                         jobs.job("probe") if probe_s else None, probe_s or 0.0)
        made.append(sched)
        return sched, jobs

    yield make
    for sched in made:
        sched.stop()


def wait(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_first_runs_come_at_once_fast_first_then_on_their_cadences(schedule):
    sched, jobs = schedule(fast_s=0.2, slow_s=1.0)
    started = time.monotonic()
    sched.start()
    time.sleep(2.1)
    sched.stop()
    names = [r[0] for r in jobs.runs]
    assert names[:2] == ["fast", "slow"]
    assert jobs.runs[0][2] - started < 0.5
    assert 6 <= len(jobs.of("fast")) <= 12  # every 0.2 s: about 11 in 2.1 s
    assert 2 <= len(jobs.of("slow")) <= 3  # at 0, 1 and 2 s


def test_one_cycle_at_a_time(schedule):
    sched, jobs = schedule(fast_s=0.1, slow_s=0.25, fast=0.15, slow=0.05)
    sched.start()
    time.sleep(2.0)
    sched.stop()
    time.sleep(0.4)
    assert jobs.most_at_once == 1
    assert len(jobs.of("fast")) >= 4 and len(jobs.of("slow")) >= 2


def test_a_late_cycle_runs_once_at_once_then_on_its_grid(schedule):
    # the first fast cycle takes 2.2 s, missing the runs due at 0.5, 1.0, 1.5 and 2.0 s:
    # they are one run, at once; the next one is at 2.5 s, not a burst of four
    sched, jobs = schedule(fast_s=0.5, slow_s=60.0)
    jobs.first_fast = 2.2
    started = time.monotonic()
    sched.start()
    wait(lambda: len(jobs.of("fast")) >= 3, 10)
    sched.stop()
    first, late, on_grid = jobs.of("fast")[:3]
    assert late[2] - first[3] < 0.2, (first, late)  # at once after the long one
    assert on_grid[2] - started >= 2.45, on_grid  # then the grid: 2.5 s
    burst = [r for r in jobs.of("fast") if first[3] <= r[2] <= first[3] + 0.2]
    assert len(burst) == 1, burst


def test_a_cycle_asked_for_now_runs_after_the_one_in_progress_and_once(schedule):
    sched, jobs = schedule(fast_s=30.0, slow_s=60.0, fast=0.3)
    sched.start()
    wait(lambda: jobs.of("slow"))
    time.sleep(0.1)
    asked = time.monotonic()
    sched.now("udev remove")
    sched.now("udev remove")  # again before it ran: one run
    sched.now("nvml xid event")
    wait(lambda: len(jobs.of("fast")) >= 3)
    time.sleep(0.5)
    reasons = [r[1] for r in jobs.of("fast")]
    assert reasons == ["schedule", "udev remove", "nvml xid event"], reasons
    assert jobs.of("fast")[1][2] - asked < 1.0


def test_the_probe_runs_on_a_thread_of_its_own(schedule):
    # a probe that takes 1.5 s delays no fast cycle; its first run is after one interval
    sched, jobs = schedule(fast_s=0.1, slow_s=10.0, probe_s=0.5, probe=1.5)
    started = time.monotonic()
    sched.start()
    wait(lambda: jobs.running == 0 and jobs.of("probe"), 10)
    probe = jobs.of("probe")[0]
    assert probe[2] - started >= 0.45
    during = [r for r in jobs.of("fast") if probe[2] <= r[2] <= probe[3]]
    assert len(during) >= 5, during  # every 0.1 s while the probe ran 1.5 s
    sched.stop()


def test_nothing_starts_after_stop(schedule):
    sched, jobs = schedule(fast_s=0.05, slow_s=0.05, probe_s=0.05)
    sched.start()
    time.sleep(0.3)
    sched.stop()
    stopped = time.monotonic()
    time.sleep(0.3)
    with jobs.lock:
        assert not [r for r in jobs.runs if r[2] > stopped + 0.01]
