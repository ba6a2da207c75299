"""The driver's lost-GPU lines without an Xid (issue 36, item 1; sources/kmsg_lost.py):
each shape in tests/fixtures/kmsg/lost-* (README.md cites each source) is Xid 79 of the GPU
it names, with or without its PCI domain; the lines of one failed start are one event; the
same words in another's record, or in a continuation of another's record, are nothing."""

from __future__ import annotations

import pytest

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
