"""Metrics of the supervised services, from the last fast cycle's `services` reading
(gpuguard/daemon/services.py). A service whose processes could not be told has no
memory series (not a zero); one whose probe is no request has no inference series."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuguard.model.derived import held_by
from gpuguard.model.snapshot import Snapshot


def families(snapshot: Snapshot) -> Iterator[Metric]:
    if not snapshot.host.services.is_ok:
        return
    entries: dict[str, Any] = snapshot.host.services.get()
    gpu_mem = GaugeMetricFamily("gpuguard_service_gpu_memory_bytes",
                                "GPU memory NVML accounts to the service's processes.",
                                labels=["service", "gpu"])
    rss = GaugeMetricFamily("gpuguard_service_rss_bytes",
                            "Resident host memory summed over the service's process tree.",
                            labels=["service"])
    slope = GaugeMetricFamily(
        "gpuguard_service_memory_growth_bytes_per_second",
        "Least-squares slope of the service's memory over the samples of its current run "
        "(memory: host or gpu).", labels=["service", "memory"])
    left = GaugeMetricFamily(
        "gpuguard_service_memory_exhaustion_seconds",
        "Projected seconds until the service's memory reaches its limit at that slope; "
        "only while it grows.", labels=["service", "memory"])
    latency = GaugeMetricFamily("gpuguard_service_inference_latency_seconds",
                                "Time the last inference request of the probe took.",
                                labels=["service"])
    success = GaugeMetricFamily("gpuguard_service_inference_success",
                                "1 when the last inference request answered as expected.",
                                labels=["service"])
    for name, entry in sorted(entries.items()):
        answer = entry.get("inference")
        if answer is not None and answer.get("ok") is not None:
            latency.add_metric([name], float(answer["latency_s"]))
            success.add_metric([name], 1 if answer.get("ok") else 0)
        if entry.get("error"):
            continue
        _memory(snapshot, name, entry, gpu_mem, rss)
        _growth(name, entry, slope, left)
    yield from (gpu_mem, rss, slope, left, latency, success)


def _memory(snapshot: Snapshot, name: str, entry: dict[str, Any], gpu_mem: GaugeMetricFamily,
            rss: GaugeMetricFamily) -> None:
    pids = set(entry.get("pids") or [])
    for gpu in snapshot.gpus:
        if gpu.compute_processes.is_ok:
            held = held_by(gpu, pids)
            if held:
                gpu_mem.add_metric([name, str(gpu.index)],
                                   sum(p.used_memory_bytes or 0 for p in held))
    rss.add_metric([name], float(entry.get("rss_bytes") or 0))


def _growth(name: str, entry: dict[str, Any], slope: GaugeMetricFamily,
            left: GaugeMetricFamily) -> None:
    """Fitted once, by the daemon's service watch (daemon/services.py)."""
    for memory in ("host", "gpu"):
        growth = (entry.get("growth") or {}).get(memory)
        if growth is None:
            continue
        slope.add_metric([name, memory], growth["slope_bytes_per_s"])
        if "exhaustion_s" in growth:
            left.add_metric([name, memory], growth["exhaustion_s"])
