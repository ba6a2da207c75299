"""sources/gpu_devices.py on procfs, sysfs and /dev trees of the test's own (issue 21)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuguard.sources import gpu_devices

NOW_MS = 1_000_000.0  # the scheduler clock of the reading process (/proc/self/sched)


def proc_tree(root: Path, processes: dict[int, dict]) -> Path:
    """A /proc: `self/sched` giving now, and per pid its stat (state, comm), sched
    (se.exec_start, ms ago) and fd links ({fd: target}; `fd: None` makes fd unlistable)."""
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "sched").write_text(f"python3 (1, #threads: 1)\n---\n"
                                         f"se.exec_start                                :"
                                         f"       {NOW_MS:.6f}\n")
    for pid, p in processes.items():
        d = proc / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({p.get('comm', 'x')}) {p['state']} 1 1 1 0 -1 4194560 "
                                "0 0 0 0 0 0 0 0 20 0 1 0 100 0 0\n")
        if p.get("ago_s") is not None:
            start = NOW_MS - p["ago_s"] * 1000
            (d / "sched").write_text(f"se.exec_start                                :"
                                     f"       {start:.6f}\nse.vruntime : 1.0\n")
        fds = p.get("fds", {})
        if fds is None:
            (d / "fd").write_text("not a directory")
            continue
        (d / "fd").mkdir()
        for fd, target in fds.items():
            os.symlink(target, d / "fd" / str(fd))
    (proc / "kmsg-is-not-a-pid").mkdir()
    return proc


STUCK = {
    4321: {"comm": "nvidia-smi", "state": "D", "ago_s": 400,
           "fds": {0: "/dev/null", 3: "/dev/nvidiactl", 4: "/dev/nvidia0", 5: "/dev/nvidia0"}},
    1234: {"comm": "python3 (worker)", "state": "D", "ago_s": 50, "fds": {7: "/dev/nvidia1"}},
    2222: {"comm": "vllm", "state": "S", "ago_s": 900, "fds": {3: "/dev/nvidia0"}},
    3333: {"comm": "jbd2/sda1-8", "state": "D", "ago_s": 900, "fds": {}},
    5555: {"comm": "other-user", "state": "D", "ago_s": 700, "fds": None},
}


def test_processes_in_d_holding_gpu_devices_with_how_long(tmp_path):
    proc = proc_tree(tmp_path, STUCK)
    stuck = gpu_devices.stuck_processes(proc, time.monotonic() + 5)
    by_pid = {p["pid"]: p for p in stuck["processes"]}
    assert set(by_pid) == {4321, 1234}  # 2222 is not in D, 3333 holds no GPU device
    assert by_pid[4321] == {"pid": 4321, "comm": "nvidia-smi", "off_cpu_s": 400.0,
                            "devices": ["/dev/nvidia0", "/dev/nvidiactl"]}
    assert by_pid[1234]["comm"] == "python3 (worker)" and by_pid[1234]["off_cpu_s"] == 50.0
    assert stuck["unreadable"] == [{"pid": 5555, "comm": "other-user", "off_cpu_s": 700.0}]
    assert stuck["scanned"] == 5 and stuck["more"] == 0


def test_without_sched_the_time_is_unknown_never_zero(tmp_path):
    proc = proc_tree(tmp_path, {4321: {**STUCK[4321], "ago_s": None}})
    [p] = gpu_devices.stuck_processes(proc, time.monotonic() + 5)["processes"]
    assert p["off_cpu_s"] is None
    (proc / "self" / "sched").unlink()  # a kernel without /proc/PID/sched
    proc2 = proc_tree(tmp_path / "b", {4321: STUCK[4321]})
    (proc2 / "self" / "sched").unlink()
    [p] = gpu_devices.stuck_processes(proc2, time.monotonic() + 5)["processes"]
    assert p["off_cpu_s"] is None


def test_the_scan_is_bounded_in_time_and_in_count(tmp_path, monkeypatch):
    proc = proc_tree(tmp_path, STUCK)
    late = gpu_devices.stuck_processes(proc, time.monotonic() - 1)
    assert "error" in late and "deadline" in late["error"]
    monkeypatch.setattr(gpu_devices, "MAX_STUCK", 1)
    many = {pid: {**STUCK[4321], "comm": f"p{pid}"} for pid in range(10, 14)}
    listed = gpu_devices.stuck_processes(proc_tree(tmp_path / "m", many), time.monotonic() + 5)
    assert len(listed["processes"]) == 1 and listed["more"] == 3
    assert "error" in gpu_devices.stuck_processes(tmp_path / "nothing", time.monotonic() + 5)


def test_modules_and_rdma_nodes(tmp_path):
    sysfs, rootfs = tmp_path / "sys", tmp_path / "root"
    (sysfs / "module" / "nvidia_uvm").mkdir(parents=True)
    (sysfs / "module" / "nvidia_uvm" / "initstate").write_text("live\n")
    (sysfs / "module" / "nvidia_peermem").mkdir()  # built in: no initstate
    (rootfs / "dev" / "infiniband").mkdir(parents=True)
    for name in ("uverbs1", "uverbs0", "rdma_cm"):
        (rootfs / "dev" / "infiniband" / name).write_text("")
    reading = gpu_devices.read(None, sysfs, rootfs)
    assert reading.get() == {"modules": {"nvidia_uvm": "live", "nvidia_peermem": "builtin"},
                             "rdma": ["uverbs0", "uverbs1"]}
    (sysfs / "module" / "nvidia_peermem").rmdir()
    assert gpu_devices.modules(sysfs)["nvidia_peermem"] is None
    assert gpu_devices.rdma_nodes(tmp_path / "nowhere") == []
