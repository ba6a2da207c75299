#!/usr/bin/env python3
"""Write packaging/grafana/gpuguard.json (Grafana 10 and 11): a datasource variable, host
and GPU variables, fleet overview, per-host rule states, Xids, temperature, power,
clock event reasons, ECC/AER/replay counters, PCIe link state, failover.

    python scripts/gen_dashboard.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "packaging" / "grafana" / "gpuguard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$host", gpu=~"$gpu"'
GPU_LEGEND = "{{instance}} GPU {{gpu}}"

_next_id = iter(range(1, 1000))


def panel(title: str, kind: str, targets: list[tuple[str, str]], x: int, y: int, w: int = 12,
          h: int = 8, unit: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": next(_next_id), "type": kind, "title": title, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": expr,
                     "legendFormat": legend} for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {},
    }
    if unit:
        out["fieldConfig"]["defaults"]["unit"] = unit
    out.update(extra)
    return out


STATUS_MAPPINGS = [{"type": "value", "options": {
    "-1": {"text": "skipped", "color": "text"}, "0": {"text": "ok", "color": "green"},
    "1": {"text": "warning", "color": "orange"}, "2": {"text": "critical", "color": "red"},
    "3": {"text": "unknown", "color": "purple"}}}]


def dashboard() -> dict[str, Any]:
    panels = [
        panel("Hosts by worst status", "table",
              [("max by (instance) (gpuguard_rule_status)", "{{instance}}")], 0, 0, 12, 8,
              fieldConfig={"defaults": {"mappings": STATUS_MAPPINGS}, "overrides": []},
              transformations=[{"id": "reduce", "options": {"reducers": ["lastNotNull"]}}]),
        panel("Critical rules now", "stat",
              [('count by (instance) (gpuguard_rule_status{instance=~"$host"} == 2)',
                "{{instance}}")], 12, 0, 6, 8),
        panel("Services on CPU (failover)", "stat",
              [('gpuguard_failover_active{instance=~"$host"}', "{{instance}} {{service}}")],
              18, 0, 6, 8, fieldConfig={"defaults": {"mappings": [{"type": "value", "options": {
                  "0": {"text": "GPU", "color": "green"},
                  "1": {"text": "CPU", "color": "orange"}}}]}, "overrides": []}),
        panel("Rule states per GPU", "table",
              [(f'gpuguard_rule_status{{{SEL}}}', "{{rule}} GPU {{gpu}}")], 0, 8, 24, 10,
              fieldConfig={"defaults": {"mappings": STATUS_MAPPINGS}, "overrides": []}),
        panel("Xids over time", "timeseries",
              [('sum by (instance, gpu, xid) (increase(gpuguard_xid_events_total'
                '{instance=~"$host"}[$__rate_interval]))',
                "{{instance}} GPU {{gpu}} Xid {{xid}}")],
              0, 18, 12, 8),
        panel("Temperature", "timeseries",
              [(f'gpuguard_gpu_temperature_celsius{{{SEL}}}', GPU_LEGEND),
               (f'gpuguard_gpu_tlimit_margin_celsius{{{SEL}}}', GPU_LEGEND + " below T.Limit")],
              12, 18, 12, 8, unit="celsius"),
        panel("Power against limit", "timeseries",
              [(f'gpuguard_gpu_power_draw_watts{{{SEL}}}', GPU_LEGEND + " draw"),
               (f'gpuguard_gpu_power_limit_watts{{{SEL}}}', GPU_LEGEND + " limit")],
              0, 26, 12, 8, unit="watt"),
        panel("Clock event reasons (idle hidden)", "timeseries",
              [(f'gpuguard_gpu_clock_event_reason{{{SEL}, reason!="gpu_idle"}} == 1',
                GPU_LEGEND + " {{reason}}")], 12, 26, 12, 8),
        panel("ECC errors (rate)", "timeseries",
              [(f'rate(gpuguard_gpu_ecc_errors_total{{{SEL}, counter="volatile"}}'
                f'[$__rate_interval])', GPU_LEGEND + " {{type}}")], 0, 34, 8, 8),
        panel("PCIe AER errors (rate)", "timeseries",
              [(f'rate(gpuguard_gpu_pcie_aer_errors_total{{{SEL}}}[$__rate_interval])',
                GPU_LEGEND + " {{type}}")], 8, 34, 8, 8),
        panel("PCIe replays (per minute)", "timeseries",
              [(f'rate(gpuguard_gpu_pcie_replays_total{{{SEL}}}[$__rate_interval]) * 60',
                GPU_LEGEND)], 16, 34, 8, 8),
        panel("PCIe link", "table",
              [(f'gpuguard_gpu_pcie_link_generation{{{SEL}}}', GPU_LEGEND + " gen {{state}}"),
               (f'gpuguard_gpu_pcie_link_width{{{SEL}}}', GPU_LEGEND + " x{{state}}")],
              0, 42, 12, 8),
        panel("Failover transitions", "timeseries",
              [('increase(gpuguard_failover_transitions_total{instance=~"$host"}'
                '[$__rate_interval])', "{{instance}} {{service}} {{direction}}"),
               ('increase(gpuguard_failover_errors_total{instance=~"$host"}[$__rate_interval])',
                "{{instance}} {{service}} errors")], 12, 42, 12, 8),
        panel("NVLinks up against expected", "timeseries",
              [(f'gpuguard_gpu_nvlink_links{{{SEL}}}', GPU_LEGEND + " {{state}}"),
               (f'sum by (instance, gpu) (increase(gpuguard_gpu_nvlink_errors_total{{{SEL}}}'
                f'[$__rate_interval]))', GPU_LEGEND + " errors")], 0, 50, 12, 8),
        panel("GPU fabric state", "stat",
              [(f'gpuguard_gpu_fabric_state{{{SEL}}}', GPU_LEGEND)], 12, 50, 12, 8,
              fieldConfig={"defaults": {"mappings": [{"type": "value", "options": {
                  "0": {"text": "not started", "color": "red"},
                  "1": {"text": "in progress", "color": "orange"},
                  "2": {"text": "completed", "color": "green"}}}]}, "overrides": []}),
        panel("Host memory available and swap in use", "timeseries",
              [('gpuguard_host_memory_available_bytes{instance=~"$host"}',
                "{{instance}} available"),
               ('gpuguard_host_swap_used_bytes{instance=~"$host"}', "{{instance}} swap used"),
               ('gpuguard_host_memory_total_bytes{instance=~"$host"}', "{{instance}} total")],
              0, 58, 12, 8, unit="bytes"),
        panel("OOM kills and disk free", "timeseries",
              [('gpuguard_host_oom_kills{instance=~"$host"} - (gpuguard_host_oom_kills'
                '{instance=~"$host"} offset $__interval) > 0',
                "{{instance}} OOM kills ({{scope}})"),
               ('gpuguard_disk_free_bytes{instance=~"$host"} / gpuguard_disk_size_bytes'
                '{instance=~"$host"}', "{{instance}} {{path}} free"),
               ('gpuguard_disk_free_inodes_ratio{instance=~"$host"}',
                "{{instance}} {{path}} inodes free")],
              12, 58, 12, 8, unit="percentunit"),
        panel("Daemon: cycle duration and scrape health", "timeseries",
              [('gpuguard_cycle_duration_seconds{instance=~"$host"}', "{{instance}} {{cadence}}"),
               ('up{job=~"gpuguard.*", instance=~"$host"}', "{{instance}} up")],
              0, 66, 24, 6, unit="s"),
        # the supervised services (service.* rules, docs/supervisor.md)
        panel("Service memory: host RSS and GPU", "timeseries",
              [('gpuguard_service_rss_bytes{instance=~"$host"}', "{{instance}} {{service}} RSS"),
               ('gpuguard_service_gpu_memory_bytes{instance=~"$host"}',
                "{{instance}} {{service}} GPU {{gpu}}")], 0, 72, 8, 8, unit="bytes"),
        panel("Service memory: time to its limit at the fitted slope", "timeseries",
              [('gpuguard_service_memory_exhaustion_seconds{instance=~"$host"}',
                "{{instance}} {{service}} {{memory}}")], 8, 72, 8, 8, unit="s"),
        panel("Service inference probe", "timeseries",
              [('gpuguard_service_inference_latency_seconds{instance=~"$host"}',
                "{{instance}} {{service}} latency"),
               ('gpuguard_service_inference_success{instance=~"$host"}',
                "{{instance}} {{service}} success")], 16, 72, 8, 8),
        # the services' inference engines (issue 23): 0 ok, 1 saturated, 2 capacity,
        # 3 stuck, 4 unknown
        panel("Engine state (0 ok, 1 saturated, 2 capacity, 3 stuck, 4 unknown)",
              "timeseries",
              [('gpuguard_service_engine_state{instance=~"$host"}',
                "{{instance}} {{service}}"),
               ('gpuguard_service_engine_progress_flat_seconds{instance=~"$host"}',
                "{{instance}} {{service}} flat s")], 0, 80, 8, 8),
        panel("Engine requests and progress", "timeseries",
              [('gpuguard_service_engine_requests{instance=~"$host"}',
                "{{instance}} {{service}} {{state}}"),
               ('rate(gpuguard_service_engine_progress_total{instance=~"$host"}'
                '[$__rate_interval])', "{{instance}} {{service}} {{unit}}/s")],
              8, 80, 8, 8),
        panel("Engine KV cache and preemptions", "timeseries",
              [('gpuguard_service_engine_kv_cache_usage_ratio{instance=~"$host"}',
                "{{instance}} {{service}} KV cache"),
               ('rate(gpuguard_service_engine_preemptions_total{instance=~"$host"}'
                '[$__rate_interval])', "{{instance}} {{service}} preemptions/s")],
              16, 80, 8, 8),
    ]
    variables = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source",
         "current": {}, "hide": 0},
        {"name": "host", "type": "query", "datasource": DS, "label": "Host",
         "query": {"query": "label_values(gpuguard_build_info, instance)", "refId": "host"},
         "definition": "label_values(gpuguard_build_info, instance)", "refresh": 2,
         "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "hide": 0},
        {"name": "gpu", "type": "query", "datasource": DS, "label": "GPU",
         "query": {"query": 'label_values(gpuguard_gpu_info{instance=~"$host"}, gpu)',
                   "refId": "gpu"},
         "definition": 'label_values(gpuguard_gpu_info{instance=~"$host"}, gpu)',
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": {},
         "hide": 0},
    ]
    return {
        "title": "gpuguard", "uid": "gpuguard", "tags": ["gpu", "nvidia", "gpuguard"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": variables}, "annotations": {"list": []}, "panels": panels,
    }


def main() -> int:
    text = json.dumps(dashboard(), indent=2) + "\n"
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
