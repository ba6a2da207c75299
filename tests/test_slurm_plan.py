"""What `gpuguard slurm health` decides (gpuguard/integrations/slurm/), on nodes as scontrol
prints them: the cases the real cluster's tests (tests/slurm/) do not reach one by one."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from gpuguard.integrations.slurm import brake as slurm_brake
from gpuguard.integrations.slurm import ctl as slurm_ctl
from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm.clock import Clock
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.integrations.slurm.gate import Step, Verb

if TYPE_CHECKING:
    from gpuguard.integrations.slurm.resume import DrainRecord


def board(i: int, bus: int | None = None) -> dict[str, Any]:
    """GPU i as results name it: its UUID and bus id are the board's (`bus`: where it sits,
    when the index moved)."""
    bus = i if bus is None else bus
    return {"index": i, "uuid": f"GPU-00000000-0000-0000-0000-{bus:012d}",
            "pci_bus_id": f"00000000:{0x18 + bus * 0x10:02X}:00.0"}


def result(rule: str, status: str, action: str = "none", gpu: int | None = 0,
           message: str = "x", bus: int | None = None) -> dict[str, Any]:
    return {"rule": rule, "status": status, "action": action, "message": message,
            "gpu": None if gpu is None else board(gpu, bus)}


def drained_for(findings: list[dict[str, Any]], gpus: int = 8) -> DrainRecord:
    """health's record of a drain for these findings on a host of `gpus` GPUs."""
    from gpuguard.integrations.slurm import resume as slurm_resume

    every = [result("thermal.margin", "ok", gpu=i) for i in range(gpus)]
    return slurm_resume.record_of(slurm.reason_for(findings), findings, every + findings, None)


def node(state: str = "IDLE", reason: str = "", when: float | None = None) -> NodeInfo:
    return NodeInfo("n1", state, reason, when, ["main"])


HOT = result("thermal.margin", "critical", "inspect_hardware")
# the return-to-service gate passed (tests/test_slurm_gate.py decides it): these tests
# are of the passive resume check, which a gated drain needs first
PASSED = Step(Verb.RESUME, "every GPU passed a standard qualification (the test's)")


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
    long = [result("site." + "x" * 120, "critical", "reboot")]
    assert len(slurm.reason_for(long)) == 80
    assert slurm.named_in("gpuguard: reboot: xid.recent GPU 3 (+1 more)") == ("xid.recent", 3)
    assert slurm.named_in("gpuguard: reboot: xid.recent") == ("xid.recent", None)


def test_a_drain_gpuguard_did_not_write_is_left_alone_whatever_it_sees() -> None:
    for reason in ("admin: cable swap", "NHC: check_gpu failed", "gpuguard-ish", ""):
        for results in ([HOT], [result("thermal.margin", "ok")]):
            assert slurm.plan(results, set(), node("IDLE+DRAIN", reason), None).do == "none"
    # Slurm's own prolog drain is gpuguard's only when set close after a failure
    # gpuguard recorded: not before it, not a day later, not without a time
    now = time.time()
    prolog = node("IDLE+DRAIN", "Prolog error", now)
    assert slurm.plan([], set(), prolog, None).do == "none"
    assert slurm.plan([], set(), prolog, now + 3600).do == "none"
    taken = slurm.plan([], set(), prolog, now - 2, "gpuguard: inspect_hardware: gpu.compute GPU 1")
    assert (taken.do, taken.reason) == ("update", "gpuguard: inspect_hardware: gpu.compute GPU 1")


def test_a_script_drain_is_gpuguards_only_close_after_its_recorded_failure() -> None:
    now = time.time()
    findings = "gpuguard: reset_gpu: xid.recent GPU 0"
    for when, failed in ((None, now - 2), (now, now - 86400), (now, now - 400), (now - 90, now)):
        other = node("IDLE+DRAIN", "Epilog error", when)
        assert slurm.plan([], set(), other, failed, findings).do == "none", (when, failed)
    for when, failed in ((now, now - 2), (now, now - 250), (now - 30, now)):
        mine = node("IDLE+DRAIN", "Epilog error", when)
        assert slurm.plan([], set(), mine, failed, findings).do == "update", (when, failed)


