"""When to fail over and back: a pure function of the counts and one cycle's outcome.

A cycle fails a service when any counted result is critical. A passing cycle resets
the failure count; an unknown outcome (a counted rule could not be read, nothing
critical) neither counts nor resets, since we learned nothing about the GPU.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Literal

from gpuguard.model.results import Result, Status

Outcome = Literal["failed", "passed", "unknown"]
Action = Literal["to_cpu", "to_gpu"] | None

# Rules tagged `failover` in rules/ count by default.
DEFAULT_TAG = "failover"

# The rules that judge the service's active variant itself (gpuguard/checks/service.py).
SERVICE_RULES = "service."

# After a failed transition the next try waits 10 s, then 20, 40, ... up to 5 minutes.
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 300.0


@dataclass
class Counts:
    failed: int = 0
    healthy: int = 0


def outcome(results: list[Result], rules: list[str] | None, tagged: set[str],
            gpus: list[int] | None, service: str | None = None, active: str = "gpu"
            ) -> tuple[Outcome, list[Result]]:
    """The cycle's outcome for one service, and the results that made it fail. A result
    about several services (service.*: `observed.service_status`) counts with the status
    it gives this one service, and not at all when it does not name it: one service whose
    inference fails is no reason to move another. While the CPU variant is `active` the
    service.* results are about it, not about the GPU the failback is for: they do not
    count (a slow CPU answer would keep the service off a healthy GPU)."""
    counted = []
    for each in results:
        if active == "cpu" and each.rule.startswith(SERVICE_RULES):
            continue
        r = own_status(each, service)
        if r is not None and _counts_for_failover(r.rule, rules, tagged) \
                and _on_its_gpus(r, gpus):
            counted.append(r)
    critical = [r for r in counted if r.status is Status.CRITICAL]
    if critical:
        return "failed", critical
    if any(r.status is Status.UNKNOWN for r in counted):
        return "unknown", []
    return "passed", []


def _counts_for_failover(rule: str, rules: list[str] | None, tagged: set[str]) -> bool:
    """Whether a rule counts for a service: one its `rules:` patterns match, or, where it
    names none, one tagged `failover`."""
    if rules is not None:
        return any(fnmatch.fnmatchcase(rule, p) for p in rules)
    return rule in tagged


def _on_its_gpus(result: Result, gpus: list[int] | None) -> bool:
    """A host result is every service's, unless it names the GPUs it is about
    (`observed["gpus"]`: gpu.count's missing GPUs); a GPU's only of a service that uses
    that GPU."""
    if gpus is None:
        return True
    if result.gpu is not None:
        return result.gpu.index in gpus
    about = result.observed.get("gpus")
    if isinstance(about, list) and about:
        return any(index in gpus for index in about)
    return True


def own_status(result: Result, service: str | None) -> Result | None:
    per_service = result.observed.get("service_status")
    if not isinstance(per_service, dict):
        return result
    status = per_service.get(service) if service is not None else None
    if status is None:
        return None
    return dataclasses.replace(result, status=Status(status))


def decide(active: str, counts: Counts, result: Outcome, now: float, on_cpu_since: float | None,
           failover_after: int, failback_after: int, min_cpu_s: float,
           manual_failback: bool) -> tuple[Counts, Action]:
    """`now` and `on_cpu_since` are readings of one clock that never steps (the
    supervisor's: CLOCK_BOOTTIME); a wall clock set back would hold the service on CPU
    for as long as it was set back."""
    if result == "failed":
        counts = Counts(failed=counts.failed + 1, healthy=0)
    elif result == "passed":
        counts = Counts(failed=0, healthy=counts.healthy + 1)
    if active == "gpu" and counts.failed >= failover_after:
        return counts, "to_cpu"
    if active == "cpu" and not manual_failback and counts.healthy >= failback_after \
            and on_cpu_since is not None and now - on_cpu_since >= min_cpu_s:
        return counts, "to_gpu"
    return counts, None


def backoff_s(failures_in_row: int) -> float:
    """Seconds to wait after the n-th failed transition in a row. The exponent is capped
    first: 2 ** n of a large n is a number no float holds (OverflowError)."""
    doublings = min(max(failures_in_row, 1) - 1, 16)
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** doublings)
