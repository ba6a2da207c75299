"""gsp.firmware: the kernel log's GSP lines without an Xid (issue 21, item 4), per GPU,
left to xid.recent where Xid 119/120 come with them."""

from __future__ import annotations

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from gpuguard.sources import kmsg
from tests.conftest import FIXTURES, with_gpus

K = FIXTURES / "kmsg"


def logged(h200, log="gsp.kmsg", buses=("00000000:9B:00.0", "00000000:3B:00.0")):
    snap = with_gpus(h200, list(buses))
    snap.host.kernel_log = kmsg.read_file(K / log)
    snap.host.__post_init__()
    return snap


def by_gpu(results):
    return {"host" if r.gpu is None else r.gpu.index: r for r in results}


def test_gsp_lines_are_critical_on_their_gpu_and_the_unnamed_ones_the_hosts(h200, run_rule):
    results = by_gpu(run_rule("gsp.firmware", logged(h200)))
    assert set(results) == {0, 1, "host"}
    # GPU 0 (9b:00): its rate-limit line follows Xid 119s, which xid.recent reports
    assert results[0].status is Status.OK
    assert results[0].message == ("1 GSP error line(s) since boot, with Xid 119: xid.recent "
                                  "reports them")
    assert results[0].observed["with_xid"] == [119] and results[0].action == "none"
    # GPU 1 (3b:00): the same line and no Xid: its own finding, a reset
    gpu1 = results[1]
    assert (gpu1.status, gpu1.action) == (Status.CRITICAL, "reset_gpu")
    assert gpu1.message.startswith("GSP RPC timeouts, rate-limited (the driver: the GPU likely "
                                   "needs to be reset), last 28m ago: drain and reset the GPU")
    assert gpu1.action_reason == "the kernel log's GSP line: rpc timeout"
    # the crash report and the boot failure name the driver's GPU number, not NVML's index
    host = results["host"]
    assert (host.status, host.action) == (Status.CRITICAL, "reboot")
    first, second = host.message.split(" | ")
    assert first.startswith("GPU7 (the driver's number): GSP firmware could not boot")
    assert "drain and reboot the node" in first
    assert second.startswith("GPU0 (the driver's number): GSP crash report (GSP-CrashCat)")
    assert [e["kind"] for e in host.observed["events"]] == ["crash", "boot_failed"]


def test_the_real_h200s_kernel_log_has_no_gsp_error(h200, run_rule):
    [result] = run_rule("gsp.firmware", logged(h200, "h200-healthy.kmsg",
                                               ("00000000:00:06.0",)))
    # the excerpt starts at record 353: it says what it read, not "since boot" (review 3)
    assert (result.status, result.message) == (
        Status.OK, "no GSP error line since [0.579388] (353 earlier kernel log record(s) "
        "overwritten before they were read)")
    assert result.gpu is not None and result.gpu.index == 0


def test_the_window_and_the_ack_leave_old_lines_out(h200, run_rule):
    snap = logged(h200)  # the log ends at 7200 s
    recent = by_gpu(run_rule("gsp.firmware", snap, Profile(xid_window_s=1200)))
    assert recent[1].status is Status.OK and recent[1].observed["aged_out"] == 1
    assert recent[1].message == "no GSP error line in the last 20m"
    assert recent["host"].status is Status.CRITICAL  # the boot failure, 3 minutes old
    snap.host.kernel_log.value["acked_seq"] = 250  # up to GPU 1's rate-limit line
    acked = by_gpu(run_rule("gsp.firmware", snap))
    assert acked[1].status is Status.OK and acked[1].observed["acknowledged"] == 1
    assert acked["host"].status is Status.CRITICAL  # the crash and boot failure came after
    assert acked["host"].observed["acknowledged"] == 0
    snap.host.kernel_log.value["acked_seq"] = 249
    assert by_gpu(run_rule("gsp.firmware", snap))[1].status is Status.CRITICAL


