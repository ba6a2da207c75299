"""The supervised services' own logs, read each fast cycle for CUDA errors
(issue 23; service.gpu_errors ties them to the Xids of the service's GPUs).

Each service's active variant has one tail (gpuguard/sources/service_logs.py: the exec
backend's log file, the container's logs, the unit's journal), read in the service
watch's request threads, one read in flight per service. A line that reports a GPU error
(rules/engines/log-errors.yaml) is kept with when it was read (the daemon's monotonic
clock: the line was written within the cycle before) and the run it was read in, for
ERRORS_KEEP_S; another variant starts them over (the failover happened). A read that
fails is reported with the entry and tried again next cycle. What a read skipped (its
bound or deadline cut the log) is kept the same way, as `skips`: service.gpu_errors is
unknown while one is within its window (an error may have been among those bytes).

The tail is handed the catalog's patterns as one expression: it keeps only the lines that
match, so a flood of other lines costs a regex scan, not a Python string a line.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpuguard.model.engine_profile import EngineCatalog
from gpuguard.sources import service_logs
from gpuguard.supervisor.service import Supervisor

DEADLINE_S = 2.0
ERRORS_KEEP_S = 3600.0
MAX_ERRORS = 50


@dataclass
class _Log:
    variant: str
    tail: Any
    errors: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_ERRORS))
    skips: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_ERRORS))
    lines: int = 0


class LogWatch:
    def __init__(self, catalog: EngineCatalog) -> None:
        self.catalog = catalog
        self._logs: dict[str, _Log] = {}
        self._keep = any_of(catalog)

    def log_of(self, supervisor: Supervisor) -> _Log | None:
        """The active variant's log, or None where its backend names none."""
        service = supervisor.service
        variant = supervisor.view().state.active
        log = self._logs.get(service.name)
        if log is None or log.variant != variant:
            # another variant than the one watched: the daemon saw it start (a failover),
            # so its lines from its run's start are news; at the first sight of the
            # service (the daemon started) what the log held is not
            tail = service_logs.tail_for(service.backend, service.backend_config, variant,
                                         from_start=log is not None)
            if tail is None:
                self._logs.pop(service.name, None)
                return None
            log = self._logs[service.name] = _Log(variant, tail)
        return log

    def read(self, log: _Log) -> dict[str, Any]:
        """The new lines' GPU errors (in a request thread; never raises)."""
        try:
            lines = log.tail.read(DEADLINE_S, self._keep)
        except service_logs.LogError as exc:
            return {"error": str(exc)[:300]}
        return {"lines": log.tail.count, "skipped": log.tail.skipped,
                "found": service_logs.matches(lines, self.catalog.error_kind)}

    def record(self, supervisor: Supervisor, log: _Log, answer: dict[str, Any] | None,
               identity: str | None, now: float) -> dict[str, Any]:
        """This cycle's read added to the service's errors: what the snapshot's service
        entry holds under `log`."""
        # `now`: the errors' ages are counted from it (the daemon's monotonic clock)
        out: dict[str, Any] = {"source": _source(supervisor.service.backend, log.tail),
                               "now": now}
        if answer is None:
            out["error"] = "not read this cycle"
        elif "error" in answer:
            out["error"] = answer["error"]
        else:
            log.lines += answer["lines"]
            for kind, line in answer["found"]:
                log.errors.append({"kind": kind, "line": line, "seen": now, "run": identity})
            if answer.get("skipped"):
                log.skips.append({"what": str(answer["skipped"])[:300], "seen": now})
        for kept in (log.errors, log.skips):
            while kept and now - kept[0]["seen"] > ERRORS_KEEP_S:
                kept.popleft()
        out["errors"] = [dict(e) for e in log.errors]
        out["skips"] = [dict(e) for e in log.skips]
        out["lines_read"] = log.lines
        return out


def any_of(catalog: EngineCatalog) -> service_logs.Patterns | None:
    """The catalog's error patterns as one expression (case-insensitive, as each is); None
    where they do not combine (the tail then gives every line, matched one by one)."""
    try:
        return service_logs.Patterns([e.pattern.pattern for e in catalog.log_errors])
    except re.error:
        return None


def _source(backend: str, tail: Any) -> str:
    if isinstance(tail, service_logs.FileTail):
        return f"file {tail.path}"
    if isinstance(tail, service_logs.DockerTail):
        return f"container {tail.container}"
    if isinstance(tail, service_logs.JournalTail):
        return f"journal of {tail.unit}"
    return backend
