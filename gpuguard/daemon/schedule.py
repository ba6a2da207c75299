"""When the daemon's cycles run: the fast and slow cadences, the active probe on a thread
of its own, and a fast cycle at once when an event asks for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler


class Schedule:
    def __init__(self, fast: Callable[..., None], fast_s: float, slow: Callable[..., None],
                 slow_s: float, probe: Callable[[], None] | None, probe_s: float) -> None:
        self.fast = fast
        self._scheduler = BackgroundScheduler(
            # one cycle at a time; the active probe (up to its deadline, 10 s) on its own
            # thread, so that it never delays a fast cycle
            executors={"default": ThreadPoolExecutor(1), "probe": ThreadPoolExecutor(1)},
            job_defaults={
                "coalesce": True,
                "max_instances": 1,
                # A cycle delayed by up to one interval (another cycle ran long) still
                # runs; later than that it is skipped and the next one comes.
                "misfire_grace_time": int(max(1, fast_s)),
            },
            timezone="UTC",
        )
        # First runs at once, fast first (one executor thread takes jobs in order).
        self._scheduler.add_job(fast, "interval", seconds=fast_s, id="fast",
                                next_run_time=_utcnow())
        self._scheduler.add_job(slow, "interval", seconds=slow_s, id="slow",
                                next_run_time=_utcnow(),
                                misfire_grace_time=int(max(1, slow_s)))
        if probe is not None:
            self._scheduler.add_job(probe, "interval", seconds=probe_s, id="active_probe",
                                    executor="probe", misfire_grace_time=int(probe_s))

    def start(self) -> None:
        self._scheduler.start()

    def now(self, reason: str) -> None:
        """A fast cycle at once (after any cycle in progress: one at a time)."""
        self._scheduler.add_job(self.fast, args=[reason], id=f"now-{reason}",
                                replace_existing=True, misfire_grace_time=None)

    def stop(self) -> None:
        self._scheduler.shutdown(wait=False)


def _utcnow() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
