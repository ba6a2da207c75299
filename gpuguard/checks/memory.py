"""memory.*: retired pages, row remapping, memory held with no process to own it, and HBM
temperature."""

from __future__ import annotations

from gpuguard.checks import not_probed, probe_floor
from gpuguard.judge.registry import CheckContext, Finding, critical, gpu_check, ok, skipped, warning
from gpuguard.model.snapshot import GpuSnapshot

_GIB = 1024**3


@gpu_check("memory.retired_pages", thresholds=("max_retired",))
def retired_pages(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    # Hopper and newer answer NotSupported here (row remapping replaced page
    # retirement): .get() turns that into "skipped", never a failure.
    pending = gpu.retired_pages_pending.get()
    total = gpu.retired_pages_sbe.get() + gpu.retired_pages_dbe.get()
    observed = {"retired": total, "pending": pending}
    if total >= ctx.threshold("max_retired"):
        return ctx.fail(f"{total} pages retired (limit {ctx.threshold('max_retired')})", **observed)
    if pending:
        return warning(f"{total} pages retired and a retirement is pending: reset the GPU to "
                       "apply it", **observed)
    return ok(f"{total} pages retired, none pending", **observed)


@gpu_check("memory.row_remap", thresholds=("warn_uncorrectable_rows",))
def row_remap(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    failure = gpu.remapped_rows_failure.get()
    pending = gpu.remapped_rows_pending.get()
    corr = gpu.remapped_rows_correctable.get_or(None)  # described, never judged
    observed = {"failure": failure, "pending": pending, "correctable": corr}
    if failure:
        return ctx.fail("row remapping failed: the GPU has run out of spare rows for a bad "
                        "memory row", **observed)
    if pending:
        return warning("a row remap is pending: reset the GPU to apply it", **observed)
    # The count it judges must be read: an unreadable one is unknown, never taken as 0.
    unc = gpu.remapped_rows_uncorrectable.get()
    observed["uncorrectable"] = unc
    if unc >= ctx.threshold("warn_uncorrectable_rows"):
        return warning(f"{unc} rows remapped for uncorrectable errors "
                       f"(>= {ctx.threshold('warn_uncorrectable_rows')})", **observed)
    corr_text = "?" if corr is None else str(corr)
    return ok(f"rows remapped: {corr_text} correctable, {unc} uncorrectable; none pending",
              **observed)


@gpu_check("memory.orphaned", thresholds=("max_unowned_gib",))
def orphaned(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    processes = gpu.compute_processes.get()
    used = gpu.memory_used_bytes.get()
    reserved = gpu.memory_reserved_bytes.get_or(0)
    limit = ctx.threshold("max_unowned_gib") * _GIB
    observed = {"used_bytes": used, "reserved_bytes": reserved, "processes": len(processes)}
    if processes:
        names = ", ".join(f"{p.name or '(exited)'}[{p.pid}]" for p in processes[:5])
        return ok(f"{len(processes)} compute process(es) hold the memory: {names}", **observed)
    if used > limit:
        return ctx.fail(f"{used / _GIB:.1f} GiB in use with no compute process: a leaked context "
                        "or a zombie process", **observed)
    return ok(f"{used / _GIB:.2f} GiB in use, no compute process", **observed)


@gpu_check("memory.temperature", thresholds=("warn_margin_c", "critical_margin_c"))
def temperature(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """HBM temperature against the memory's own maximum (the driver's THRESHOLD_MEM_MAX):
    HBM throttles and then errors near it, while the GPU core may still be cool."""
    temp = gpu.memory_temperature_c.get()
    limit = gpu.memory_temperature_max_c.get()
    observed = {"memory_temperature_c": temp, "memory_temperature_max_c": limit}
    if limit <= 0:
        # nvidia-smi's XML shows a T.Limit-relative 0 C here on an H200: no maximum.
        return skipped(f"no memory temperature maximum given (reads {limit} C): HBM at "
                       f"{temp} C not judged", **observed)
    margin = limit - temp
    observed["margin_c"] = margin
    text = f"HBM at {temp} C, {margin} C below its {limit} C maximum"
    if margin <= ctx.threshold("critical_margin_c"):
        return critical(text, **observed)
    if margin <= ctx.threshold("warn_margin_c"):
        return warning(text, **observed)
    return ok(text, **observed)


@gpu_check("memory.pattern")
def pattern(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Walking ones and zeros written to device memory and read back (the active probe):
    a stuck or coupled bit that ECC did not catch shows here."""
    gate = not_probed(gpu, "probe_pattern")
    if gate is not None:
        return gate
    result = gpu.probe_pattern.get()
    size, wrong = result.get("bytes"), result.get("mismatches")
    observed = {"bytes": size, "mismatches": wrong}
    if result.get("error"):
        return ctx.fail(f"the memory pattern could not be written: {result['error']}",
                        error=result["error"], **observed)
    if wrong:
        return ctx.fail(f"{wrong} words read back different from the walking pattern written "
                        f"({size} bytes checked)", **observed)
    # two passes over the buffer (walking ones, then walking zeros): say so, or 8 MiB asked
    # for reads as 16 MiB checked
    written = (f" ({size >> 21} MiB, written and read twice: walking ones, then walking "
               "zeros)") if size else ""
    return ok(f"walking ones and zeros read back right{written}", **observed)


# HBM bandwidth by model as NVML names it, GB/s (NVIDIA's data sheets): memory.bandwidth's
# reference. A model not here is measured and reported, not judged (see the rule).
HBM_GBPS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100 80GB PCIe": 1935.0,
}


@gpu_check("memory.bandwidth", thresholds=("floor_fraction",))
def bandwidth(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """A device-to-device copy, bytes read plus written per second, against a share of
    the SKU's HBM bandwidth: a measurement, where the memory clock alone proves nothing."""
    gate = not_probed(gpu, "probe_memory")
    if gate is not None:
        return gate
    measured = gpu.probe_memory.get()
    model = gpu.name.get_or(None)
    floor = probe_floor(ctx, gpu, "memory")
    observed: dict[str, object] = {"gbps": measured, "model": model}
    if floor is None and isinstance(model, str) and model in HBM_GBPS:
        floor = HBM_GBPS[model] * ctx.threshold("floor_fraction")
        observed["hbm_gbps"] = HBM_GBPS[model]
    if floor is None:
        return ok(f"device-to-device copy at {measured:.0f} GB/s; no HBM bandwidth known for "
                  f"{model}: not judged (active_probe.floors_gbps in the profile sets one)",
                  **observed)
    observed["floor_gbps"] = round(floor, 1)
    if measured < floor:
        return ctx.fail(f"device-to-device copy at {measured:.0f} GB/s, below the floor of "
                        f"{floor:.0f} GB/s", **observed)
    return ok(f"device-to-device copy at {measured:.0f} GB/s (floor {floor:.0f} GB/s)",
              **observed)
