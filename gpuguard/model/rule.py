"""What a loaded rule is: the model that the loader (ruleset.py) builds and the checks,
the engine and the daemon read. Below both, so that neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.model.results import Status

if TYPE_CHECKING:
    from gpuguard.model.expr import Condition


@dataclass
class Rule:
    id: str
    scope: str
    severity: Status
    summary: str
    remediation: str
    origin: str
    thresholds: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    tags: tuple[str, ...] = ()
    message: str | None = None
    when: Condition | None = None
    overrides: list[str] = field(default_factory=list)
    # The daemon runs "fast" rules every few seconds, "slow" ones (versions, VBIOS,
    # toolkit) every minute; `gpuguard check` runs both.
    cadence: str = "fast"
    # What is wrong when the rule fails (alert texts); `summary` states what it checks.
    problem: str | None = None
    # The suggested action when it fails, where gpuguard.judge.actions' default is wrong, and
    # the file:line that set it.
    action: str | None = None
    action_origin: str | None = None
    # An unchanged failing finding older than this is acknowledged on its own (events.md)
    auto_clear_s: float | None = None
    # Escalate to inspect_hardware when the same fatal finding (one Xid kind on one board)
    # was recorded this many times within this window (gpuguard.events.escalation)
    escalate_count: int | None = None
    escalate_window_s: float | None = None
    # What kind of finding it gives (KINDS): only a hardware finding that comes back after
    # a reboot escalates to inspect_hardware (gpuguard.events.escalation); a setting
    # against the profile, software or the host's resources keep their own action. None:
    # a user rule that does not say (it does not escalate).
    kind: str | None = None


# The kinds of finding a rule gives (`kind:` in rules/*.yaml; every shipped rule says one)
KINDS = ("hardware", "setting", "software", "resource")


@dataclass
class XidEntry:
    severity: str
    actions: tuple[str, ...]
    meaning: str
    origin: str
    # NVIDIA's name for the code, its resolution buckets as published (immediate,
    # investigatory: the Xid catalog; the SXid list's class), and why gpuguard grades it
    # other than its bucket mapping says (judge/xid_buckets.py), where it does.
    mnemonic: str = ""
    nvidia: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class RuleSet:
    rules: dict[str, Rule] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    xid_catalog: dict[int, XidEntry] = field(default_factory=dict)
    # NVSwitch SXids (rules/sxid.yaml), loaded as the Xid catalog is
    sxid_catalog: dict[int, XidEntry] = field(default_factory=dict)
    # Where each catalog comes from and how old it is ("NVIDIA's Xid catalog of 2025-10-29"):
    # an Xid it does not hold is named as not in *this* catalog.
    xid_catalog_source: str = ""
    sxid_catalog_source: str = ""

    def failover_rules(self) -> set[str]:
        """The rules tagged `failover`: the supervisor fails over on them and Slurm
        drains for them, whatever their action."""
        return {r.id for r in self.rules.values() if "failover" in r.tags}

    def ordered(self) -> list[Rule]:
        return [self.rules[k] for k in sorted(self.rules)]
