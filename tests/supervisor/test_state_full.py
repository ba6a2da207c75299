"""A full state filesystem does not block failover (issue 20, item 9): the write of the
state file before each step used to raise, and 15 critical cycles made no failover. The
daemon on the fake NVML, the exec backend with real commands, the state directory a real
tiny tmpfs that fills."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.supervisor import state
from tests.conftest import mounted_tmpfs
from tests.daemon.conftest import metric_lines
from tests.daemon.test_clock_steps import exec_service


@pytest.fixture
def small_state_dir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/state (the daemon's --state-dir) as a 256 KiB tmpfs, always unmounted."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (./scripts/test.sh runs as root)")
    with mounted_tmpfs(tmp_path / "state", "size=256k") as mnt:
        yield mnt


class SpaceHog:
    """Takes every byte left on a filesystem and keeps taking what frees up, until
    released: a state write renamed over its old file frees that file's page, and a hog
    that filled once would leave it to the daemon's next write (the old race of this test).
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / "filler"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._stop = threading.Event()
        self._take()  # full before the constructor returns
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        try:
            while os.write(self._fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: full

    def _keep(self) -> None:
        while not self._stop.wait(0.005):  # 100x faster than the daemon's 0.5 s cycle
            self._take()

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        os.close(self._fd)
        self.path.unlink()


@pytest.fixture
def space_hog(small_state_dir: Path) -> Iterator[SpaceHog]:
    """A hog on the tiny state filesystem, released (fd closed) before it is unmounted."""
    hog = SpaceHog(small_state_dir)
    try:
        yield hog
    finally:
        hog.release()


def write_errors(daemon) -> float:
    lines = [x for x in metric_lines(daemon.metrics(),
                                     "gpuguard_failover_state_write_errors_total")
             if 'service="batch"' in x]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_a_full_state_filesystem_fails_over_first_and_writes_the_state_later(
        start_daemon, fake_env, tmp_path, small_state_dir, request):
    temperature = tmp_path / "temperature"
    temperature.write_text("40\n")
    config = exec_service(tmp_path, min_cpu_time=0)
    daemon = start_daemon("--fast-interval", "0.5", "--config", str(config),
                          env=fake_env(temp_file=str(temperature)))
    path = state.path_for(small_state_dir, "batch")
    daemon.wait_for(lambda: path.exists() and (tmp_path / "variants" / "gpu").exists(), 15,
                    "the GPU variant running, its state written")
    # nothing failed before the filesystem filled (a cycle's write right after the fill
    # may already fail: that is the fault under test, not a failure before it)
    assert write_errors(daemon) == 0
    hog = request.getfixturevalue("space_hog")  # full from here on

    temperature.write_text("95\n")  # critical: failover_after 2
    daemon.wait_for(lambda: (tmp_path / "variants" / "cpu").exists(), 20,
                    "the failover to CPU with the state filesystem full")
    assert not (tmp_path / "variants" / "gpu").exists()
    assert daemon.wait_for(lambda: write_errors(daemon) >= 1, 5, "the failed writes counted")
    failed = [json.loads(line) for line in daemon.log.read_text().splitlines()
              if '"failover_state_write_failed"' in line]
    assert failed and "No space left" in failed[0]["error"], failed
    assert state.read(path).active == "gpu"  # the old file is whole (atomic writes)

    hog.release()  # room again: the next cycle writes what it could not
    daemon.wait_for(lambda: state.read(path).active == "cpu", 10, "the state written")
    assert '"failover_state_write_recovered"' in daemon.log.read_text()
    assert state.read(path).transitions["to_cpu"] == 1
