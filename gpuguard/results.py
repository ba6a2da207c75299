"""Results of rules, and how they add up to an exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"

    @property
    def rank(self) -> int:
        """Order of badness, for sorting and for "worst of"."""
        return _RANK[self]


_RANK = {
    Status.SKIPPED: 0,
    Status.OK: 1,
    Status.UNKNOWN: 2,
    Status.WARNING: 3,
    Status.CRITICAL: 4,
}

SEVERITIES = (Status.WARNING, Status.CRITICAL)


@dataclass(frozen=True)
class GpuRef:
    index: int
    uuid: str | None
    pci_bus_id: str | None

    @property
    def key(self) -> str:
        """The one identity of a GPU in the daemon's results and history. Index, UUID and
        bus id together: two GPUs that report the same UUID (itself a finding, see
        gpu.identity) stay two, neither hiding the other."""
        return f"{self.index}/{self.uuid or '-'}/{self.pci_bus_id or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}


@dataclass
class Result:
    rule: str
    status: Status
    severity: Status
    message: str
    gpu: GpuRef | None = None
    remediation: str | None = None
    observed: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status.value,
            "severity": self.severity.value,
            "gpu": self.gpu.to_json() if self.gpu else None,
            "message": self.message,
            "remediation": self.remediation,
            "observed": self.observed,
        }


def exit_code(results: list[Result]) -> int:
    """Nagios-style: 2 any critical, else 1 any warning, else 3 any unknown, else 0."""
    statuses = {r.status for r in results}
    if Status.CRITICAL in statuses:
        return 2
    if Status.WARNING in statuses:
        return 1
    if Status.UNKNOWN in statuses:
        return 3
    return 0


def summary(results: list[Result]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    return counts