def test_resume_needs_the_named_rule_ok_not_unknown_or_missing() -> None:
    ours = node("IDLE+DRAIN", "gpuguard: inspect_hardware: thermal.margin GPU 0")
    record = drained_for([HOT], gpus=2)
    both_ok = [result("thermal.margin", "ok", gpu=i) for i in (0, 1)]
    assert slurm.plan(both_ok, set(), ours, None, record=record, gate=PASSED).do == "resume"
    for results in ([result("thermal.margin", "unknown"), both_ok[1]],
                    [result("thermal.margin", "skipped"), both_ok[1]],
                    [], [both_ok[1]]):
        assert slurm.plan(results, set(), ours, None, record=record,
                          gate=PASSED).do == "keep", results
    assert slurm.plan([HOT, both_ok[1]], set(), ours, None, record=record,
                      gate=PASSED).do == "keep"
    other = result("ecc.uncorrected", "critical", "reset_gpu", gpu=1)
    changed = slurm.plan([other], set(), ours, None, record=record, gate=PASSED)
    assert (changed.do, changed.reason) == ("update", "gpuguard: reset_gpu: ecc.uncorrected GPU 1")
    draining = node("MIXED+DRAIN", "gpuguard: inspect_hardware: thermal.margin GPU 0")
    assert slurm.plan(both_ok, set(), draining, None, record=record, gate=PASSED).do == "resume"
    # without the record of what it drained for (a lost state dir) it cannot tell
    assert slurm.plan(both_ok, set(), ours, None).do == "keep"


def test_resume_judges_the_whole_verdict_not_the_first_finding_named() -> None:
    """Drained for memory.row_remap on GPUs 0 and 3 ("GPU 0 (+1 more)"): GPU 0 reads fine
    but GPU 3 cannot be read. Unknown anywhere on a drain-capable rule is no evidence."""
    bad = [result("memory.row_remap", "critical", "inspect_hardware", gpu=g) for g in (0, 3)]
    record = drained_for(bad)
    ours = node("IDLE+DRAIN", slurm.reason_for(slurm.drain_worthy(bad, set())))
    assert ours.reason == "gpuguard: inspect_hardware: memory.row_remap GPU 0 (+1 more)"
    healthy = [result("memory.row_remap", "ok", gpu=g) for g in range(8)]
    assert slurm.plan(healthy, set(), ours, None, record=record, gate=PASSED).do == "resume"
    gpu3_unknown = [*healthy[:3], result("memory.row_remap", "unknown", gpu=3), *healthy[4:]]
    kept = slurm.plan(gpu3_unknown, set(), ours, None, record=record, gate=PASSED)
    assert kept.do == "keep" and "unknown" in kept.why
    assert slurm.plan([*healthy[:3], *healthy[4:]], set(), ours, None, record=record,
                      gate=PASSED).do == "keep"
    # another drain-capable rule unknown (ecc.*: reset_gpu), or missing on one GPU
    for extra in ([result("ecc.uncorrected", "unknown", gpu=5)],
                  [result("ecc.uncorrected", "ok", gpu=g) for g in range(7)],
                  [result("site.tray_check", "unknown", gpu=None)],
                  [result("gpu.lost", "unknown", gpu=2)]):
        assert slurm.plan(healthy + extra, set(), ours, None, record=record,
                          gate=PASSED).do == "keep", extra
    # a rule that never drains (persistence.*: no action) may be unknown; a failover
    # rule may not
    calm = [*healthy, result("persistence.mode", "unknown", gpu=1)]
    assert slurm.plan(calm, set(), ours, None, record=record, gate=PASSED).do == "resume"
    tagged = [*healthy, result("persistence.mode", "unknown", gpu=1)]
    assert slurm.plan(tagged, {"persistence.mode"}, ours, None, record=record,
                      gate=PASSED).do == "keep"