def test_a_gsp_line_whose_xid_aged_out_is_this_rules_again(h200, run_rule):
    """The Xid 119 at 5000 s left a 30-minute window (the log ends at 7200 s), and so did
    the rate-limit line at 5018 s; a fresh one alone in the window is gsp.firmware's."""
    snap = logged(h200)
    snap.host.kernel_log.value["gsp"].append(
        {"kind": "rpc_timeout", "pci": "0000:9b:00.0", "rm_gpu": None, "text": "Rate limiting",
         "seq": 600, "usec": 7100 * 10**6})
    gpu0 = by_gpu(run_rule("gsp.firmware", snap, Profile(xid_window_s=1800)))[0]
    assert gpu0.status is Status.CRITICAL and gpu0.observed["aged_out"] == 1
    assert "with_xid" not in gpu0.observed


def test_without_gpus_every_line_is_the_hosts_and_an_older_input_is_skipped(h200, run_rule):
    snap = logged(h200)
    snap.gpus = []
    [result] = run_rule("gsp.firmware", snap)  # the host's, with the Xid 119 in it
    assert result.gpu is None and result.status is Status.OK
    assert result.observed["with_xid"] == [119]
    [result] = run_rule("gsp.firmware", snap, Profile(xid_window_s=1800))
    assert result.status is Status.CRITICAL
    assert "GSP firmware could not boot" in result.message
    snap.host.kernel_log.value["gsp"] = []
    [result] = run_rule("gsp.firmware", snap)
    assert result.message == "no GSP error line since boot"
    del snap.host.kernel_log.value["gsp"]
    assert run_rule("gsp.firmware", snap)[0].status is Status.SKIPPED
    snap.host.kernel_log = Reading.failed("cannot read /dev/kmsg")
    assert run_rule("gsp.firmware", snap)[0].status is Status.UNKNOWN


def test_repeats_are_counted(h200, run_rule):
    snap = logged(h200)
    line = {"kind": "rpc_timeout", "pci": "0000:3b:00.0", "rm_gpu": None, "text": "x",
            "seq": 700, "usec": 7150 * 10**6}
    snap.host.kernel_log.value["gsp"].append(line)
    gpu1 = by_gpu(run_rule("gsp.firmware", snap))[1]
    assert gpu1.message.startswith("GSP RPC timeouts, rate-limited (the driver: the GPU likely "
                                   "needs to be reset) x2, last 50s ago")
    assert gpu1.observed["counted"] == 2


def test_xid_120_also_leaves_the_finding_to_xid_recent(h200, run_rule):
    snap = logged(h200)
    snap.host.kernel_log.value["xids"] = [
        {"xid": 120, "pci": "0000:3b:00.0", "pid": None, "process": None,
         "text": "GSP task panic", "seq": 240, "usec": 5400 * 10**6}]
    gpu1 = by_gpu(run_rule("gsp.firmware", snap))[1]
    assert gpu1.status is Status.OK and gpu1.observed["with_xid"] == [120]


def test_lines_not_kept_are_counted(h200, run_rule):
    snap = logged(h200)
    assert {r.observed["older_not_kept"] for r in run_rule("gsp.firmware", snap)} == {0}
    del snap.host.kernel_log.value["gsp_dropped"]
    assert {r.observed["older_not_kept"] for r in run_rule("gsp.firmware", snap)} == {0}
    snap.host.kernel_log.value["gsp_dropped"] = 7
    assert {r.observed["older_not_kept"] for r in run_rule("gsp.firmware", snap)} == {7}


def test_a_crash_report_naming_no_gpu_at_all_says_no_number(h200, run_rule):
    """The crash report as some drivers print it, without "GPU0" (a user's report quoted
    in NVIDIA/open-gpu-kernel-modules#1271): the host's, and no made-up GPU number."""
    snap = logged(h200)
    snap.host.kernel_log.value["gsp"] = [
        {"kind": "crash", "pci": None, "rm_gpu": None,
         "text": "NVRM: kgspHealthCheck_TU102: ***** GSP-CrashCat Report *****",
         "seq": 300, "usec": 6000 * 10**6}]
    host = by_gpu(run_rule("gsp.firmware", snap))["host"]
    assert host.status is Status.CRITICAL
    assert host.message.startswith("GSP crash report (GSP-CrashCat)")
