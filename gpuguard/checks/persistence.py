"""persistence.mode: the driver stays loaded between clients (faster start, stable state)."""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, gpu_check, ok
from gpuguard.snapshot import GpuSnapshot


@gpu_check("persistence.mode")
def mode(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    if not gpu.persistence_mode.get():
        return ctx.fail("persistence mode is off: the driver tears the GPU down whenever the "
                        "last client exits", persistence_mode=False)
    return ok("persistence mode on", persistence_mode=True)
