"""Time in gpuguard: wall time as it is shown (one format, in UTC, everywhere a time is
printed: the event list, escalations and acks, failover status, a stuck worker's start;
local time would make two hosts' lines, or a host before and after a timezone change,
disagree), and the clocks durations are measured with (below)."""

from __future__ import annotations

import time


def utc(t: float, suffix: bool = True) -> str:
    """`2026-12-01 16:04:05 UTC` (without the suffix under a column that says UTC)."""
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    return f"{text} UTC" if suffix else text


def utc_stamp(t: float | None = None) -> str:
    """`20261201T160405`: a time in a file name (UTC; it sorts as time)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if t is None else t))


# --- the clocks gpuguard measures time with ---------------------------------------------
#
# The wall clock is for display and for stored timestamps only: NTP steps it, an admin sets
# it, a VM restored from a snapshot wakes up hours behind. Every interval, age, deadline
# and freshness in gpuguard is measured on time.monotonic(), which never steps. What must
# survive a restart of the daemon (time on CPU) is measured on CLOCK_BOOTTIME beside the
# boot id: a monotonic clock the whole boot shares, so another process of the same boot
# can take a difference of it.


def boottime() -> float:
    """Seconds since this boot (CLOCK_BOOTTIME: counts suspend, never steps)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_elapsed(then_boot_id: str | None, then_boottime: float | None,
                 boot_id: str | None) -> float | None:
    """Seconds since the CLOCK_BOOTTIME reading `then_boottime` of boot `then_boot_id`;
    None when it cannot be told: another boot (the clock started again at 0), a boot id
    that was not read, no reading, or a reading ahead of this boot's clock (not ours)."""
    if then_boottime is None or then_boot_id is None or then_boot_id != boot_id:
        return None
    elapsed = boottime() - then_boottime
    return elapsed if elapsed >= 0 else None


# A step of the wall clock smaller than this is not reported: NTP slews at most 0.5 ms a
# second, and the two clocks are read a few microseconds apart.
JUMP_THRESHOLD_S = 2.0


class JumpWatch:
    """Sees the wall clock step: between two looks, the wall and monotonic clocks advance
    by the same amount unless the wall clock was set (or the host was suspended: the
    monotonic clock stops then, so a resume looks like a step forward)."""

    def __init__(self, threshold_s: float = JUMP_THRESHOLD_S) -> None:
        self.threshold_s = threshold_s
        self._wall, self._mono = time.time(), time.monotonic()

    def look(self) -> float | None:
        """How far the wall clock stepped since the last look (seconds, negative: back);
        None when it did not."""
        wall, mono = time.time(), time.monotonic()
        step = (wall - self._wall) - (mono - self._mono)
        self._wall, self._mono = wall, mono
        return step if abs(step) >= self.threshold_s else None
