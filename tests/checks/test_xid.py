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


def by_gpu(results):
    """xid.recent's results by the GPU they are about (`host` for the host's)."""
    return {"host" if r.gpu is None else r.gpu.index: r for r in results}


def test_each_gpu_gets_its_own_result_most_severe_code_first(h200, run_rule):
    results = by_gpu(run_rule("xid.recent", host(h200)))
    assert set(results) == {0, 1, 2}  # every line names a listed GPU: no host result
    gpu0, gpu1, gpu2 = results[0], results[1], results[2]
    assert gpu0.status is Status.CRITICAL
    assert gpu0.message.startswith("Xid 119 (GSP RPC timeout), last 10s ago: drain and reset "
                                   "the GPU")
    assert gpu0.action == "reset_gpu" and gpu0.action_reason == "Xid 119 in the catalog"
    # GPU 1: the 154's reset (critical) before the unknown 999 (a warning for a person)
    # before the 94 (a warning for the application); the 63 never counts
    assert gpu1.status is Status.CRITICAL
    parts = gpu1.message.split(" | ")
    assert [p.split(" ")[1] for p in parts] == ["154", "999", "94"]
    assert parts[1] == ("Xid 999 (not in the Xid catalog gpuguard ships (NVIDIA's Xid catalog "
                        "of 2025-10-29)), last 5s ago: look it up in NVIDIA's Xid catalog and "
                        "have the GPU inspected; re-grade it in rules.d")
    assert gpu1.observed["not_counted"] == 1
    assert gpu2.status is Status.WARNING and gpu2.action == "restart_app"
    assert gpu2.message.startswith("Xid 13 (graphics engine exception") \
        and "restart the application" in gpu2.message
    assert gpu2.observed["not_counted"] == 1  # the 45 after the 13
    assert "Xid 45" not in gpu2.message


