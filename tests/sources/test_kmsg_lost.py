"""The driver's lost-GPU lines without an Xid (issue 36, item 1; sources/kmsg_lost.py):
each shape in tests/fixtures/kmsg/lost-* (README.md cites each source) is Xid 79 of the GPU
it names, with or without its PCI domain; the lines of one failed start are one event; the
same words in another's record, or in a continuation of another's record, are nothing."""

from __future__ import annotations

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.judge.xids import UNSUPPORTED, grade
from gpuguard.sources import kmsg
from tests.conftest import FIXTURES

K = FIXTURES / "kmsg"


def lost(name: str) -> list[tuple[int, str | None, str | None]]:
    reading = kmsg.read_file(K / name)
    assert reading.is_ok, reading.describe()
    return [(e["xid"], e["pci"], e.get("line")) for e in reading.get()["xids"]]


@pytest.mark.parametrize(("name", "expected"), [
    ("lost-single-line.log", [(79, "0000:11:00.0", None)]),
    ("lost-short-form.log", [(79, "0000:11:00.0", None)]),
    # the probe failure after the record it sums up is not counted again
    ("lost-multi-line.log", [(79, "0000:11:00.0", None)]),
    ("lost-multi-line.kmsg", [(79, "0000:11:00.0", None)]),
    ("lost-probe-failed.log",
     [(79, None, "The NVIDIA probe routine failed for 1 device(s).")]),
    # RmInitAdapter and rm_init_adapter, a moment apart: one failed start
    ("lost-init-failed.log",
     [(79, "0000:11:00.0", "GPU 0000:11:00.0: RmInitAdapter failed! (0x30:0xffff:1129)")]),
    ("lost-init-failed-old.log", [(79, None, "RmInitAdapter failed! (0x30:0xffff:660)")]),
    ("lost-start-failed.log",
     [(79, "0000:11:00.0", "GPU 0000:11:00.0: rm_init_private_state() failed!"),
      (79, "0000:12:00.0", "Device start failed for 0000:12:00.0 (ret=-5)")]),
    # the older nv.c's, no GPU named: the host's; the probe failure after it sums it up
    ("lost-private-state-old.log", [(79, None, "rm_init_private_state() failed!")]),
    # a GPU the release does not support: tied to its bus id, graded apart (below)
    ("lost-unsupported.log",
     [(79, "0000:11:00.0", "The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:25a0) installed in "
                           "this system is not supported by the")]),
    ("lost-unsupported.kmsg",
     [(79, "0000:11:00.0", "The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:1b38) installed in "
                           "this system is not supported by the")]),
    # open nvidia.ko on a GPU without GSP
    ("lost-unsupported-gsp.log",
     [(79, "0000:11:00.0", "The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:2331) installed in "
                           "this system is not supported by open")]),
    ("lost-unsupported-old.log",
     [(79, "0000:11:00.0", "The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:0fd3) installed in "
                           "this system is not supported by the 304.88")]),
    # the Xid 79 line and the "fallen off" line the driver writes for one loss: one
    ("lost-xid-and-fallen.log", [(79, "0000:11:00.0", None)]),
])
def test_each_shape_is_xid_79_of_the_gpu_it_names(name, expected):
    assert lost(name) == expected


def test_two_failed_starts_apart_are_two(tmp_path):
    path = tmp_path / "k.log"
    line = "NVRM: GPU 0000:11:00.0: RmInitAdapter failed! (0x30:0xffff:1)\n"
    path.write_text(f"[   10.000000] {line}[   70.000000] {line}")
    assert [e["usec"] for e in kmsg.read_file(path).get()["xids"]] == [10_000_000, 70_000_000]


@pytest.mark.parametrize("line", [
    "NVRM: GPU 0000:11:00.0: RmInitAdapter failed! (0x30:0xffff:1129)",
    "NVRM: The NVIDIA probe routine failed for 1 device(s).",
    "NVRM: GPU 11:00.0: GPU has fallen off the bus.",
    "NVRM: Device start failed for 0000:11:00.0 (ret=-5)",
    "NVRM: rm_init_private_state() failed!",
])
def test_the_words_in_anothers_record_are_nothing(tmp_path, line):
    """Issue 26 / 28: only the driver's own records count: a USB product string quoting the
    line, a continuation of another subsystem's record, a record userspace wrote."""
    path = tmp_path / "k.kmsg"
    path.write_text(f"6,1,1000,-;usb 1-1: Product: {line}\n"
                    f"6,2,2000,-;audit: msg=x\\x0a{line}\n"
                    f"12,3,3000,-;{line}\n")
    assert kmsg.read_file(path).get()["xids"] == []
    indented = tmp_path / "k.log"
    indented.write_text(f"[    1.000000] usb 1-1: new device\n               {line}\n")
    assert kmsg.read_file(indented).get()["xids"] == []


def events(tmp_path, text: str) -> list[dict]:
    path = tmp_path / "k.log"
    path.write_text(text)
    return kmsg.read_file(path).get()["xids"]