def test_resume_follows_the_board_not_the_nvml_index() -> None:
    """Drained for GPU 3 (bus 0x48); GPU 3 fell off the bus and NVML renumbered: index 3 is
    now the healthy board of bus 0x58. A cold check sees seven healthy GPUs."""
    record = drained_for([result("memory.row_remap", "critical", "inspect_hardware", gpu=3)])
    ours = node("IDLE+DRAIN", "gpuguard: inspect_hardware: memory.row_remap GPU 3")
    seven = [result(rule, "ok", gpu=i, bus=i if i < 3 else i + 1)
             for i in range(7) for rule in ("memory.row_remap", "thermal.margin")]
    kept = slurm.plan(seven, set(), ours, None, record=record, gate=PASSED)
    assert kept.do == "keep" and "00000000:48:00.0" in kept.why and "missing" in kept.why
    # the board back (reseated) and ok: resumed
    eight = seven + [result(r, "ok", gpu=7, bus=3) for r in ("memory.row_remap", "thermal.margin")]
    assert slurm.plan(eight, set(), ours, None, record=record, gate=PASSED).do == "resume"
    # a rewritten reason keeps every GPU present at the first drain
    from gpuguard.integrations.slurm import resume as slurm_resume

    again = slurm_resume.record_of("r", [], seven, record)
    assert slurm.plan(seven, set(), ours, None, record=again, gate=PASSED).do == "keep"


def test_a_cut_reason_never_names_another_gpu() -> None:
    rule = "site.nvlink_replay_counter_growth_on_tray_xyzw"
    finding = [result(rule, "critical", "inspect_hardware", gpu=12)]
    reason = slurm.reason_for(finding)
    assert len(reason) <= 80 and reason.endswith(" GPU 12"), reason
    named = slurm.named_in(reason)
    assert named is not None and named[1] == 12 and named[0].endswith("~")
    assert rule.startswith(named[0][:-1]) and len(reason) == 80
    more = slurm.reason_for(finding + [result(rule, "critical", "inspect_hardware", gpu=1)] * 11)
    assert len(more) <= 80 and more.endswith(" GPU 12 (+11 more)") and "~" in more
    named_more = slurm.named_in(more)
    assert named_more is not None and named_more[1] == 12 and named_more[0].endswith("~")
    # and a cut reason does not resume on another GPU's ok (the whole verdict is judged)
    later = [result(rule, "ok", gpu=1), result(rule, "unknown", gpu=12)]
    record = drained_for(finding, gpus=13)
    assert slurm.plan(later, set(), node("IDLE+DRAIN", reason), None, record=record,
                      gate=PASSED).do == "keep"


def test_only_gpuguards_exact_reason_is_gpuguards() -> None:
    ok = [result("memory.row_remap", "ok", gpu=g) for g in range(8)]
    for reason in ("gpuguard: inspect_hardware: memory.row_remap GPU 3 RMA-4711 keep out",
                   " gpuguard: inspect_hardware: memory.row_remap GPU 3",
                   "gpuguard: inspect_hardware: memory.row_remap GPU 3 (+1 more) hold",
                   "gpuguard: keep_out: memory.row_remap GPU 3",
                   "gpuguard: inspect_hardware: memory.row_remap GPU 3x",
                   "gpuguard: inspect_hardware: Memory.row_remap GPU 3"):
        assert slurm.named_in(reason) is None, reason
        assert slurm.plan(ok, set(), node("IDLE+DRAIN", reason), None).do == "none", reason
    assert slurm.named_in("gpuguard: inspect_hardware: memory.row_remap GPU 3") == \
        ("memory.row_remap", 3)
    assert slurm.named_in("gpuguard: failover: gpu.lost") == ("gpu.lost", None)


IN_STEP = Clock(0.0, "the test: this node's clock is slurmctld's")


def nodes(n: int, drained: dict[str, tuple[str, float]]) -> dict[str, NodeInfo]:
    out = {}
    for i in range(n):
        name = f"n{i}"
        reason, when = drained.get(name, ("", 0.0))
        out[name] = NodeInfo(name, "IDLE+DRAIN" if reason else "IDLE", reason,
                             when if reason else None, ["main"])
    return out


@pytest.mark.parametrize(("total", "ours", "holds"), [
    (10, 0, False), (10, 1, True), (20, 2, False), (20, 3, True), (5, 0, False), (5, 1, True),
    (100, 18, False), (100, 19, True)])
def test_the_brake_counts_this_drain_too(total: int, ours: int, holds: bool) -> None:
    now = time.time()
    drained = {f"n{i + 1}": ("gpuguard: reset_gpu: xid.recent GPU 0", now - 30)
               for i in range(ours)}
    found = slurm_brake.count(nodes(total, drained), "n0", IN_STEP, 600)
    assert slurm_brake.holds(found, slurm_brake.BrakeSettings()) is holds


