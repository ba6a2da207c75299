"""Prometheus text for node_exporter's textfile collector (`--format prometheus`): the
families shared with the daemon (gpuguard/outputs/families.py) and the check's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuguard.model.results import Verdict
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs import families


class CheckCollector(Collector):
    def __init__(self, snapshot: Snapshot, verdict: Verdict, duration_s: float) -> None:
        self.snapshot = snapshot
        self.verdict = verdict
        self.results = verdict.results
        self.duration_s = duration_s

    def collect(self) -> Iterator[Any]:
        yield families.rule_status(self.results)
        yield families.suggested_action(self.results)
        # The same per-GPU gauges as the daemon's: a textfile user sees temperature, power,
        # ECC and PCIe beside the verdicts.
        yield from families.telemetry(self.snapshot)
        yield from families.host_resources(self.snapshot)
        yield from families.sources(self.snapshot)
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
        yield families.build_info()


def render(snapshot: Snapshot, verdict: Verdict, duration_s: float) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CheckCollector(snapshot, verdict, duration_s))
    return generate_latest(registry).decode()
