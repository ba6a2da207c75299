"""The alerts of the service.* rules (generated like every rule's, scripts/gen_alerts.py),
tested with promtool: host-level series (no GPU labels), as the daemon exports them."""

from gpuguard.config.ruleset import load_ruleset
from gpuguard.outputs.runbooks import rule_page, runbook_url
from tests.prometheus.test_alerts import H, run_promtool


def _series(rule, values, failed, severity):
    return [{"series": f'gpuguard_rule_status{{{H},rule="{rule}",severity="{severity}"}}',
             "values": values},
            {"series": f'gpuguard_rule_failed_cycles{{{H},rule="{rule}"}}', "values": failed}]


def _alert(rule_id, severity):
    rule = load_ruleset().rules[rule_id]
    return {"exp_labels": {"severity": severity, "gpuguard_rule": rule_id,
                           "instance": "h1:9412", "job": "gpuguard", "rule": rule_id},
            "exp_annotations": {
                "summary": f"{rule_id} {severity} on h1:9412 host: {rule.problem}",
                "description": f"{rule.problem[0].upper()}{rule.problem[1:]} ({rule_id}, "
                               f"{severity} for 3 cycles or more).",
                "runbook_url": runbook_url(rule_page(rule_id))}}


def test_failed_inference_and_a_leak_fire_on_the_host(tmp_path):
    run_promtool(tmp_path, [{
        "interval": "15s",
        "input_series": [
            *_series("service.inference", "0 2 2 2 2", "0 1 2 3 4", "critical"),
            *_series("service.memory_growth", "1x8", "1+1x8", "warning"),
            *_series("service.gpu_memory", "0x8", "0x8", "warning"),
        ],
        "alert_rule_test": [
            {"eval_time": "30s", "alertname": "GPUGuardRuleCritical", "exp_alerts": []},
            {"eval_time": "45s", "alertname": "GPUGuardRuleCritical",
             "exp_alerts": [_alert("service.inference", "critical")]},
            {"eval_time": "1m", "alertname": "GPUGuardRuleWarning",
             "exp_alerts": [_alert("service.memory_growth", "warning")]},
        ]}])


def test_a_stuck_engine_and_a_sustained_capacity_fire_saturated_does_not(tmp_path):
    """issue 23: service.engine critical (stuck) and the opt-in service.engine_full
    warning fire after 3 cycles; an engine saturated or at capacity keeps service.engine
    ok (0), so nothing fires for it."""
    run_promtool(tmp_path, [{
        "interval": "15s",
        "input_series": [
            *_series("service.engine", "0 2 2 2 2", "0 1 2 3 4", "critical"),
            *_series("service.engine_full", "1x8", "1+1x8", "warning"),
            {"series": 'gpuguard_service_engine_state{instance="h1:9412",job="gpuguard",'
                       'service="llm"}', "values": "1x8"},
        ],
        "alert_rule_test": [
            {"eval_time": "30s", "alertname": "GPUGuardRuleCritical", "exp_alerts": []},
            {"eval_time": "45s", "alertname": "GPUGuardRuleCritical",
             "exp_alerts": [_alert("service.engine", "critical")]},
            {"eval_time": "1m", "alertname": "GPUGuardRuleWarning",
             "exp_alerts": [_alert("service.engine_full", "warning")]},
        ]}])
