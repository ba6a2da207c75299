"""Results of rules, and how they add up to an exit code."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuguard.model.identity import GpuId


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

# What a host rule's finding names, in `observed[NAMES]`: a list of short strings (the
# missing GPUs "GPU-aaaa (0000:3b:00.0)", the services "llm", the Xid codes "79"). The
# finding is that set as much as its status: an ack covers exactly the set it was given
# for (gpuguard.events.acks), and a set that changes under the same status is a
# transition (gpuguard.events.recording). A check that names things puts them here;
# everyone else reads them through names_of.
NAMES = "names"
# Bounds of a set as stored with a transition or an ack: a name is cut to NAME_MAX
# characters, and past NAMES_MAX names the rest become one name holding their count and
# digest, so two different sets never compare equal.
NAME_MAX = 200
NAMES_MAX = 64


def names_of(observed: dict[str, Any]) -> tuple[str, ...]:
    """The set a finding names (sorted, each once; () when it names nothing)."""
    raw = observed.get(NAMES)
    if not isinstance(raw, list | tuple):
        return ()
    names = sorted({str(n)[:NAME_MAX] for n in raw if isinstance(n, str | int)})
    if len(names) <= NAMES_MAX:
        return tuple(names)
    rest = names[NAMES_MAX - 1:]
    digest = hashlib.sha256("\0".join(rest).encode()).hexdigest()[:16]
    return (*names[:NAMES_MAX - 1], f"... and {len(rest)} more (sha256 {digest})")


@dataclass
class Result:
    rule: str
    status: Status
    severity: Status
    message: str
    gpu: GpuId | None = None
    remediation: str | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    # What to do (gpuguard.judge.actions owns the words: none .. inspect_hardware) and why;
    # `none` for a result that is not failing.
    action: str = "none"
    action_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status.value,
            "severity": self.severity.value,
            "gpu": self.gpu.to_json() if self.gpu else None,
            "message": self.message,
            "remediation": self.remediation,
            "observed": self.observed,
            "action": self.action,
            "action_reason": self.action_reason,
        }

    @classmethod
    def from_json(cls, raw: object) -> Result:
        """A result as to_json wrote it (the daemon's socket: `gpuguard slurm` reads it
        back); ValueError for anything of another shape, never a partial result."""
        if not isinstance(raw, dict):
            raise ValueError("a result is not an object")
        gpu = raw.get("gpu")
        observed = raw.get("observed", {})
        texts = [raw.get(k) for k in ("rule", "message", "action")]
        optional = [raw.get(k) for k in ("remediation", "action_reason")]
        if not all(isinstance(v, str) for v in texts) or \
                not all(v is None or isinstance(v, str) for v in optional) or \
                not isinstance(observed, dict) or not (gpu is None or _gpu_json(gpu)):
            raise ValueError("a result of the wrong shape")
        return cls(raw["rule"], Status(str(raw.get("status"))),
                   Status(str(raw.get("severity"))),
                   raw["message"], None if gpu is None else GpuId(
                       gpu["index"], gpu.get("uuid"), gpu.get("pci_bus_id")),
                   raw.get("remediation"), observed, raw["action"], raw.get("action_reason"))


def _gpu_json(gpu: object) -> bool:
    return isinstance(gpu, dict) and isinstance(gpu.get("index"), int) and \
        not isinstance(gpu.get("index"), bool) and \
        all(gpu.get(k) is None or isinstance(gpu.get(k), str) for k in ("uuid", "pci_bus_id"))


def exit_code(results: list[Result]) -> int:
    """Nagios-style: 2 any critical, else 1 any warning, else 3 any unknown, else 0.
    No result at all is 3: nothing was checked, so nothing is known to be well."""
    statuses = {r.status for r in results}
    if Status.CRITICAL in statuses:
        return 2
    if Status.WARNING in statuses:
        return 1
    if Status.UNKNOWN in statuses or not results:
        return 3
    return 0


FAIL_ON = ("unknown", "warning", "critical")
# Codes that --fail-on lets pass (exit 0): below the status it names.
_PASSES = {"unknown": frozenset(), "warning": frozenset({3}), "critical": frozenset({1, 3})}


@dataclass(frozen=True)
class Verdict:
    """The one judgement of a host that every consumer acts on (`check`, `status`, the
    daemon's socket, Slurm, NPD): its results and the exit code they give under --fail-on,
    decided here once; every renderer prints `code` and the process exits with it."""

    results: list[Result]
    fail_on: str = "unknown"
    # What the reader must know about this run besides the results (whose verdict it is,
    # how old); the table prints them under its header.
    notes: tuple[str, ...] = ()
    # Who judged: "a cold check", "the daemon's verdict (pid N): ..."
    source: str = ""
    # The rules tagged `failover` in the rule pack that judged (Slurm drains for them)
    failover_rules: frozenset[str] = frozenset()

    @property
    def nagios_code(self) -> int:
        return exit_code(self.results)

    @property
    def code(self) -> int:
        nagios = self.nagios_code
        return 0 if nagios in _PASSES[self.fail_on] else nagios

    def summary(self) -> dict[str, int]:
        return summary(self.results)

    def to_json(self) -> dict[str, Any]:
        """The verdict as the daemon's socket serves it (`want: results`)."""
        return {"code": self.code, "note": self.source,
                "failover_rules": sorted(self.failover_rules),
                "results": [r.to_json() for r in self.results]}

    @classmethod
    def from_json(cls, raw: object) -> Verdict:
        """A verdict as to_json wrote it; ValueError for anything of another shape."""
        if not isinstance(raw, dict) or not isinstance(raw.get("results"), list):
            raise ValueError("a verdict without results")
        rules = raw.get("failover_rules")
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError("a verdict without its failover rules")
        return cls([Result.from_json(r) for r in raw["results"]],
                   source=str(raw.get("note") or "the daemon's verdict"),
                   failover_rules=frozenset(rules))

    def describe_exit(self) -> str:
        """The footer's words: the code, and why when --fail-on changed it or nothing ran."""
        if not self.results:
            return (f"exit {self.code}: no rule gave a result (GPU rules need a GPU the "
                    "driver lists; see --only and --skip)")
        if self.code != self.nagios_code:
            return f"exit {self.code} under --fail-on {self.fail_on}; {self.nagios_code} without"
        return f"exit {self.code}"


def summary(results: list[Result]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    return counts
