"""sxid.recent: NVSwitch SXid lines graded by the catalog in rules/sxid.yaml, windowed and
acknowledged as Xids are."""

from __future__ import annotations

from typing import Any

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.judge.sxids import line_says
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading, Snapshot
from tests.checks import h200x2

NOW = 10_000 * 10**6
FATAL = ("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 14 LTSSM Fault Up")
NONFATAL = ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)")


def sxid(code: int, text: str, switch: str = "0000:05:00.0", link: int | None = 32,
         seq: int = 1, age_s: int = 60) -> dict[str, Any]:
    return {"sxid": code, "switch": switch, "link": link, "text": text, "seq": seq,
            "usec": NOW - age_s * 10**6}


def with_sxids(events: list[dict[str, Any]] | None, acked: int | None = None,
               **extra: Any) -> Snapshot:
    snap = h200x2.snapshot()
    log: dict[str, Any] = {"source": "kmsg", "records": 10, "now_usec": NOW, "xids": [],
                           "acked_seq": acked, **extra}
    if events is not None:
        log["sxids"] = events
    snap.host.kernel_log = Reading.ok(log)
    snap.host.__post_init__()
    return snap


def test_no_sxid_is_ok(run_rule):
    [result] = run_rule("sxid.recent", with_sxids([]))
    assert result.status is Status.OK and result.message == "no NVSwitch SXid since boot"


def test_a_fatal_sxid_is_critical_and_a_non_fatal_a_warning(run_rule):
    [result] = run_rule("sxid.recent", with_sxids([sxid(20034, FATAL, "0000:07:00.0", 14)]))
    assert result.status is Status.CRITICAL
    assert result.message == ("NVSwitch 0000:07:00.0 link 14: SXid 20034 (NVSwitch link LTSSM "
                              "fault (the link went down), fatal by its line), last 1m ago: "
                              "drain the node; reset the NVSwitches and GPUs (reboot)")
    assert result.action == "reboot" and result.action_reason == "SXid 20034's line says Fatal"
    replay = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20001, Non-fatal, Link 32 TX replay"
    [result] = run_rule("sxid.recent", with_sxids([sxid(20001, replay, seq=1),
                                                   sxid(20001, replay, seq=2, age_s=30)]))
    assert result.status is Status.WARNING and result.action == "inspect_hardware"
    assert "SXid 20001 x2" in result.message and "last 30s ago" in result.message
    # 12028 is filed non-fatal, but the guide says the GPU's traffic stalls and its access
    # hangs, recovered by a reset of GPUs and switches: graded critical, with that reason
    [result] = run_rule("sxid.recent", with_sxids([sxid(12028, NONFATAL)]))
    assert result.status is Status.CRITICAL and result.action == "reboot"


def test_an_sxid_the_catalog_lacks_is_graded_by_its_own_line(run_rule):
    fatal = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 29001, Fatal, Link 3 something new"
    [result] = run_rule("sxid.recent", with_sxids([sxid(29001, fatal)]))
    assert result.status is Status.CRITICAL and result.action == "reboot"
    assert ("not in the SXid list gpuguard ships (the NVSwitch SXid list of NVIDIA's Fabric "
            "Manager User Guide (October 2023)), fatal by its line") in result.message
    other = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 29002, Non-fatal, Link 4 new too"
    [result] = run_rule("sxid.recent", with_sxids([sxid(29002, other)]))
    assert result.status is Status.WARNING and result.action == "inspect_hardware"
    silent = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 29003, Link 4 no word"
    [result] = run_rule("sxid.recent", with_sxids([sxid(29003, silent)]))
    assert result.status is Status.WARNING and result.action_reason == (
        "SXid 29003 is not in the SXid list gpuguard ships (the NVSwitch SXid list of "
        "NVIDIA's Fabric Manager User Guide (October 2023))")
    assert line_says(other) == "non-fatal" and line_says(fatal) == "fatal"
    assert line_says(None) is None


def test_a_fatal_class_sxid_is_graded_by_its_line_on_both_forms(run_rule):
    """The guide's "fatal" class (D.5) is fatal or not as the line says."""
    nonfatal = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Non-fatal, Link 14 LTSSM"
    [result] = run_rule("sxid.recent", with_sxids([sxid(20034, nonfatal)]))
    assert result.status is Status.WARNING and result.action == "inspect_hardware"
    neither = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Link 14 LTSSM Fault Up"
    [result] = run_rule("sxid.recent", with_sxids([sxid(20034, neither)]))
    assert result.status is Status.CRITICAL and result.action == "reboot"
    # always fatal whatever the line says; the switch's own ECC corrections never count
    [result] = run_rule("sxid.recent", with_sxids([sxid(22003, "22003, Non-fatal, Minion")]))
    assert result.status is Status.CRITICAL
    [result] = run_rule("sxid.recent", with_sxids([sxid(11012, "11012, Non-fatal, SBE")]))
    assert result.status is Status.OK and result.observed["not_counted"] == 1


def test_sxids_name_a_switch_so_they_are_the_hosts_unless_a_gpu_is_named(run_rule):
    snap = with_sxids([sxid(20034, FATAL, "0000:07:00.0", 14)])
    [result] = run_rule("sxid.recent", snap)
    assert result.gpu is None
    gpu_bus = snap.gpus[1].pci_bus_id.get()
    snap.host.kernel_log.value["sxids"].append(sxid(20034, FATAL, gpu_bus, 2, seq=2))
    results = {r.gpu.index if r.gpu else "host": r for r in run_rule("sxid.recent", snap)}
    assert set(results) == {1, "host"}
    assert results[1].status is Status.CRITICAL and results["host"].status is Status.CRITICAL
    assert results[1].observed["counted"] == 1 and results["host"].observed["counted"] == 1