def test_the_brake_counts_only_gpuguards_recent_drains() -> None:
    now = time.time()
    drained = {"n1": ("admin: cable swap", now), "n2": ("gpuguard: reboot: gpu.lost", now - 700),
               "n3": ("gpuguard: reboot: gpu.lost", now - 10)}
    found = slurm_brake.count(nodes(10, drained), "n0", IN_STEP, 600)
    assert found.drained_by_us == ["n3"]
    assert 0 <= slurm_brake.jitter_s(slurm_brake.BrakeSettings(), 300) <= 30
    assert slurm_brake.jitter_s(slurm_brake.BrakeSettings(jitter_share=0), 300) == 0


def test_the_brake_caps_what_gpuguard_holds_drained_whatever_its_age() -> None:
    """8 of 10 nodes drained by gpuguard 11 minutes ago (past the window): the rate lets
    the 9th through, the cap does not. Existing drains are counted, never undone."""
    now = time.time()
    old = {f"n{i}": ("gpuguard: reset_gpu: xid.recent GPU 0", now - 660) for i in range(2, 10)}
    found = slurm_brake.count(nodes(10, old), "n1", IN_STEP, 600)
    assert found.drained_by_us == [] and len(found.held_by_us) == 8
    why = slurm_brake.why_held(found, slurm_brake.BrakeSettings())
    assert why is not None and "cap of 3" in why
    # under the cap (2 of 10 old) the rate alone decides: free to drain
    two = {k: v for k, v in old.items() if k in ("n2", "n3")}
    assert not slurm_brake.holds(slurm_brake.count(nodes(10, two), "n1", IN_STEP, 600),
                                 slurm_brake.BrakeSettings())
    # the cap is at least one node; an administrator's drain does not count
    one = slurm_brake.count(nodes(2, {"n0": ("admin: rma", now - 9999)}), "n1", IN_STEP, 600)
    assert not slurm_brake.holds(one, slurm_brake.BrakeSettings(cap_percent=0))
    # Slurm's "Prolog error" drains within the window count (gpuguard's until taken over)
    fresh = {f"n{i}": ("Prolog error", now - 20) for i in (2, 3)}
    assert slurm_brake.count(nodes(10, fresh), "n1", IN_STEP, 600).drained_by_us == ["n2", "n3"]
    stale = {f"n{i}": ("Prolog error", now - 6000) for i in (2, 3)}
    assert slurm_brake.count(nodes(10, stale), "n1", IN_STEP, 600).held_by_us == []


def shown(name: str, state: str, rest: str = "", partitions: str = "main") -> str:
    """A node as `scontrol show node -o` prints it (Slurm 22.05, as on the test cluster)."""
    return (f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=2 "
            "Gres=gpu:2 NodeAddr=127.0.0.1 Version=22.05.8 OS=Linux 6.1.0 #1 SMP "
            f"PREEMPT_DYNAMIC Debian  RealMemory=1000 State={state} ThreadsPerCore=1 "
            f"Partitions={partitions}  BootTime=None CfgTRES=cpu=2 AllocTRES= "
            f"ExtSensorsTemp=n/s{rest}")


