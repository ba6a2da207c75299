"""Wall time as gpuguard shows it: one format, in UTC, everywhere a time is printed (the
event list, escalations and acks, failover status, a stuck worker's start). Local time
would make two hosts' lines, or a host before and after a timezone change, disagree."""

from __future__ import annotations

import time


def utc(t: float, suffix: bool = True) -> str:
    """`2026-12-01 16:04:05 UTC` (without the suffix under a column that says UTC)."""
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    return f"{text} UTC" if suffix else text


def utc_stamp(t: float | None = None) -> str:
    """`20261201T160405`: a time in a file name (UTC; it sorts as time)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if t is None else t))
