"""Metric families that `check --format prometheus` (node_exporter's textfile collector)
and the daemon both export: built here once, so a name, its labels and its encoding
cannot differ between the two."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from gpuguard import __version__
from gpuguard.model import clock_events
from gpuguard.model.derived import (
    NVLINK_COUNTERS,
    aer_total,
    expected_links,
    links_up,
    nvlink_totals,
)
from gpuguard.model.identity import LABELS, labels_of
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import Snapshot

GPU_LABELS = list(LABELS)  # the GPU identity's (gpuguard.model.identity)
# gpuguard_rule_status: Nagios order, and -1 for a rule that did not run.
STATUS_VALUE = {
    Status.OK: 0,
    Status.WARNING: 1,
    Status.CRITICAL: 2,
    Status.UNKNOWN: 3,
    Status.SKIPPED: -1,
}


def rule_status(results: Iterable[Result]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuguard_rule_status",
        "Last result of a rule: 0 ok, 1 warning, 2 critical, 3 unknown (skipped rules are "
        "not exported).",
        labels=["rule", "severity", *GPU_LABELS])
    for r in results:
        # A skipped rule (not supported here, disabled, nothing to compare with) says nothing
        # about the GPU: /status lists it; a series for it would be a third of an 8-GPU
        # host's budget of 450.
        if r.status is Status.SKIPPED:
            continue
        family.add_metric([r.rule, r.severity.value, *labels_of(r.gpu)], STATUS_VALUE[r.status])
    return family


def suggested_action(results: Iterable[Result]) -> GaugeMetricFamily:
    """One series per GPU (and one `host`): the most severe suggested action of its failing
    results, `none` when all is well (gpuguard.judge.actions decides it)."""
    from gpuguard.judge.actions import per_gpu

    family = GaugeMetricFamily(
        "gpuguard_suggested_action",
        "1 for the most severe suggested action of each GPU's failing results (gpu `host` "
        "for host rules; action none when all is well): one series per GPU.",
        labels=["gpu", "action"])
    for gpu, action in sorted(per_gpu(results).items()):
        family.add_metric([gpu, action.value], 1)
    return family


def sources(snapshot: Snapshot) -> Iterator[Metric]:
    success = GaugeMetricFamily("gpuguard_source_success", "1 when the source answered in "
                                "time and none of its readings is an error.",
                                labels=["source"])
    duration = GaugeMetricFamily("gpuguard_source_duration_seconds",
                                 "How long the source took to read.", labels=["source"])
    for name, run in sorted(snapshot.sources.items()):
        success.add_metric([name], 1 if run.success else 0)
        duration.add_metric([name], run.duration_s)
    yield success
    yield duration


def build_info() -> InfoMetricFamily:
    return InfoMetricFamily("gpuguard_build", "gpuguard version.", value={"version": __version__})


# gpuguard_gpu_fabric_state: the order the fabric goes through.
FABRIC_VALUE = {"not_started": 0, "in_progress": 1, "completed": 2}


def telemetry(snapshot: Snapshot, nvlink_links_per_gpu: int | None = None
              ) -> Iterator[Metric]:
    """Per-GPU telemetry; `nvlink_links_per_gpu` is the profile's (links expected), else
    the GPU's peers decide it as nvlink.state does."""
    host = snapshot.host

    def gauge(name: str, help_text: str, extra: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, help_text, labels=[*GPU_LABELS, *(extra or [])])

    info = InfoMetricFamily("gpuguard_gpu", "GPU identity.",
                            labels=[*GPU_LABELS, "model", "vbios", "driver"])
    temp = gauge("gpuguard_gpu_temperature_celsius", "GPU temperature.")
    margin = gauge("gpuguard_gpu_tlimit_margin_celsius",
                   "Degrees below T.Limit, where the GPU starts slowing down.")
    power = gauge("gpuguard_gpu_power_draw_watts", "Power draw (1 s average on Ampere+).")
    limit = gauge("gpuguard_gpu_power_limit_watts", "Enforced power limit.")
    util = gauge("gpuguard_gpu_utilization_ratio", "GPU utilization, 0 to 1.")
    mem = gauge("gpuguard_gpu_memory_used_bytes", "GPU memory in use (without the driver's "
                "reservation where the driver says).")
    ecc = CounterMetricFamily("gpuguard_gpu_ecc_errors", "ECC errors: volatile since the "
                              "driver loaded, aggregate over the GPU's life.",
                              labels=[*GPU_LABELS, "type", "counter"])
    aer = CounterMetricFamily("gpuguard_gpu_pcie_aer_errors", "PCIe AER errors since boot on "
                              "the GPU and the bridges above it, summed.",
                              labels=[*GPU_LABELS, "type"])
    replays = CounterMetricFamily("gpuguard_gpu_pcie_replays", "PCIe replay counter.",
                                  labels=GPU_LABELS)
    gen = gauge("gpuguard_gpu_pcie_link_generation", "PCIe link generation.", ["state"])
    width = gauge("gpuguard_gpu_pcie_link_width", "PCIe link width (lanes).", ["state"])
    reasons = gauge("gpuguard_gpu_clock_event_reason", "1 while a clock event reason is "
                    "active (idle is normal).", ["reason"])
    # Multi-GPU (issue 11): per GPU, never per link (an 8-GPU HGX has 144 links); the
    # per-link detail is in /status and the snapshot.
    nvlinks = gauge("gpuguard_gpu_nvlink_links", "NVLinks up, and how many should be (the "
                    "profile, or the most up among the GPU's peers of the same model).",
                    ["state"])
    nvlink_errors = CounterMetricFamily("gpuguard_gpu_nvlink_errors", "NVLink error "
                                        "counters since the driver loaded, summed over the "
                                        "GPU's links.", labels=[*GPU_LABELS, "type"])
    fabric = gauge("gpuguard_gpu_fabric_state", "GPU fabric (NVSwitch) state: 0 not "
                   "started, 1 in progress, 2 completed.")
    mem_temp = gauge("gpuguard_gpu_memory_temperature_celsius", "HBM temperature.")

    def put(family: Any, labels: list[str], reading: Any, scale: float = 1.0,
            extra: list[str] | None = None) -> None:
        if reading.is_ok and isinstance(reading.value, int | float):
            family.add_metric([*labels, *(extra or [])], reading.value * scale)

    for gpu in snapshot.gpus:
        labels = gpu.identity().labels()
        info.add_metric(labels, {"model": gpu.name.get_or(""),
                                 "vbios": gpu.vbios_version.get_or(""),
                                 "driver": host.driver_version.get_or("")})
        put(temp, labels, gpu.temperature_c)
        put(margin, labels, gpu.temperature_tlimit_margin_c)
        put(power, labels, gpu.power_draw_w)
        put(limit, labels, gpu.power_limit_enforced_w)
        put(util, labels, gpu.utilization_gpu_percent, 0.01)
        put(mem, labels, gpu.memory_used_bytes)
        put(ecc, labels, gpu.ecc_volatile_corrected, extra=["corrected", "volatile"])
        put(ecc, labels, gpu.ecc_volatile_uncorrected, extra=["uncorrected", "volatile"])
        put(ecc, labels, gpu.ecc_aggregate_corrected, extra=["corrected", "aggregate"])
        put(ecc, labels, gpu.ecc_aggregate_uncorrected, extra=["uncorrected", "aggregate"])
        put(replays, labels, gpu.pcie_replay_counter)
        put(gen, labels, gpu.pcie_link_gen_current, extra=["current"])
        put(gen, labels, gpu.pcie_link_gen_max, extra=["max"])
        put(width, labels, gpu.pcie_link_width_current, extra=["current"])
        put(width, labels, gpu.pcie_link_width_max, extra=["max"])
        if gpu.pcie_aer.is_ok:
            for kind in ("correctable", "nonfatal", "fatal"):
                aer.add_metric([*labels, kind], aer_total(gpu.pcie_aer.get(), kind))
        put(mem_temp, labels, gpu.memory_temperature_c)
        if gpu.fabric_state.is_ok:
            fabric.add_metric(labels, FABRIC_VALUE[gpu.fabric_state.get()])
        up = links_up(gpu)
        if up is not None:
            expected, _ = expected_links(gpu, snapshot, nvlink_links_per_gpu)
            nvlinks.add_metric([*labels, "up"], up)
            nvlinks.add_metric([*labels, "expected"], expected)
            totals = nvlink_totals(gpu)
            for name in NVLINK_COUNTERS:
                if (count := totals[name]) is not None:
                    nvlink_errors.add_metric([*labels, name], count)
        if gpu.clock_event_reasons.is_ok:
            mask = gpu.clock_event_reasons.get()
            for name in clock_events.EXPORTED:
                bit = clock_events.BITS[name]
                reasons.add_metric([*labels, name], 1 if mask & bit else 0)
    yield from (info, temp, margin, power, limit, util, mem, ecc, aer, replays, gen, width,
                reasons, nvlinks, nvlink_errors, fabric, mem_temp)


