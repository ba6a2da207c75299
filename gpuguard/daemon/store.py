"""The daemon's last results: one per rule and GPU, with how many cycles in a row it failed.

A warning or critical result counts as a failed cycle, ok resets the count, and an
unknown or skipped result leaves it as it was (the supervisor's rule: we did not learn
anything). State changes are logged with the observed values; steady states are not.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import structlog

from gpuguard.results import Result, Status

log = structlog.get_logger("gpuguard.results")

Key = tuple[str, str]  # (rule, gpu uuid or "" for host rules)
FAILED = (Status.WARNING, Status.CRITICAL)


def key_of(result: Result) -> Key:
    if result.gpu is None:
        return (result.rule, "")
    return (result.rule, result.gpu.uuid or result.gpu.pci_bus_id or f"index-{result.gpu.index}")


@dataclass
class Entry:
    result: Result
    failed_cycles: int
    since: float


class ResultStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}
        self._cadence_of: dict[Key, str] = {}
        self.stale = False

    def update(self, results: list[Result], cadence: str, partial: bool = False) -> None:
        """Replace this cadence's results. `partial` (a hung NVML sweep) updates only the
        results given and keeps the rest, marked stale, rather than dropping every GPU."""
        now = time.time()
        with self._lock:
            seen = set()
            for result in results:
                key = key_of(result)
                seen.add(key)
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
            if not partial:
                for key in [k for k, c in self._cadence_of.items()
                            if c == cadence and k not in seen]:
                    # a GPU that left, or a rule no longer selected: its series go too
                    del self._entries[key]
                    del self._cadence_of[key]
            self.stale = partial

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def results(self) -> list[Result]:
        return [e.result for e in self.entries()]


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