def test_an_unsupported_gpu_is_graded_to_install_a_release_that_supports_it():
    """Not Xid 79's reboot: the same release loads again after one and says the same."""
    [event] = kmsg.read_file(K / "lost-unsupported.log").get()["xids"]
    assert event["text"] == UNSUPPORTED
    catalog = load_ruleset().xid_catalog
    graded = grade(79, event["text"], catalog)
    assert (graded.severity, graded.first) == ("critical", "update_software")
    assert "install an NVIDIA driver release that supports this GPU" in graded.action
    assert "reboot" not in graded.action
    # a real Xid 79 keeps its reboot
    assert grade(79, "GPU has fallen off the bus.", catalog).first == "reboot"


UNSUPPORTED_PROBE = ("[    8.299192] NVRM: The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:2d04)\n"
                     "               NVRM: installed in this system is not supported by the\n"
                     "               NVRM: NVIDIA 555.58.02 driver release.\n"
                     "[    8.299260] NVRM: The NVIDIA probe routine failed for 1 device(s).\n")
LOAD = ("[{t}] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release "
        "Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025\n")


def test_the_load_after_its_own_probe_is_no_repair_of_the_unsupported_gpu(tmp_path):
    """The driver prints its load line after probing every GPU (one it does not support
    among others it does): that load is the one the probe was of, so its repair (a
    reload, which clears an update_software) takes its place before the probe's lines; a
    load a minute later (a release installed and loaded) comes after them."""
    path = tmp_path / "k.log"
    path.write_text(UNSUPPORTED_PROBE + LOAD.format(t="    8.299300"))
    log = kmsg.read_file(path).get()
    [event], [reload] = log["xids"], log["repairs"]
    assert reload["n"] < event["n"]
    path.write_text(UNSUPPORTED_PROBE + LOAD.format(t="   70.000000"))
    log = kmsg.read_file(path).get()
    [event], [reload] = log["xids"], log["repairs"]
    assert reload["n"] > event["n"]


def test_a_probe_failure_alone_stays_the_hosts_lost_gpu(tmp_path):
    [event] = events(tmp_path, "[   10.439662] NVRM: The NVIDIA probe routine failed for 1 "
                               "device(s).\n")
    assert (event["pci"], event["text"]) == (None, "GPU has fallen off the bus.")


def test_the_unsupported_words_in_anothers_record_are_nothing(tmp_path):
    """Issue 26: the probe's two lines as a continuation of another subsystem's record or
    written from userspace count for nothing."""
    first = "NVRM: The NVIDIA GPU 0000:11:00.0 (PCI ID: 10de:2d04)"
    second = "NVRM: installed in this system is not supported by the"
    path = tmp_path / "k.kmsg"
    path.write_text(f"6,1,1000,-;usb 1-1: Product: {first}\\x0a{second}\n"
                    f"12,2,2000,-;{first}\n12,3,2001,-;{second}\n")
    assert kmsg.read_file(path).get()["xids"] == []


@pytest.mark.parametrize("lines", [
    # the Xid first (osinit.c osHandleGpuLost), the "fallen off" line first, the short form
    ["NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=x, GPU has fallen off the bus.",
     "NVRM: GPU 0000:11:00.0: GPU has fallen off the bus."],
    ["NVRM: GPU 0000:11:00.0: GPU has fallen off the bus.",
     "NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=x, GPU has fallen off the bus."],
    ["NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=x, GPU has fallen off the bus.",
     "NVRM: GPU 11:00.0: GPU has fallen off the bus."],
])
def test_the_xid_79_line_and_the_fallen_off_line_of_one_loss_are_one(tmp_path, lines):
    text = "".join(f"[ 5120.10101{i}] {line}\n" for i, line in enumerate(lines))
    assert [e["pci"] for e in events(tmp_path, text)] == ["0000:11:00.0"]
    # a minute apart: two losses; another GPU's line: its own loss
    apart = f"[ 5120.000000] {lines[0]}\n[ 5180.000000] {lines[1]}\n"
    assert len(events(tmp_path, apart)) == 2
    other = f"[ 5120.000000] {lines[0]}\n[ 5120.000001] {lines[1].replace('11:00', '12:00')}\n"
    assert len(events(tmp_path, other)) == 2
    # three lines: the third is the next loss
    third = text + f"[ 5120.200000] {lines[0]}\n"
    assert len(events(tmp_path, third)) == 2


@pytest.mark.parametrize("name", ["lost-unsupported-upgrade.log",
                                  "lost-unsupported-upgrade-notime.log"])
def test_a_failed_loads_probe_is_not_the_next_loads(name):
    """A load whose probe left no GPU up ("None of the NVIDIA devices were initialized")
    prints no load line: the next load (a new release, seconds later, or in a log without
    a clock) is not that probe's, so its reload comes after the unsupported event and
    clears it (README.md: a stale initramfs's old release, then the new one)."""
    log = kmsg.read_file(K / name).get()
    [event], [reload] = log["xids"], log["repairs"]
    assert event["text"] == UNSUPPORTED
    assert reload["n"] > event["n"]


def test_a_load_long_after_a_failed_one_is_after_it(tmp_path):
    """The control: the new release loaded at 500 s comes after the failed probe."""
    path = tmp_path / "k.log"
    path.write_text((K / "lost-unsupported-upgrade.log").read_text().replace(
        "[    8.2", "[  500.2"))
    log = kmsg.read_file(path).get()
    [event], [reload] = log["xids"], log["repairs"]
    assert reload["n"] > event["n"]
