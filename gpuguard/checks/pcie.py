"""pcie.*: the link trained at its full width and generation, and is not replaying.

The driver drops generation (and on some platforms width) when the GPU is idle to
save power, so current-versus-max is judged only while the GPU is busy.
"""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, gpu_check, ok, warning
from gpuguard.snapshot import GpuSnapshot


def _busy(gpu: GpuSnapshot, ctx: CheckContext) -> bool:
    return bool(gpu.utilization_gpu_percent.get() >= ctx.threshold("busy_utilization_percent"))


@gpu_check("pcie.link_width")
def link_width(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    current, maximum = gpu.pcie_link_width_current.get(), gpu.pcie_link_width_max.get()
    observed = {"current": current, "max": maximum,
                "utilization_percent": gpu.utilization_gpu_percent.get()}
    if current >= maximum:
        return ok(f"x{current} of x{maximum}", **observed)
    if not _busy(gpu, ctx):
        return ok(f"x{current} of x{maximum} while idle: not judged (links narrow to save power); "
                  "run again under load", **observed)
    return ctx.fail(f"PCIe link is x{current} under load, the slot and GPU support x{maximum}",
                    **observed)


@gpu_check("pcie.link_gen")
def link_gen(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    current, maximum = gpu.pcie_link_gen_current.get(), gpu.pcie_link_gen_max.get()
    observed = {"current": current, "max": maximum,
                "utilization_percent": gpu.utilization_gpu_percent.get()}
    if current >= maximum:
        return ok(f"Gen{current} of Gen{maximum}", **observed)
    if not _busy(gpu, ctx):
        return ok(f"Gen{current} of Gen{maximum} while idle: normal power saving", **observed)
    return ctx.fail(f"PCIe link runs at Gen{current} under load, Gen{maximum} is possible",
                    **observed)


@gpu_check("pcie.replays")
def replays(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    count = gpu.pcie_replay_counter.get()
    limit = ctx.threshold("max_replays")
    if count > limit:
        return ctx.fail(f"{count} PCIe replays since the driver loaded (> {limit})", replays=count)
    return ok(f"{count} PCIe replays", replays=count)


@gpu_check("pcie.aer")
def aer(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    chain = gpu.pcie_aer.get()
    problems: list[str] = []
    worst_fatal = False
    for device in chain:
        where = f"{device['role'].replace('_', ' ')} {device['address']}"
        for kind in ("fatal", "nonfatal"):
            counts = device.get(kind) or {}
            if counts.get("TOTAL", 0) > 0:
                worst_fatal = True
                named = ", ".join(f"{k} {v}" for k, v in counts.items() if k != "TOTAL")
                problems.append(f"{where}: {counts['TOTAL']} {kind} ({named or 'unnamed'})")
    limit = ctx.threshold("max_correctable")
    for device in chain:
        counts = device.get("correctable") or {}
        if counts.get("TOTAL", 0) > limit:
            named = ", ".join(f"{k} {v}" for k, v in counts.items() if k != "TOTAL")
            problems.append(f"{device['role'].replace('_', ' ')} {device['address']}: "
                            f"{counts['TOTAL']} correctable (> {limit}; {named})")
    observed = {"devices": chain}
    if worst_fatal:
        return ctx.fail("PCIe AER errors: " + "; ".join(problems), **observed)
    if problems:
        return warning("PCIe AER errors: " + "; ".join(problems), **observed)
    checked = ", ".join(f"{d['role'].replace('_', ' ')} {d['address']}" for d in chain)
    return ok(f"no uncorrectable AER errors on {checked}", **observed)
