"""Review 3: a flood of newer lines never evicts an older fatal one from the kernel-log
summary. The newest N lines are kept as before, and outside that bound the latest line of
each (GPU, code) (of each (GSP kind, GPU), of each (NVSwitch, SXid)), so a fatal Xid 48
followed by 2,500 Xid 13s is still there (scripts in review3/xid_flood_evicts_fatal_xid.sh)."""

from __future__ import annotations

from gpuguard.sources import kmsg
from gpuguard.sources.kmsg_gpu import MAX_GSP

XID_48 = "NVRM: Xid (PCI:0000:00:06): 48, pid=1, name=x, An uncorrectable double bit error (DBE)"
XID_13 = "NVRM: Xid (PCI:0000:00:06): 13, pid={}, name=python, Graphics Exception: ESR 0x50"


def read(tmp_path, lines):
    path = tmp_path / "kmsg.log"
    path.write_text("".join(f"[ {100 + i}.000000] {text}\n" for i, text in enumerate(lines)))
    reading = kmsg.read_file(path)
    assert reading.is_ok, reading.describe()
    return reading.get()


def test_a_flood_of_app_xids_keeps_the_fatal_xid_before_it(tmp_path):
    flood = kmsg.MAX_XIDS + 500
    log = read(tmp_path, [XID_48, *(XID_13.format(1000 + i) for i in range(flood))])
    codes = [e["xid"] for e in log["xids"]]
    assert codes[0] == 48 and codes.count(13) == kmsg.MAX_XIDS  # the 48, then the newest 13s
    assert log["xids"][0]["usec"] == 100 * 10**6
    assert log["xids_dropped"] == 500  # the oldest 13s: their latest of the pair is kept
    # the log's order holds: what a repair is compared with (`n`) still rises
    assert [e["n"] for e in log["xids"]] == sorted(e["n"] for e in log["xids"])


def test_a_fatal_word_of_its_own_line_is_its_own_pair(tmp_path):
    """Xid 154's grade is in its line: a Node Reboot Required 154 is not evicted by a flood
    of later 154s that say None."""
    reboot = ("NVRM: Xid (PCI:0000:00:06): 154, pid=1, name=x, GPU recovery action changed "
              "from 0x0 (None) to 0x2 (Node Reboot Required)")
    none = ("NVRM: Xid (PCI:0000:00:06): 154, pid=1, name=x, GPU recovery action changed "
            "from 0x2 (Node Reboot Required) to 0x0 (None)")
    log = read(tmp_path, [reboot, *([none] * (kmsg.MAX_XIDS + 1))])
    assert "Node Reboot Required)" in log["xids"][0]["text"] and len(log["xids"]) == \
        kmsg.MAX_XIDS + 1


def test_a_flood_of_gsp_lines_of_one_gpu_keeps_anothers(tmp_path):
    crash = "NVRM: GPU0 kgspHealthCheck_TU102: ********* GSP-CrashCat Report *********"
    rate = ("NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:3b:00 (printing 1 of "
            "every 30).  The GPU likely needs to be reset.")
    log = read(tmp_path, [crash, *([rate] * (MAX_GSP + 10))])
    assert [e["kind"] for e in log["gsp"][:2]] == ["crash", "rpc_timeout"]
    assert len(log["gsp"]) == MAX_GSP + 1 and log["gsp_dropped"] == 10


def test_a_flood_of_sxids_keeps_the_fatal_one_before_it(tmp_path):
    fatal = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 3 NVLink error"
    noise = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link {} egress error"
    log = read(tmp_path, [fatal, *(noise.format(i % 64) for i in range(kmsg.MAX_XIDS + 5))])
    assert log["sxids"][0]["sxid"] == 24007 and log["sxids_dropped"] == 5


def test_a_fatal_sxid_that_began_with_its_data_line_is_not_lost_to_later_non_fatal_ones(
        tmp_path):
    """An SXid's first line is often its Data line, which carries no Fatal word: the event is
    keyed again when its description comes, and a later non-fatal event that began with the
    same Data line does not take the fatal one's place."""
    data = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Data {0x0, 0x1}"
    fatal = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 3 NVLink error"
    noise = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Non-fatal, Link 4 NVLink error"
    log = read(tmp_path, [data, fatal, *([data, noise] * (kmsg.MAX_XIDS + 1))])
    assert log["sxids"][0]["text"].startswith("Fatal") and log["sxids_dropped"] == 1
