"""When the daemon's cycles run: the fast and slow cadences, the active probe on a thread
of its own, and a fast cycle at once when an event asks for it.

On the monotonic clock, so a step of the wall clock (NTP, a VM restored from a snapshot,
an admin's `date -s`) changes nothing here. This used to be APScheduler 3, whose
interval trigger computes each next run as a wall-clock datetime and whose scheduler
sleeps until `next_run_time - datetime.now()`: with the clock set one hour back, no cycle
ran for an hour, while /healthz and the watchdog said all was well (issue 20). APScheduler
3 has no monotonic mode (4 is a pre-release with another API), and what the daemon needs
of it fits in this module:

- first runs at once, fast first; then every `fast_s` and `slow_s` on a fixed grid from
  the start;
- one cycle at a time (one thread runs them all); when two are due, the one due first
  runs first, fast before slow on a tie;
- a cycle that comes late (another ran long) runs once, at once, however many runs it
  missed (they are coalesced), and the next one is the next point of its grid;
- `now(reason)`: a fast cycle after the one in progress, if any; asked again for the
  same reason before it ran, it still runs once;
- the active probe every `probe_s` (the first after one interval) on a thread of its
  own, so that it never delays a fast cycle; it too comes late at most once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("gpuguard.schedule")


@dataclass
class _Job:
    name: str
    run: Callable[..., None]
    interval_s: float
    due: float = 0.0  # time.monotonic() of its next run

    def advance(self, now: float) -> None:
        """The next point of its grid after `now` (the runs missed in between are one)."""
        missed = max(0, math.floor((now - self.due) / self.interval_s))
        self.due += (missed + 1) * self.interval_s


class Schedule:
    def __init__(self, fast: Callable[..., None], fast_s: float, slow: Callable[..., None],
                 slow_s: float, probe: Callable[[], None] | None, probe_s: float) -> None:
        self.fast = fast
        # in order of precedence on a tie: fast first
        self._jobs = [_Job("fast", fast, fast_s), _Job("slow", slow, slow_s)]
        self._probe = _Job("active_probe", probe, probe_s) if probe is not None else None
        self._asked: list[str] = []  # fast cycles asked for by events, by reason
        self._wake = threading.Condition()
        self._stopped = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        started = time.monotonic()
        for job in self._jobs:
            job.due = started
        targets: list[tuple[str, Callable[[], None]]] = [("cycles", self._run_cycles)]
        if self._probe is not None:
            self._probe.due = started + self._probe.interval_s
            targets.append(("active-probe", self._run_probe))
        for name, target in targets:
            thread = threading.Thread(target=target, name=f"schedule-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def now(self, reason: str) -> None:
        """A fast cycle at once (after any cycle in progress: one at a time)."""
        with self._wake:
            if reason not in self._asked:
                self._asked.append(reason)
            self._wake.notify_all()

    def stop(self) -> None:
        """No cycle starts after this; one in progress is not waited for (the daemon
        waits for it, within its stop grace)."""
        with self._wake:
            self._stopped = True
            self._wake.notify_all()

    # --- the threads --------------------------------------------------------------------

    def _run_cycles(self) -> None:
        while True:
            with self._wake:
                picked = self._next_cycle()
                while picked is None and not self._stopped:
                    self._wake.wait(self._wait_s(self._jobs))
                    picked = self._next_cycle()
                if self._stopped or picked is None:
                    return
            name, run, args = picked
            _guarded(name, run, *args)

    def _next_cycle(self) -> tuple[str, Callable[..., None], tuple[str, ...]] | None:
        """What runs now (under the lock): a cycle an event asked for, else the interval
        job due first; None when nothing is due yet."""
        if self._asked:
            return "fast", self.fast, (self._asked.pop(0),)
        now = time.monotonic()
        due = [job for job in self._jobs if job.due <= now]
        if not due:
            return None
        job = min(due, key=lambda j: j.due)  # min keeps the first of equals: fast
        job.advance(now)
        return job.name, job.run, ()

    def _run_probe(self) -> None:
        assert self._probe is not None
        job = self._probe
        while True:
            with self._wake:
                while not self._stopped and job.due > time.monotonic():
                    self._wake.wait(self._wait_s([job]))
                if self._stopped:
                    return
                job.advance(time.monotonic())
            _guarded(job.name, job.run)

    @staticmethod
    def _wait_s(jobs: list[_Job]) -> float:
        # Condition.wait's timeout runs on the monotonic clock; the cap only bounds how
        # long a wrong `due` could hold a thread, it never decides when a job runs.
        return min(max(min(j.due for j in jobs) - time.monotonic(), 0.0), 60.0)


def _guarded(name: str, run: Callable[..., None], *args: str) -> None:
    """A job that raises is logged, and the schedule goes on (the daemon's cycles catch
    their own exceptions; this is the last guard)."""
    try:
        run(*args)
    except Exception:
        log.exception("scheduled_job_failed", job=name)
