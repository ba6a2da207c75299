from pathlib import Path

import pytest

from gpuguard.model.pci import normalise_pci
from gpuguard.sources import kmsg
from tests.conftest import FIXTURES

K = FIXTURES / "kmsg"


def xids(name):
    reading = kmsg.read_file(K / name)
    assert reading.is_ok, reading.describe()
    return reading.get()


@pytest.mark.parametrize("name", ["xids.kmsg", "dmesg.log", "dmesg-raw.log", "dmesg-notime.log"])
def test_every_format_gives_the_same_xids(name):
    log = xids(name)
    assert [(e["xid"], e["pci"]) for e in log["xids"]] == [
        (13, "0000:86:00.0"), (45, "0000:86:00.0"), (63, "0000:3b:00.0"),
        (94, "0000:3b:00.0"), (154, "0000:3b:00.0"), (119, "0000:00:06.0"),
        (999, "0000:3b:00.0")]
    first = log["xids"][0]
    assert (first["pid"], first["process"]) == (4121, "python3")
    assert first["text"].startswith("Graphics SM Warp Exception")
    gsp = log["xids"][5]
    assert gsp["pid"] is None and gsp["process"] is None


def test_kmsg_keeps_sequence_numbers_and_times():
    log = xids("xids.kmsg")
    assert [e["seq"] for e in log["xids"]][:2] == [900, 901]
    assert log["xids"][0]["usec"] == 1_200_000_000
    assert log["now_usec"] == 7_200_000_000  # a saved log ends at its last record
    assert log["records"] == 12  # dictionary lines ( SUBSYSTEM=...) are not records


def test_timestamps_per_format():
    assert xids("dmesg.log")["xids"][0]["usec"] == 1_200_000_000
    assert xids("dmesg-raw.log")["xids"][0]["seq"] is None
    assert xids("dmesg-notime.log")["xids"][0]["usec"] is None


def test_fallen_off_the_bus_without_the_word_xid_is_79():
    [event] = xids("fallen-off.log")["xids"]
    assert (event["xid"], event["pci"]) == (79, "0000:5e:00.0")


def test_unsigned_module_and_api_mismatch():
    assert xids("unsigned-module.log")["unsigned_module_rejected"] is True
    assert xids("xids.kmsg")["unsigned_module_rejected"] is False
    assert xids("api-mismatch.log")["api_mismatch"] == {"client": "580.159.04",
                                                         "kernel": "570.133.20"}


def test_pci_addresses_are_normalised():
    assert normalise_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalise_pci("0000:3b:00") == "0000:3b:00.0"
    assert normalise_pci("PCI:0000:3b:00".removeprefix("PCI:")) == "0000:3b:00.0"


def test_a_log_whose_last_line_has_no_newline_is_read_and_says_it_may_be_cut(tmp_path):
    """A pasted excerpt without its last newline (issue 36, item 4): every line is read,
    the last one too, and the summary names the line; a whole log has no such key."""
    text = (K / "xids.kmsg").read_text()
    path = tmp_path / "cut.log"
    path.write_text(text.rstrip("\n"))
    reading = kmsg.read_file(path)
    whole = kmsg.read_file(K / "xids.kmsg").get()
    assert reading.is_ok
    summary = reading.get()
    assert summary["cut_line"] == text.rstrip("\n").rsplit("\n", 1)[-1][:80]
    assert {k: v for k, v in summary.items() if k not in ("cut_line", "source")} == \
        {k: v for k, v in whole.items() if k != "source"}
    assert "cut_line" not in whole


