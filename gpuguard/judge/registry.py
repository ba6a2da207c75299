"""The check registry: checks register here by rule id, one module per rule family in
gpuguard/checks/ (loaded by load_all, so that this layer names no check module).

A check is a plain function. Host-scope checks take `(ctx)`, GPU-scope checks
take `(gpu, ctx)`; both return a `Finding`. A check reads only the snapshot
(through `ctx` and `gpu`) and its rule's thresholds, never the host itself.
Calling `.get()` on a reading that is not available raises `Unavailable`, which
the engine turns into `skipped` (not supported) or `unknown` (read error), so a
check only spells out the cases it judges.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuguard.model.results import Status

if TYPE_CHECKING:
    from gpuguard.model.profile import Profile
    from gpuguard.model.rule import Rule, RuleSet
    from gpuguard.model.samples import Samples
    from gpuguard.model.snapshot import GpuSnapshot, Snapshot

FAMILIES = (
    "driver", "gpu", "vbios", "ecc", "memory", "pcie", "clocks", "power", "thermal",
    "persistence", "recovery", "xid", "toolkit", "nvlink", "fabric", "p2p", "mig", "sxid",
    "host", "service", "image", "gsp", "devices", "qualify",
)


@dataclass
class Finding:
    status: Status
    message: str
    observed: dict[str, Any] = field(default_factory=dict)


@dataclass
class PerGpu:
    """A host check's findings told apart by GPU (xid.recent, sxid.recent, gsp.firmware: a
    kernel log names the GPU of each line): one per GPU index, and one for the host where
    something names no GPU the snapshot lists (None: no host result). The engine makes a
    result of each, so each GPU's finding has its own status, action, alert and history."""

    gpus: dict[int, Finding]
    host: Finding | None = None


@dataclass
class CheckContext:
    rule: Rule
    snapshot: Snapshot
    profile: Profile
    ruleset: RuleSet
    # The daemon's short history (gpuguard.model.samples.Samples); None in `gpuguard check`.
    samples: Samples | None = None

    def threshold(self, name: str) -> Any:
        if name not in THRESHOLDS.get(self.rule.id, ()) or name not in self.rule.thresholds:
            raise KeyError(f"{self.rule.id} reads threshold {name!r}, which it does not "
                           "declare")  # the engine reports it unknown; the tests catch it
        return self.rule.thresholds[name]

    def fail(self, message: str, **observed: Any) -> Finding:
        """The rule's own severity (what the YAML or an override says)."""
        return Finding(self.rule.severity, message, observed)


def ok(message: str, **observed: Any) -> Finding:
    return Finding(Status.OK, message, observed)


def warning(message: str, **observed: Any) -> Finding:
    return Finding(Status.WARNING, message, observed)


def critical(message: str, **observed: Any) -> Finding:
    return Finding(Status.CRITICAL, message, observed)


def skipped(reason: str, **observed: Any) -> Finding:
    return Finding(Status.SKIPPED, reason, observed)


def unknown(reason: str, **observed: Any) -> Finding:
    return Finding(Status.UNKNOWN, reason, observed)


HostCheck = Callable[[CheckContext], "Finding | PerGpu"]
GpuCheck = Callable[["GpuSnapshot", CheckContext], Finding]

HostPart = Callable[[CheckContext], "Finding | None"]

HOST_CHECKS: dict[str, HostCheck] = {}
GPU_CHECKS: dict[str, GpuCheck] = {}
# A GPU-scope rule's finding about a GPU the snapshot does not list (gpu.lost of a GPU on
# the PCI bus that NVML reaches by bus id only to fail): one host result beside the GPUs',
# None where there is nothing to say (no result: the rule's results are as without it).
HOST_PARTS: dict[str, HostPart] = {}
# The threshold names each check reads: their values and defaults live once, in the rule
# file; the loader refuses a pack whose file does not declare exactly these
# (tests/test_ruleset.py proves each list is what the check's code reads).
THRESHOLDS: dict[str, tuple[str, ...]] = {}


def host_check(rule_id: str, thresholds: tuple[str, ...] = ()
               ) -> Callable[[HostCheck], HostCheck]:
    def register(fn: HostCheck) -> HostCheck:
        HOST_CHECKS[rule_id] = fn
        THRESHOLDS[rule_id] = thresholds
        return fn

    return register


def gpu_check(rule_id: str, thresholds: tuple[str, ...] = ()
              ) -> Callable[[GpuCheck], GpuCheck]:
    def register(fn: GpuCheck) -> GpuCheck:
        GPU_CHECKS[rule_id] = fn
        THRESHOLDS[rule_id] = thresholds
        return fn

    return register


def host_part(rule_id: str) -> Callable[[HostPart], HostPart]:
    """Register a GPU-scope rule's host part (HOST_PARTS)."""
    def register(fn: HostPart) -> HostPart:
        HOST_PARTS[rule_id] = fn
        return fn

    return register


def load_all() -> None:
    """Import every family module: each registers its checks (the rule pack's loader calls
    this, and the engine finds the checks here)."""
    for family in FAMILIES:
        importlib.import_module(f"gpuguard.checks.{family}")
