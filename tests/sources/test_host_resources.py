"""The host_memory and disk_space sources on real parts: this host's /proc, a fixture /proc,
a tmpfs of known size filled past host.disk's line, a private Docker engine, and a call
that never returns held to its deadline."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.io import deadline
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Snapshot
from gpuguard.sources import host_memory
from gpuguard.sources.host import HostOptions, collect_host
from tests.conftest import FIXTURES, mounted_tmpfs

MEMINFO_FIXTURE = FIXTURES / "procfs-meminfo"


def test_memory_of_this_host_is_sane():
    reading = host_memory.read(Path("/proc"), 5.0)
    sizes = reading.get()
    assert 256 * 2**20 < sizes["total_bytes"] < 2**50
    assert 0 < sizes["available_bytes"] <= sizes["total_bytes"]
    assert 0 <= sizes["swap_used_bytes"] <= sizes["swap_total_bytes"]


def test_memory_from_a_procfs_root():
    sizes = host_memory.read(MEMINFO_FIXTURE, 5.0).get()
    assert sizes == {"total_bytes": 2113459876 * 1024, "available_bytes": 147942191 * 1024,
                     "swap_total_bytes": 8388604 * 1024,
                     "swap_used_bytes": (8388604 - 2097151) * 1024}


def test_a_procfs_root_is_not_left_behind_for_other_psutil_users():
    import psutil

    host_memory.read(MEMINFO_FIXTURE, 5.0)
    assert psutil.PROCFS_PATH == "/proc"
    assert psutil.Process(os.getpid()).pid == os.getpid()  # reads this host's /proc


def test_the_fixture_host_warns_on_memory_and_swap(run_rule, h200):
    collect_host(h200, HostOptions(paths=_paths(procfs=MEMINFO_FIXTURE)),
                 only=frozenset({"host_memory"}))
    [result] = run_rule("host.memory", h200)
    assert result.status is Status.WARNING, result.message
    assert "(7.0 %)" in result.message and "swap 75 % in use" in result.message


@pytest.mark.parametrize("text", ["MemFree: 10 kB\n", "not a meminfo\n", ""])
def test_a_meminfo_that_is_not_one_is_an_error_not_zero(tmp_path, text):
    (tmp_path / "meminfo").write_text(text)
    (tmp_path / "vmstat").write_text((MEMINFO_FIXTURE / "vmstat").read_text())
    reading = host_memory.read(tmp_path, 5.0)
    assert reading.state == "error", reading


def test_a_missing_procfs_is_an_error(tmp_path):
    reading = host_memory.read(tmp_path / "nothing", 5.0)
    assert reading.state == "error" and "meminfo" in (reading.error or "")


def _paths(**roots: Path):
    from gpuguard.io.paths import Paths

    return Paths(**roots)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted under tmp_path, always unmounted."""
    with mounted_tmpfs(tmp_path / "models", "size=8m,nr_inodes=400") as mount:
        yield mount


def _fill(mount: Path, mib: int) -> None:
    with open(mount / "model.safetensors", "wb") as out:
        out.write(b"\0" * (mib * 2**20))


def _judge_disk(run_rule, h200: Snapshot, paths: tuple[Path, ...], rootfs: Path = Path("/"),
                docker: str = "off") -> tuple[Status, str, list[dict[str, object]]]:
    opts = HostOptions(paths=_paths(rootfs=rootfs), disk_paths=paths, docker=docker)
    collect_host(h200, opts, only=frozenset({"disk_space"}))
    [result] = run_rule("host.disk", h200, Profile())
    return result.status, result.message, h200.host.disk_space.get()