def test_seven_codes_on_one_gpu_show_the_three_most_severe_with_counts(h200, run_rule,
                                                                        tmp_path):
    """The issue's log: Xids 79, 119, 143, 109, 154, 95 and 48 on one GPU used to be one
    host result joining all seven; now GPU 1's result names the three most severe, and
    the rest are in observed.codes."""
    lines = [(79, "GPU has fallen off the bus."), (119, "Timeout after 6s of waiting for RPC"),
             (143, "GPU init error"), (109, "CTX SWITCH TIMEOUT"), (109, "CTX SWITCH TIMEOUT"),
             (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
             (95, "Uncontained: LTC TAG (0x2,0x0)"), (48, "An uncorrectable double bit error")]
    log = tmp_path / "seven.log"
    log.write_text("".join(f"[ {100 + n}.000000] NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, "
                           f"name=x, {text}\n" for n, (xid, text) in enumerate(lines)))
    results = by_gpu(run_rule("xid.recent", host(h200, log)))
    assert set(results) == {0, 1, 2}
    assert results[0].status is Status.OK and results[2].status is Status.OK
    gpu1 = results[1]
    assert gpu1.status is Status.CRITICAL and gpu1.action == "reboot"
    parts = gpu1.message.split(" | ")
    assert len(parts) == 4
    # reboots first (the 154 names one, 79 is one), the latest first among equals; then
    # the most frequent of the resets
    assert parts[0].startswith("Xid 154 (GPU recovery action changed)")
    assert parts[1].startswith("Xid 79 (GPU has fallen off the bus)")
    assert parts[2].startswith("Xid 109 x2 (Context Switch Timeout Error)")
    assert parts[3] == "and 4 more Xid code(s) (observed.codes, `gpuguard events`)"
    assert [c["xid"] for c in gpu1.observed["codes"]] == [154, 79, 109, 48, 95, 143, 119]
    assert {c["xid"]: c["count"] for c in gpu1.observed["codes"]}[109] == 2
    assert len(gpu1.observed["events"]) == 8


def test_xid_143_is_in_the_catalog_and_an_unknown_one_goes_to_a_person(h200, run_rule,
                                                                      tmp_path):
    """Xid 143 said "not in gpuguard's catalog" and then "do: none (Xid 143 in the
    catalog)". It is GPU_INIT_ERROR, RESET_GPU; an Xid the catalog lacks is a warning
    whose action is inspect_hardware, and nothing says it is in the catalog."""
    log = tmp_path / "143.log"
    log.write_text("[ 10.000000] NVRM: Xid (PCI:0000:3b:00): 143, pid=1, name=x, init\n")
    gpu1 = by_gpu(run_rule("xid.recent", host(h200, log)))[1]
    assert gpu1.status is Status.CRITICAL and gpu1.action == "reset_gpu"
    assert gpu1.message == "Xid 143 (GPU Initialization Error), last 0s ago: drain and " \
                           "reset the GPU (nvidia-smi -r -i <index>)"
    assert gpu1.action_reason == "Xid 143 in the catalog"
    log.write_text("[ 10.000000] NVRM: Xid (PCI:0000:3b:00): 200, pid=1, name=x, new\n")
    gpu1 = by_gpu(run_rule("xid.recent", host(h200, log)))[1]
    assert gpu1.status is Status.WARNING and gpu1.action == "inspect_hardware"
    assert gpu1.action_reason == ("Xid 200 is not in the Xid catalog gpuguard ships "
                                  "(NVIDIA's Xid catalog of 2025-10-29)")
    assert "in the catalog)" not in gpu1.message


FATAL_145 = "145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"
NONFATAL_145 = ("145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 "
                "0x00000000)")


def test_nvlink5_xids_are_graded_by_their_own_line(h200, run_rule, tmp_path):
    """NVIDIA's NVLink5 workflow (Xids 144-150): every Fatal item is RESET_GPU; a Nonfatal
    one needs nothing unless the driver names an action in an Xid 154 of its own. The line
    formats are gpud's test lines (leptonai/gpud)."""
    log = tmp_path / "nvlink5.log"
    for rest, status, action in ((FATAL_145, Status.CRITICAL, "reset_gpu"),
                                 (NONFATAL_145, Status.WARNING, "none"),
                                 ("146, TLW_CTRL Non-fatal XC0 i0 Link 03 (0x1)", Status.WARNING,
                                  "none"),
                                 ("144, SAW_MVB XC0 i0 Link 00 (0x00000001)", Status.CRITICAL,
                                  "reset_gpu")):
        log.write_text(f"[ 10.000000] NVRM: Xid (PCI:0000:3b:00): {rest}\n")
        gpu1 = by_gpu(run_rule("xid.recent", host(h200, log)))[1]
        assert (gpu1.status, gpu1.action) == (status, action), rest
    log.write_text(f"[ 10.000000] NVRM: Xid (PCI:0000:3b:00): {FATAL_145}\n")
    gpu1 = by_gpu(run_rule("xid.recent", host(h200, log)))[1]
    assert gpu1.message.startswith("Xid 145 (NVLINK: RLW Error, fatal by its line), last 0s "
                                   "ago: drain and reset the GPU")
    assert gpu1.action_reason == "Xid 145's line says Fatal"
    log.write_text(f"[ 10.000000] NVRM: Xid (PCI:0000:3b:00): {NONFATAL_145}\n")
    gpu1 = by_gpu(run_rule("xid.recent", host(h200, log)))[1]
    assert gpu1.message == ("Xid 145 (NVLINK: RLW Error, non-fatal by its line), last 0s ago: "
                            "none unless an Xid 154 names one")


def test_window_lets_an_old_line_age_out(h200, run_rule):
    # The log ends at 7200 s; the Xid 13 at 1200 s is 100 minutes old.
    results = by_gpu(run_rule("xid.recent", host(h200), Profile(xid_window_s=3600)))
    assert results[2].status is Status.OK
    assert results[2].observed["aged_out"] == 2  # the 13 and its 45
    assert results[2].message == "no Xid in the last 1h to act on (2 older than the window)"
    assert results[0].status is Status.CRITICAL


def test_application_xid_alone_is_a_warning(h200, run_rule, tmp_path):
    path = tmp_path / "app.log"
    path.write_text("[ 10.000000] NVRM: Xid (PCI:0000:86:00): 31, pid=77, name=python3, "
                    "fault @ 0x7f..\n")
    results = by_gpu(run_rule("xid.recent", host(h200, path)))
    assert results[2].status is Status.WARNING and results[2].action == "restart_app"
    assert results[2].message.startswith("Xid 31 (GPU memory page fault")
    assert results[0].status is Status.OK and results[0].message == "no Xid since boot"


def test_acknowledged_lines_do_not_count(h200, run_rule):
    snap = host(h200)
    assert snap.host.kernel_log.value is not None
    snap.host.kernel_log.value["acked_seq"] = 980
    results = run_rule("xid.recent", snap)
    assert {r.status for r in results} == {Status.OK}
    assert {r.observed["acked_seq"] for r in results} == {980}


def test_recovery_none_in_xid_154_does_not_count(h200, run_rule, tmp_path):
    path = tmp_path / "154.log"
    path.write_text("[ 10.000000] NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', "
                    "name=<unknown>, GPU recovery action changed from 0x1 (GPU Reset Required) "
                    "to 0x0 (None)\n")
    assert {r.status for r in run_rule("xid.recent", host(h200, path))} == {Status.OK}


def test_a_user_regrades_an_xid_without_code(h200, run_rule, tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "xid.yaml").write_text(
        "xid_catalog:\n  119: {severity: warning}\n  154: {severity: ignore}\n"
        "  999: {severity: ignore, action: ignore, meaning: our lab's test Xid}\n")
    regraded = load_ruleset([rules])
    assert regraded.xid_catalog[119].actions == ("reset_gpu",)  # kept from the pack
    assert regraded.xid_catalog[119].reason == ""  # the pack's reason was for its grade
    results = by_gpu(run_rule("xid.recent", host(h200), rules=regraded))
    assert results[0].status is Status.WARNING
    assert results[1].status is Status.WARNING  # the 94 alone
    assert "Xid 999" not in results[1].message and "Xid 154" not in results[1].message


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


def test_a_gpu_missing_from_nvml_is_the_hosts_result(h200, run_rule):
    """A line naming no GPU NVML lists (this one fell off the bus) is the host's result;
    each listed GPU says it logged nothing."""
    results = by_gpu(run_rule("xid.recent", host(h200, "fallen-off.log")))
    assert set(results) == {0, 1, 2, "host"}
    assert [results[i].status for i in (0, 1, 2)] == [Status.OK] * 3
    assert results["host"].status is Status.CRITICAL and results["host"].action == "reboot"
    assert results["host"].message.startswith(
        "0000:5e:00.0 (not among the GPUs NVML lists): Xid 79 (GPU has fallen off the bus)")


def test_without_gpus_every_xid_is_the_hosts(h200, run_rule):
    snap = host(h200)
    snap.gpus = []
    [result] = run_rule("xid.recent", snap)
    assert result.gpu is None and result.status is Status.CRITICAL
    snap.host.kernel_log.value["xids"] = []
    [result] = run_rule("xid.recent", snap)
    assert result.gpu is None and result.message == "no Xid since boot"


def test_repeated_fatal_xid_says_contact_vendor(h200, run_rule, tmp_path):
    path = Path(tmp_path / "many.log")
    path.write_text("".join(
        f"[ {100 + i}.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
        for i in range(5)))
    gpu1 = by_gpu(run_rule("xid.recent", host(h200, path)))[1]
    assert "Xid 48 x5" in gpu1.message and "contact NVIDIA support" in gpu1.message


def test_unreadable_kernel_log_is_unknown_never_ok(h200, run_rule, tmp_path):
    from gpuguard.model.snapshot import Reading

    snap = host(h200)
    snap.host.kernel_log = Reading.failed("cannot read /dev/kmsg: operation not permitted "
                                          "(needs CAP_SYSLOG when kernel.dmesg_restrict=1)")
    snap.host.__post_init__()
    [result] = run_rule("xid.recent", snap)  # one result for the host: no GPU is vouched for
    assert result.status is Status.UNKNOWN and result.gpu is None
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
    cases += [(145, FATAL_145.split(", ", 1)[1]), (145, NONFATAL_145.split(", ", 1)[1])]
    for n, (xid, text) in enumerate(cases):
        log = tmp_path / f"{n}.log"
        log.write_text(f"[ 10.000000] NVRM: Xid (PCI:0000:18:00): {xid}, pid=1, name=x, "
                       f"{text}\n")
        snap = host(h200, log)
        result = by_gpu(run_rule("xid.recent", snap))["host"]
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


def gpu0(run_rule, snap, profile=None):
    return by_gpu(run_rule("xid.recent", snap, profile))[0]


def test_window_edge_is_inside(h200, run_rule):
    hour = Profile(xid_window_s=3600)
    result = gpu0(run_rule, logged(h200, [xid_event(119, usec=NOW - 3600 * 10**6)]), hour)
    assert result.observed["counted"] == 1 and result.observed["aged_out"] == 0
    result = gpu0(run_rule, logged(h200, [xid_event(119, usec=NOW - 3600 * 10**6 - 1)]), hour)
    assert result.observed["counted"] == 0 and result.observed["aged_out"] == 1


def test_age_is_told_when_known(h200, run_rule):
    result = gpu0(run_rule, logged(h200, [xid_event(119, usec=NOW - 6000 * 10**6)]))
    assert result.observed["events"][0]["age_s"] == 6000
    assert result.message.startswith("Xid 119 (GSP RPC timeout), last 1h ago: ")
    for snap in (logged(h200, [xid_event(119, usec=None)]),
                 logged(h200, [xid_event(119)], now=None)):
        result = gpu0(run_rule, snap)
        assert result.status is Status.CRITICAL
        assert result.observed["events"][0]["age_s"] is None
        assert result.message.startswith("Xid 119 (GSP RPC timeout): ")


def test_dropped_and_informational_lines_are_told(h200, run_rule):
    result = gpu0(run_rule, logged(h200, [], xids_dropped=None))
    assert result.message == "no Xid since boot" and result.observed["older_not_kept"] == 0
    result = gpu0(run_rule, logged(h200, [xid_event(63)]))
    assert result.message == "no Xid since boot to act on (1 informational)"
    result = gpu0(run_rule, logged(h200, [xid_event(119)]))
    assert not result.message.endswith("not kept)")
    # which GPU the lines not kept were about cannot be told: every result says so
    for result in run_rule("xid.recent", logged(h200, [xid_event(119)], xids_dropped=3)):
        assert result.message.endswith(" (and 3 older Xid line(s) of any GPU not kept)")
        assert result.observed["older_not_kept"] == 3


def test_codes_of_equal_weight_go_by_count_then_by_the_latest(h200, run_rule):
    """Among codes of one severity and action, the more frequent first, then the latest."""
    events = [xid_event(13, seq=1), xid_event(31, seq=2), xid_event(31, seq=3),
              xid_event(8, seq=4), xid_event(68, seq=5)]
    result = gpu0(run_rule, logged(h200, events))
    assert [p.split(" ")[1] for p in result.message.split(" | ")][:3] == ["31", "68", "8"]
    assert result.message.endswith(" | and 1 more Xid code(s) (observed.codes, "
                                   "`gpuguard events`)")
    result = gpu0(run_rule, logged(h200, events[:3]))
    assert "more Xid code" not in result.message  # three codes: all shown


def test_critical_before_warning_and_action_weight_within(h200, run_rule):
    events = [xid_event(13, seq=9), xid_event(54, seq=1), xid_event(119, seq=2),
              xid_event(78, seq=8)]
    result = gpu0(run_rule, logged(h200, events))
    # 54 (CHECK_MECHANICALS: critical, inspect) before 119 (critical, reset); 78
    # (UPDATE_SWFW: warning, update_software) before 13 (warning, restart_app)
    assert [c["xid"] for c in result.observed["codes"]] == [54, 119, 78, 13]
    assert result.action == "inspect_hardware"


def test_unlisted_addresses_show_three_and_count_the_rest(h200, run_rule):
    pcis = [f"0000:{bus:02x}:00.0" for bus in (0xA1, 0xA2, 0xA3, 0xA4)]
    result = by_gpu(run_rule("xid.recent",
                             logged(h200, [xid_event(79, pci=p) for p in pcis[:3]])))["host"]
    assert result.message.startswith("0000:a1:00.0, 0000:a2:00.0, 0000:a3:00.0 (not among")
    result = by_gpu(run_rule("xid.recent",
                             logged(h200, [xid_event(79, pci=p) for p in pcis])))["host"]
    assert result.message.startswith("0000:a1:00.0, 0000:a2:00.0, 0000:a3:00.0 and 1 more "
                                     "(not among the GPUs NVML lists): Xid 79 x4")
    result = by_gpu(run_rule("xid.recent", logged(h200, [xid_event(79, pci=None)])))["host"]
    assert result.message.startswith("no address (not among the GPUs NVML lists): Xid 79")


def test_repeats_are_counted_and_a_fatal_one_asks_for_the_vendor(h200, run_rule, tmp_path):
    result = gpu0(run_rule, logged(h200, [xid_event(119), xid_event(119)]))
    assert "Xid 119 x2 (" in result.message and "vendor" not in result.message
    result = gpu0(run_rule, logged(h200, [xid_event(119)] * 5))
    assert result.message.endswith("; it keeps coming back: contact NVIDIA support or the "
                                   "vendor")
    result = gpu0(run_rule, logged(h200, [xid_event(31)] * 5))  # an app's fault
    assert "vendor" not in result.message
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "xid.yaml").write_text(
        "overrides:\n  xid.recent: {thresholds: {repeat_for_vendor: 2}}\n")
    result = by_gpu(run_rule("xid.recent", logged(h200, [xid_event(119)] * 2),
                             rules=load_ruleset([rules])))[0]
    assert "contact NVIDIA support" in result.message


