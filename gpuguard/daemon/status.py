"""What the daemon says about itself: /healthz, /status and systemd's STATUS= line, and
whether its cycles still come to an end (the watchdog's condition)."""

from __future__ import annotations

import time
from typing import Any

from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.latest import LatestResults
from gpuguard.daemon.metrics import DaemonStats
from gpuguard.model.results import Status, Verdict
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs import json_out
from gpuguard.supervisor.service import Supervisor


def health(stats: DaemonStats, store: LatestResults,
           freshness: Freshness) -> tuple[bool, dict[str, Any]]:
    """Healthy: a fast cycle succeeded within the fast cadence's stale_after (the one
    freshness rule, daemon/freshness.py) and the last one did not fail. The age is on the
    monotonic clock: a wall clock set back or forward changes nothing."""
    with stats.lock:
        last_ok = stats.last_success_mono.get("fast")
        last_failed = stats.last_cycle_ok.get("fast") is False
    age = None if last_ok is None else round(time.monotonic() - last_ok, 3)
    limit = freshness.stale_after("fast")
    fresh = age is not None and age < limit and not last_failed
    return fresh, {"alive": True, "last_successful_cycle_age_s": age,
                   "fresh_within_s": limit, "last_cycle_failed": last_failed,
                   "stale_results": store.stale, "stale_reason": store.stale_reason()}


def document(last: Snapshot | None, store: LatestResults) -> dict[str, Any]:
    doc = json_out.document(last or Snapshot(), Verdict(store.results()))
    doc["stale"] = store.stale
    doc["stale_reason"] = store.stale_reason()
    return doc


def line(last: Snapshot | None, store: LatestResults, supervisors: list[Supervisor]) -> str:
    """systemd's STATUS=: how many GPUs, how many findings, where each service runs."""
    results = store.results()
    worst = {s: sum(1 for r in results if r.status is s)
             for s in (Status.CRITICAL, Status.WARNING, Status.UNKNOWN)}
    gpus = len(last.gpus) if last else 0
    text = (f"{gpus} GPU(s): {worst[Status.CRITICAL]} critical, {worst[Status.WARNING]} "
            f"warning, {worst[Status.UNKNOWN]} unknown")
    reason = store.stale_reason()
    text += f" (results stale: {reason})" if reason else ""
    for supervisor in supervisors:
        snap = supervisor.view()
        moving = f", moving to {snap.state.transition.to}" if snap.state.transition else ""
        text += f"; {snap.service} on {snap.state.active.upper()}{moving}"
    return text


def cycles_progress(stats: DaemonStats, fast_interval: float, timeout: float,
                    stale_after: float = 0.0) -> bool:
    """Whether cycles still come to an end: one ended (or the daemon started) within
    `3 x fast interval + 2 x timeout`, or the fast cadence's stale_after where that is
    longer (a service's probe may make a cycle that long by design), on the monotonic
    clock. Between cycles too: a schedule that stopped starting them (it used to wait on
    the wall clock, which a step back stalled for an hour) is as stuck as a cycle that
    never ends."""
    with stats.lock:
        last_end = max(stats.last_cycle_mono.values(), default=stats.started_mono)
    return time.monotonic() - last_end < max(3 * fast_interval + 2 * timeout, stale_after)


def source_failure(snap: Snapshot) -> str | None:
    """Why this cycle's GPU facts are not all current: NVML hung, or the sweep (or the
    replayed input) failed. NVML not starting at all is a current fact (driver.loaded)."""
    if snap.nvml.hung_call is not None:
        return "NVML did not answer in time"
    if snap.nvml.sweep_error is not None:
        return f"the NVML sweep failed: {snap.nvml.sweep_error[:200]}"
    return None
