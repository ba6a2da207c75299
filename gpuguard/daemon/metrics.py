"""Prometheus metrics of the daemon, rendered from the last cycle by a custom Collector.

Module-level Gauges would keep the label sets of a GPU that left; a Collector that
yields families from the last cycle lets its series disappear. Every name has the one
prefix `gpuguard_` and base units; docs/metrics.md lists them all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from gpuguard.daemon import service_metrics
from gpuguard.daemon.latest import LatestResults
from gpuguard.model.identity import labels_of
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs import families


@dataclass
class DaemonStats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    cycle_duration_s: dict[str, float] = field(default_factory=dict)
    # When the last cycle of each cadence ended: wall time for the timestamp metric (a
    # display), monotonic time for every age and freshness (a clock step changes nothing)
    last_cycle_time: dict[str, float] = field(default_factory=dict)
    last_cycle_mono: dict[str, float] = field(default_factory=dict)
    cycles_total: dict[str, int] = field(default_factory=dict)
    # Whether the last cycle of each cadence succeeded, when one last did (monotonic),
    # and failures.
    last_cycle_ok: dict[str, bool] = field(default_factory=dict)
    last_success_mono: dict[str, float] = field(default_factory=dict)
    cycle_failures_total: dict[str, int] = field(default_factory=dict)
    started_mono: float = field(default_factory=time.monotonic)
    # Steps of the wall clock the daemon saw (io/clock.JumpWatch), and the last one's size
    clock_jumps_total: int = 0
    last_clock_jump_s: float = 0.0
    deadline_exceeded_total: int = 0
    reloads_total: int = 0
    reload_success: int = 1
    last_reload_time: float = 0.0
    # (xid, severity, gpu, uuid, pci_bus_id) -> events seen, and when the last one happened
    xids: dict[tuple[str, ...], int] = field(default_factory=dict)
    xid_last: dict[tuple[str, ...], float] = field(default_factory=dict)
    # (gpu, uuid, pci_bus_id) -> (when, code) of the GPU's last Xid (monotonic): the
    # value of dcgm-exporter's DCGM_FI_DEV_XID_ERRORS (the last code, not a count)
    xid_latest: dict[tuple[str, ...], tuple[float, int]] = field(default_factory=dict)

    def account(self, cadence: str, took_s: float, succeeded: bool) -> None:
        """A cycle of this cadence ended, taking `took_s`, well or not."""
        with self.lock:
            now = time.monotonic()
            self.cycle_duration_s[cadence] = took_s
            self.last_cycle_time[cadence] = time.time()  # the metric's timestamp
            self.last_cycle_mono[cadence] = now
            self.cycles_total[cadence] = self.cycles_total.get(cadence, 0) + 1
            self.last_cycle_ok[cadence] = succeeded
            if succeeded:
                self.last_success_mono[cadence] = now
            else:
                self.cycle_failures_total[cadence] = \
                    self.cycle_failures_total.get(cadence, 0) + 1


class DaemonCollector(Collector):
    def __init__(self, store: LatestResults, stats: DaemonStats,
                 last_snapshot: Callable[[], Snapshot | None],
                 services: Callable[[], list[Any]] | None = None,
                 event_store: Callable[[], dict[str, Any]] | None = None) -> None:
        self.store = store
        self.stats = stats
        self.last_snapshot = last_snapshot
        self.services = services or (lambda: [])
        self.event_store = event_store  # the recorder's counters; None when it is off

    def collect(self) -> Iterator[Metric]:
        yield from self._rules()
        snapshot = self.last_snapshot()
        # The telemetry of a failed cycle's snapshot is not current: none rather than old.
        if snapshot is not None and not self.store.cycle_failed("fast"):
            yield from families.telemetry(snapshot)
            yield from families.host_resources(snapshot)
            yield from families.sources(snapshot)
            yield from service_metrics.families(snapshot,
                                                [e.result for e in self.store.entries()])
        yield from self._daemon()
        yield from self._failover()
        yield from self._event_store()

    def _event_store(self) -> Iterator[Metric]:
        if self.event_store is None:
            return
        got = self.event_store()
        yield CounterMetricFamily("gpuguard_event_store_written",
                                  "Events written to the event store.", value=got["written"])
        # one series, not one per reason: the 8-GPU series budget (the log names the reason)
        yield CounterMetricFamily(
            "gpuguard_event_store_dropped", "Events the store could not take (full disk, "
            "read-only, I/O error, queue full; the log says which); the cycles go on.",
            value=sum(got["dropped"].values()))
        yield CounterMetricFamily("gpuguard_event_store_corrupt",
                                  "Corrupt store files moved aside (a new one was started).",
                                  value=got["corrupt"])
        yield GaugeMetricFamily("gpuguard_event_store_size_bytes",
                                "Size of the store's main file at its last write.",
                                value=got["size_bytes"])
        yield GaugeMetricFamily("gpuguard_event_store_wal_bytes",
                                "Size of the store's write-ahead log at its last flush.",
                                value=got["wal_bytes"])
        yield CounterMetricFamily(
            "gpuguard_event_store_wal_pinned", "Flushes that could not bring the WAL under "
            "its bound: a reader held a read transaction (docs/events.md).",
            value=got["wal_pinned"])
        yield CounterMetricFamily(
            "gpuguard_event_store_replaced", "Times the store's files were deleted or "
            "replaced under the daemon (it reopened a fresh store; the log names the file).",
            value=got["wal_replaced"])
        yield CounterMetricFamily(
            "gpuguard_event_store_unsafe", "Opens of the store refused: a symbolic link or "
            "a file of another user in its place.", value=got["unsafe"])
        yield CounterMetricFamily(
            "gpuguard_event_store_rows_skipped", "Stored rows that failed validation on "
            "read (each counted once; history and acks go on without them).",
            value=got["rows_skipped"])

    def _failover(self) -> Iterator[Metric]:
        snaps = self.services()
        if not snaps:
            return
        active = GaugeMetricFamily("gpuguard_failover_active",
                                   "1 while the service runs on its CPU variant.",
                                   labels=["service"])
        moving = GaugeMetricFamily("gpuguard_failover_in_progress",
                                   "1 while a transition is under way.", labels=["service"])
        failed = GaugeMetricFamily("gpuguard_failover_failed_cycles",
                                   "Consecutive failed cycles counted towards failover.",
                                   labels=["service"])
        transitions = CounterMetricFamily("gpuguard_failover_transitions",
                                          "Completed transitions.",
                                          labels=["service", "direction"])
        last = GaugeMetricFamily("gpuguard_failover_last_transition_timestamp_seconds",
                                 "When the last transition completed (Unix time).",
                                 labels=["service"])
        errors = CounterMetricFamily("gpuguard_failover_errors",
                                     "Transitions that failed (the source was kept).",
                                     labels=["service"])
        writes = CounterMetricFamily("gpuguard_failover_state_write_errors",
                                     "Writes of the service's state file that failed (a "
                                     "full or read-only state directory); failover goes on.",
                                     labels=["service"])
        for snap in snaps:
            st = snap.state
            active.add_metric([snap.service], 1 if st.active == "cpu" else 0)
            moving.add_metric([snap.service], 1 if st.transition else 0)
            failed.add_metric([snap.service], st.failed_cycles)
            for direction in ("to_cpu", "to_gpu"):
                transitions.add_metric([snap.service, direction],
                                       st.transitions.get(direction, 0))
            last.add_metric([snap.service], st.last_transition or 0)
            errors.add_metric([snap.service], st.errors)
            writes.add_metric([snap.service], snap.state_write_errors)
        yield from (active, moving, failed, transitions, last, errors, writes)

    def _rules(self) -> Iterator[Metric]:
        entries = self.store.entries()
        failed = GaugeMetricFamily(
            "gpuguard_rule_failed_cycles",
            "Consecutive cycles a rule failed (warning or critical); only series above 0.",
            labels=["rule", *families.GPU_LABELS])
        for entry in entries:
            if entry.failed_cycles:
                failed.add_metric([entry.result.rule, *labels_of(entry.result.gpu)],
                                  entry.failed_cycles)
        yield families.rule_status(e.result for e in entries)
        yield failed
        yield families.suggested_action(e.result for e in entries)

    def _daemon(self) -> Iterator[Metric]:
        stats = self.stats
        with stats.lock:
            durations = dict(stats.cycle_duration_s)
            last = dict(stats.last_cycle_time)
            cycles = dict(stats.cycles_total)
            last_ok = dict(stats.last_cycle_ok)
            failures = dict(stats.cycle_failures_total)
            xids = dict(stats.xids)
            xid_last = dict(stats.xid_last)
            deadline, reloads = stats.deadline_exceeded_total, stats.reloads_total
            reload_ok, reload_time = stats.reload_success, stats.last_reload_time
            ended = dict(stats.last_cycle_mono)
            jumps, last_jump = stats.clock_jumps_total, stats.last_clock_jump_s
        now = time.monotonic()
        duration = GaugeMetricFamily("gpuguard_cycle_duration_seconds",
                                     "Wall time of the last cycle.", labels=["cadence"])
        timestamp = GaugeMetricFamily("gpuguard_last_cycle_timestamp_seconds",
                                      "When the last cycle ended (Unix time).", labels=["cadence"])
        age = GaugeMetricFamily("gpuguard_last_cycle_age_seconds",
                                "Seconds since the last cycle ended, on the daemon's "
                                "monotonic clock (a step of the host's clock does not "
                                "change it).", labels=["cadence"])
        total = CounterMetricFamily("gpuguard_cycles", "Cycles run.", labels=["cadence"])
        success = GaugeMetricFamily("gpuguard_last_cycle_successful",
                                    "1 when the last cycle ran to its end, 0 when it failed "
                                    "(its rules are unknown until one succeeds).",
                                    labels=["cadence"])
        failed = CounterMetricFamily("gpuguard_cycle_failures", "Cycles that failed.",
                                     labels=["cadence"])
        for cadence in sorted(last):
            duration.add_metric([cadence], durations.get(cadence, 0.0))
            timestamp.add_metric([cadence], last[cadence])
            age.add_metric([cadence], round(max(now - ended.get(cadence, now), 0.0), 3))
            total.add_metric([cadence], cycles.get(cadence, 0))
            success.add_metric([cadence], 1 if last_ok.get(cadence, True) else 0)
            failed.add_metric([cadence], failures.get(cadence, 0))
        yield duration
        yield timestamp
        yield age
        yield total
        yield success
        yield failed
        xid = CounterMetricFamily(
            "gpuguard_xid_events", "Xid events seen in the kernel log (since boot) and from "
            "NVML events, by Xid and GPU (an Xid at an address NVML does not list: gpu and "
            "uuid empty, the line's address).", labels=["xid", "severity", *families.GPU_LABELS])
        last_seen = GaugeMetricFamily(
            "gpuguard_xid_last_seen_age_seconds", "How long ago the last Xid of this kind "
            "happened on this GPU, by the kernel log's own clock and the daemon's monotonic "
            "clock (never the wall clock: a host clock that steps, or one apart from "
            "Prometheus's, neither hides nor repeats one). Alert on `this < window`.",
            labels=["xid", "severity", *families.GPU_LABELS])
        for label, count in sorted(xids.items()):
            xid.add_metric(list(label), count)
            last_seen.add_metric(list(label), round(max(0.0, now - xid_last.get(label, now)), 1))
        yield xid
        yield last_seen
        yield CounterMetricFamily("gpuguard_check_deadline_exceeded",
                                  "NVML sweeps that passed their deadline (driver.responsive).",
                                  value=deadline)
        yield CounterMetricFamily("gpuguard_config_reloads",
                                  "Configuration reloads asked for (SIGHUP).", value=reloads)
        yield GaugeMetricFamily("gpuguard_config_last_reload_successful",
                                "1 when the last reload succeeded (or none was asked), 0 when "
                                "it failed and the previous rules are still in use.",
                                value=reload_ok)
        yield GaugeMetricFamily("gpuguard_config_last_reload_timestamp_seconds",
                                "When the configuration was last loaded (Unix time).",
                                value=reload_time)
        yield GaugeMetricFamily("gpuguard_results_stale",
                                "1 when results are not all fresh: NVML did not answer in "
                                "time (those GPUs' rules are unknown) or a cycle failed.",
                                value=1 if self.store.stale else 0)
        yield CounterMetricFamily("gpuguard_clock_jumps",
                                  "Steps of the host's wall clock the daemon saw (NTP, a VM "
                                  "restored, date -s); its intervals and ages run on the "
                                  "monotonic clock and are not changed by them.",
                                  value=jumps)
        yield GaugeMetricFamily("gpuguard_clock_last_jump_seconds",
                                "Size of the last step of the wall clock (negative: back; "
                                "0 when none was seen).", value=last_jump)
        yield families.build_info()


def compat_text(daemon: Any) -> Callable[[], bytes]:
    """What /metrics adds after the registry's text: dcgm-exporter's series
    (gpuguard/outputs/metrics_dcgm.py) while `--metrics-compat dcgm` or the profile's
    `metrics_compat: dcgm` asks for them, from the snapshot and verdict the gpuguard_*
    series come from; nothing, and that module never imported, while neither does."""
    def render() -> bytes:
        config, snapshot = daemon.current()
        wanted = daemon.cfg.metrics_compat or (config[0].metrics_compat if config else None)
        # a failed cycle's snapshot is not current: none rather than old (as collect())
        if wanted != "dcgm" or config is None or snapshot is None or \
                daemon.store.cycle_failed("fast"):
            return b""
        from gpuguard.outputs import metrics_dcgm

        with daemon.stats.lock:
            last = {gpu: code for gpu, (_, code) in daemon.stats.xid_latest.items()}
        catalog = config[1].xid_catalog

        def meaning(code: int) -> str | None:
            entry = catalog.get(code)
            return None if entry is None else str(entry.meaning)

        return metrics_dcgm.render(snapshot, [e.result for e in daemon.store.entries()],
                                   last, meaning).encode()
    return render


def registry_of(daemon: Any) -> CollectorRegistry:
    """The daemon's /metrics (gpuguard/daemon/app.py): its results and telemetry, its own
    health, the supervisors', the event store's and the status page's counters."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon.store, daemon.stats, lambda: daemon.current()[1],
                                      lambda: [s.view() for s in daemon.supervisors],
                                      daemon.recorder.metrics if daemon.recorder else None))
    registry.register(daemon.page.collector())
    return registry