def test_window_is_named_in_days_hours_minutes_or_seconds(h200, run_rule):
    for seconds, text in ((86400, "1d"), (86399, "23h"), (3600, "1h"), (3599, "59m"),
                          (60, "1m"), (59, "59s")):
        result = gpu0(run_rule, logged(h200, []), Profile(xid_window_s=seconds))
        assert result.message == f"no Xid in the last {text}", seconds


def test_acknowledged_and_aged_lines_are_told_not_hidden(h200, run_rule):
    snap = logged(h200, [xid_event(119, seq=5), xid_event(119, seq=6)])
    snap.host.kernel_log.value["acked_seq"] = 6
    result = gpu0(run_rule, snap)
    assert result.status is Status.OK
    assert result.message == "no Xid since boot to act on (2 acknowledged)"
    assert result.observed["acknowledged"] == 2


# -- xid.app_repeated: an application's Xid that keeps hitting one GPU (issue 21) --------

BUS = {0: "0000:00:06.0", 1: "0000:3b:00.0", 2: "0000:86:00.0"}


def app_xid(gpu, at_s, pid=100, xid=13, seq=None):
    return {"xid": xid, "pci": BUS[gpu], "pid": pid, "process": "python3", "text": "",
            "seq": seq, "usec": None if at_s is None else at_s * 10**6}


