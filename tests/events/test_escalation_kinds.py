"""A setting is not a fault (issue 20, item 6): only a hardware finding that comes back
after a reboot escalates to inspect_hardware. Each rule says what kind of finding it
gives (`kind:` in rules/*.yaml)."""

from __future__ import annotations

import time

from gpuguard.events import store as eventstore
from gpuguard.events.escalation import apply_history
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from tests.events.conftest import BOOT_A, BOOT_B, procfs, result


def test_a_setting_against_the_profile_does_not_escalate_after_a_reboot(tmp_path, run):
    """MIG enabled against the profile in boot A and again in boot B: mig.mode keeps its
    own action; recovery.action, a hardware finding, in the same runs escalates."""
    state = tmp_path / "state"
    profile = tmp_path / "profile.yaml"
    profile.write_text("mig: enabled\n")
    only = ("mig.mode", "recovery.action")

    def both(boot: str) -> tuple[dict, dict]:
        doc = run(state, procfs(tmp_path, boot), "--profile", str(profile), only=only)
        return result(doc, "mig.mode", 0), result(doc, "recovery.action", 0)

    mig, recovery = both(BOOT_A)
    assert (mig["status"], mig["action"]) == ("critical", "reset_gpu")
    assert recovery["action"] == "reset_gpu"
    mig, recovery = both(BOOT_B)
    assert mig["status"] == "critical"
    assert mig["action"] == "reset_gpu", mig["action_reason"]
    assert recovery["action"] == "inspect_hardware"
    assert "came back after a reboot" in recovery["action_reason"]


def test_every_shipped_rule_says_what_kind_of_finding_it_gives(default_rules):
    from typing import get_args

    from gpuguard.config.shapes import FindingKind
    from gpuguard.model.rule import KINDS

    assert get_args(FindingKind) == KINDS  # the file's words are the model's
    kinds = {rule.id: rule.kind for rule in default_rules.ordered()}
    assert not [rule for rule, kind in kinds.items() if kind is None]
    assert set(kinds.values()) <= set(KINDS)
    for setting in ("mig.mode", "persistence.mode", "persistence.daemon",
                    "clocks.applications", "power.limit", "ecc.mode"):
        assert kinds[setting] == "setting", setting
    for software in ("driver.version", "toolkit.parity", "service.inference"):
        assert kinds[software] == "software", software
    for hardware in ("ecc.uncorrected", "memory.row_remap", "recovery.action", "xid.recent",
                     "pcie.link_width", "nvlink.state", "gpu.lost", "memory.pattern"):
        assert kinds[hardware] == "hardware", hardware


def test_only_hardware_findings_escalate_across_boots(tmp_path, default_rules):
    """Every shipped GPU rule, critical on one board in boot A and again in boot B."""
    path = tmp_path / "events.db"
    board = GpuId(0, "GPU-aaaa", "00000000:01:00.0", "S123")
    rules = [r for r in default_rules.ordered() if r.scope == "gpu"]
    writer = EventWriter(path, BOOT_A)
    writer.record_all(Event(kind="rule", source="daemon", time=time.time() - 60, rule=r.id,
                            status="critical", gpu_index=0, gpu_uuid=board.uuid,
                            gpu_serial=board.serial) for r in rules)
    writer.flush()
    writer.close()
    now = [Result(r.id, Status.CRITICAL, Status.CRITICAL, "bad", board, action="reset_gpu")
           for r in rules]
    conn = eventstore.open_reader(path)
    try:
        applied = apply_history(now, conn, BOOT_B, default_rules, {0: board})
    finally:
        conn.close()
    escalated = {r.rule for r in applied if r.action == "inspect_hardware"}
    hardware = {r.id for r in rules if r.kind == "hardware"}
    assert escalated == hardware
    assert "mig.mode" not in escalated and "ecc.uncorrected" in escalated


def test_a_user_rule_says_its_kind_and_a_wrong_one_is_refused(tmp_path):
    from gpuguard.config.ruleset import load_ruleset
    from gpuguard.config.yamlfile import ConfigError

    rules = tmp_path / "rules.d"
    rules.mkdir()
    site = ("rules:\n  - id: site.gpu0\n    scope: gpu\n    severity: critical\n"
            "    summary: s\n    message: m\n    when: 'index == 0'\n")
    (rules / "site.yaml").write_text(site)
    assert load_ruleset([rules]).rules["site.gpu0"].kind is None  # unsaid: no escalation
    (rules / "site.yaml").write_text(site + "    kind: hardware\n")
    assert load_ruleset([rules]).rules["site.gpu0"].kind == "hardware"
    (rules / "site.yaml").write_text(site + "    kind: hardwear\n")
    try:
        load_ruleset([rules])
    except ConfigError as exc:
        assert "site.yaml:8" in str(exc) and "kind" in str(exc)
    else:
        raise AssertionError("a misspelled kind was taken")
