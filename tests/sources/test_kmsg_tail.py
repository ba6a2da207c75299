"""The daemon's kernel log read where it left off (issue 32, sources/kmsg_tail.py) gives at
every read exactly the summary a whole read gives then: the Xid fixtures read piece by
piece, issue 28's quoted-driver-line corpus (every driver line inside another subsystem's
record, in every format: tests/sources/test_kmsg_driver_prefix.py), a saved log truncated,
replaced, rewritten or half written, and /dev/kmsg (a ring buffer of the test's own) whose
front is pushed out, or whose reader is overtaken (EPIPE)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gpuguard.io.atomic import write_text
from gpuguard.sources import kmsg
from gpuguard.sources.kmsg_records import LineParser
from gpuguard.sources.kmsg_tail import Device, FileTail, KernelLogTail
from tests.conftest import FIXTURES
from tests.sources import test_kmsg_driver_prefix as prefix

LOGS = sorted(p for p in (FIXTURES / "kmsg").iterdir() if p.suffix in (".kmsg", ".log"))


def whole(path: Path) -> dict[str, Any]:
    reading = kmsg.read_file(path)
    return reading.get() if reading.is_ok else {"failed": reading.error}


def tailed(tail: FileTail) -> dict[str, Any]:
    reading = tail.read(5.0)
    return reading.get() if reading.is_ok else {"failed": reading.error}


def pieces(text: str, every: int) -> list[str]:
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + every]) for i in range(0, len(lines), every)]


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("every", [1, 2, 5])
def test_a_fixture_appended_piece_by_piece_reads_as_the_whole_file(tmp_path, log, every):
    """Each piece appended (a record's continuation lines in the next piece too), then
    read: the summary is the whole file's, read now."""
    path = tmp_path / "kmsg.log"
    path.write_text("")
    tail = FileTail(path)
    assert tailed(tail) == whole(path)
    for piece in pieces(log.read_text(), every):
        with path.open("a") as f:
            f.write(piece)
        assert tailed(tail) == whole(path)
        assert tailed(tail) == whole(path)  # unchanged: the kept summary again
    assert tailed(tail) == whole(log) | {"source": str(path)}


def corpus() -> list[tuple[str, list[str]]]:
    cases = []
    for fmt in prefix.FORMATS:
        for name in prefix.DRIVER:
            for other in prefix.OTHERS:
                for where in (0, 1, 3):
                    for continuation in (False, True):
                        case = prefix.quoted_case(fmt, name, other, where, continuation)
                        if case is not None:
                            cases.append((f"{fmt}/{name}/{other[0]}/{where}/{continuation}",
                                          prefix.render(fmt, case)))
    return cases


def test_the_quoted_driver_line_corpus_fed_line_by_line_is_the_whole_read():
    """Issue 28's corpus (every quoted driver line in every format and place), fed a line
    at a time to one summary: after each line, what a whole read of the lines so far
    gives; the record a continuation line continues is carried across the pieces."""
    cases = corpus()
    assert len(cases) > 1000
    for label, lines in cases:
        parser, summary = LineParser(), kmsg.LogSummary()
        for i, line in enumerate(lines):
            summary.feed(parser.feed([line]))
            assert summary.result("t", 1) == kmsg.summarise(
                kmsg.parse_lines(lines[:i + 1]), "t", 1), (label, i)


@pytest.mark.parametrize("fmt", prefix.FORMATS)
def test_the_corpus_through_a_saved_log_read_as_it_grows(tmp_path, fmt):
    path = tmp_path / "kmsg.log"
    for label, lines in (c for c in corpus() if c[0].startswith(f"{fmt}/xid")):
        path.write_text("")
        tail = FileTail(path)
        for line in [*prefix.render(fmt, prefix.BASE), *lines]:
            with path.open("a") as f:
                f.write(line + "\n")
            assert tailed(tail) == whole(path), label


def test_a_saved_log_truncated_replaced_or_rewritten_is_read_whole(tmp_path):
    path = tmp_path / "kmsg.log"
    xids = (FIXTURES / "kmsg" / "xids.kmsg").read_text().splitlines(keepends=True)
    path.write_text("".join(xids))
    tail = FileTail(path)
    assert tailed(tail) == whole(path)
    path.write_text("".join(xids[:3]))  # truncated, in place
    assert tailed(tail) == whole(path)
    write_text(path, "".join(xids[5:]))  # replaced (a new inode): the front gone
    assert tailed(tail) == whole(path)
    # rewritten in place as `dmesg > file` rewrites a full ring buffer: as long or longer,
    # its front gone
    front_gone = "".join(xids[1:]) + xids[0]
    path.write_text(front_gone)
    assert tailed(tail) == whole(path)
    path.write_text(front_gone.replace("Xid", "Xix", 1))  # the same size, its start changed
    assert tailed(tail) == whole(path)
    os.utime(path, ns=(1, 1))  # only its times changed: the same bytes
    assert tailed(tail) == whole(path)


def test_a_line_half_written_reads_as_a_whole_read_cut_and_is_read_when_whole(tmp_path):
    """The half line is read as the whole read reads it (cut, and said so: issue 36), and
    the next read, with the line's end, is the whole file's, not the half line's rest as a
    line of its own."""
    path = tmp_path / "kmsg.log"
    lines = (FIXTURES / "kmsg" / "xids.kmsg").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:4]))
    tail = FileTail(path)
    assert tailed(tail) == whole(path)
    with path.open("a") as f:
        f.write(lines[4][:20])
    half = tailed(tail)
    assert half == whole(path) and half["cut_line"] == lines[4][:20]
    with path.open("a") as f:
        f.write(lines[4][20:])
    assert tailed(tail) == whole(path) and "cut_line" not in tailed(tail)
    assert len(tailed(tail)["xids"]) == len(kmsg.read_file(path).get()["xids"])