def repeated(run_rule, h200, events, rules=None, now_s=90_000):
    snap = logged(h200, events, now=now_s * 10**6)
    return by_gpu(run_rule("xid.app_repeated", snap, rules=rules))


def test_an_app_xid_that_keeps_hitting_one_gpu_alone_points_at_the_gpu(h200, run_rule):
    events = [app_xid(1, t, pid=p) for t, p in ((10_000, 7), (20_000, 8), (30_000, 9))]
    results = repeated(run_rule, h200, events)
    gpu1 = results[1]
    assert (gpu1.status, gpu1.action) == (Status.WARNING, "inspect_hardware")
    assert gpu1.message == ("Xid 13/31 hit this GPU alone 3 times in the last 1d (0 alone on "
                            "the other GPUs): an application fault that keeps hitting one GPU "
                            "points at the GPU")
    assert gpu1.observed["pids"] == [7, 8, 9]
    assert results[0].status is Status.OK and results[2].status is Status.OK
    assert results[0].message == ("0 Xid 13/31 incident(s) on this GPU alone in the last 1d "
                                  "(3 on the other GPUs)")
    # two are not yet a pattern
    assert repeated(run_rule, h200, events[:2])[1].status is Status.OK


def test_a_fault_spread_over_gpus_is_the_apps(h200, run_rule):
    # a tensor-parallel job failing on three GPUs at once, three times
    at_once = [app_xid(gpu, t + gpu, pid=t) for t in (10_000, 20_000, 30_000) for gpu in (0, 1, 2)]
    assert {r.status for r in repeated(run_rule, h200, at_once).values()} == {Status.OK}
    # one model per GPU, the bug hitting GPU 0 and GPU 2 as often: neither is singled out
    spread = [app_xid(gpu, t, pid=t) for gpu, times in ((0, (11_000, 15_000, 19_000)),
                                                        (2, (13_000, 17_000, 21_000)))
              for t in times]
    assert {r.status for r in repeated(run_rule, h200, spread).values()} == {Status.OK}
    # GPU 1 alone more often than all the others together: singled out
    more = spread[:2] + [app_xid(1, t, pid=t) for t in (23_000, 25_000, 27_000)]
    results = repeated(run_rule, h200, more)
    assert results[1].status is Status.WARNING and results[0].status is Status.OK
    assert results[1].observed["alone_on_other_gpus"] == 2


