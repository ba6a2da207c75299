"""What `gpuguard slurm health` decides (gpuguard/integrations/slurm*.py), on nodes as sinfo
prints them: the cases the real cluster's tests (tests/slurm/) do not reach one by one."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuguard.integrations import slurm, slurm_brake, slurm_ctl
from gpuguard.integrations.slurm_ctl import SEP, NodeInfo


def result(rule: str, status: str, action: str = "none", gpu: int | None = 0,
           message: str = "x") -> dict[str, Any]:
    return {"rule": rule, "status": status, "action": action, "message": message,
            "gpu": None if gpu is None else {"index": gpu}}


def node(state: str = "idle", reason: str = "", when: float | None = None) -> NodeInfo:
    return NodeInfo("n1", state, reason, when, ["main"])


HOT = result("thermal.margin", "critical", "inspect_hardware")


def test_only_critical_hardware_or_failover_findings_drain() -> None:
    assert slurm.plan([HOT], set(), node(), None).do == "drain"
    for harmless in (result("thermal.margin", "warning", "none"),
                     result("thermal.margin", "unknown"),
                     result("persistence.mode", "critical", "none"),
                     result("fleet.brake", "critical", "inspect_hardware", gpu=None)):
        assert slurm.plan([harmless], set(), node(), None).do == "none", harmless
    tagged = result("gpu.lost", "critical", "none")
    assert slurm.plan([tagged], {"gpu.lost"}, node(), None).reason == \
        "gpuguard: failover: gpu.lost GPU 0"


def test_the_reason_names_the_worst_action_and_fits_80_characters() -> None:
    many = [result("xid.recent", "critical", "reset_gpu", gpu=None),
            result("pcie.link_width", "critical", "inspect_hardware", gpu=7),
            result("ecc.uncorrected", "critical", "reset_gpu", gpu=2)]
    reason = slurm.reason_for(slurm.drain_worthy(many, set()))
    assert reason == "gpuguard: inspect_hardware: pcie.link_width GPU 7 (+2 more)"
    long = [result("x" * 120, "critical", "reboot")]
    assert len(slurm.reason_for(long)) == 80
    assert slurm.named_in("gpuguard: reboot: xid.recent GPU 3 (+1 more)") == ("xid.recent", 3)
    assert slurm.named_in("gpuguard: reboot: xid.recent") == ("xid.recent", None)


def test_a_drain_gpuguard_did_not_write_is_left_alone_whatever_it_sees() -> None:
    for reason in ("admin: cable swap", "NHC: check_gpu failed", "gpuguard-ish", ""):
        for results in ([HOT], [result("thermal.margin", "ok")]):
            assert slurm.plan(results, set(), node("drained", reason), None).do == "none"
    # Slurm's own prolog drain is gpuguard's only after gpuguard recorded a failure
    # before it; an older failure record does not claim a newer drain
    now = time.time()
    prolog = node("drained", "Prolog error", now)
    assert slurm.plan([], set(), prolog, None).do == "none"
    assert slurm.plan([], set(), prolog, now + 3600).do == "none"
    taken = slurm.plan([], set(), prolog, now - 2, "gpuguard: inspect_hardware: gpu.compute GPU 1")
    assert (taken.do, taken.reason) == ("update", "gpuguard: inspect_hardware: gpu.compute GPU 1")


def test_resume_needs_the_named_rule_ok_not_unknown_or_missing() -> None:
    ours = node("drained", "gpuguard: inspect_hardware: thermal.margin GPU 0")
    assert slurm.plan([result("thermal.margin", "ok")], set(), ours, None).do == "resume"
    for results in ([result("thermal.margin", "unknown")], [result("thermal.margin", "skipped")],
                    [], [result("thermal.margin", "ok", gpu=1)]):
        assert slurm.plan(results, set(), ours, None).do == "keep", results
    assert slurm.plan([HOT], set(), ours, None).do == "keep"
    other = result("ecc.uncorrected", "critical", "reset_gpu", gpu=1)
    changed = slurm.plan([other], set(), ours, None)
    assert (changed.do, changed.reason) == ("update", "gpuguard: reset_gpu: ecc.uncorrected GPU 1")
    draining = node("draining", "gpuguard: inspect_hardware: thermal.margin GPU 0")
    assert slurm.plan([result("thermal.margin", "ok")], set(), draining, None).do == "resume"


def nodes(n: int, drained: dict[str, tuple[str, float]]) -> dict[str, NodeInfo]:
    out = {}
    for i in range(n):
        name = f"n{i}"
        reason, when = drained.get(name, ("", 0.0))
        out[name] = NodeInfo(name, "drained" if reason else "idle", reason,
                             when if reason else None, ["main"])
    return out


@pytest.mark.parametrize(("total", "ours", "holds"), [
    (10, 0, False), (10, 1, True), (20, 2, False), (20, 3, True), (5, 0, False), (5, 1, True),
    (100, 18, False), (100, 19, True)])
def test_the_brake_counts_this_drain_too(total: int, ours: int, holds: bool) -> None:
    now = time.time()
    drained = {f"n{i + 1}": ("gpuguard: reset_gpu: xid.recent GPU 0", now - 30)
               for i in range(ours)}
    found = slurm_brake.count(nodes(total, drained), "n0", now, 600)
    assert slurm_brake.holds(found, slurm_brake.BrakeSettings()) is holds


def test_the_brake_counts_only_gpuguards_recent_drains() -> None:
    now = time.time()
    drained = {"n1": ("admin: cable swap", now), "n2": ("gpuguard: reboot: gpu.lost", now - 700),
               "n3": ("gpuguard: reboot: gpu.lost", now - 10)}
    found = slurm_brake.count(nodes(10, drained), "n0", now, 600)
    assert found.drained_by_us == ["n3"]
    assert 0 <= slurm_brake.jitter_s(slurm_brake.BrakeSettings(), 300) <= 30
    assert slurm_brake.jitter_s(slurm_brake.BrakeSettings(jitter_share=0), 300) == 0


def test_sinfo_lines_parse_and_odd_ones_are_not_trusted() -> None:
    text = SEP.join(("n1", "drained", "2026-12-01T17:37:35", "main*", "gpuguard: a: b|c")) + \
        "\n" + SEP.join(("n1", "drained", "2026-12-01T17:37:35", "gpu", "gpuguard: a: b|c")) + \
        "\n" + SEP.join(("n2", "idle", "Unknown", "main*", "none")) + "\n"
    parsed = slurm_ctl.parse_nodes(text)
    assert parsed["n1"].partitions == ["main", "gpu"] and parsed["n1"].drained
    assert parsed["n1"].reason == "gpuguard: a: b|c" and parsed["n1"].reason_time
    assert parsed["n2"].reason == "" and parsed["n2"].reason_time is None
    with pytest.raises(slurm_ctl.SlurmUnavailable):
        slurm_ctl.parse_nodes("n1 idle none\n")


def test_a_missing_tool_is_unavailable_not_a_crash(tmp_path: Any) -> None:
    settings = slurm_ctl.SlurmSettings(bin_dir=tmp_path, timeout_s=1)
    with pytest.raises(slurm_ctl.SlurmUnavailable, match="sinfo not found"):
        slurm_ctl.node(settings, "n1")
