"""atomic.write_text writes regular files only: a device, FIFO, socket, directory or symlink
at the path is refused with an OSError that says what it is, and left as it was."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from gpuguard.io.atomic import write_text
from tests.conftest import gpuguard
from tests.daemon.conftest import LIVE


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_writes_a_new_file_and_replaces_a_regular_one(tmp_path: Path) -> None:
    target = tmp_path / "out.prom"
    write_text(target, "one\n")
    assert target.read_text() == "one\n"
    write_text(target, "two\n", mode=0o600)
    assert target.read_text() == "two\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert no_temp_files(tmp_path)


def test_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file \\(a FIFO\\)") as info:
        write_text(fifo, "x")
    assert info.value.filename == str(fifo) and info.value.errno == errno.EINVAL
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert no_temp_files(tmp_path)


def test_refuses_a_symlink_and_leaves_link_and_target(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("kept\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        write_text(link, "x")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "kept\n"
    assert no_temp_files(tmp_path)


def test_refuses_a_symlink_to_a_device(tmp_path: Path) -> None:
    link = tmp_path / "null"
    link.symlink_to("/dev/null")  # only the link is looked at; /dev/null is not touched
    with pytest.raises(OSError, match="symbolic link"):
        write_text(link, "x")
    assert link.is_symlink()


def test_refuses_a_directory(tmp_path: Path) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_text(directory, "x")
    assert directory.is_dir() and not list(directory.iterdir())


def test_refuses_a_character_device(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("making a device node needs root (the test suite runs as root)")
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    with pytest.raises(OSError, match="a character device"):
        write_text(device, "x")
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert no_temp_files(tmp_path)


def test_refuses_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(OSError, match="a socket"):
            write_text(path, "x")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_check_output_onto_a_fifo_exits_3_and_changes_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = gpuguard("check", "--input", str(LIVE), "-o", str(fifo), timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (f"gpuguard: cannot write {fifo}: not a regular file "
                                   "(a FIFO); gpuguard writes only regular files")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_a_file_written_not_durable_is_still_whole_and_skips_only_the_fsyncs(tmp_path, monkeypatch):
    import os as _os

    from gpuguard.io.atomic import write_text as write

    synced: list[int] = []
    real = _os.fsync
    monkeypatch.setattr(_os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    target = tmp_path / "gpu-hardware"
    write(target, "status=ok\n", durable=False)
    assert target.read_text() == "status=ok\n" and synced == []
    assert [p.name for p in tmp_path.iterdir()] == ["gpu-hardware"]  # no temp file left
    write(target, "status=critical\n")
    assert target.read_text() == "status=critical\n" and len(synced) == 2  # file, directory
