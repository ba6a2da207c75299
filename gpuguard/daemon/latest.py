"""The daemon's last results: one per rule and GPU, with how many cycles in a row it failed.

A warning or critical result counts as a failed cycle, ok resets the count, and an
unknown or skipped result leaves it as it was (the supervisor's rule: we did not learn
anything). State changes are logged with the observed values; steady states are not.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gpuguard.model.results import Result, Status

log = structlog.get_logger("gpuguard.results")

# (rule, the GPU's live key (model.identity.GpuId.key), or "" for a host rule)
Key = tuple[str, str]
FAILED = (Status.WARNING, Status.CRITICAL)


def key_of(result: Result) -> Key:
    if result.gpu is None:
        return (result.rule, "")
    return (result.rule, result.gpu.key)


@dataclass
class Entry:
    result: Result
    failed_cycles: int
    since: float


class LatestResults:
    """The last result of every rule and GPU. `stale` says when they are not all fresh:
    NVML did not answer (the GPUs it did not answer for are unknown, naming the call), or
    a cycle failed (its rules turn unknown: an old ok is never served as current)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}
        self._cadence_of: dict[Key, str] = {}
        self._source_failed: str | None = None  # why the sources were not all read
        self._failed: dict[str, str] = {}  # cadence -> why its last cycle failed
        self._updated: dict[str, float] = {}  # cadence -> its last update (monotonic)
        # called after each update or failure, outside the lock (NPD's files, issue 22)
        self.on_change: Callable[[], None] | None = None

    @property
    def stale(self) -> bool:
        with self._lock:
            return self._source_failed is not None or bool(self._failed)

    def cycle_failed(self, cadence: str) -> bool:
        with self._lock:
            return cadence in self._failed

    def stale_reason(self) -> str | None:
        with self._lock:
            reasons = [f"the last {c} cycle failed: {why}" for c, why in sorted(
                self._failed.items())]
            if self._source_failed is not None:
                reasons.append(self._source_failed)
        return "; ".join(reasons) or None

    def update(self, results: list[Result], cadence: str,
               source_failed: str | None = None) -> None:
        """Replace this cadence's results with a cycle's. Results of rules or GPUs that the
        cycle no longer has (a GPU that left, a rule no longer selected) go with their series."""
        now = time.time()
        with self._lock:
            seen = set()
            for result in results:
                key = key_of(result)
                seen.add(key)
                self._put(key, result, cadence, now)
            for key in [k for k, c in self._cadence_of.items()
                        if c == cadence and k not in seen]:
                del self._entries[key]
                del self._cadence_of[key]
            self._failed.pop(cadence, None)
            self._updated[cadence] = time.monotonic()
            if cadence == "fast":
                self._source_failed = source_failed
        if self.on_change is not None:
            self.on_change()

    def mark_failed(self, cadence: str, why: str) -> None:
        """A cycle of `cadence` failed: its rules are unknown until one succeeds. The last
        status is kept in `observed`; the failure count is left as it was (we learned
        nothing), as for any unknown result."""
        now = time.time()
        with self._lock:
            self._failed[cadence] = why
            for key, entry in list(self._entries.items()):
                if self._cadence_of.get(key) != cadence or \
                        entry.result.observed.get("stale"):
                    continue
                old = entry.result
                stale = dataclasses.replace(
                    old, status=Status.UNKNOWN, remediation=None,
                    message=f"stale: the last {cadence} cycle failed ({why}); the last result "
                            f"was {old.status.value}: {old.message}",
                    observed={"stale": True, "last_status": old.status.value})
                self._put(key, stale, cadence, now)
        if self.on_change is not None:
            self.on_change()

    def _put(self, key: Key, result: Result, cadence: str, now: float) -> None:
        old = self._entries.get(key)
        failed = old.failed_cycles if old else 0
        if result.status in FAILED:
            failed += 1
        elif result.status is Status.OK:
            failed = 0
        if old is None or old.result.status is not result.status:
            _log_change(old.result if old else None, result)
            since = now
        else:
            since = old.since
        self._entries[key] = Entry(result, failed, since)
        self._cadence_of[key] = cadence

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def results(self) -> list[Result]:
        return [e.result for e in self.entries()]

    def by_cadence(self) -> list[tuple[Result, str, float]]:
        """Each result with its cadence and when (monotonic) that cadence's last cycle
        replaced it: `gpuguard status` judges freshness per cadence from these."""
        with self._lock:
            return [(e.result, self._cadence_of[k], self._updated.get(self._cadence_of[k], 0.0))
                    for k, e in self._entries.items()]


def _log_change(old: Result | None, new: Result) -> None:
    if old is None and new.status in (Status.OK, Status.SKIPPED):
        return  # the first ok of a rule is not news
    log.info(
        "rule_state_changed",
        rule=new.rule,
        gpu=None if new.gpu is None else new.gpu.index,
        uuid=None if new.gpu is None else new.gpu.uuid,
        old=None if old is None else old.status.value,
        new=new.status.value,
        message=new.message,
        observed=new.observed,
    )