def host_resources(snapshot: Snapshot) -> Iterator[Metric]:
    """Host memory, OOM kills and disk space (host.memory, host.disk): only what was read,
    so a `check` that did not ask for them exports none of these families' series."""
    host = snapshot.host
    if host.host_memory.is_ok:
        sizes = host.host_memory.get()
        for name, key, text in (
                ("gpuguard_host_memory_total_bytes", "total_bytes", "Host memory (RAM)."),
                ("gpuguard_host_memory_available_bytes", "available_bytes",
                 "Host memory available without swapping (MemAvailable: page cache the "
                 "kernel can drop counts as available)."),
                ("gpuguard_host_swap_total_bytes", "swap_total_bytes", "Swap space."),
                ("gpuguard_host_swap_used_bytes", "swap_used_bytes", "Swap space in use.")):
            yield GaugeMetricFamily(name, text, value=sizes[key])
    if host.kernel_log.is_ok:
        log = host.kernel_log.get()
        kills = GaugeMetricFamily(
            "gpuguard_host_oom_kills", "Out-of-memory kills the kernel log holds (since boot, "
            "as far back as its ring buffer reaches), by scope: host (the host ran out) or "
            "cgroup (a container or unit hit its limit). Not a counter (the ring buffer "
            "forgets): a new kill is a rise, `x - x offset 10m > 0`.",
            labels=["scope"])
        counts = {"host": 0, "cgroup": 0}
        for event in log.get("ooms", []):
            scope = event.get("scope") or "host"
            counts[scope] = counts.get(scope, 0) + 1
        counts["host"] += log.get("ooms_dropped") or 0
        for scope, count in sorted(counts.items()):
            kills.add_metric([scope], count)
        yield kills
    if host.disk_space.is_ok:
        labels = ["path", "role"]
        size = GaugeMetricFamily("gpuguard_disk_size_bytes", "Size of the filesystem holding "
                                 "the path (Docker's data root, or a profile disk_path).",
                                 labels=labels)
        free = GaugeMetricFamily("gpuguard_disk_free_bytes", "Space free to unprivileged "
                                 "processes on the filesystem holding the path (df's Avail).",
                                 labels=labels)
        inodes = GaugeMetricFamily("gpuguard_disk_free_inodes_ratio", "Free inodes of the "
                                   "filesystem holding the path, 0 to 1 (none for a "
                                   "filesystem without an inode table).", labels=labels)
        for entry in host.disk_space.get():
            if entry.get("error"):
                continue  # not read: no series rather than an old or made-up one
            where = [entry["path"], entry["role"]]
            size.add_metric(where, entry["total_bytes"])
            free.add_metric(where, entry["free_bytes"])
            if entry["inodes_total"]:
                inodes.add_metric(where, entry["inodes_free"] / entry["inodes_total"])
        yield from (size, free, inodes)
