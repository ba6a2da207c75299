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
                              "fault (the link went down)), last 1m ago: drain and reboot the "
                              "node; open a case with the vendor if it comes back")
    [result] = run_rule("sxid.recent", with_sxids([sxid(12028, NONFATAL, seq=1),
                                                   sxid(12028, NONFATAL, seq=2, age_s=30)]))
    assert result.status is Status.WARNING
    assert "SXid 12028 x2" in result.message and "last 30s ago" in result.message


def test_an_sxid_the_catalog_lacks_is_graded_by_its_own_line(run_rule):
    fatal = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 24007, Fatal, Link 3 sourcetrack timeout"
    [result] = run_rule("sxid.recent", with_sxids([sxid(24007, fatal)]))
    assert result.status is Status.CRITICAL and "not in gpuguard's catalog" in result.message
    other = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 22013, Non-fatal, Minion Link 4 DLREQ"
    assert run_rule("sxid.recent", with_sxids([sxid(22013, other)]))[0].status \
        is Status.WARNING
    assert line_says(other) == "non-fatal" and line_says(fatal) == "fatal"
    assert line_says(None) is None


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
                                         "link LTSSM fault (the link went down)): drain")


@pytest.mark.parametrize(("age_s", "shown"), [
    (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86399, "23h"), (86400, "1d")])
def test_ages_are_written_in_the_largest_whole_unit(run_rule, age_s, shown):
    later = NOW + 86400 * 10**6  # a clock late enough for a line a day old
    event = {**sxid(12028, NONFATAL), "usec": later - age_s * 10**6}
    [result] = run_rule("sxid.recent", with_sxids([event], now_usec=later))
    assert f", last {shown} ago: " in result.message