def test_the_lines_of_one_fault_are_one_incident(h200, run_rule):
    # several SMs report one fault: 4 lines within a second, then Xid 31 a minute on
    burst = [app_xid(1, 10_000 + i, pid=5) for i in range(4)] + \
        [app_xid(1, 10_060, pid=5, xid=31)]
    assert repeated(run_rule, h200, burst)[1].observed["incidents"] == 1
    # a minute and a second later, or another process: another incident
    assert repeated(run_rule, h200, [*burst, app_xid(1, 10121, pid=5)])[1] \
        .observed["incidents"] == 2
    assert repeated(run_rule, h200, [*burst, app_xid(1, 10061, pid=6)])[1] \
        .observed["incidents"] == 2
    # an incident on GPU 0 a minute after GPU 1's starts is shared; one later is not
    assert repeated(run_rule, h200, [*burst, app_xid(0, 10060, pid=9)])[1] \
        .observed["alone"] == 0
    assert repeated(run_rule, h200, [*burst, app_xid(0, 10061, pid=9)])[1] \
        .observed["alone"] == 1
    # only 13 and 31 count
    assert repeated(run_rule, h200, [app_xid(1, t, pid=t, xid=43) for t in
                                     (10_000, 20_000, 30_000)])[1].observed["incidents"] == 0


