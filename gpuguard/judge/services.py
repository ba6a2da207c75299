"""The service.* rules' findings, one per service, as one result for the host: its
status the worst service's, each service's own in `observed.service_status` (the
supervisor counts only its own: gpuguard/supervisor/policy.py), every service named in
the message. gpuguard/checks/service.py and service_engine.py share these."""

from __future__ import annotations

from typing import Any

from gpuguard.judge.registry import CheckContext, Finding, skipped
from gpuguard.model.results import NAMES, Status


def combine(findings: dict[str, Finding]) -> Finding:
    if not findings:
        return skipped("no service is supervised")
    if all(f.status is Status.SKIPPED for f in findings.values()):
        return skipped("; ".join(f"{name}: {f.message}" for name, f in findings.items()))
    worst = max(findings.values(), key=lambda f: f.status.rank).status
    # the worst first; services of one status stay in name order (a stable sort)
    ordered = sorted(findings.items(), key=lambda item: -item[1].status.rank)
    message = "; ".join(f"{name}: {f.message}" for name, f in ordered)
    return Finding(worst, message, {
        "service_status": {name: f.status.value for name, f in findings.items()},
        "services": {name: f.observed for name, f in findings.items()},
        # what the finding names: the services that fail it (an ack covers these)
        NAMES: sorted(name for name, f in findings.items()
                      if f.status in (Status.WARNING, Status.CRITICAL)),
    })


def services_of(ctx: CheckContext) -> dict[str, Any] | None:
    """The services' entries; None when no service is configured (or in `gpuguard
    check`): nothing to judge, whatever NVML did. An error reading is unknown (.get())."""
    reading = ctx.snapshot.host.services
    if reading.state == "absent":
        return None
    return reading.get()


NO_SERVICE = "no supervised service (services are the daemon's: docs/supervisor.md)"
