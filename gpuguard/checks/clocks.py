"""clocks.*: clock event reasons that mean the GPU is being slowed down.

Bit 0x1 (GPU idle), application clocks, sync boost and display clocks are normal
and are never counted.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok
from gpuguard.model import clock_events
from gpuguard.model.samples import Sample
from gpuguard.model.snapshot import GpuSnapshot


@gpu_check("clocks.hw_slowdown", thresholds=("min_fraction", "window_s"))
def hw_slowdown(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    mask = gpu.clock_event_reasons.get()
    active = [name for bit, name in clock_events.HW_NAMES.items() if mask & bit]
    if ctx.samples is not None:
        # gpud's rule: unhealthy when slowdown was seen in most minutes of a window,
        # not on one blip.
        window_s = ctx.threshold("window_s")
        minutes = _minutes_with_slowdown(ctx.samples.of(gpu), window_s)
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
    if mask & clock_events.SW_THERMAL:
        return ctx.fail(f"the driver lowers clocks to stay under its temperature target "
                        f"(reasons 0x{mask:x})", reasons=f"0x{mask:x}")
    return ok("no software thermal slowdown", reasons=f"0x{mask:x}")


@gpu_check("clocks.power_cap",
           thresholds=("low_draw_ratio", "min_fraction", "min_sm_clock_ratio", "window_s"))
def power_cap(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Capping at the power limit under full load is what the board is built to do (a
    busy H200 sits at 690 of 700 W with the bit set): a finding only when the cap holds
    the GPU back abnormally. A lowered limit is power.limit's finding, not this one's."""
    mask = gpu.clock_event_reasons.get()
    if not mask & clock_events.SW_POWER_CAP:
        return ok("not power capped", reasons=f"0x{mask:x}")
    draw, limit = gpu.power_draw_w.get(), gpu.power_limit_enforced_w.get()
    default = gpu.power_limit_default_w.get()
    sm, sm_max = gpu.clock_sm_mhz.get(), gpu.clock_sm_max_mhz.get()
    observed = {"reasons": f"0x{mask:x}", "power_draw_w": draw, "power_limit_w": limit,
                "power_limit_default_w": default, "clock_sm_mhz": sm, "clock_sm_max_mhz": sm_max}
    at = f"{draw:.0f} W of a {limit:.0f} W limit, SM clock {sm} of {sm_max} MHz"
    if limit < default - ctx.ruleset.rules["power.limit"].thresholds["tolerance_w"]:
        return ok(f"capped at {at}: the limit is lowered from the default {default:.0f} W, "
                  "which power.limit reports", **observed)
    draw_floor = ctx.threshold("low_draw_ratio") * limit
    clock_floor = ctx.threshold("min_sm_clock_ratio") * sm_max
    low_draw, low_clock = draw < draw_floor, sm < clock_floor
    if ctx.samples is not None:
        window_s = ctx.threshold("window_s")
        needed = ctx.threshold("min_fraction") * window_s / 60
        samples = ctx.samples.of(gpu)
        clock_minutes = _minutes_all(samples, window_s, lambda s: bool(
            s.power_cap and s.clock_sm_mhz is not None and s.clock_sm_mhz < clock_floor))
        draw_minutes = _minutes_all(samples, window_s, lambda s: bool(
            s.power_cap and s.power_draw_w is not None and s.power_draw_w < draw_floor))
        observed |= {"minutes_low_clock": clock_minutes, "minutes_low_draw": draw_minutes,
                     "minutes_needed": needed}
        span = f"throughout {{}} of the last {window_s / 60:.0f} minutes (now {at})"
        if clock_minutes >= needed:
            return ctx.fail(f"power capped with the SM clock below {clock_floor:.0f} MHz "
                            f"{span.format(clock_minutes)}", **observed)
        if draw_minutes >= needed:
            return ctx.fail(f"power capped while drawing below {draw_floor:.0f} W "
                            f"{span.format(draw_minutes)}", **observed)
        if low_clock or low_draw:
            minutes = max(clock_minutes, draw_minutes)
            return ok(f"capped at {at}: held back in {minutes} minute(s) of the window, not "
                      f"yet persistent (fails at {needed:.0f})", **observed)
    elif low_clock:
        return ctx.fail(f"power capped with the SM clock held at {sm} MHz, below "
                        f"{clock_floor:.0f} MHz ({ctx.threshold('min_sm_clock_ratio'):.0%} of "
                        f"its {sm_max} MHz maximum), at {draw:.0f} W of a {limit:.0f} W limit",
                        **observed)
    elif low_draw:
        # Measured on an H200: at every load step the bit was set for up to a second while
        # the 1 s average draw read 179-593 W; one sample cannot tell that from a fault.
        return ok(f"power-cap bit set at {draw:.0f} W of a {limit:.0f} W limit: in one "
                  "sample that is a load step (the daemon judges it over time)", **observed)
    return ok(f"capped at {at}: running at its power limit, as the board is built to",
              **observed)


def _minutes_all(samples: list[Sample], window_s: float,
                 held_back: Callable[[Sample], bool]) -> int:
    """Minutes of the window in which every sample was held back (a load step lasts
    about a second; a bursty server has one in many minutes, rarely in every sample of one)."""
    if not samples:
        return 0
    now = samples[-1].t
    minutes: dict[int, bool] = {}
    for s in samples:
        if now - s.t < window_s:
            minute = int((now - s.t) // 60)
            minutes[minute] = minutes.get(minute, True) and held_back(s)
    return sum(minutes.values())


@gpu_check("clocks.applications")
def applications(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Application clocks below their defaults: a silent slowdown a tuning or benchmark
    script leaves behind (`nvidia-smi -ac`), seen by no clock event reason but app clocks."""
    sm, sm_default = gpu.clock_sm_app_mhz.get(), gpu.clock_sm_app_default_mhz.get()
    mem, mem_default = gpu.clock_mem_app_mhz.get(), gpu.clock_mem_app_default_mhz.get()
    observed = {"sm_mhz": sm, "sm_default_mhz": sm_default, "mem_mhz": mem,
                "mem_default_mhz": mem_default}
    low = [f"{name} {now} MHz (default {default} MHz)"
           for name, now, default in (("SM", sm, sm_default), ("memory", mem, mem_default))
           if now < default]
    if low:
        return ctx.fail("application clocks below their defaults: " + ", ".join(low),
                        **observed)
    return ok(f"application clocks SM {sm} / memory {mem} MHz, at or above their defaults",
              **observed)