def test_the_message_names_three_pairs_most_severe_first(run_rule):
    events = [sxid(20001, "20001, Non-fatal, Link 1 TX replay", seq=1),
              sxid(12028, NONFATAL, seq=2), sxid(20012, "20012, Non-fatal, Link 2", seq=3),
              sxid(20034, FATAL, "0000:07:00.0", 14, seq=4)]
    [result] = run_rule("sxid.recent", with_sxids(events))
    parts = result.message.split(" | ")
    assert [p.split("SXid ")[1].split(" ")[0] for p in parts[:3]] == ["20034", "12028", "20012"]
    assert parts[3] == "and 1 more (switch, SXid) pair(s) (observed.events)"


def test_the_window_and_the_ack_leave_old_lines_out(run_rule):
    events = [sxid(20034, FATAL, seq=5, age_s=7200)]
    assert run_rule("sxid.recent", with_sxids(events))[0].status is Status.CRITICAL
    [result] = run_rule("sxid.recent", with_sxids(events), Profile(xid_window_s=3600))
    assert result.status is Status.OK and result.observed["aged_out"] == 1
    assert run_rule("sxid.recent", with_sxids(events, acked=5))[0].status is Status.OK
    assert run_rule("sxid.recent", with_sxids(events, acked=4))[0].status is Status.CRITICAL


def test_the_catalog_is_data_a_user_regrades(run_rule, tmp_path):
    rules_d = tmp_path / "rules.d"
    rules_d.mkdir()
    (rules_d / "site.yaml").write_text("sxid_catalog:\n  20034: {severity: ignore}\n")
    rules = load_ruleset([rules_d])
    [result] = run_rule("sxid.recent", with_sxids([sxid(20034, FATAL)]), rules=rules)
    assert result.status is Status.OK and result.message == ("no NVSwitch SXid since boot "
                                                             "(1 informational)")


def test_a_new_catalog_entry_needs_all_three(tmp_path):
    from gpuguard.config.yamlfile import ConfigError

    rules_d = tmp_path / "rules.d"
    rules_d.mkdir()
    (rules_d / "site.yaml").write_text("sxid_catalog:\n  99999: {severity: warning}\n")
    with pytest.raises(ConfigError, match=r"site.yaml:2: sxid_catalog\[99999\] is new here"):
        load_ruleset([rules_d])


def test_an_input_without_an_sxid_list_is_skipped_and_a_bad_one_unknown(run_rule):
    assert run_rule("sxid.recent", with_sxids(None))[0].status is Status.SKIPPED
    assert run_rule("sxid.recent", with_sxids([{"sxid": "x"}]))[0].status is Status.UNKNOWN
    [result] = run_rule("sxid.recent", with_sxids([sxid(12028, NONFATAL)], sxids_dropped=4))
    assert result.message.endswith("(and 4 older SXid line(s) not kept)")


def test_the_window_boundary_to_the_microsecond(run_rule):
    """A line exactly window old still counts; one a microsecond older is aged out."""
    at_edge = sxid(20034, FATAL, seq=5, age_s=3600)
    [result] = run_rule("sxid.recent", with_sxids([at_edge]), Profile(xid_window_s=3600))
    assert result.status is Status.CRITICAL and result.observed["aged_out"] == 0
    just_over = {**at_edge, "usec": NOW - 3600 * 10**6 - 1}
    [result] = run_rule("sxid.recent", with_sxids([just_over]), Profile(xid_window_s=3600))
    assert result.status is Status.OK and result.observed["aged_out"] == 1
    assert result.message == "no NVSwitch SXid in the last 1h"


def test_a_line_without_a_time_counts_and_shows_no_age(run_rule):
    """No usec on the line, or no clock in the summary: it cannot be aged, so it counts
    (never dropped for being unreadable), and no age is made up."""
    undated = {k: v for k, v in sxid(20034, FATAL, "0000:07:00.0", 14).items() if k != "usec"}
    for snap in (with_sxids([undated]),
                 with_sxids([sxid(20034, FATAL, "0000:07:00.0", 14)], now_usec=None)):
        [result] = run_rule("sxid.recent", snap, Profile(xid_window_s=3600))
        assert result.status is Status.CRITICAL
        assert result.observed["events"][0]["age_s"] is None
        assert result.message.startswith("NVSwitch 0000:07:00.0 link 14: SXid 20034 (NVSwitch "
                                         "link LTSSM fault (the link went down), fatal by its "
                                         "line): drain")


@pytest.mark.parametrize(("age_s", "shown"), [
    (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86399, "23h"), (86400, "1d")])
def test_ages_are_written_in_the_largest_whole_unit(run_rule, age_s, shown):
    later = NOW + 86400 * 10**6  # a clock late enough for a line a day old
    event = {**sxid(12028, NONFATAL), "usec": later - age_s * 10**6}
    [result] = run_rule("sxid.recent", with_sxids([event], now_usec=later))
    assert f", last {shown} ago: " in result.message


def test_one_sxid_on_two_switches_is_two_pairs_and_three_pairs_need_no_more(run_rule):
    two = [sxid(20034, FATAL, "0000:07:00.0", 14, seq=1),
           sxid(20034, FATAL, "0000:08:00.0", 3, seq=2)]
    [result] = run_rule("sxid.recent", with_sxids(two))
    assert len(result.message.split(" | ")) == 2
    assert "NVSwitch 0000:08:00.0 link 3" in result.message
    three = [*two, sxid(20001, "20001, Non-fatal, Link 1", seq=3)]
    [result] = run_rule("sxid.recent", with_sxids(three))
    assert len(result.message.split(" | ")) == 3 and "more" not in result.message
