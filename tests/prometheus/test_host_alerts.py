"""Issue 14's alerts under `promtool test rules`: host.disk and host.memory through the
per-rule alerts, a new host-wide OOM kill at once (not a container's at its own limit), a
disk filling up before host.disk's line, and silence for a host whose old OOM kill is only
remembered and whose disk is steady."""

from __future__ import annotations

from gpuguard.outputs.runbooks import alert_page, runbook_url
from tests.prometheus.test_alerts import H, run_promtool, status, warning_alert

HOST = 'gpu="",uuid="",pci_bus_id=""'


def host_status(rule: str, values: str, failed: str) -> list[dict[str, str]]:
    return [{"series": s["series"].replace('gpu="3",uuid="U3",pci_bus_id="0000:3b:00.0"', HOST),
             "values": s["values"]} for s in status(rule, values, failed=failed)]


def host_warning(rule: str) -> dict[str, object]:
    alert = warning_alert(rule)
    labels = dict(alert["exp_labels"])  # type: ignore[call-overload]
    for name in ("gpu", "uuid", "pci_bus_id"):  # empty labels are no labels in Prometheus
        labels.pop(name)
    annotations = dict(alert["exp_annotations"])  # type: ignore[call-overload]
    annotations["summary"] = annotations["summary"].replace("GPU 3 (0000:3b:00.0)", "host")
    return {"exp_labels": labels, "exp_annotations": annotations}


def test_host_rules_alert_after_three_cycles(tmp_path):
    run_promtool(tmp_path, [
        {"interval": "15s",
         "input_series": host_status("host.disk", "1x8", failed="1 2 3 4 5 6 7 8 9"),
         "alert_rule_test": [
             {"eval_time": "15s", "alertname": "GPUGuardRuleWarning", "exp_alerts": []},
             {"eval_time": "1m", "alertname": "GPUGuardRuleWarning",
              "exp_alerts": [host_warning("host.disk")]}]},
        {"interval": "15s",
         "input_series": host_status("host.memory", "1x8", failed="1 2 3 4 5 6 7 8 9"),
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "GPUGuardRuleWarning",
              "exp_alerts": [host_warning("host.memory")]}]},
    ])


def test_a_new_host_oom_kill_alerts_at_once_and_an_old_one_does_not(tmp_path):
    run_promtool(tmp_path, [{
        "interval": "1m",
        "input_series": [
            # one host kill already in the log for an hour, a second one at minute 30
            {"series": f'gpuguard_host_oom_kills{{{H},scope="host"}}', "values": "1x29 2x30"},
            {"series": f'gpuguard_host_oom_kills{{{H},scope="cgroup"}}', "values": "0x60"},
        ],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "GPUGuardHostOomKill", "exp_alerts": []},
            {"eval_time": "31m", "alertname": "GPUGuardHostOomKill", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "instance": "h1:9412", "job": "gpuguard",
                               "scope": "host"},
                "exp_annotations": {
                    "summary": "the host ran out of memory and the out-of-memory killer "
                               "killed a process on h1:9412",
                    "description": "host.memory in /status names the victim; `journalctl "
                                   "-k | grep -i -e 'out of memory' -e oom-kill`. See what "
                                   "holds the memory (`ps aux --sort=-rss | head`, "
                                   "`systemd-cgtop -m`).",
                    "runbook_url": runbook_url(alert_page("GPUGuardHostOomKill"))}}]},
            {"eval_time": "45m", "alertname": "GPUGuardHostOomKill", "exp_alerts": []},
        ]}])


def test_a_kill_at_a_cgroups_own_limit_does_not_alert(tmp_path):
    # a container killed at its --memory limit: its size, not the host's memory
    run_promtool(tmp_path, [{
        "interval": "1m",
        "input_series": [
            {"series": f'gpuguard_host_oom_kills{{{H},scope="cgroup"}}', "values": "1x29 2x30"},
            {"series": f'gpuguard_host_oom_kills{{{H},scope="host"}}', "values": "0x60"},
        ],
        "alert_rule_test": [
            {"eval_time": "31m", "alertname": "GPUGuardHostOomKill", "exp_alerts": []},
        ]}])


def test_a_disk_filling_up_alerts_before_the_line_and_a_steady_one_does_not(tmp_path):
    gib = 2**30
    size = 1000 * gib
    run_promtool(tmp_path, [{
        "interval": "1m",
        "input_series": [
            # the model cache loses 1 GiB a minute from 240 GiB free (24 %)
            {"series": f'gpuguard_disk_free_bytes{{{H},path="/models",role="profile"}}',
             "values": f"{240 * gib}-{gib}x90"},
            {"series": f'gpuguard_disk_size_bytes{{{H},path="/models",role="profile"}}',
             "values": f"{size}x90"},
            # Docker's data root: 20 % free and steady
            {"series": f'gpuguard_disk_free_bytes{{{H},path="/var/lib/docker",role="docker"}}',
             "values": f"{200 * gib}x90"},
            {"series": f'gpuguard_disk_size_bytes{{{H},path="/var/lib/docker",role="docker"}}',
             "values": f"{size}x90"},
        ],
        "alert_rule_test": [
            # filling, but not yet held for 30 minutes
            {"eval_time": "20m", "alertname": "GPUGuardDiskFillingUp", "exp_alerts": []},
            {"eval_time": "1h", "alertname": "GPUGuardDiskFillingUp", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "instance": "h1:9412", "job": "gpuguard",
                               "path": "/models", "role": "profile"},
                "exp_annotations": {
                    "summary": "/models on h1:9412 fills up within a day at its current rate",
                    "description": "See what grows there: `docker system df` for Docker's "
                                   "data root, `du -sh <path>/*` for the model cache; prune "
                                   "old images and model revisions (host.disk's "
                                   "remediation).",
                    "runbook_url": runbook_url(alert_page("GPUGuardDiskFillingUp"))}}]},
        ]}])
