"""The daemon's side of the event store: a thread of its own does every disk access.

A cycle only hands its results over (memory, bounded) and takes the history's verdicts
(escalations, acks) that the thread worked out for the previous cycle: no cycle waits on
the disk, however slow or locked it is. An overlay entry applies only while the result's
finding (status, and the set it names) is the one it was worked out for, so a changed
finding never carries an old ack. Bad rows the thread meets are skipped and counted
(`metrics()["rows_skipped"]`), never the end of the recording.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gpuguard.events import store as eventstore
from gpuguard.events.escalation import apply_history
from gpuguard.events.recording import finding_of, rule_transitions
from gpuguard.events.store import Event, Finding, StoreUnreadable
from gpuguard.events.writer import EventWriter
from gpuguard.judge.actions import FAILING
from gpuguard.model.identity import GpuId, finding_key
from gpuguard.model.results import Result
from gpuguard.model.rule import RuleSet
from gpuguard.model.snapshot import Snapshot

log = structlog.get_logger("gpuguard.events")

# Cycles waiting for the thread; more are dropped (counted): the disk is that slow.
CYCLES_QUEUED_MAX = 64
# A failing finding history has not yet been worked out for (the daemon's first cycle, a
# new finding): the cycle waits this long for the thread to work it out, so the first
# verdict already carries its acks and escalations, as a cold check's does (issue 27: one
# judgement). Once per finding: past the bound (a locked store) it comes a cycle later.
FIRST_HISTORY_WAIT_S = 1.0
FLUSH_EVERY_S = 1.0


@dataclasses.dataclass(frozen=True)
class Overlay:
    """History's word on one finding, worked out by the thread for the last cycle."""

    finding: Finding  # the status and names it was worked out for
    action: str
    reason: str | None
    observed: dict[str, Any]


def _key(r: Result) -> tuple[str, str]:
    return finding_key(r.rule, r.gpu)


