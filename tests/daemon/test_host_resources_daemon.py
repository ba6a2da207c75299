"""The daemon end to end on host resources (issue 14): host memory from a /proc root, OOM
kills from a saved kernel log, a real tmpfs as the profile's model cache filled past
host.disk's line between two slow cycles, and what /metrics and /status say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, mounted_tmpfs
from tests.daemon.conftest import host_snapshot, metric_lines, write_snapshot


@pytest.fixture
def rootfs(tmp_path: Path) -> Iterator[Path]:
    """A host root whose /models is an 8 MiB tmpfs, always unmounted."""
    root = tmp_path / "rootfs"
    with mounted_tmpfs(root / "models", "size=8m"):
        yield root


def value(text: str, name: str, labels: str = "") -> float | None:
    for line in metric_lines(text, name):
        if labels in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_daemon_reports_host_memory_oom_kills_and_a_filling_disk(start_daemon, tmp_path,
                                                                  rootfs):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(1))
    profile = tmp_path / "profile.yaml"
    profile.write_text("disk_paths: [/models]\n")
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--slow-interval", "0.5", "--no-docker",
                          "--profile", str(profile),
                          "--kmsg-file", str(FIXTURES / "kmsg" / "oom.kmsg"),
                          "--path.procfs", str(FIXTURES / "procfs-meminfo"),
                          "--path.rootfs", str(rootfs))
    daemon.wait_for(lambda: "gpuguard_disk_free_bytes{" in daemon.metrics(), what="disk")
    text = daemon.metrics()
    assert value(text, "gpuguard_host_memory_total_bytes") == 2113459876 * 1024
    assert value(text, "gpuguard_host_memory_available_bytes") == 147942191 * 1024
    assert value(text, "gpuguard_host_swap_used_bytes") == (8388604 - 2097151) * 1024
    assert value(text, "gpuguard_host_oom_kills", 'scope="host"') == 2
    assert value(text, "gpuguard_host_oom_kills", 'scope="cgroup"') == 1
    assert value(text, "gpuguard_disk_size_bytes", 'path="/models"') == 8 * 2**20
    assert value(text, "gpuguard_disk_free_inodes_ratio", 'path="/models"') is not None
    assert value(text, "gpuguard_source_success", 'source="host_memory"') == 1
    assert value(text, "gpuguard_source_success", 'source="disk_space"') == 1
    # 7 % available, swap 75 % used, a host kill and a container's kill in the last day:
    # a warning naming both
    memory = daemon.result("host.memory")
    assert memory is not None and memory["status"] == "warning"
    assert "pt_main_thread (pid 52001" in memory["message"]
    assert value(text, "gpuguard_rule_status", 'rule="host.memory"') == 1
    disk = daemon.wait_for(lambda: daemon.result("host.disk"), what="host.disk")
    assert disk["status"] == "ok", disk

    (rootfs / "models" / "model.safetensors").write_bytes(b"\0" * (7 * 2**20 + 2**19))
    daemon.wait_for(lambda: (daemon.result("host.disk") or {}).get("status") == "warning",
                    what="host.disk warning after the fill")
    # the metrics follow with the next fast cycle, which carries the slow cycle's facts
    daemon.wait_for(lambda: value(daemon.metrics(), "gpuguard_disk_free_bytes",
                                  'path="/models"') == 2**19, what="the free bytes metric")
    text = daemon.metrics()
    assert value(text, "gpuguard_rule_status", 'rule="host.disk"') == 1
    assert "/models (profile): " in (daemon.result("host.disk") or {})["message"]
