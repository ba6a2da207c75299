"""Issue 20, item 11: the event store held above its bound (a reader pinning the WAL, which
gpuguard cannot stop) alerts once it stays there; a moment above does not."""

from __future__ import annotations

from gpuguard.outputs.runbooks import alert_page, runbook_url
from tests.prometheus.test_alerts import H, run_promtool

MIB = 2**20
SIZE = f"gpuguard_event_store_size_bytes{{{H}}}"
ALERT = {
    "exp_labels": {"severity": "warning", "instance": "h1:9412", "job": "gpuguard"},
    "exp_annotations": {
        "summary": "the event store on h1:9412 has stayed above its 64 MiB bound for 15 "
                   "minutes",
        "description": "A reader holds a read transaction and pins the WAL, which gpuguard "
                       "cannot checkpoint: find it with `fuser -v /var/lib/gpuguard/events.db*` "
                       "(or lsof) and end it; the daemon truncates the WAL at its next flush. "
                       "Meanwhile new events wait in memory (bounded; "
                       "gpuguard_event_store_dropped_total counts what does not fit).",
        "runbook_url": runbook_url(alert_page("GPUGuardEventStoreOverBound")),
    },
}


def test_a_store_held_above_its_bound_alerts_and_a_moment_above_does_not(tmp_path):
    above = 70 * MIB
    run_promtool(tmp_path, [
        {"interval": "1m",
         "input_series": [{"series": SIZE, "values": f"{60 * MIB}x10 {above}x30 {10 * MIB}x10"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "GPUGuardEventStoreOverBound",
              "exp_alerts": []},
             {"eval_time": "20m", "alertname": "GPUGuardEventStoreOverBound",
              "exp_alerts": []},  # above for 10 minutes only
             {"eval_time": "30m", "alertname": "GPUGuardEventStoreOverBound",
              "exp_alerts": [ALERT]},
             {"eval_time": "45m", "alertname": "GPUGuardEventStoreOverBound",
              "exp_alerts": []},  # the reader let go
         ]},
        {"interval": "1m",
         "input_series": [{"series": SIZE,
                           "values": f"{60 * MIB}x5 {above}x3 {60 * MIB}x5 {above}x3 "
                                     f"{60 * MIB}x20"}],
         "alert_rule_test": [
             {"eval_time": "30m", "alertname": "GPUGuardEventStoreOverBound",
              "exp_alerts": []}]},
    ])
