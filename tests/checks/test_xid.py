from pathlib import Path

from gpuguard.config.ruleset import load_ruleset
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.sources import kmsg
from tests.conftest import FIXTURES, with_gpus

K = FIXTURES / "kmsg"
BUSES = ["00000000:00:06.0", "00000000:3B:00.0", "00000000:86:00.0"]


def host(h200, log="xids.kmsg"):
    snap = with_gpus(h200, BUSES)
    snap.host.kernel_log = kmsg.read_file(K / log)
    snap.host.__post_init__()
    return snap


def test_since_boot_counts_fatal_and_application_xids(h200, run_rule):
    [result] = run_rule("xid.recent", host(h200))
    assert result.status is Status.CRITICAL
    msg = result.message
    assert "GPU 0 (0000:00:06.0): Xid 119 (GSP RPC timeout)" in msg
    assert "drain and reset the GPU" in msg
    assert "GPU 1 (0000:3b:00.0): Xid 154 (GPU recovery action changed)" in msg
    assert "GPU 1 (0000:3b:00.0): Xid 94" in msg
    assert "GPU 2 (0000:86:00.0): Xid 13" in msg and "restart the application" in msg
    assert "Xid 999 (not in gpuguard's catalog)" in msg
    # 63 and 45 never count on their own
    assert "Xid 63" not in msg and "Xid 45" not in msg
    assert result.observed["not_counted"] == 2


def test_window_lets_an_old_line_age_out(h200, run_rule):
    # The log ends at 7200 s; the Xid 13 at 1200 s is 100 minutes old.
    [result] = run_rule("xid.recent", host(h200), Profile(xid_window_s=3600))
    assert "Xid 13" not in result.message
    assert result.observed["aged_out"] == 2  # the 13 and its 45
    assert result.status is Status.CRITICAL


def test_application_xid_alone_is_a_warning(h200, run_rule, tmp_path):
    path = tmp_path / "app.log"
    path.write_text("[ 10.000000] NVRM: Xid (PCI:0000:86:00): 31, pid=77, name=python3, "
                    "fault @ 0x7f..\n")
    snap = host(h200)
    snap.host.kernel_log = kmsg.read_file(path)
    [result] = run_rule("xid.recent", snap)
    assert result.status is Status.WARNING
    assert "GPU 2 (0000:86:00.0): Xid 31 (GPU memory page fault" in result.message


def test_acknowledged_lines_do_not_count(h200, run_rule):
    snap = host(h200)
    assert snap.host.kernel_log.value is not None
    snap.host.kernel_log.value["acked_seq"] = 980
    [result] = run_rule("xid.recent", snap)
    assert result.status is Status.OK
    assert result.observed["acked_seq"] == 980


def test_recovery_none_in_xid_154_does_not_count(h200, run_rule, tmp_path):
    path = tmp_path / "154.log"
    path.write_text("[ 10.000000] NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', "
                    "name=<unknown>, GPU recovery action changed from 0x1 (GPU Reset Required) "
                    "to 0x0 (None)\n")
    snap = host(h200)
    snap.host.kernel_log = kmsg.read_file(path)
    assert run_rule("xid.recent", snap)[0].status is Status.OK


def test_a_user_regrades_an_xid_without_code(h200, run_rule, tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "xid.yaml").write_text(
        "xid_catalog:\n  119: {severity: warning}\n  154: {severity: ignore}\n"
        "  999: {severity: ignore, action: ignore, meaning: our lab's test Xid}\n")
    regraded = load_ruleset([rules])
    assert regraded.xid_catalog[119].actions == ("reset_gpu",)  # kept from the pack
    [result] = run_rule("xid.recent", host(h200), rules=regraded)
    assert result.status is Status.WARNING
    assert "Xid 999" not in result.message and "Xid 154" not in result.message


def test_bad_catalog_entry_names_file_and_line(tmp_path):
    import pytest

    from gpuguard.config.yamlfile import ConfigError

    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "xid.yaml").write_text("xid_catalog:\n  79: {severity: fatal}\n")
    with pytest.raises(ConfigError, match=r"xid\.yaml:2: xid_catalog\[79\]: severity must be"):
        load_ruleset([rules])
    (rules / "xid.yaml").write_text("xid_catalog:\n  500: {severity: warning}\n")
    with pytest.raises(ConfigError, match="is new here: it needs severity, action and meaning"):
        load_ruleset([rules])


