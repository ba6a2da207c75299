"""thermal.margin: how far the GPU is from the temperature where it starts slowing down.

Current drivers judge against T.Limit, measured on the GPU's hottest sensor; when the
driver reports that margin it is used. Otherwise the GPU temperature is compared with
the absolute slowdown threshold (older GPUs and drivers).
"""

from __future__ import annotations

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, warning
from gpuguard.model.snapshot import GpuSnapshot


@gpu_check("thermal.margin", thresholds=("warn_margin_c",))
def margin(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    # A margin the driver offers but that could not be read is unknown: falling back to
    # the absolute threshold would judge a different, cooler sensor and could say ok.
    if gpu.temperature_tlimit_margin_c.state in ("ok", "error"):
        return _by_tlimit(gpu, ctx)
    return _by_threshold(gpu, ctx)


def _by_tlimit(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    left = gpu.temperature_tlimit_margin_c.get()
    observed = {"tlimit_margin_c": left, "temperature_c": gpu.temperature_c.value}
    if left <= 0:
        return ctx.fail(f"at T.Limit ({-left} C past it): the GPU slows its clocks to cool",
                        **observed)
    if left <= ctx.threshold("warn_margin_c"):
        return warning(f"{left} C below T.Limit, where the GPU starts slowing down", **observed)
    return ok(f"{left} C below T.Limit", **observed)


def _by_threshold(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
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
