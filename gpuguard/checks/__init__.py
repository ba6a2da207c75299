"""Checks with real logic, one module per rule family, each registering its checks in
gpuguard.judge.registry by rule id. A check reads only the snapshot and its rule's
thresholds, never the host itself (see the registry for the contract). Below: helpers
that several families share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuguard.judge.registry import CheckContext, Finding, skipped

if TYPE_CHECKING:
    from gpuguard.model.snapshot import GpuSnapshot


def not_probed(gpu: GpuSnapshot, measured: str) -> Finding | None:
    """The active probe's rules (gpu.compute, memory.pattern, memory.bandwidth,
    pcie.bandwidth, nvlink.bandwidth): skipped, with the reason, when the probe did not run
    (no --active: never unknown, never ok) or left this GPU alone (it was serving)."""
    skipped_because = gpu.probe_skipped
    if skipped_because.state == "absent" and getattr(gpu, measured).state == "absent":
        return skipped("the active probe did not run (gpuguard check --active)")
    if skipped_because.is_ok and skipped_because.get():
        return skipped(f"the active probe left this GPU alone: {skipped_because.get()}",
                       why=skipped_because.get())
    return None


def probe_floor(ctx: CheckContext, gpu: GpuSnapshot, kind: str) -> float | None:
    """The profile's GB/s floor of `kind` (pcie, memory, nvlink) for this GPU's model."""
    model = gpu.name.get_or(None)
    floors = ctx.profile.probe_floors_gbps.get(model, {}) if isinstance(model, str) else {}
    return floors.get(kind)
