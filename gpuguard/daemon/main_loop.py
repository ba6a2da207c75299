"""The daemon's main thread, until SIGTERM: reloads on SIGHUP, systemd's READY= and
STATUS=, its watchdog, and steps of the wall clock (seen, logged and counted)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gpuguard.daemon import notify, status
from gpuguard.daemon.metrics import DaemonStats
from gpuguard.io.clock import JumpWatch

log = structlog.get_logger("gpuguard.daemon")


@dataclass
class Parts:
    stop: threading.Event
    reload: threading.Event
    do_reload: Callable[[], None]
    ready: threading.Event  # set once a fast cycle ended
    status_line: Callable[[], str]
    stats: DaemonStats
    fast_interval: float
    timeout: float
    # the fast cadence's stale_after (daemon/freshness.py): a cycle slow by design (a
    # service's long probe) is no stuck daemon for the watchdog either
    stale_after: Callable[[], float] = lambda: 0.0


def run(parts: Parts) -> None:
    ping = notify.watchdog_interval()
    ready_sent = False
    last_status = ""
    last_ping = 0.0
    jumps = JumpWatch()
    while not parts.stop.wait(min(1.0, ping or 1.0)):
        clock_step(parts.stats, jumps.look())
        if parts.reload.is_set():
            parts.reload.clear()
            parts.do_reload()
        if parts.ready.is_set():
            line = parts.status_line()
            if not ready_sent:
                notify.notify("READY=1", f"STATUS={line}")
                ready_sent = True
            elif line != last_status:
                notify.notify(f"STATUS={line}")
            last_status = line
        # The watchdog is pinged from this loop, not from cycles: a wedged GPU is
        # reported (driver.responsive) instead of getting the daemon restarted. But only
        # while cycles come to an end: every read has a deadline, so a cycle that does
        # not end, or a schedule that starts none, is a stuck daemon, and systemd
        # restarting it is the right cure.
        if ping and time.monotonic() - last_ping >= ping and status.cycles_progress(
                parts.stats, parts.fast_interval, parts.timeout, parts.stale_after()):
            notify.notify("WATCHDOG=1")
            last_ping = time.monotonic()


def clock_step(stats: DaemonStats, step: float | None) -> None:
    """A step of the wall clock (io/clock.JumpWatch): logged and counted. Nothing else
    to do: every interval, age and deadline runs on the monotonic clock, and the wall
    clock only stamps what is shown and stored."""
    if step is None:
        return
    with stats.lock:
        stats.clock_jumps_total += 1
        stats.last_clock_jump_s = round(step, 3)
    log.warning("clock_jumped", step_s=round(step, 3),
                direction="forward" if step > 0 else "back",
                effect="none: intervals, ages and deadlines run on the monotonic clock")
