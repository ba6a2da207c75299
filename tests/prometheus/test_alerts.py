"""The shipped alert rules, unit-tested with `promtool test rules` (Debian's prometheus)."""

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from gpuguard.config.ruleset import load_ruleset
from gpuguard.outputs.runbooks import alert_page, rule_page, runbook_url
from tests.conftest import REPO

ALERTS = REPO / "packaging" / "prometheus" / "gpuguard-alerts.yaml"
H = 'instance="h1:9412",job="gpuguard"'
G3 = 'gpu="3",uuid="U3",pci_bus_id="0000:3b:00.0"'


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: ./scripts/test.sh installs Debian's prometheus")
    return path


def test_alert_file_is_current_and_valid():
    check = subprocess.run([sys.executable, "scripts/gen_alerts.py", "--check"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    lint = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def critical_alert(rule_id):
    rule = load_ruleset().rules[rule_id]
    return {
        "exp_labels": {"severity": "critical", "gpuguard_rule": rule_id,
                       "instance": "h1:9412", "job": "gpuguard", "rule": rule_id,
                       "gpu": "3", "uuid": "U3", "pci_bus_id": "0000:3b:00.0"},
        "exp_annotations": {
            "summary": f"{rule_id} critical on h1:9412 GPU 3 (0000:3b:00.0): {rule.problem}",
            "description": f"{rule.problem[0].upper()}{rule.problem[1:]} ({rule_id}, critical "
                           "for 3 cycles or more).",
            "runbook_url": runbook_url(rule_page(rule_id)),
        },
    }


def warning_alert(rule_id):
    alert = critical_alert(rule_id)
    rule = load_ruleset().rules[rule_id]
    alert["exp_labels"]["severity"] = "warning"
    alert["exp_annotations"]["summary"] = (f"{rule_id} warning on h1:9412 GPU 3 "
                                           f"(0000:3b:00.0): {rule.problem}")
    alert["exp_annotations"]["description"] = (f"{rule.problem[0].upper()}{rule.problem[1:]} "
                                               f"({rule_id}, warning for 3 cycles or more).")
    return alert


def status(rule, values, severity="critical", failed=None):
    series = [{"series": f'gpuguard_rule_status{{{H},rule="{rule}",severity="{severity}",{G3}}}',
               "values": values}]
    if failed:
        series.append({"series": f'gpuguard_rule_failed_cycles{{{H},rule="{rule}",{G3}}}',
                       "values": failed})
    return series


def run_promtool(tmp_path, tests):
    doc = {"rule_files": [str(ALERTS)], "evaluation_interval": "15s", "tests": tests}
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    proc = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_critical_held_three_cycles_fires_two_do_not(tmp_path):
    run_promtool(tmp_path, [
        {"interval": "15s",
         "input_series": status("memory.row_remap", "2x8", failed="1 2 3 4 5 6 7 8 9"),
         "alert_rule_test": [
             {"eval_time": "15s", "alertname": "GPUGuardRuleCritical", "exp_alerts": []},
             {"eval_time": "1m", "alertname": "GPUGuardRuleCritical",
              "exp_alerts": [critical_alert("memory.row_remap")]}]},
        {"interval": "15s",
         "input_series": status("persistence.mode", "1x8", severity="warning",
                                failed="1 2 3 4 5 6 7 8 9"),
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "GPUGuardRuleCritical", "exp_alerts": []},
             {"eval_time": "1m", "alertname": "GPUGuardRuleWarning",
              "exp_alerts": [warning_alert("persistence.mode")]}]},
        {"interval": "15s",
         "input_series": status("driver.responsive", "2 2 0 0", failed="1 2 0 0"),
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "GPUGuardRuleCritical", "exp_alerts": []}]},
    ])