@pytest.mark.parametrize("bad", [b"\0\0binary\n", b"\xff\xfe not utf-8\n"])
def test_bad_bytes_appended_are_the_whole_reads_failure_in_its_words(tmp_path, bad):
    path = tmp_path / "kmsg.log"
    path.write_text("6,0,1000,-;eth0: link up\n")
    tail = FileTail(path)
    tailed(tail)
    with path.open("ab") as f:
        f.write(bad)
    failed = tailed(tail)
    assert "failed" in failed and failed == whole(path)


def test_an_sxid_event_split_across_reads_leaves_the_last_summary_as_it_was(tmp_path):
    """result() hands out copies: the next read's line of the same SXid event changes the
    new summary, not one handed out before (the daemon's memory keeps those)."""
    path = tmp_path / "kmsg.log"
    head = "4,0,1000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x0}\n"
    path.write_text(head)
    tail = FileTail(path)
    first = tailed(tail)
    with path.open("a") as f:
        f.write("4,1,1001,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 "
                "LTSSM Fault Up\n")
    second = tailed(tail)
    assert second == whole(path) and second["sxids"][0]["link"] == 14
    assert first["sxids"][0]["text"] == "Data {0x0}" and first["sxids"][0]["link"] is None


class Ring(Device):
    """/dev/kmsg as the kernel serves it: a ring of `capacity` records, each read one record
    (and its dictionary lines); a reader whose next record was overwritten gets EPIPE and
    goes on at the first one held; a new descriptor, or one sought to 0, at the first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[str] = []  # every record logged, by sequence number
        self.pos: dict[int, int] = {}
        self.opened = 0

    def first(self) -> int:
        return max(0, len(self.records) - self.capacity)

    def log(self, text: str) -> None:
        """A record: its text after the header, its dictionary lines after it."""
        seq = len(self.records)
        self.records.append(f"4,{seq},{(1000 + seq) * 1_000_000},-;{text}\n")

    def held(self) -> list[str]:
        return "".join(self.records[self.first():]).split("\n")

    def open(self, path: Path) -> int:
        self.opened += 1
        self.pos[self.opened] = self.first()
        return self.opened

    def read(self, fd: int, size: int) -> bytes:
        if self.pos[fd] < self.first():
            self.pos[fd] = self.first()
            raise OSError(errno.EPIPE, "Broken pipe")
        if self.pos[fd] >= len(self.records):
            raise BlockingIOError
        self.pos[fd] += 1
        return self.records[self.pos[fd] - 1].encode()

    def seek_first(self, fd: int) -> None:
        self.pos[fd] = self.first()

    def close(self, fd: int) -> None:
        del self.pos[fd]


def device_read(tail: KernelLogTail, ring: Ring, path: Path) -> tuple[dict[str, Any], ...]:
    """The tail's summary and the whole read's of what the ring holds, times apart."""
    reading = tail.read(path, 5.0)
    assert reading.is_ok, reading.error
    got = dict(reading.get())
    got.pop("now_usec")
    want = kmsg.summarise(kmsg.parse_lines(ring.held()), str(path), 0)
    want.pop("now_usec")
    return got, want


def fixture_records() -> list[str]:
    """Every record of the /dev/kmsg fixtures, as text after the header (renumbered)."""
    out = []
    for log in LOGS:
        if log.suffix == ".kmsg":
            for line in log.read_text().splitlines():
                if not line.startswith(" "):
                    out.append(line.split(";", 1)[1])
    return out


@pytest.fixture
def char_device(tmp_path, monkeypatch):
    """A path the tail takes for a character device (it is the test's ring)."""
    path = tmp_path / "kmsg"
    path.write_text("")
    real = os.stat

    class Char:
        def __init__(self, st: os.stat_result) -> None:
            self.st = st
            self.st_mode = 0o20600  # S_IFCHR

    monkeypatch.setattr("gpuguard.sources.kmsg_tail.os.stat",
                        lambda p, *a, **k: Char(real(p)) if Path(p) == path else real(p))
    return path


@pytest.mark.parametrize("capacity", [10_000, 40, 7])
@pytest.mark.parametrize("every", [1, 3, 50])
def test_dev_kmsg_read_where_it_left_off_is_the_whole_read_across_a_wrap(char_device,
                                                                        capacity, every):
    """The fixtures' records logged `every` at a time into a ring of `capacity`: the front
    pushed out (a full ring), and at 7 a reader overtaken between reads (EPIPE)."""
    ring = Ring(capacity)
    tail = KernelLogTail(ring)
    records = fixture_records() * 3
    for i in range(0, len(records), every):
        for text in records[i:i + every]:
            ring.log(text)
        got, want = device_read(tail, ring, char_device)
        assert got == want, i
        again, want = device_read(tail, ring, char_device)
        assert again == want


def test_dev_kmsg_is_kept_open_and_read_only_for_what_is_new(char_device):
    ring = Ring(10_000)
    tail = KernelLogTail(ring)
    for i in range(100):
        ring.log(f"eth0: link flap {i}")
    device_read(tail, ring, char_device)
    reads = []
    real_read = ring.read
    ring.read = lambda fd, size: reads.append(fd) or real_read(fd, size)  # type: ignore
    ring.log("NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE")
    got, want = device_read(tail, ring, char_device)
    assert got == want and [e["xid"] for e in got["xids"]] == [48]
    assert ring.opened == 2  # the reader and the front's, opened once
    assert len(reads) == 3  # the front's first record, the new one, the end


def test_dev_kmsg_that_never_ends_fails_as_the_whole_read_does(char_device):
    class Endless(Ring):
        def read(self, fd: int, size: int) -> bytes:
            return b"\0" * size

    reading = KernelLogTail(Endless(1)).read(char_device, 0.5)
    assert not reading.is_ok and "not a kernel log device?" in (reading.error or "")
