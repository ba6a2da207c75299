"""The store's files in a folder others may write (issue 20, item 13): the writer opens
events.db, its -wal and -shm only when each is a regular file of its own user with one
link (lstat before, fstat after, the same inode), changes permissions only through a
descriptor opened with O_NOFOLLOW, and refuses otherwise: the target of a planted link
is never changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter

ROOT = os.geteuid() == 0


def event() -> Event:
    return Event(kind="rule", source="daemon", time=time.time(), rule="pcie.replays",
                 status="warning", gpu_index=0, message="m")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir a group may write (the mistake an admin can make), with a target a
    member would like root to change: a file of root's, mode 0600."""
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o2775)
    secret = tmp_path / "secret"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    return folder


def untouched(tmp_path: Path) -> bool:
    secret = tmp_path / "secret"
    return secret.read_text() == "root's own\n" and secret.stat().st_mode & 0o777 == 0o600


def refused(writer: EventWriter) -> bool:
    return writer.flush() == 0 and writer.stats.dropped.get("unsafe_file", 0) > 0


def test_a_store_swapped_for_a_symlink_is_refused_and_its_target_untouched(state, tmp_path):
    path = state / "events.db"
    writer = EventWriter(path, "b1")
    writer.record(event())
    assert writer.flush() == 1
    writer.close()
    path.unlink()
    path.symlink_to(tmp_path / "secret")
    again = EventWriter(path, "b1")  # the daemon restarted
    again.record(event())
    assert refused(again)
    assert untouched(tmp_path)
    assert path.is_symlink()  # left as it is, for the admin to see
    again.close()


def test_a_swap_under_a_running_writer_is_noticed_at_its_next_flush(state, tmp_path):
    path = state / "events.db"
    writer = EventWriter(path, "b1")
    writer.record(event())
    assert writer.flush() == 1
    os.rename(path, state / "moved.db")
    path.symlink_to(tmp_path / "secret")
    writer.record(event())
    assert refused(writer)
    assert untouched(tmp_path)
    writer.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_planted_wal_or_shm_link_is_refused(state, tmp_path, suffix):
    path = state / "events.db"
    writer = EventWriter(path, "b1")
    writer.record(event())
    assert writer.flush() == 1
    writer.close()  # the last connection: SQLite removes -wal and -shm
    Path(f"{path}{suffix}").symlink_to(tmp_path / "secret")
    again = EventWriter(path, "b1")
    again.record(event())
    assert refused(again)
    assert untouched(tmp_path)
    again.close()


def test_a_hard_link_to_another_file_is_refused(state, tmp_path):
    """A hard link shares the inode: a chmod through it would change the other file."""
    path = state / "events.db"
    os.link(tmp_path / "secret", path)
    writer = EventWriter(path, "b1")
    writer.record(event())
    assert refused(writer)
    assert untouched(tmp_path)
    writer.close()


@pytest.mark.skipif(not ROOT, reason="needs root, to make a file of another user")
def test_a_store_of_another_user_is_refused(state, tmp_path):
    path = state / "events.db"
    path.write_bytes(b"")
    os.chown(path, 1000, 1000)
    path.chmod(0o666)
    writer = EventWriter(path, "b1")
    writer.record(event())
    assert refused(writer)
    assert path.stat().st_mode & 0o777 == 0o666 and path.stat().st_size == 0
    writer.close()


def test_a_store_of_its_own_user_is_written_0644_through_its_descriptor(state):
    old = os.umask(0o077)
    try:
        writer = EventWriter(state / "events.db", "b1")
        writer.record(event())
        assert writer.flush() == 1
        modes = {p.name: p.stat().st_mode & 0o777 for p in state.iterdir()}
        writer.close()
    finally:
        os.umask(old)
    assert modes == {"events.db": 0o644, "events.db-wal": 0o644, "events.db-shm": 0o644}
