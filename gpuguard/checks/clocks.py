"""clocks.*: clock event reasons that mean the GPU is being slowed down.

Bit 0x1 (GPU idle), application clocks, sync boost and display clocks are normal
and are never counted.
"""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, gpu_check, ok
from gpuguard.history import Sample
from gpuguard.snapshot import GpuSnapshot

SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

HW_REASONS = {HW_SLOWDOWN: "HW slowdown", HW_THERMAL: "HW thermal slowdown",
              HW_POWER_BRAKE: "HW power brake"}


@gpu_check("clocks.hw_slowdown")
def hw_slowdown(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    mask = gpu.clock_event_reasons.get()
    active = [name for bit, name in HW_REASONS.items() if mask & bit]
    if ctx.history is not None:
        # gpud's rule: unhealthy when slowdown was seen in most minutes of a window,
        # not on one blip.
        window_s = ctx.threshold("window_s")
        minutes = _minutes_with_slowdown(ctx.history.samples(gpu), window_s)
        needed = ctx.threshold("min_fraction") * window_s / 60
        observed = {"reasons": f"0x{mask:x}", "minutes_with_slowdown": minutes,
                    "minutes_needed": needed}
        if minutes >= needed:
            now = f", now {', '.join(active)}" if active else ""
            return ctx.fail(f"HW slowdown in {minutes} of the last {window_s / 60:.0f} "
                            f"minutes{now}", **observed)
        if active:
            return ok(f"{', '.join(active)} now, seen in {minutes} minute(s) of the window: "
                      f"not yet persistent (fails at {needed:.0f})", **observed)
        return ok(f"no hardware slowdown (reasons 0x{mask:x})", **observed)
    if active:
        return ctx.fail(f"clocks held down by {', '.join(active)} (reasons 0x{mask:x})",
                        reasons=f"0x{mask:x}")
    return ok(f"no hardware slowdown (reasons 0x{mask:x})", reasons=f"0x{mask:x}")


def _minutes_with_slowdown(samples: list[Sample], window_s: float) -> int:
    if not samples:
        return 0
    now = samples[-1].t
    return len({int((now - s.t) // 60) for s in samples
                if s.hw_slowdown and now - s.t < window_s})


@gpu_check("clocks.sw_thermal")
def sw_thermal(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    mask = gpu.clock_event_reasons.get()
    if mask & SW_THERMAL:
        return ctx.fail(f"the driver lowers clocks to stay under its temperature target "
                        f"(reasons 0x{mask:x})", reasons=f"0x{mask:x}")
    return ok("no software thermal slowdown", reasons=f"0x{mask:x}")


@gpu_check("clocks.power_cap")
def power_cap(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    mask = gpu.clock_event_reasons.get()
    if not mask & SW_POWER_CAP:
        return ok("not power capped", reasons=f"0x{mask:x}")
    draw, limit = gpu.power_draw_w.get(), gpu.power_limit_enforced_w.get()
    ratio = draw / limit if limit else 0.0
    observed = {"reasons": f"0x{mask:x}", "power_draw_w": draw, "power_limit_w": limit}
    if ratio >= ctx.threshold("min_draw_ratio"):
        return ctx.fail(f"power capped at {draw:.0f} W of a {limit:.0f} W limit: the GPU runs at "
                       "its TDP", **observed)
    return ok(f"power-cap bit set at {draw:.0f} W of {limit:.0f} W: a transient, not TDP "
              "throttling", **observed)