def test_silent_on_idle_downshift_idle_clock_bit_and_one_old_xid(tmp_path):
    quiet = [
        # idle PCIe downshift: the link reads x8 of x16, the rule says ok
        *status("pcie.link_width", "0x20"),
        {"series": f'gpuguard_gpu_pcie_link_width{{{H},{G3},state="current"}}',
         "values": "8x20"},
        {"series": f'gpuguard_gpu_pcie_link_width{{{H},{G3},state="max"}}', "values": "16x20"},
        # the idle clock event reason is normal
        {"series": f'gpuguard_gpu_clock_event_reason{{{H},{G3},reason="gpu_idle"}}',
         "values": "1x20"},
        *status("clocks.hw_slowdown", "0x20"),
        # one old fatal Xid, already in the kernel log when the daemon started (2 h ago)
        {"series": f'gpuguard_xid_events_total{{{H},xid="79",severity="critical",{G3}}}',
         "values": "1x20"},
        {"series": f'gpuguard_xid_last_seen_age_seconds{{{H},xid="79",'
                   f'severity="critical",{G3}}}', "values": "7200+15x20"},
        {"series": f'up{{{H}}}', "values": "1x20"},
        # a host clock an hour behind Prometheus's: the stamp is old, the age is not
        {"series": f'gpuguard_last_cycle_timestamp_seconds{{{H},cadence="fast"}}',
         "values": "-3600+15x20"},
        {"series": f'gpuguard_last_cycle_age_seconds{{{H},cadence="fast"}}',
         "values": "5x20"},
        {"series": f'gpuguard_config_last_reload_successful{{{H}}}', "values": "1x20"},
        {"series": f'gpuguard_results_stale{{{H}}}', "values": "0x20"},
        {"series": f'gpuguard_check_deadline_exceeded_total{{{H}}}', "values": "0x20"},
    ]
    names = ["GPUGuardRuleCritical", "GPUGuardRuleWarning", "GPUGuardFatalXid", "GPUGuardDown",
             "GPUGuardSilent", "GPUGuardAbsent", "GPUGuardConfigReloadFailed",
             "GPUGuardCheckDeadline"]
    run_promtool(tmp_path, [{"interval": "15s", "input_series": quiet, "alert_rule_test": [
        {"eval_time": "4m", "alertname": name, "exp_alerts": []} for name in names]}])


def test_daemon_and_supervisor_alerts_fire(tmp_path):
    run_promtool(tmp_path, [{
        "interval": "15s",
        "input_series": [
            # a new fatal Xid at t=45 s
            {"series": f'gpuguard_xid_last_seen_age_seconds{{{H},xid="79",'
                       f'severity="critical",{G3}}}', "values": "_ _ _ 0+15x3"},
            {"series": f'gpuguard_failover_active{{{H},service="llm"}}', "values": "0 1 1 1"},
            {"series": f'gpuguard_failover_in_progress{{{H},service="llm"}}',
             "values": "1x12"},
            {"series": f'up{{{H}}}', "values": "0x10"},
            {"series": f'gpuguard_last_cycle_age_seconds{{{H},cadence="fast"}}',
             "values": "0+15x10"},
            {"series": f'gpuguard_config_last_reload_successful{{{H}}}', "values": "1 0 0"},
            {"series": f'gpuguard_results_stale{{{H}}}', "values": "0 1 1"},
        ],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GPUGuardFatalXid",
             "exp_alerts": [fatal_xid_alert("GPU 3 (0000:3b:00.0)", "15s", G3_LABELS)]},
            {"eval_time": "30s", "alertname": "GPUGuardFailoverActive",
             "exp_alerts": [_simple("GPUGuardFailoverActive", "warning",
                                    {"service": "llm"})]},
            {"eval_time": "2m30s", "alertname": "GPUGuardFailoverInProgress",
             "exp_alerts": [_simple("GPUGuardFailoverInProgress", "warning",
                                    {"service": "llm"})]},
            {"eval_time": "1m30s", "alertname": "GPUGuardDown",
             "exp_alerts": [_simple("GPUGuardDown", "critical", {})]},
            {"eval_time": "2m", "alertname": "GPUGuardSilent",
             "exp_alerts": [_simple("GPUGuardSilent", "critical", {"cadence": "fast"})]},
            {"eval_time": "30s", "alertname": "GPUGuardConfigReloadFailed",
             "exp_alerts": [_simple("GPUGuardConfigReloadFailed", "warning", {})]},
            {"eval_time": "30s", "alertname": "GPUGuardCheckDeadline",
             "exp_alerts": [_simple("GPUGuardCheckDeadline", "critical", {})]},
        ]}, {
        "interval": "1m",
        "input_series": [],
        "alert_rule_test": [{"eval_time": "6m", "alertname": "GPUGuardAbsent",
                             "exp_alerts": [_simple("GPUGuardAbsent", "critical", {},
                                                    instance=None)]}]}])


G3_LABELS = {"gpu": "3", "uuid": "U3", "pci_bus_id": "0000:3b:00.0"}


def fatal_xid_alert(where, age, gpu_labels):
    return {"exp_labels": {"severity": "critical", "instance": "h1:9412", "job": "gpuguard",
                           **gpu_labels},
            "exp_annotations": {
                "summary": f"Fatal Xid on h1:9412 {where}",
                "description": f"The latest fatal Xid on it was {age} ago; xid.recent of this "
                               "GPU names the codes, most severe first, and what to do.",
                "runbook_url": runbook_url(alert_page("GPUGuardFatalXid"))}}


