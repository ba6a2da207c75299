"""The suggested action (gpuguard/judge/actions.py): one per failing result, from the rule's
`action:`, the Xid catalog, the driver's recovery field, else the family default."""

import json

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.config.yamlfile import ConfigError
from gpuguard.judge import actions
from gpuguard.judge.actions import Action
from gpuguard.model.results import Result, Status
from tests.checks.test_xid import host
from tests.conftest import FIXTURES, gpuguard, set_gpu


def test_actions_are_ordered_by_severity_and_match_the_rule_file_words():
    from typing import get_args

    from gpuguard.config.shapes import RuleAction

    assert list(get_args(RuleAction)) == [a.value for a in Action]
    assert actions.worst([Action.REBOOT, Action.RESTART_APP]) is Action.REBOOT
    assert actions.worst([]) is Action.NONE


def test_an_ok_result_suggests_none(h200, run_rule):
    [result] = run_rule("recovery.action", h200)
    assert result.status is Status.OK
    assert (result.action, result.action_reason) == ("none", None)


@pytest.mark.parametrize(("field", "action"), [("gpu_reset", "reset_gpu"),
                                               ("node_reboot", "reboot"),
                                               ("drain_p2p", "restart_app")])
def test_the_driver_recovery_field_names_the_action(h200, run_rule, field, action):
    set_gpu(h200, recovery_action=field)
    [result] = run_rule("recovery.action", h200)
    assert result.action == action
    assert field in (result.action_reason or "")


def test_xids_take_the_catalog_action_per_gpu(h200, run_rule):
    results = run_rule("xid.recent", host(h200))
    by_gpu = {r.gpu.index: r for r in results}
    # 119 GSP timeout: reset; 154 "to 0x1 (GPU Reset Required)": reset (the unknown 999
    # beside it asks for an inspection, which a reset outranks only by severity: the 154
    # is critical); 13: restart the app
    assert {i: r.action for i, r in by_gpu.items()} == \
        {0: "reset_gpu", 1: "inspect_hardware", 2: "restart_app"}
    assert by_gpu[0].action_reason == "Xid 119 in the catalog"
    assert by_gpu[1].action_reason == ("Xid 999 is not in the Xid catalog gpuguard ships "
                                       "(NVIDIA's Xid catalog of 2025-10-29)")
    assert {e["xid"]: e["suggested"] for e in by_gpu[1].observed["events"]} == \
        {154: "reset_gpu", 94: "restart_app", 999: "inspect_hardware"}
    assert actions.per_gpu(results) == {"0": Action.RESET_GPU, "1": Action.INSPECT_HARDWARE,
                                        "2": Action.RESTART_APP}


def test_xid_154_follows_its_text(default_rules):
    catalog = default_rules.xid_catalog
    text = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert actions.of_xid(154, text, catalog) is Action.REBOOT
    assert actions.of_xid(79, None, catalog) is Action.REBOOT
    assert actions.of_xid(48, None, catalog) is Action.RESET_GPU
    assert actions.of_xid(78, None, catalog) is Action.UPDATE_SOFTWARE
    assert actions.of_xid(64, None, catalog) is Action.INSPECT_HARDWARE
    assert actions.of_xid(500, None, catalog) is Action.INSPECT_HARDWARE  # not in it
    assert actions.of_xid(154, None, catalog) is Action.RESET_GPU  # an NVML event: no text
    assert actions.of_xid(154, text.replace("to 0x2", "from"), catalog) is Action.RESET_GPU


def test_the_rule_file_action_wins_over_the_family_default(h200, run_rule):
    # memory.orphaned says restart_app in rules/memory.yaml; the family default (memory:
    # reset) would be wrong for memory held by a dead process
    rules = load_ruleset()
    assert rules.rules["memory.orphaned"].action == "restart_app"
    assert rules.rules["memory.orphaned"].action_origin.endswith("memory.yaml:" + str(
        rules.rules["memory.orphaned"].action_origin.rsplit(":", 1)[1]))
    rule = rules.rules["memory.orphaned"]
    action, why = actions.suggest(rule, Status.WARNING, {}, rules)
    assert action is Action.RESTART_APP and "memory.yaml" in (why or "")
    rule.action = None
    assert actions.suggest(rule, Status.WARNING, {}, rules)[0] is Action.NONE
    assert actions.suggest(rules.rules["ecc.uncorrected"], Status.CRITICAL, {}, rules)[0] \
        is Action.RESET_GPU


