"""vbios.*: VBIOS versions agree across GPUs of one model, and are on the allowlist."""

from __future__ import annotations

from collections import defaultdict

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, host_check, ok, skipped
from gpuguard.model.snapshot import GpuSnapshot


@host_check("vbios.consistent")
def consistent(ctx: CheckContext) -> Finding:
    by_model: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for gpu in ctx.snapshot.gpus:
        if gpu.name.is_ok and gpu.vbios_version.is_ok:
            by_model[gpu.name.get()][gpu.vbios_version.get().upper()].append(gpu.index)
    if not by_model:
        return skipped("no GPU reported both its model and VBIOS version")
    mixed = {model: versions for model, versions in by_model.items() if len(versions) > 1}
    if mixed:
        parts = []
        for model, versions in sorted(mixed.items()):
            listing = "; ".join(
                f"{v} on GPU {', '.join(map(str, idx))}" for v, idx in sorted(versions.items())
            )
            parts.append(f"{model}: {listing}")
        return ctx.fail("GPUs of one model run different VBIOS versions: " + " | ".join(parts),
                        versions={m: {v: i for v, i in vs.items()} for m, vs in mixed.items()})
    summary = ", ".join(f"{m} {next(iter(v))}" for m, v in sorted(by_model.items()))
    return ok(f"one VBIOS per model: {summary}")


@gpu_check("vbios.allowed")
def allowed(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    model = gpu.name.get()
    allowlist = ctx.profile.vbios_allowed.get(model)
    if not allowlist:
        return skipped(f"no VBIOS allowlist for {model} in the profile")
    version = gpu.vbios_version.get().upper()
    if version not in allowlist:
        return ctx.fail(f"VBIOS {version} is not in the profile's list for {model}: "
                        f"{', '.join(allowlist)}", vbios_version=version, allowed=allowlist)
    return ok(f"VBIOS {version} is allowed", vbios_version=version)