def test_one_fatal_xid_alert_per_gpu_whatever_codes_it_logged(tmp_path):
    """Issue 21: Xids 79 and 48 on GPU 3 are one alert, Xid 119 on GPU 5 another, and an
    Xid at an address NVML does not list a third; a warning Xid alerts nowhere."""
    g5 = 'gpu="5",uuid="U5",pci_bus_id="0000:86:00.0"'
    gone = 'gpu="",uuid="",pci_bus_id="0000:5e:00.0"'
    last = "gpuguard_xid_last_seen_age_seconds"
    run_promtool(tmp_path, [{
        "interval": "15s",
        "input_series": [
            {"series": f'{last}{{{H},xid="79",severity="critical",{G3}}}', "values": "0+15x8"},
            {"series": f'{last}{{{H},xid="48",severity="critical",{G3}}}', "values": "_ 0+15x7"},
            {"series": f'{last}{{{H},xid="119",severity="critical",{g5}}}', "values": "_ _ 0+15x6"},
            {"series": f'{last}{{{H},xid="79",severity="critical",{gone}}}', "values": "0+15x8"},
            {"series": f'{last}{{{H},xid="13",severity="warning",{g5}}}', "values": "0+15x8"},
        ],
        "alert_rule_test": [{"eval_time": "1m", "alertname": "GPUGuardFatalXid", "exp_alerts": [
            fatal_xid_alert("GPU 3 (0000:3b:00.0)", "45s", G3_LABELS),
            fatal_xid_alert("GPU 5 (0000:86:00.0)", "30s",
                            {"gpu": "5", "uuid": "U5", "pci_bus_id": "0000:86:00.0"}),
            # (Prometheus drops an empty label)
            fatal_xid_alert("0000:5e:00.0 (an address NVML does not list)", "1m 0s",
                            {"pci_bus_id": "0000:5e:00.0"}),
        ]}]}])


def _daemon_rules():
    return yaml.safe_load(ALERTS.read_text())["groups"][1]["rules"]


def _simple(name, severity, labels, instance="h1:9412"):
    """Expected labels and annotations of a daemon alert, its templates filled by hand."""
    rule = next(r for r in _daemon_rules() if r["alert"] == name)
    fill = {"{{ $labels.instance }}": instance or "", "{{ $labels.service }}": "llm"}
    annotations = {}
    for key, text in rule["annotations"].items():
        for k, v in fill.items():
            text = text.replace(k, v)
        annotations[key] = text
    base = {"severity": severity, **labels}
    if instance:
        base.update({"instance": instance, "job": "gpuguard"})
    return {"exp_labels": base, "exp_annotations": annotations}


def test_kubernetes_manifests_parse_and_carry_the_same_alerts():
    k8s = REPO / "packaging" / "kubernetes"
    rule = yaml.safe_load((k8s / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    daemonset = yaml.safe_load((k8s / "daemonset.yaml").read_text())
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    kinds = [d["kind"] for d in yaml.safe_load_all((k8s / "servicemonitor.yaml").read_text())]
    assert kinds == ["Service", "ServiceMonitor"]


# Texts that describe the healthy state: "no hardware slowdown", "not capped", "the GPU
# is not ...", "persistence mode is on", "... stay below the thresholds", "... answers".
HEALTHY_OPENINGS = re.compile(r"^(no|not|none|every|all)\b|^the (gpu|board) is not\b",
                              re.IGNORECASE)
HEALTHY_PHRASES = re.compile(r"\b(is on|stay below|stays below|stays low|stays clear|is not "
                             r"below|returns within|runs at its full|meets the|are the same "
                             r"driver|is on the|can be initialised)\b")


def describes_a_problem(text: str) -> bool:
    return not HEALTHY_OPENINGS.search(text) and not HEALTHY_PHRASES.search(text)


def test_every_rule_alert_says_what_is_wrong():
    """The alert fires on a failure: its summary and description must name the problem,
    never restate the healthy condition the rule checks (`summary:` in rules/)."""
    doc = yaml.safe_load(ALERTS.read_text())
    by_rule = {}
    for group in doc["groups"]:
        for alert in group["rules"]:
            if "gpuguard_rule" in alert["labels"]:
                by_rule.setdefault(alert["labels"]["gpuguard_rule"], []).append(alert)
    # The criterion rejects the texts these alerts carried before `problem:` existed.
    for healthy in ("no hardware slowdown, HW thermal slowdown or HW power brake",
                    "persistence mode is on (the driver keeps the GPU initialised)",
                    "the GPU is not capped at its power limit (TDP throttling)",
                    "the enforced power limit is not below the board's default"):
        assert not describes_a_problem(healthy), healthy
    rules = load_ruleset().ordered()
    assert {r.id for r in rules} - {"xid.recent"} == set(by_rule)
    for rule in rules:
        for alert in by_rule.get(rule.id, []):
            for key in ("summary", "description"):
                text = alert["annotations"][key]
                tail = text.split("}}: ", 1)[-1] if key == "summary" else text
                assert describes_a_problem(tail), (rule.id, key, text)
                assert rule.summary.lower() not in text.lower(), (rule.id, key, text)
                problem = getattr(rule, "problem", None)
                assert problem and describes_a_problem(problem), (rule.id, problem)
                assert problem.lower() in text.lower(), (rule.id, key, text)