def test_a_tmpfs_filled_past_the_lines(run_rule, h200, tmpfs):
    status, message, [entry] = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.OK and entry["total_bytes"] == 8 * 2**20
    _fill(tmpfs, 7)  # 1 MiB of 8 left: 12.5 %
    status, message, _ = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.OK, message
    _fill(tmpfs, 7)
    with open(tmpfs / "more", "wb") as out:
        out.write(b"\0" * (2**20 // 2))  # 0.5 MiB left: 6.25 %
    status, message, [entry] = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.WARNING, message
    assert message.startswith(f"{tmpfs} (profile): 0.0 GiB free (6.2 % of 0.0 GiB)")
    os.unlink(tmpfs / "more")
    _fill(tmpfs, 8)  # full
    status, message, [entry] = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.CRITICAL and entry["free_bytes"] == 0


def test_a_tmpfs_out_of_inodes(run_rule, h200, tmpfs):
    for n in range(375):  # of 400 inodes, the root directory holds one
        (tmpfs / f"shard-{n}").touch()
    status, message, [_entry] = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.WARNING and "of inodes free" in message, message
    for n in range(375, 395):
        (tmpfs / f"shard-{n}").touch()
    status, message, _ = _judge_disk(run_rule, h200, (tmpfs,))
    assert status is Status.CRITICAL, message


def test_paths_are_read_under_the_rootfs(run_rule, h200, tmpfs):
    # the host's /models, seen as <rootfs>/models (gpuguard in a container)
    _status, _, [entry] = _judge_disk(run_rule, h200, (Path("/models"),), rootfs=tmpfs.parent)
    assert entry["path"] == "/models" and entry["total_bytes"] == 8 * 2**20


def test_a_missing_path_is_unknown(run_rule, h200, tmp_path):
    status, message, _ = _judge_disk(run_rule, h200, (tmp_path / "not-there",))
    assert status is Status.UNKNOWN and "No such file or directory" in message


def test_no_docker_and_no_paths_gives_no_result_to_warn_on(run_rule, h200, tmp_path,
                                                            monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    status, _, entries = _judge_disk(run_rule, h200, (), rootfs=tmp_path, docker="on")
    assert entries == [] and status is Status.SKIPPED


def test_docker_root_without_an_engine_is_the_default_where_it_exists(run_rule, h200, tmp_path,
                                                                      monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    (tmp_path / "var/lib/docker").mkdir(parents=True)
    status, _, [entry] = _judge_disk(run_rule, h200, (), rootfs=tmp_path, docker="on")
    assert entry["path"] == "/var/lib/docker" and entry["role"] == "docker"
    assert status is Status.OK


def test_an_engine_that_does_not_answer_is_unknown(run_rule, h200, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    status, message, [entry] = _judge_disk(run_rule, h200, (), rootfs=tmp_path, docker="on")
    assert status is Status.UNKNOWN and "did not answer" in message
    assert entry["role"] == "docker" and "error" in entry


def test_the_data_root_the_engine_reports(run_rule, h200, tmp_path, monkeypatch, docker_host):
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    status, _, [entry] = _judge_disk(run_rule, h200, (), docker="on")
    # the private engine keeps its data in its own state folder, not /var/lib/docker
    assert entry["role"] == "docker" and entry["path"] != "/var/lib/docker"
    assert Path(str(entry["path"])).is_dir() and int(str(entry["total_bytes"])) > 0
    assert status in (Status.OK, Status.WARNING, Status.CRITICAL)


def test_a_call_that_never_returns_is_held_to_its_deadline_and_not_repeated():
    release = threading.Event()
    calls = []

    def stuck() -> int:
        calls.append(1)
        release.wait(30)
        return 1

    try:
        started = time.monotonic()
        answers = deadline.call_all({"stuck": stuck, "quick": lambda: 2}, 0.3)
        assert time.monotonic() - started < 5
        assert isinstance(answers["stuck"], deadline.DeadlineExceeded)
        assert answers["quick"] == 2
        # the next cycle does not start a second thread behind the stuck one
        again = deadline.call_all({"stuck": stuck}, 0.3)
        assert "still not returned" in str(again["stuck"]) and len(calls) == 1
    finally:
        release.set()
    for _ in range(100):
        if not any(t.name == "deadline:stuck" for t in threading.enumerate()):
            break
        time.sleep(0.05)
    assert deadline.call("stuck", lambda: 3, 1.0) == 3  # once it returned, it is asked again