def test_fallen_off_gpu_missing_from_nvml_is_still_reported(h200, run_rule):
    [result] = run_rule("xid.recent", host(h200, "fallen-off.log"))
    assert result.status is Status.CRITICAL
    assert "0000:5e:00.0 (not among the GPUs NVML lists): Xid 79 (GPU has fallen off the bus)" \
        in result.message
    assert "reboot" in result.message


def test_repeated_fatal_xid_says_contact_vendor(h200, run_rule, tmp_path):
    path = Path(tmp_path / "many.log")
    path.write_text("".join(
        f"[ {100 + i}.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
        for i in range(5)))
    snap = host(h200)
    snap.host.kernel_log = kmsg.read_file(path)
    [result] = run_rule("xid.recent", snap)
    assert "Xid 48 x5" in result.message and "contact NVIDIA support" in result.message


def test_unreadable_kernel_log_is_unknown_never_ok(h200, run_rule, tmp_path):
    from gpuguard.model.snapshot import Reading

    snap = host(h200)
    snap.host.kernel_log = Reading.failed("cannot read /dev/kmsg: operation not permitted "
                                          "(needs CAP_SYSLOG when kernel.dmesg_restrict=1)")
    snap.host.__post_init__()
    [result] = run_rule("xid.recent", snap)
    assert result.status is Status.UNKNOWN
    assert "CAP_SYSLOG" in result.message


RECOVERY_TEXTS = ["GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
                  "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
                  "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
                  "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
                  "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
                  "GPU recovery action changed to something new"]


def test_the_check_and_the_metrics_grade_every_xid_alike(h200, run_rule, tmp_path):
    """One grading: for every catalog entry (and every Xid 154 text), the severity xid.recent
    gives an event equals the severity label of gpuguard_xid_events_total."""
    from gpuguard.daemon.app import Daemon
    from gpuguard.daemon.settings import DaemonConfig

    rules = load_ruleset()
    cases = [(xid, "some text") for xid in rules.xid_catalog if xid != 154]
    cases += [(154, text) for text in RECOVERY_TEXTS] + [(999, "not in the catalog")]
    for n, (xid, text) in enumerate(cases):
        log = tmp_path / f"{n}.log"
        log.write_text(f"[ 10.000000] NVRM: Xid (PCI:0000:18:00): {xid}, pid=1, name=x, "
                       f"{text}\n")
        snap = host(h200, log)
        [result] = run_rule("xid.recent", snap)
        events = result.observed["events"]
        by_check = events[0]["severity"] if events else "ignore"
        daemon = Daemon(DaemonConfig())
        daemon.xids.count_kernel_log(snap, rules)
        [(label, count)] = daemon.stats.xids.items()
        assert count == 1
        assert label[1] == by_check, (xid, text, label, by_check)


# -- window edges, ages, grouping and the vendor hint (scripts/mutate_rules.py survivors) --

NOW = 7200 * 10**6


def xid_event(xid, pci="0000:00:06.0", usec=NOW - 10 * 10**6, seq=1000):
    return {"xid": xid, "pci": pci, "pid": None, "process": None, "text": "", "seq": seq,
            "usec": usec}


def logged(h200, events, now=NOW, **extra):
    from gpuguard.model.snapshot import Reading

    snap = with_gpus(h200, BUSES)
    snap.host.kernel_log = Reading.ok({"xids": events, "now_usec": now, "acked_seq": None,
                                       **extra})
    snap.host.__post_init__()
    return snap


def test_window_edge_is_inside(h200, run_rule):
    hour = Profile(xid_window_s=3600)
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119, usec=NOW - 3600 * 10**6)]),
                        hour)
    assert result.observed["counted"] == 1 and result.observed["aged_out"] == 0
    [result] = run_rule("xid.recent",
                        logged(h200, [xid_event(119, usec=NOW - 3600 * 10**6 - 1)]), hour)
    assert result.observed["counted"] == 0 and result.observed["aged_out"] == 1


