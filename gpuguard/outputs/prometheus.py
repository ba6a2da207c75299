"""Prometheus text for node_exporter's textfile collector (`--format prometheus`).

Status encoding of gpuguard_rule_status (also used by the daemon): 0 ok, 1 warning,
2 critical, 3 unknown (Nagios order), -1 skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from gpuguard import __version__
from gpuguard.results import Status, Verdict
from gpuguard.snapshot import Snapshot

STATUS_VALUE = {
    Status.OK: 0,
    Status.WARNING: 1,
    Status.CRITICAL: 2,
    Status.UNKNOWN: 3,
    Status.SKIPPED: -1,
}


class CheckCollector(Collector):
    def __init__(self, snapshot: Snapshot, verdict: Verdict, duration_s: float) -> None:
        self.snapshot = snapshot
        self.verdict = verdict
        self.results = verdict.results
        self.duration_s = duration_s

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        status = GaugeMetricFamily(
            "gpuguard_rule_status",
            "Result of a rule: 0 ok, 1 warning, 2 critical, 3 unknown, -1 skipped.",
            labels=["rule", "severity", "gpu", "uuid", "pci_bus_id"],
        )
        for r in self.results:
            gpu = r.gpu
            status.add_metric(
                [r.rule, r.severity.value,
                 "" if gpu is None else str(gpu.index),
                 (gpu.uuid or "") if gpu else "",
                 (gpu.pci_bus_id or "") if gpu else ""],
                STATUS_VALUE[r.status],
            )
        yield status
        counts = GaugeMetricFamily("gpuguard_check_results", "Results of the last check by status.",
                                   labels=["status"])
        for name, n in self.verdict.summary().items():
            counts.add_metric([name], n)
        yield counts
        yield GaugeMetricFamily(
            "gpuguard_check_exit_code",
            "Exit code of the last check: 0 ok, 1 warning, 2 critical, 3 unknown.",
            value=self.verdict.code,
        )
        yield GaugeMetricFamily("gpuguard_check_duration_seconds",
                                "Wall time of the last check.", value=self.duration_s)
        yield GaugeMetricFamily("gpuguard_check_timestamp_seconds",
                                "When the last check read the host (Unix time).",
                                value=self.snapshot.host.collected_at)
        yield InfoMetricFamily("gpuguard_build", "gpuguard version.",
                               value={"version": __version__})


def render(snapshot: Snapshot, verdict: Verdict, duration_s: float) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CheckCollector(snapshot, verdict, duration_s))
    return generate_latest(registry).decode()