def test_per_gpu_gives_one_value_per_gpu(h200, run_rule):
    results = run_rule("recovery.action", h200)
    assert actions.per_gpu(results) == {"0": Action.NONE}
    failing = Result("x.y", Status.CRITICAL, Status.CRITICAL, "m", results[0].gpu,
                     action="inspect_hardware")
    assert actions.per_gpu([*results, failing]) == {"0": Action.INSPECT_HARDWARE}


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("overrides:\n  pcie.replays:\n    action: rebot\n", 3,
     "overrides['pcie.replays']: action must be one of"),
    ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
     "    message: m\n    when: 'index == 9'\n    auto_clear: 0h\n", 8, "site.x: auto_clear"),
    ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
     "    message: m\n    when: 'index == 9'\n    auto_clear: soon\n", 8,
     "rules[0]: auto_clear must be a span"),
    ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
     "    message: m\n    when: 'index == 9'\n    escalate: {count: 1, window: 24h}\n", 8,
     "rules[0].escalate: count must be"),
])
def test_a_bad_action_or_window_is_file_line(tmp_path, text, line, problem):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_ruleset([tmp_path])
    assert caught.value.line == line, str(caught.value)
    assert caught.value.problem.startswith(problem), str(caught.value)


def test_json_and_table_carry_the_action(tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    # a site rule that fires on the recorded H200: its action comes from its own key
    (rules / "site.yaml").write_text(
        "rules:\n  - id: site.always\n    scope: gpu\n    severity: critical\n"
        "    summary: s\n    message: fired on $index\n    when: 'index == 0'\n"
        "    action: reboot\n")
    snap = str(FIXTURES / "h200-live" / "idle-snapshot.json")
    out = gpuguard("check", "--input", snap, "--rules", str(rules), "--format", "json")
    doc = json.loads(out.stdout)
    by_rule = {r["rule"]: r for r in doc["results"]}
    assert by_rule["site.always"]["action"] == "reboot"
    assert "site.yaml:8" in by_rule["site.always"]["action_reason"]
    assert by_rule["thermal.margin"]["action"] == "none"
    table = gpuguard("check", "--input", snap, "--rules", str(rules)).stdout
    assert "do:  reboot (the rule's action: key, site.yaml:8)" in table
    # docs/check.md's sample is what the recorded snapshot prints (no failing row: no action)
    readme = (FIXTURES.parent.parent / "docs" / "check.md").read_text()
    plain = gpuguard("check", "--input", snap).stdout
    assert plain.strip() in readme


def test_rules_explain_says_what_to_do():
    out = gpuguard("rules", "explain", "memory.orphaned")
    assert "action:      critical restart_app (the rule's action: key, memory.yaml:" in out.stdout
    out = gpuguard("rules", "explain", "recovery.action")
    assert "action:      the driver's recovery action field, else critical reset_gpu" \
        in out.stdout


# Critical rules whose action is deliberately `none` (their `action:` key says so and why)
# devices.uvm (issue 21): loading a module is configuration, not a repair of the GPU
CRITICAL_AND_NONE = {"driver.version", "host.disk", "image.cuda", "devices.uvm"}


def test_every_shipped_rule_has_a_deliberate_action():
    """No shipped rule reaches the generic fallback (a user's `when:` rule's: reboot for a
    host rule), and a critical one suggests something to do unless its key says `none`:
    the exec backend passes the action on (GPUGUARD_ACTION), the Slurm example drains on it."""
    rules = load_ruleset()
    fallback, critical_none = [], set()
    for rule in rules.rules.values():
        if rule.action is None and rule.id.split(".", 1)[0] not in actions.FAMILY_DEFAULT \
                and rule.id not in actions.FINDING_DECIDES:
            fallback.append(rule.id)
        if rule.severity == "critical":
            action, why = actions.suggest(rule, Status.CRITICAL, {}, rules)
            if action is Action.NONE:
                assert rule.action == "none", f"{rule.id}: none by default ({why})"
                critical_none.add(rule.id)
    assert fallback == []
    assert critical_none == CRITICAL_AND_NONE


@pytest.mark.parametrize("rule_id", ["gpu.compute", "memory.pattern"])
def test_a_probe_that_reads_back_wrong_data_is_hardware(rule_id):
    """A kernel or memory pattern that reads back wrong is silent data corruption: no reset
    makes that board trustworthy again. A CUDA error on the way (the kernel never ran) is
    reset like a wedged GPU."""
    rules = load_ruleset()
    rule = rules.rules[rule_id]
    action, why = actions.suggest(rule, Status.CRITICAL, {"mismatches": 3}, rules)
    assert action is Action.INSPECT_HARDWARE and "wrong" in (why or "")
    assert actions.suggest(rule, Status.CRITICAL, {"error": "CUDA error 999"}, rules)[0] \
        is Action.RESET_GPU
    assert actions.suggest(rule, Status.CRITICAL, {"mismatches": 0, "error": "x"}, rules)[0] \
        is Action.RESET_GPU
