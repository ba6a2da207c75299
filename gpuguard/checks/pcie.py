"""pcie.*: the link trained at its full width and generation, and is not replaying.

The driver drops generation (and on some platforms width) when the GPU is idle to
save power, so current-versus-max is judged only while the GPU is busy.
"""

from __future__ import annotations

from typing import Any

from gpuguard.checks import not_probed, probe_floor
from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, unknown, warning
from gpuguard.model.samples import Sample, growth
from gpuguard.model.snapshot import GpuSnapshot


def _busy(gpu: GpuSnapshot, ctx: CheckContext) -> bool:
    return bool(gpu.utilization_gpu_percent.get() >= ctx.threshold("busy_utilization_percent"))


@gpu_check("pcie.link_width", thresholds=("busy_utilization_percent",))
def link_width(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    current, maximum = gpu.pcie_link_width_current.get(), gpu.pcie_link_width_max.get()
    observed = {"current": current, "max": maximum,
                "utilization_percent": gpu.utilization_gpu_percent.get()}
    if current == 0:
        # no lanes: not a link narrowed to save power; what it is cannot be told from here
        return unknown(f"the link reports x0 of x{maximum}: no width to judge", **observed)
    if current >= maximum:
        return ok(f"x{current} of x{maximum}", **observed)
    if not _busy(gpu, ctx):
        return ok(f"x{current} of x{maximum} while idle: not judged (links narrow to save power); "
                  "run again under load", **observed)
    return ctx.fail(f"PCIe link is x{current} under load, the slot and GPU support x{maximum}",
                    **observed)


@gpu_check("pcie.link_gen", thresholds=("busy_utilization_percent",))
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


# Lane rate in bits/s by PCIe generation (line coding ignored, as DCGM does).
LANE_RATE = {1: 2.5e9, 2: 5e9, 3: 8e9, 4: 16e9, 5: 32e9, 6: 64e9}


def expected_replays_per_minute(gen: int, width: int) -> float:
    """DCGM's limit: 1e-12 x lane rate (bit/s) x 60 per lane per minute, times the width."""
    return 1e-12 * LANE_RATE.get(gen, 32e9) * 60 * width


@gpu_check("pcie.replays", thresholds=("max_replays",))
def replays(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    count = gpu.pcie_replay_counter.get()
    if ctx.samples is not None:
        rate = _replay_rate(ctx.samples.of(gpu))
        if rate is not None:
            per_minute, span_s = rate
            limit = expected_replays_per_minute(gpu.pcie_link_gen_current.get(),
                                                gpu.pcie_link_width_current.get())
            observed = {"replays": count, "per_minute": round(per_minute, 3),
                        "limit_per_minute": round(limit, 3), "over_s": round(span_s)}
            if per_minute > limit:
                return ctx.fail(f"PCIe replays at {per_minute:.2f}/min over {span_s:.0f} s, "
                                f"above DCGM's {limit:.2f}/min for this link", **observed)
            return ok(f"PCIe replays at {per_minute:.2f}/min (limit {limit:.2f}/min)",
                      **observed)
    limit_count = ctx.threshold("max_replays")
    if count > limit_count:
        return ctx.fail(f"{count} PCIe replays since the driver loaded (> {limit_count})",
                        replays=count)
    return ok(f"{count} PCIe replays", replays=count)


def _replay_rate(samples: list[Sample]) -> tuple[float, float] | None:
    """Replays per minute since the oldest sample after the last counter reset; None
    below a minute of history."""
    usable = [(s.t, s.replays) for s in samples if s.replays is not None]
    start = 0
    for i in range(1, len(usable)):
        if usable[i][1] < usable[i - 1][1]:
            start = i  # the driver reloaded: count from there
    usable = usable[start:]
    if len(usable) < 2 or usable[-1][0] - usable[0][0] < 60:
        return None
    span = usable[-1][0] - usable[0][0]
    return (usable[-1][1] - usable[0][1]) * 60 / span, span


@gpu_check("pcie.aer", thresholds=("max_correctable",))
def aer(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    chain = gpu.pcie_aer.get()
    uncorrectable = _uncorrectable(chain)
    problems = uncorrectable + _correctable_over(chain, ctx.threshold("max_correctable"))
    observed: dict[str, Any] = {"devices": chain}
    if ctx.samples is not None and not problems:
        grew = growth(ctx.samples.of(gpu), "aer_correctable")
        if grew is not None and grew[0] > 0:
            problems.append(f"correctable errors grew by {grew[0]} in the last {grew[1]:.0f} s")
    if uncorrectable:
        return ctx.fail("PCIe AER errors: " + "; ".join(problems), **observed)
    if problems:
        return warning("PCIe AER errors: " + "; ".join(problems), **observed)
    checked = ", ".join(_aer_device(d) for d in chain)
    return ok(f"no uncorrectable AER errors on {checked}", **observed)


def _uncorrectable(chain: list[dict[str, Any]]) -> list[str]:
    """Each device of the chain (the GPU and the ports above it) with fatal or non-fatal
    errors: any one of them is the rule's failure."""
    problems: list[str] = []
    for device in chain:
        for kind in ("fatal", "nonfatal"):
            counts = device.get(kind) or {}
            if counts.get("TOTAL", 0) > 0:
                problems.append(f"{_aer_device(device)}: {counts['TOTAL']} {kind} "
                                f"({_aer_named(counts) or 'unnamed'})")
    return problems


def _correctable_over(chain: list[dict[str, Any]], limit: int) -> list[str]:
    """Each device of the chain with more correctable errors since boot than the limit."""
    problems: list[str] = []
    for device in chain:
        counts = device.get("correctable") or {}
        if counts.get("TOTAL", 0) > limit:
            problems.append(f"{_aer_device(device)}: {counts['TOTAL']} correctable "
                            f"(> {limit}; {_aer_named(counts)})")
    return problems


def _aer_device(device: dict[str, Any]) -> str:
    """A device of the chain by its role and address, e.g. "root port 0000:00:01.0"."""
    return f"{device['role'].replace('_', ' ')} {device['address']}"


def _aer_named(counts: dict[str, int]) -> str:
    """The error kinds counted (sysfs names them), without the TOTAL line."""
    return ", ".join(f"{k} {v}" for k, v in counts.items() if k != "TOTAL")


# Data rate per lane and direction in GB/s after line coding (8b/10b to Gen2, 128b/130b
# from Gen3): the link's theoretical rate, of which a healthy x16 Gen5 H200 moves 87 %.
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@gpu_check("pcie.bandwidth", thresholds=("floor_fraction",))
def bandwidth(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Pinned host-to-device and device-to-host copies (the active probe) against a share
    of the rate of the link as it trained: a link at full width can still move a fraction
    of it (a bad riser, retimer or slot)."""
    gate = not_probed(gpu, "probe_pcie")
    if gate is not None:
        return gate
    measured = gpu.probe_pcie.get()
    slower = min(measured["h2d_gbps"], measured["d2h_gbps"])
    observed: dict[str, Any] = {"h2d_gbps": measured["h2d_gbps"],
                                "d2h_gbps": measured["d2h_gbps"]}
    floor = probe_floor(ctx, gpu, "pcie")
    text = (f"host to device {measured['h2d_gbps']:.1f} GB/s, device to host "
            f"{measured['d2h_gbps']:.1f} GB/s")
    if floor is None:
        gen, width = gpu.pcie_link_gen_current.get(), gpu.pcie_link_width_current.get()
        observed["link"] = f"Gen{gen} x{width}"
        if gen not in LANE_GBPS:
            return ok(f"{text}; no lane rate known for PCIe Gen{gen}: not judged "
                      "(active_probe.floors_gbps in the profile sets one)", **observed)
        link = LANE_GBPS[gen] * width
        observed["link_gbps"] = round(link, 1)
        floor = link * ctx.threshold("floor_fraction")
    observed["floor_gbps"] = round(floor, 1)
    if slower < floor:
        return ctx.fail(f"{text}: below the floor of {floor:.1f} GB/s", **observed)
    return ok(f"{text} (floor {floor:.1f} GB/s)", **observed)