def test_a_log_cut_mid_line_reads_the_cut_line_as_it_is(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text((K / "dmesg.log").read_text()[:-40])
    reading = kmsg.read_file(path)
    assert reading.is_ok and reading.get()["cut_line"]


def test_binary_log(tmp_path):
    path = tmp_path / "kmsg.bin"
    path.write_bytes(b"\x7fELF\x02\x01\x00\x00" * 64)
    reading = kmsg.read_file(path)
    assert reading.state == "error" and "binary" in (reading.error or "")


def test_missing_log(tmp_path):
    reading = kmsg.read_file(tmp_path / "nope.log")
    assert reading.state == "error" and "No such file" in (reading.error or "")


@pytest.mark.live(needs="the host's /dev/kmsg (read only)")
def test_live_dev_kmsg_reads_or_says_why():
    if not Path("/dev/kmsg").exists():
        pytest.skip("this host has no /dev/kmsg")
    reading = kmsg.read_device(Path("/dev/kmsg"))
    if reading.is_ok:
        log = reading.get()
        assert log["source"] == "/dev/kmsg" and log["records"] > 0
        assert log["now_usec"] > 0
    else:  # unprivileged: the reason, never an empty "ok"
        assert "CAP_SYSLOG" in (reading.error or "") or "cannot read" in (reading.error or "")


def test_nvswitch_sxids_one_entry_per_event():
    log = xids("sxids.kmsg")
    assert [e["xid"] for e in log["xids"]] == [45]  # an SXid is not an Xid
    assert [(e["sxid"], e["switch"], e["link"]) for e in log["sxids"]] == [
        (22013, "0000:04:00.0", 44), (22013, "0000:04:00.0", 45),
        (12028, "0000:05:00.0", 32), (20034, "0000:07:00.0", 14),
        (12028, "0000:84:00.0", None)]  # a Data line alone: still an event, no link
    first = log["sxids"][0]
    # Data, description and Severity lines of one event: one entry, the description's
    # text, the first line's sequence number and time
    assert first["text"] == "Non-fatal, Link 44 Minion Link DLREQ interrupt"
    assert (first["seq"], first["usec"]) == (1201, 38175561)
    assert log["sxids"][3]["text"] == "Fatal, Link 14 LTSSM Fault Up"
    assert log["sxids_dropped"] == 0


def test_sxids_are_bounded(tmp_path):
    line = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link {} egress error\n"
    path = tmp_path / "storm.log"
    path.write_text("".join(line.format(i % 64) for i in range(kmsg.MAX_XIDS + 10)))
    log = xids(path)
    assert len(log["sxids"]) == kmsg.MAX_XIDS and log["sxids_dropped"] == 10
    assert log["sxids"][-1]["link"] == (kmsg.MAX_XIDS + 9) % 64


def test_a_saved_log_is_timed_by_its_highest_stamp_so_no_age_is_negative(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("[  100.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=x, GPU has "
                   "fallen off the bus.\n[    5.000000] an earlier boot's line\n")
    summary = kmsg.read_file(log).get()
    assert summary["now_usec"] == 100_000_000


# -- GSP lines without an Xid and the driver's loads (issue 21; sources/kmsg_gpu.py) ------

def test_each_gsp_pattern_is_read_with_its_gpu():
    """One fixture line per pattern (tests/fixtures/kmsg/gsp.kmsg; the sources are named in
    sources/kmsg_gpu.py): the rate-limit line names its GPU by PCI address, the crash report
    and the boot failure by the driver's own number; a boot failure's lines are one event;
    the lines about an Xid 119 (its RPC buffer) are not GSP errors of their own."""
    log = kmsg.read_file(FIXTURES / "kmsg" / "gsp.kmsg").get()
    assert [(e["kind"], e["pci"], e["rm_gpu"], e["seq"]) for e in log["gsp"]] == [
        ("rpc_timeout", "0000:9b:00.0", None, 202), ("rpc_timeout", "0000:3b:00.0", None, 250),
        ("crash", None, 0, 300), ("boot_failed", None, 7, 400)]
    assert log["gsp_dropped"] == 0
    # the RmInitAdapter failure after the GSP boot failure is a lost GPU (issue 36)
    assert [(x["xid"], x["pci"]) for x in log["xids"]] == [(119, "0000:9b:00.0"),
                                                          (79, "0000:a2:00.0")]
    # each load of the driver, open or proprietary module; the second is a reload (issue 21,
    # item 3), before every GSP line, so it clears none of them
    assert log["driver_loads"] == [{"version": "570.195.03", "seq": 50, "usec": 500_000},
                                   {"version": "580.159.04", "seq": 100, "usec": 1_000_000}]
    assert [(r["kind"], r["seq"]) for r in log["repairs"]] == [("driver_reload", 100)]


def test_the_real_h200s_log_holds_a_driver_load_and_no_gsp_error():
    log = kmsg.read_file(FIXTURES / "kmsg" / "h200-healthy.kmsg").get()
    assert log["gsp"] == [] and log["xids"] == []
    assert [d["version"] for d in log["driver_loads"]] == ["580.159.04"]


def test_gsp_lines_are_bounded_and_the_rest_counted(tmp_path):
    from gpuguard.sources.kmsg_gpu import MAX_GSP

    path = tmp_path / "storm.log"
    path.write_text("".join(
        f"[ {n}.000000] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:3b:00 "
        "(printing 1 of every 30).  The GPU likely needs to be reset.\n"
        for n in range(1, MAX_GSP + 51)))
    log = kmsg.read_file(path).get()
    assert len(log["gsp"]) == MAX_GSP and log["gsp_dropped"] == 50
    assert log["gsp"][-1]["usec"] == (MAX_GSP + 50) * 10**6  # the newest are kept


def test_a_second_boot_failure_line_within_a_second_is_the_same_event(tmp_path):
    path = tmp_path / "boot.log"
    line = "NVRM: GPU7 RmInitAdapter: Cannot initialize GSP firmware RM\n"
    path.write_text(f"[ 10.000000] {line}[ 10.900000] {line}[ 12.000000] {line}")
    assert [e["usec"] for e in kmsg.read_file(path).get()["gsp"]] == [10_000_000, 12_000_000]


# -- repairs: a GPU reset, a driver reload (issue 21, item 3; sources/kmsg_gpu.py) -------

def test_each_repair_pattern_is_read_in_the_logs_order():
    """One fixture line per pattern (tests/fixtures/kmsg/repairs.kmsg; the sources are named
    in sources/kmsg_gpu.py): NVSentinel's reset line naming the GPU by UUID, the same naming
    it by bus id, and a load of the driver after the first (a reload); the boot's first load
    is no repair. Each carries its place among the driver's lines, as the Xids and GSP
    lines do, so that a repair clears what came before it."""
    log = kmsg.read_file(FIXTURES / "kmsg" / "repairs.kmsg").get()
    assert [(r["kind"], r["uuid"], r["pci"], r["seq"], r["usec"]) for r in log["repairs"]] == [
        ("gpu_reset", "GPU-fa4e0000-0000-0000-0000-000000000000", None, 210, 5_100_000_000),
        ("gpu_reset", None, "0000:11:00.0", 211, 5_200_000_000),
        ("driver_reload", None, None, 300, 6_000_000_000)]
    places = [x["n"] for x in log["xids"]] + [g["n"] for g in log["gsp"]]
    assert max(places) < min(r["n"] for r in log["repairs"])
    assert [d["seq"] for d in log["driver_loads"]] == [100, 300]


def test_a_load_after_the_drivers_lines_is_a_reload_even_without_an_earlier_load(tmp_path):
    """The ring buffer overwrote the boot's first load: a load after an Xid is a reload."""
    path = tmp_path / "wrapped.kmsg"
    path.write_text(
        "4,900,5000000000,-;NVRM: Xid (PCI:0000:10:00): 48, pid=1, name=x, DBE.\n"
        "6,901,6000000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
        "580.159.04  Release Build  (nixbld@)\n")
    log = kmsg.read_file(path).get()
    assert [r["kind"] for r in log["repairs"]] == ["driver_reload"]
    assert kmsg.read_file(FIXTURES / "kmsg" / "h200-healthy.kmsg").get()["repairs"] == []


def test_the_reset_phrase_quoted_inside_another_message_is_no_reset(tmp_path):
    """A reset clears findings: the phrase inside another line (a process or device name,
    a relayed user text) is not one (review 4); the whole record, or a writer's tag and the
    record, is."""
    uuid = "GPU-fa4e0000-0000-0000-0000-000000000000"
    path = tmp_path / "quoted.kmsg"
    path.write_text(
        f"4,1,1000000,-;audit: comm=\"x\" msg=GPU reset occurred: {uuid}\n"
        f"4,2,2000000,-;usb 1-1: GPU reset occurred: {uuid} and more\n"
        f"12,3,3000000,-;nvsentinel[42]: GPU reset occurred: {uuid}\n"
        f"12,4,4000000,-;GPU reset occurred: PCI:0000:11:00.0\n")
    log = kmsg.read_file(path).get()
    assert [(r["seq"], r["uuid"], r["pci"]) for r in log["repairs"]] == [
        (3, uuid, None), (4, None, "0000:11:00.0")]


# -- the driver's own records only (issue 28, item 1; sources/kmsg_records.py) -----------

def test_the_probes_fallen_off_the_bus_record_is_xid_79_of_the_gpu_it_names():
    """NVIDIA/NVSentinel#155: three lines of one record, no Xid (the old code read none)."""
    log = xids("fallen-off-probe.log")
    assert [(e["xid"], e["pci"], e["usec"]) for e in log["xids"]] == [
        (79, "0000:b3:00.0", 1_843_308_145)]
    assert [d["version"] for d in log["driver_loads"]] == ["570.158.01"]


def test_the_api_mismatch_that_names_its_client_gives_both_versions():
    """Drivers 575 and later (NVIDIA/open-gpu-kernel-modules#829), as journalctl -k prints
    them (the old code read neither version)."""
    assert xids("api-mismatch-575.log")["api_mismatch"] == {"client": "570.133.07",
                                                             "kernel": "575.51.02"}


def test_each_decorated_format_is_read_as_its_record(tmp_path):
    """dmesg -T, dmesg -x with ISO times, journalctl -k: one header stripped, the rest the
    record (tests/fixtures/kmsg/README.md names the sources)."""
    assert [e["xid"] for e in xids("dmesg-ctime.log")["xids"]] == [13, 13, 13, 109]
    assert [e["xid"] for e in xids("journal-k.log")["xids"]] == [45, 45, 45]
    assert xids("journal-k.log")["api_mismatch"] == {"client": "535.54.03",
                                                     "kernel": "530.30.02"}
    iso = xids("dmesg-decode-iso.log")
    assert [(e["sxid"], e["switch"]) for e in iso["sxids"]] == [(12028, "0000:84:00.0"),
                                                                 (20034, "0000:07:00.0")]
    assert [e["xid"] for e in iso["xids"]] == [48]


def test_a_process_name_and_a_file_name_make_no_driver_line(tmp_path):
    """The kernel begins a segfault's line with the process's name (15 characters it
    chooses) and ends it with the mapped file's name (anyone's): `NVRM: GPU x` and a file
    called "fallen off the bus" (or "GSP-CrashCat Report") is no Xid 79 (no GSP crash)."""
    path = tmp_path / "segv.kmsg"
    path.write_text("".join(
        f"6,{i},{i * 1000},-;{comm}[4242]: segfault at 0 ip 00007f0000001000 sp "
        f"00007ffd00000000 error 4 in {file}[7f0000000000+1000]\n"
        for i, (comm, file) in enumerate([
            ("NVRM: GPU x", "GPU has fallen off the bus"),
            ("NVRM: GPU0 x", "GSP-CrashCat Report"),
            ("NVRM: GPU7 x: a", "cannot proceed with booting GSP"),
            ("NVRM: x", "kernel module has the version 1.2.3"),
            ("nvidia-nvswitch", "SXid (PCI:0000:05:00.0): 20034, Fatal")])))
    log = kmsg.read_file(path).get()
    assert (log["xids"], log["gsp"], log["sxids"], log["api_mismatch"]) == ([], [], [], None)


def test_a_device_read_is_split_into_its_records_lines(tmp_path):
    """One read of /dev/kmsg is a record with its dictionary lines; a file read as the
    device (`gpuguard xid ack --kmsg-file`) comes in 16 KiB pieces: both are read line by
    line, so a record is judged by its own header, whole (before: a piece was a "line", and
    the Xid across a piece's end was lost)."""
    path = tmp_path / "kmsg"
    pad = "".join(f"6,{i},{i * 1000},-;eth0: link flap {i:05d}\n" for i in range(500))
    xid = ("4,900,9000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen "
           "off the bus.\n")
    filler = "6,800,8000000,-;"
    end = 16384 * (len(pad) // 16384 + 1)  # the end of the piece the Xid's line starts in
    cut = end - 20 - len(pad) - len(filler) - 1
    assert cut > 0
    path.write_text(pad + filler + "x" * cut + "\n" + xid +
                    "6,901,9000001,-;usb 1-1: Product: hub\n SUBSYSTEM=usb\n DEVICE=c189:1\n")
    log = kmsg.read_device(path).get()
    assert [(e["xid"], e["seq"]) for e in log["xids"]] == [(79, 900)]
    assert log["records"] == 503 and log["last_seq"] == 901


def test_a_line_ends_at_a_newline_only(tmp_path):
    """A USB string holding U+2028 (or \\x0b, \\x1c, U+0085) before an Xid line: one line,
    the USB record's, not a driver line of its own (str.splitlines() splits there)."""
    path = tmp_path / "dmesg.txt"
    quote = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus."
    path.write_text("".join(f"[ {i}.000000] usb 1-1: Product: hub{sep}{quote}\n"
                            for i, sep in enumerate(["\u2028", "\x0b", "\x1c", "\x85"], 1)))
    log = kmsg.read_file(path).get()
    assert log["xids"] == [] and log["records"] == 4
