"""The supervised services' own logs, read each fast cycle for CUDA errors
(issue 23; service.gpu_errors ties them to the Xids of the service's GPUs).

Each service's active variant has one tail (gpuguard/sources/service_logs.py: the exec
backend's log file, the container's logs, the unit's journal), read in the service
watch's request threads, one read in flight per service. A line that reports a GPU error
(rules/engines/log-errors.yaml) is kept with when it was read (the daemon's monotonic
clock: the line was written within the cycle before) and the run it was read in, for
ERRORS_KEEP_S; another variant starts them over (the failover happened). A read that
fails is reported with the entry and tried again next cycle.
"""

from __future__ import annotations

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
    lines: int = 0


class LogWatch:
    def __init__(self, catalog: EngineCatalog) -> None:
        self.catalog = catalog
        self._logs: dict[str, _Log] = {}

    def log_of(self, supervisor: Supervisor) -> _Log | None:
        """The active variant's log, or None where its backend names none."""
        service = supervisor.service
        variant = supervisor.view().state.active
        log = self._logs.get(service.name)
        if log is None or log.variant != variant:
            tail = service_logs.tail_for(service.backend, service.backend_config, variant)
            if tail is None:
                self._logs.pop(service.name, None)
                return None
            log = self._logs[service.name] = _Log(variant, tail)
        return log

    def read(self, log: _Log) -> dict[str, Any]:
        """The new lines' GPU errors (in a request thread; never raises)."""
        try:
            lines = log.tail.read(DEADLINE_S)
        except service_logs.LogError as exc:
            return {"error": str(exc)[:300]}
        return {"lines": len(lines),
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
        while log.errors and now - log.errors[0]["seen"] > ERRORS_KEEP_S:
            log.errors.popleft()
        out["errors"] = [dict(e) for e in log.errors]
        out["lines_read"] = log.lines
        return out


def _source(backend: str, tail: Any) -> str:
    if isinstance(tail, service_logs.FileTail):
        return f"file {tail.path}"
    if isinstance(tail, service_logs.DockerTail):
        return f"container {tail.container}"
    if isinstance(tail, service_logs.JournalTail):
        return f"journal of {tail.unit}"
    return backend