def test_scontrol_lines_parse_and_odd_ones_are_not_trusted() -> None:
    """The base state and every flag; the reason is the rest of the line, its time the
    last ` [user@time]`; what the reason says is never read as a field."""
    hostile = " Reason=admin: x State=IDLE Partitions=evil [a@b] [root@2026-12-01T17:37:35]"
    text = shown("n1", "DOWN+DRAIN+NOT_RESPONDING", hostile, "main,gpu") + "\n" + \
        shown("n2", "IDLE") + "\n"
    parsed = slurm_ctl.parse_nodes(text)
    one = parsed["n1"]
    assert (one.base, one.flags, one.partitions) == \
        ("DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}), ["main", "gpu"]) and one.drained
    assert one.reason == "admin: x State=IDLE Partitions=evil [a@b]" and one.reason_time
    assert one.reason_time == time.mktime(time.strptime("2026-12-01T17:37:35",
                                                        "%Y-%m-%dT%H:%M:%S"))
    assert (parsed["n2"].reason, parsed["n2"].reason_time, parsed["n2"].word) == \
        ("", None, "idle")
    untimed = slurm_ctl.parse_node(shown("n3", "IDLE+DRAIN", " Reason=Prolog error"))
    assert (untimed.reason, untimed.reason_time, untimed.word) == \
        ("Prolog error", None, "drained")
    assert slurm_ctl.parse_node(shown("n4", "ALLOCATED+DRAIN")).word == "draining"
    assert slurm_ctl.parse_node(shown("n5", "IDLE+FAIL")).word == "idle+fail"
    for odd in ("n1 idle none", shown("n1", "idle"), shown("n1", "IDLE") + " State=DOWN x",
                "Node n1 not found"):
        with pytest.raises(slurm_ctl.SlurmUnavailable):
            slurm_ctl.parse_nodes(odd)


def test_a_missing_tool_is_unavailable_not_a_crash(tmp_path: Any) -> None:
    settings = slurm_ctl.SlurmSettings(bin_dir=tmp_path, timeout_s=1)
    with pytest.raises(slurm_ctl.SlurmUnavailable, match="scontrol not found"):
        slurm_ctl.node(settings, "n1")


def test_an_ok_on_a_wrapped_kernel_log_is_no_evidence_for_a_resume() -> None:
    """Drained for Xid 119 on GPU 0; the ring buffer wraps (a cold check, or a daemon
    restarted after it): xid.recent says ok "since [t]", its line simply gone. It resumed
    the node with the GPU never reset (review 4). A repair seen (a reset line) clears it."""
    xid = result("xid.recent", "critical", "reset_gpu")
    ours = node("IDLE+DRAIN", "gpuguard: reset_gpu: xid.recent GPU 0")
    record = drained_for([xid], gpus=1)
    wrapped = {**result("xid.recent", "ok"), "observed": {"records_lost": 5001, "cleared": 0}}
    kept = slurm.plan([wrapped], set(), ours, None, record=record, gate=PASSED)
    assert kept.do == "keep" and "overwritten" in kept.why, kept
    repaired = {**wrapped, "observed": {"records_lost": 5001, "cleared": 1}}
    assert slurm.plan([repaired], set(), ours, None, record=record, gate=PASSED).do == "resume"
    whole = {**wrapped, "observed": {"records_lost": 0}}
    assert slurm.plan([whole], set(), ours, None, record=record, gate=PASSED).do == "resume"


def test_a_drain_record_naming_no_finding_is_no_record() -> None:
    """Review 4: a record with empty findings and GPUs let any verdict resume the node."""
    from gpuguard.integrations.slurm.resume import DrainRecord

    assert DrainRecord.from_json({"reason": "gpuguard: reboot: x", "findings": [],
                                  "gpus": []}) is None
    ours = node("IDLE+DRAIN", "gpuguard: inspect_hardware: thermal.margin GPU 0")
    assert slurm.plan([result("thermal.margin", "ok")], set(), ours, None,
                      record=None).do == "keep"


def test_the_fleet_is_the_partitions_nodes_and_an_oversized_answer_is_not_trusted(
        tmp_path: Any) -> None:
    """partition_nodes reads every node (scontrol) and keeps the partitions'; an answer
    past its bound is unavailable, never a fleet cut short (the brake would count too
    few)."""
    from tests.slurm.test_slurm_scripts import FAKE_SLURM

    (tmp_path / "nodes").write_text("n1|IDLE|Unknown|gpu|none\nn2|IDLE+DRAIN|Unknown|gpu,cpu|x\n"
                                    "n3|IDLE|Unknown|cpu|none\n")
    settings = slurm_ctl.SlurmSettings(FAKE_SLURM, tmp_path / "slurm.conf", 10)
    assert sorted(slurm_ctl.partition_nodes(settings, ["gpu"])) == ["n1", "n2"]
    assert sorted(slurm_ctl.partition_nodes(settings, ["cpu"])) == ["n2", "n3"]
    assert sorted(slurm_ctl.partition_nodes(settings, ["*"])) == ["n1", "n2", "n3"]
    assert slurm_ctl.node(settings, "n2").reason == "x"
    with pytest.raises(slurm_ctl.SlurmUnavailable, match="not found"):
        slurm_ctl.node(settings, "n9")
    (tmp_path / "nodes").write_text("n1|IDLE|Unknown|gpu|" + "x" * 5_000_000 + "\n")
    with pytest.raises(slurm_ctl.SlurmUnavailable, match="more than 4194304 bytes"):
        slurm_ctl.node(settings, "n1")
