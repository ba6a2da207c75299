"""power.limit: the enforced power limit is not below the board's default."""

from __future__ import annotations

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok
from gpuguard.model import clock_events
from gpuguard.model.snapshot import GpuSnapshot


@gpu_check("power.limit", thresholds=("tolerance_w",))
def limit(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    enforced, default = gpu.power_limit_enforced_w.get(), gpu.power_limit_default_w.get()
    observed = {"enforced_w": enforced, "default_w": default}
    if enforced < default - ctx.threshold("tolerance_w"):
        # clocks.power_cap leaves capping at a lowered limit to this rule: say so here.
        capped = gpu.clock_event_reasons.get_or(0) & clock_events.SW_POWER_CAP
        now = ", and the GPU is capped at it now" if capped else ""
        return ctx.fail(f"power limit is {enforced:.0f} W, below the default {default:.0f} W"
                        f"{now}", **observed)
    return ok(f"power limit {enforced:.0f} W (default {default:.0f} W)", **observed)
