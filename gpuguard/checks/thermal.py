"""thermal.margin: distance between the GPU temperature and where it starts slowing down."""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, gpu_check, ok, warning
from gpuguard.snapshot import GpuSnapshot


@gpu_check("thermal.margin")
def margin(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    temp = gpu.temperature_c.get()
    if gpu.temperature_slowdown_c.is_ok:
        limit, which = gpu.temperature_slowdown_c.get(), "slowdown"
    else:
        limit, which = gpu.temperature_gpu_max_c.get(), "GPU max"
    left = limit - temp
    observed = {"temperature_c": temp, "limit_c": limit, "limit": which}
    if left <= 0:
        return ctx.fail(f"{temp} C is at or over the {which} temperature {limit} C", **observed)
    if left <= ctx.threshold("warn_margin_c"):
        return warning(f"{temp} C is {left} C from the {which} temperature {limit} C", **observed)
    return ok(f"{temp} C, {left} C below {which} ({limit} C)", **observed)