class EventRecorder:
    def __init__(self, path: Path, boot_id: str | None,
                 flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.writer = EventWriter(path, boot_id)
        self.boot_id = boot_id
        self.flush_every_s = flush_every_s
        self.cycles_dropped = 0
        self._cycles: deque[tuple[list[Result], dict[int, GpuId], RuleSet, float]] = deque()
        self._overlay: dict[tuple[str, str], Overlay] = {}
        self._last: dict[tuple[str, str], Finding] | None = None
        self._lock = threading.Lock()
        self._asked: set[tuple[str, str]] = set()  # findings a cycle waited for once
        self._worked = threading.Condition(self._lock)  # the thread finished a work()
        self._works = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # a test's stand-in for a slow disk: called before each flush
        self.before_flush: Callable[[], None] | None = None

    # --- in the cycle: memory only ----------------------------------------------------

    def apply(self, results: list[Result], snapshot: Snapshot,
              ruleset: RuleSet) -> list[Result]:
        """The daemon's history step (gpuguard/assess/history.History), called by the one
        judgement (gpuguard/assess/once.judge) of each cycle."""
        return self.on_cycle(results, snapshot.gpu_ids(), ruleset)

    def on_cycle(self, results: list[Result], known: dict[int, GpuId],
                 ruleset: RuleSet) -> list[Result]:
        """The results with the history's last verdicts applied; queued for recording. A
        failing finding met for the first time waits (once, FIRST_HISTORY_WAIT_S at most)
        for the thread to work out its history."""
        new = {_key(r) for r in results if r.status in FAILING} - self._asked
        with self._lock:
            if len(self._cycles) >= CYCLES_QUEUED_MAX:
                self._cycles.popleft()
                self.cycles_dropped += 1
            self._cycles.append((results, known, ruleset, time.time()))
            works = self._works
        self._wake.set()
        if new and self._thread is not None and self._thread.is_alive():
            self._asked |= new
            end = time.monotonic() + FIRST_HISTORY_WAIT_S
            with self._worked:
                while self._works == works and time.monotonic() < end:
                    self._worked.wait(max(0.0, end - time.monotonic()))
        with self._lock:
            overlay = dict(self._overlay)
        out = []
        for r in results:
            verdict = overlay.get(_key(r)) if r.status in FAILING else None
            if verdict is not None and verdict.finding == finding_of(r):
                r = dataclasses.replace(r, action=verdict.action, action_reason=verdict.reason,
                                        observed={**r.observed, **verdict.observed})
            out.append(r)
        return out

    def record(self, event: Event) -> None:
        self.writer.record(event)
        self._wake.set()

    # --- the thread -------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-store", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            try:
                self.work()
            except Exception:  # never the end of the recording, nor of the daemon
                log.exception("event_store_error")
        try:
            self.work()  # what the last cycle left
        except Exception:
            log.exception("event_store_error")
        self.writer.close()

    def work(self) -> None:
        """Take the queued cycles: work out their history verdicts, record their
        transitions, write. Runs on the thread (and in tests, directly)."""
        if self.before_flush is not None:
            self.before_flush()
        if self._last is None:
            self._last = self.writer.last_findings()
        with self._lock:
            cycles = list(self._cycles)
            self._cycles.clear()
        for results, known, ruleset, when in cycles:
            applied = self._history(results, known, ruleset, when)
            self.writer.record_all(rule_transitions(applied, self._last, "daemon",
                                                    when))
        with self._worked:  # the overlay is this cycle's: a waiting cycle takes it now
            self._works += 1
            self._worked.notify_all()
        self.writer.flush()

    def _history(self, results: list[Result], known: dict[int, GpuId], ruleset: RuleSet,
                 when: float) -> list[Result]:
        applied = results
        if any(r.status in FAILING for r in results):
            try:
                conn = eventstore.open_reader(self.writer.path)
            except StoreUnreadable:
                conn = None
            if conn is not None:
                try:
                    applied = apply_history(results, conn, self.boot_id, ruleset, known, when,
                                            skipped=self.writer.skipped)
                finally:
                    conn.close()
        # this cycle's results only: the other cadence's verdicts stay as they were
        with self._lock:
            overlay = dict(self._overlay)
            for before, after in zip(results, applied, strict=True):
                key = _key(after)
                if (after.action, after.action_reason) == (before.action, before.action_reason):
                    overlay.pop(key, None)
                    continue
                extra = {k: v for k, v in after.observed.items()
                         if before.observed.get(k) != v}
                overlay[key] = Overlay(finding_of(after), after.action, after.action_reason,
                                       extra)
            self._overlay = overlay
        return applied

    def metrics(self) -> dict[str, Any]:
        """The recorder's counters for /metrics (daemon/metrics.py exports them).
        size_bytes: the main file and its WAL; wal_pinned: flushes held back above the
        bound by a reader pinning the WAL; wal_replaced: the store's files deleted or
        replaced under it; rows_skipped: bad rows met (each once); unsafe: opens refused
        (a link or another user's file); dropped["wal_lost"]: events a deleted WAL took."""
        stats = self.writer.stats
        return {"written": stats.written, "dropped": dict(stats.dropped),
                "corrupt": stats.corrupt_moved, "queued": stats.queued,
                "busy": stats.busy, "size_bytes": stats.size_bytes,
                "wal_bytes": stats.wal_bytes, "wal_pinned": stats.wal_pinned,
                "wal_replaced": stats.wal_replaced, "unsafe": stats.unsafe,
                "rows_skipped": self.writer.skipped.count,
                "cycles_dropped": self.cycles_dropped}


def supervisor_event(what: dict[str, Any]) -> Event:
    """A failover transition that ended, as the event store keeps it."""
    return Event(kind="supervisor", source="supervisor", rule=str(what.get("service")),
                 status=f"{what.get('outcome')}:{what.get('to')}",
                 action=str(what.get("action") or "none"), message=str(what.get("reason") or ""),
                 data={k: v for k, v in what.items() if k not in ("reason", "action")})