def test_age_is_told_when_known(h200, run_rule):
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119, usec=NOW - 6000 * 10**6)]))
    assert result.observed["events"][0]["age_s"] == 6000
    assert result.message.startswith("GPU 0 (0000:00:06.0): Xid 119 (GSP RPC timeout), "
                                     "last 1h ago: ")
    for snap in (logged(h200, [xid_event(119, usec=None)]),
                 logged(h200, [xid_event(119)], now=None)):
        [result] = run_rule("xid.recent", snap)
        assert result.status is Status.CRITICAL
        assert result.observed["events"][0]["age_s"] is None
        assert result.message.startswith("GPU 0 (0000:00:06.0): Xid 119 (GSP RPC timeout): ")


def test_dropped_and_informational_lines_are_told(h200, run_rule):
    [result] = run_rule("xid.recent", logged(h200, [], xids_dropped=None))
    assert result.message == "no Xid since boot" and result.observed["older_not_kept"] == 0
    [result] = run_rule("xid.recent", logged(h200, [xid_event(63)]))
    assert result.message == "no Xid since boot to act on (1 informational)"
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119)]))
    assert not result.message.endswith("not kept)")
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119)], xids_dropped=3))
    assert result.message.endswith(" (and 3 older Xid line(s) not kept)")


def test_parts_are_ordered_by_gpu_then_xid(h200, run_rule):
    events = [xid_event(13, pci="0000:3b:00.0"), xid_event(94, pci="0000:00:06.0")]
    [result] = run_rule("xid.recent", logged(h200, events))
    first, second = result.message.split(" | ")
    assert first.startswith("GPU 0 ") and second.startswith("GPU 1 ")


def test_unlisted_addresses_show_three_and_count_the_rest(h200, run_rule):
    pcis = [f"0000:{bus:02x}:00.0" for bus in (0xA1, 0xA2, 0xA3, 0xA4)]
    [result] = run_rule("xid.recent", logged(h200, [xid_event(79, pci=p) for p in pcis[:3]]))
    assert result.message.startswith("0000:a1:00.0, 0000:a2:00.0, 0000:a3:00.0 (not among")
    [result] = run_rule("xid.recent", logged(h200, [xid_event(79, pci=p) for p in pcis]))
    assert result.message.startswith("0000:a1:00.0, 0000:a2:00.0, 0000:a3:00.0 and 1 more "
                                     "(not among the GPUs NVML lists): Xid 79 x4")


def test_repeats_are_counted_and_a_fatal_one_asks_for_the_vendor(h200, run_rule, tmp_path):
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119), xid_event(119)]))
    assert "Xid 119 x2 (" in result.message and "vendor" not in result.message
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119)] * 5))
    assert result.message.endswith("; it keeps coming back: contact NVIDIA support or the "
                                   "vendor")
    [result] = run_rule("xid.recent", logged(h200, [xid_event(31)] * 5))  # an app's fault
    assert "vendor" not in result.message
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "xid.yaml").write_text(
        "overrides:\n  xid.recent: {thresholds: {repeat_for_vendor: 2}}\n")
    [result] = run_rule("xid.recent", logged(h200, [xid_event(119)] * 2),
                        rules=load_ruleset([rules]))
    assert "contact NVIDIA support" in result.message


def test_window_is_named_in_days_hours_minutes_or_seconds(h200, run_rule):
    for seconds, text in ((86400, "1d"), (86399, "23h"), (3600, "1h"), (3599, "59m"),
                          (60, "1m"), (59, "59s")):
        [result] = run_rule("xid.recent", logged(h200, []), Profile(xid_window_s=seconds))
        assert result.message == f"no Xid in the last {text}", seconds


def test_acknowledged_and_aged_lines_are_told_not_hidden(h200, run_rule):
    snap = logged(h200, [xid_event(119, seq=5), xid_event(119, seq=6)])
    snap.host.kernel_log.value["acked_seq"] = 6
    [result] = run_rule("xid.recent", snap)
    assert result.status is Status.OK
    assert result.message == "no Xid since boot to act on (2 acknowledged)"
    assert result.observed["acknowledged"] == 2
