"""supervisor/processes.py with real processes: an exec service's pid file and its
descendants, and a container's processes on the tests' private Docker engine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuguard.supervisor import processes
from gpuguard.supervisor.config import load_services


def exec_service(tmp_path: Path, pid_file: Path | None) -> Any:
    section: dict[str, Any] = {k: ["true"] for k in ("start_gpu", "stop_gpu", "start_cpu",
                                                     "stop_cpu")}
    if pid_file is not None:
        section["pid_file_gpu"] = str(pid_file)
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{"name": "s", "backend": "exec",
                                                "probe": {"exec": ["true"]},
                                                "exec": section}]}))
    [service] = load_services(config)
    return service


def test_exec_tree_is_the_main_pid_and_its_descendants(tmp_path: Path) -> None:
    # a shell with two children, one of which has a child of its own
    main = subprocess.Popen(["sh", "-c", "sleep 60 & (sleep 60 & wait) & wait"])
    try:
        pid_file = tmp_path / "s.pid"
        pid_file.write_text(f"{main.pid}\n")
        service = exec_service(tmp_path, pid_file)
        deadline = time.monotonic() + 10
        while len(psutil.Process(main.pid).children(recursive=True)) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        tree = processes.tree(service, "gpu", 2.0)
        expected = {main.pid, *(c.pid for c in psutil.Process(main.pid).children(recursive=True))}
        assert set(tree.pids) == expected and len(expected) == 4
        assert tree.started_at == pytest.approx(psutil.Process(main.pid).create_time())
        assert tree.identity.startswith(f"pid {main.pid} ")
        total, each = processes.rss_bytes(tree.pids)
        assert total == sum(p["rss_bytes"] for p in each) and total > 0
        assert {p["name"] for p in each} == {"sh", "sleep"}
    finally:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(main.pid).children(recursive=True):
                child.kill()
        main.kill()
        main.wait()


@pytest.mark.parametrize(("content", "problem"), [
    (None, "exec.pid_file_gpu is not configured"),
    ("", "holds no PID"),
    ("abc", "holds no PID"),
    ("0", "holds no PID"),
    ("999999999", "is not running"),
])
def test_exec_tree_that_cannot_be_told_says_why(tmp_path: Path, content: str | None,
                                                problem: str) -> None:
    pid_file = tmp_path / "s.pid"
    if content is not None:
        pid_file.write_text(content)
    service = exec_service(tmp_path, pid_file if content is not None else None)
    with pytest.raises(processes.TreeError, match=problem):
        processes.tree(service, "gpu", 2.0)


def test_exec_pid_file_that_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "s.pid"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(processes.TreeError, match="cannot read the pid file"):
        processes.tree(exec_service(tmp_path, fifo), "gpu", 0.5)
    assert time.monotonic() - started < 5


def test_host_headroom_is_at_most_the_available_memory() -> None:
    available = psutil.virtual_memory().available
    headroom = processes.host_headroom_bytes([os.getpid()])
    assert 0 <= headroom <= available * 1.1  # available moves between the two reads


def test_docker_tree_is_the_containers_host_pids(tmp_path: Path, docker_host: str,
                                                busybox_image: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    client = docker.from_env()
    name = f"gg-tree-{os.getpid()}"
    config = tmp_path / "gpuguard.yaml"
    variant = {"name": name, "image": busybox_image}
    config.write_text(json.dumps({"services": [{
        "name": "s", "backend": "docker", "probe": {"docker_health": True},
        "docker": {"gpu": variant, "cpu": {**variant, "name": name + "-cpu"}}}]}))
    [service] = load_services(config)
    container = client.containers.run(busybox_image, ["sh", "-c", "sleep 600 & sleep 600; true"],
                                      name=name, detach=True)
    try:
        tree = processes.tree(service, "gpu", 5.0)
        top = container.top()
        column = top["Titles"].index("PID")
        assert tree.pids == sorted(int(row[column]) for row in top["Processes"])
        assert len(tree.pids) == 3  # sh and two sleeps, as the host sees them
        assert all(psutil.pid_exists(pid) for pid in tree.pids)
        assert tree.identity.startswith(f"container {container.id[:12]} ")
        assert tree.started_at is not None and abs(tree.started_at - time.time()) < 60
        container.restart(timeout=0)
        again = processes.tree(service, "gpu", 5.0)
        assert again.identity != tree.identity  # a restart is a new run
        container.stop(timeout=0)
        with pytest.raises(processes.TreeError, match="exited"):
            processes.tree(service, "gpu", 5.0)
        with pytest.raises(processes.TreeError, match="Docker"):
            processes.tree(service, "cpu", 5.0)  # no such container
    finally:
        container.remove(force=True)
        client.close()


def test_exec_identity_stays_through_a_wall_clock_step(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall-clock step moves /proc/stat's btime (and psutil's create_time, btime +
    ticks): the same process is the same run, so the identity is its start ticks."""
    main = subprocess.Popen(["sleep", "60"])
    try:
        pid_file = tmp_path / "s.pid"
        pid_file.write_text(f"{main.pid}\n")
        service = exec_service(tmp_path, pid_file)
        before = processes.tree(service, "gpu", 2.0)
        stepped = tmp_path / "proc"
        stepped.mkdir()
        with open("/proc/stat") as real:  # the kernel's view after `date -s +1 hour`
            (stepped / "stat").write_text("".join(
                f"btime {int(line.split()[1]) + 3600}\n" if line.startswith("btime ")
                else line for line in real))
        (stepped / str(main.pid)).symlink_to(f"/proc/{main.pid}")
        monkeypatch.setattr(psutil, "PROCFS_PATH", str(stepped))
        after = processes.tree(service, "gpu", 2.0)
        assert after.started_at is not None and before.started_at is not None
        assert after.started_at - before.started_at == pytest.approx(3600, abs=2)
        assert after.identity == before.identity
        assert processes.start_ticks(main.pid, 2.0) > 0
    finally:
        main.kill()
        main.wait()