def test_lines_without_a_time_are_one_incident_per_process(h200, run_rule):
    untimed = [app_xid(1, None, pid=p) for p in (1, 1, 2, 3)]
    results = repeated(run_rule, h200, untimed)
    assert results[1].observed["incidents"] == 3 and results[1].status is Status.WARNING
    # the same process on another GPU: shared, the app's
    assert repeated(run_rule, h200, [*untimed, app_xid(0, None, pid=3)])[1] \
        .observed["alone"] == 2


def test_the_window_the_ack_and_the_thresholds(h200, run_rule, tmp_path):
    from tests.conftest import overridden

    old = [app_xid(1, t, pid=t, seq=t) for t in (1_000, 2_000, 3_000)]
    # the log ends at 90,000 s: a day back reaches 3,600 s
    assert repeated(run_rule, h200, old)[1].status is Status.OK
    assert repeated(run_rule, h200, old, now_s=87_400)[1].status is Status.WARNING
    assert repeated(run_rule, h200, old, now_s=87_401)[1].status is Status.OK
    rules = overridden(tmp_path, "xid.app_repeated", period_s=100_000, min_incidents=4)
    assert repeated(run_rule, h200, old, rules)[1].status is Status.OK
    four = [*old, app_xid(1, 4000, pid=4, seq=4000)]
    assert repeated(run_rule, h200, four, rules)[1].status is Status.WARNING
    snap = logged(h200, four, now=90_000 * 10**6)
    snap.host.kernel_log.value["acked_seq"] = 1_000
    [gpu1] = [r for r in run_rule("xid.app_repeated", snap, rules=rules) if r.gpu.index == 1]
    assert gpu1.status is Status.OK and gpu1.observed["incidents"] == 3


def test_the_real_h200s_log_has_no_repeated_app_xid(h200, run_rule):
    snap = host(h200, "h200-healthy.kmsg")
    assert {r.status for r in run_rule("xid.app_repeated", snap)} == {Status.OK}
    # an address NVML does not list has no peers to compare with: nothing to say
    lone = [{**app_xid(1, t, pid=t), "pci": "0000:5e:00.0"} for t in (1, 200, 400)]
    assert {r.status for r in repeated(run_rule, h200, lone).values()} == {Status.OK}


def test_xid_31_counts_as_13_does_and_the_pids_are_bounded(h200, run_rule):
    events = [app_xid(1, 10_000 + 100 * n, pid=n, xid=31) for n in range(25)]
    gpu1 = repeated(run_rule, h200, events)[1]
    assert gpu1.status is Status.WARNING and gpu1.observed["alone"] == 25
    assert gpu1.observed["pids"] == list(range(20))  # the first 20 in observed


def test_a_line_exactly_a_minute_after_the_last_is_the_same_incident(h200, run_rule):
    lines = [app_xid(1, 10_000, pid=5), app_xid(1, 10_060, pid=5)]
    assert repeated(run_rule, h200, lines)[1].observed["incidents"] == 1
    # an untimed line of the process, then its timed ones: the first timed one sets the
    # incident's end, so one more than a minute later is another incident
    mixed = [app_xid(1, None, pid=5), app_xid(1, 10_000, pid=5), app_xid(1, 20_000, pid=5)]
    assert repeated(run_rule, h200, mixed)[1].observed["incidents"] == 2


def test_an_untimed_incident_of_the_same_process_elsewhere_is_shared(h200, run_rule):
    timed = [app_xid(1, t, pid=p) for t, p in ((10_000, 1), (20_000, 2), (30_000, 3))]
    gpu1 = repeated(run_rule, h200, [*timed, app_xid(0, None, pid=1)])[1]
    assert gpu1.status is Status.OK and gpu1.observed["alone"] == 2
