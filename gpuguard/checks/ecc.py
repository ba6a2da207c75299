"""ecc.*: ECC is on as expected, and its error counters are within bounds."""

from __future__ import annotations

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok
from gpuguard.model.samples import growth
from gpuguard.model.snapshot import GpuSnapshot


def _word(on: bool) -> str:
    return "enabled" if on else "disabled"


@gpu_check("ecc.mode")
def mode(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    current = gpu.ecc_mode_current.get()
    pending = gpu.ecc_mode_pending.get_or(current)
    expected = ctx.profile.ecc_expected
    observed = {"current": current, "pending": pending, "expected": expected}
    if expected is not None and current != expected:
        return ctx.fail(f"ECC is {_word(current)}, the profile expects it {_word(expected)}",
                        **observed)
    if pending != current:
        return ctx.fail(f"ECC is {_word(current)} but {_word(pending)} is pending: it takes "
                        "effect at the next GPU reset or reboot", **observed)
    return ok(f"ECC {_word(current)}", **observed)


@gpu_check("ecc.uncorrected", thresholds=("max_volatile_uncorrected",))
def uncorrected(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    count = gpu.ecc_volatile_uncorrected.get()
    observed = {
        "volatile_uncorrected": count,
        "volatile_dram_uncorrected": gpu.ecc_volatile_dram_uncorrected.value,
        "volatile_sram_uncorrected": gpu.ecc_volatile_sram_uncorrected.value,
    }
    if count > ctx.threshold("max_volatile_uncorrected"):
        return ctx.fail(f"{count} uncorrectable ECC error(s) since the driver loaded", **observed)
    return ok("no uncorrectable ECC errors since the driver loaded", **observed)


@gpu_check("ecc.corrected", thresholds=("max_dram", "max_sram", "max_total"))
def corrected(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    sram, dram = gpu.ecc_volatile_sram_corrected, gpu.ecc_volatile_dram_corrected
    over = []
    observed: dict[str, int] = {}
    if sram.is_ok or dram.is_ok:
        for label, reading, limit in (("SRAM", sram, ctx.threshold("max_sram")),
                                      ("DRAM", dram, ctx.threshold("max_dram"))):
            if reading.is_ok:
                observed[f"volatile_{label.lower()}_corrected"] = reading.get()
                if reading.get() > limit:
                    over.append(f"{label} {reading.get()} > {limit:g}")
    else:
        total = gpu.ecc_volatile_corrected.get()
        observed["volatile_corrected"] = total
        if total > ctx.threshold("max_total"):
            over.append(f"total {total} > {ctx.threshold('max_total'):g}")
    if over:
        return ctx.fail("corrected ECC errors since the driver loaded above threshold: "
                        + ", ".join(over), **observed)
    if ctx.samples is not None:
        grew = growth(ctx.samples.of(gpu), "ecc_corrected")
        if grew is not None and grew[0] > 0:
            return ctx.fail(f"corrected ECC errors grew by {grew[0]} in the last {grew[1]:.0f} s",
                            grew_by=grew[0], **observed)
    return ok("corrected ECC errors within bounds", **observed)
