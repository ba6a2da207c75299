"""Metrics of the supervised services, from the last fast cycle's `services` reading
(gpuguard/daemon/services.py). A service whose processes could not be told has no
memory series (not a zero); one whose probe is no request has no inference series; one
without an engine gpuguard knows has no engine series (issue 23)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuguard.judge.engine_state import STATES
from gpuguard.model.derived import held_by
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import Snapshot


def families(snapshot: Snapshot, results: Iterable[Result] = ()) -> Iterator[Metric]:
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
    yield from engine_families(entries, results)


def engine_families(entries: dict[str, Any], results: Iterable[Result]) -> Iterator[Metric]:
    """The engines' state as service.engine judged it (0 ok, 1 saturated, 2 capacity,
    3 stuck, 4 unknown) and the values of their newest read: 7 series per service at
    most, none for a service without an engine."""
    judged = next((r for r in results if r.rule == "service.engine"
                   and r.status is not Status.SKIPPED), None)
    states = (judged.observed.get("services") or {}) if judged is not None else {}
    state = GaugeMetricFamily(
        "gpuguard_service_engine_state", "The service's inference engine as service.engine "
        "judged its own metrics: 0 ok, 1 saturated, 2 capacity, 3 stuck, 4 unknown.",
        labels=["service"])
    requests = GaugeMetricFamily("gpuguard_service_engine_requests",
                                 "Requests the engine says are running or waiting.",
                                 labels=["service", "state"])
    progress = CounterMetricFamily(
        "gpuguard_service_engine_progress", "The engine's own progress counter as read "
        "(unit: tokens generated, forward passes or requests completed).",
        labels=["service", "unit"])
    kv_cache = GaugeMetricFamily("gpuguard_service_engine_kv_cache_usage_ratio",
                                 "KV cache in use, 0 to 1, as the engine reports it.",
                                 labels=["service"])
    preemptions = CounterMetricFamily("gpuguard_service_engine_preemptions",
                                      "Requests the engine preempted, as it counts them.",
                                      labels=["service"])
    flat = GaugeMetricFamily(
        "gpuguard_service_engine_progress_flat_seconds", "Seconds the engine has held "
        "requests with its progress counter still (0 when it moves or nothing waits).",
        labels=["service"])
    for name, entry in sorted(entries.items()):
        engine = entry.get("engine")
        judged_one = states.get(name) or {}
        if not engine or judged_one.get("state") not in STATES:
            continue
        state.add_metric([name], STATES.index(judged_one["state"]))
        flat.add_metric([name], float(judged_one.get("flat_s") or 0.0))
        _engine_values(name, engine, requests, progress, kv_cache, preemptions)
    yield from (state, requests, progress, kv_cache, preemptions, flat)


def _engine_values(name: str, engine: dict[str, Any], requests: GaugeMetricFamily,
                   progress: CounterMetricFamily, kv_cache: GaugeMetricFamily,
                   preemptions: CounterMetricFamily) -> None:
    reads = engine.get("reads") or []
    if not reads or reads[-1][1] is not None:
        return  # not read this cycle: no value rather than an old one
    _t, _error, running, waiting, made, kv, preempted = reads[-1]
    for label, value in (("running", running), ("waiting", waiting)):
        if value is not None:
            requests.add_metric([name, label], float(value))
    if made is not None:
        progress.add_metric([name, str(engine.get("unit") or "").replace(" ", "_")],
                            float(made))
    if kv is not None:
        kv_cache.add_metric([name], float(kv))
    if preempted is not None:
        preemptions.add_metric([name], float(preempted))


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
