"""mig.mode: MIG mode as the profile wants it, and no mode change waiting for a reset."""

from __future__ import annotations

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, warning
from gpuguard.model.snapshot import GpuSnapshot


def _word(on: bool) -> str:
    return "enabled" if on else "disabled"


@gpu_check("mig.mode")
def mode(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    current = gpu.mig_mode_current.get()  # not supported (no MIG on this GPU): skipped
    pending = gpu.mig_mode_pending.get()
    expected = ctx.profile.mig_expected
    observed = {"current": current, "pending": pending, "expected": expected}
    if expected is not None and current != expected:
        then = " (the change is pending: reset the GPU)" if pending == expected else ""
        return ctx.fail(f"MIG is {_word(current)}, the profile wants it {_word(expected)}"
                        f"{then}", **observed)
    if pending != current:
        return warning(f"MIG is {_word(current)} but {_word(pending)} is pending: it takes "
                       "effect at the next GPU reset", **observed)
    return ok(f"MIG {_word(current)}", **observed)
