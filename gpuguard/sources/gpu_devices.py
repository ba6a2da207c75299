"""The GPU's device side outside NVML: processes stuck in uninterruptible sleep holding
/dev/nvidia* (procfs), whether nvidia-uvm and nvidia-peermem are loaded (sysfs), and the
RDMA device nodes GPUDirect RDMA goes through (/dev/infiniband). One host source,
`gpu_devices`; each part is read only where its root is (a replay names its roots).

A process in uninterruptible sleep ("D") cannot be killed; one that holds a GPU device
and stays there (the hang after Xid 79 or 45, in which `nvidia-smi` itself hangs) keeps
the GPU from being reset: only a reboot frees it. A process is briefly in D all the time
(the driver pins memory, waits on a lock), so how long it has been off the CPU decides:
the scheduler's `se.exec_start` in /proc/PID/sched is when it last ran, on the clock our
own task's line (/proc/self/sched, read while we run) gives as now. Every read is bounded:
the /proc scan by a deadline and MAX_PIDS, the threads of one process by MAX_TASKS
(a process is stuck when any of its threads is: /proc/PID/task/TID/stat), the fds of one
process by MAX_FDS, the list
by MAX_STUCK; /proc/PID/stat, fd links and sched never take the process's memory lock
(cmdline and environ would, and hang behind a stuck process).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from gpuguard.model.snapshot import Reading

MAX_PIDS = 100_000
MAX_FDS = 4096
MAX_STUCK = 64
MAX_TASKS = 4096  # threads of one process looked at
MODULES = ("nvidia_uvm", "nvidia_peermem")
_EXEC_START = re.compile(rb"^se\.exec_start\s*:\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*$",
                         re.MULTILINE)


def read(procfs: Path | None, sysfs: Path | None, rootfs: Path | None,
         deadline_s: float = 5.0) -> Reading[dict[str, Any]]:
    """The parts whose root is given: {"stuck": ..., "modules": ..., "rdma": ...}."""
    out: dict[str, Any] = {}
    if procfs is not None:
        out["stuck"] = stuck_processes(procfs, time.monotonic() + deadline_s)
    if sysfs is not None:
        out["modules"] = modules(sysfs)
    if rootfs is not None:
        out["rdma"] = rdma_nodes(rootfs)
    return Reading.ok(out)


def stuck_processes(procfs: Path, end: float) -> dict[str, Any]:
    """Processes in state D holding /dev/nvidia*: [{"pid", "comm", "devices",
    "off_cpu_s"}] (off_cpu_s None where the kernel has no /proc/PID/sched), and D-state
    processes whose files could not be listed (another user's, without root) with how long
    they have been off the CPU; or {"error"}."""
    now_ms = _exec_start_ms(procfs / "self" / "sched")
    try:
        names = os.listdir(procfs)
    except OSError as exc:
        return {"error": f"cannot list processes in {procfs}: {exc.strerror or exc}"}
    found: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    scanned = more = 0
    for name in names:
        if not name.isdigit():
            continue
        if time.monotonic() > end or scanned >= MAX_PIDS:
            return {"error": f"the scan of {procfs} stopped after {scanned} processes "
                             "(deadline or size bound): not every process was seen"}
        scanned += 1
        state, comm = _state(procfs / name / "stat")
        stuck_task = procfs / name if state == "D" else _stuck_thread(procfs / name, end)
        if stuck_task is None:
            continue
        off_cpu_s = _off_cpu_s(stuck_task / "sched", now_ms)
        devices = _nvidia_fds(procfs / name / "fd")
        entry = {"pid": int(name), "comm": comm, "off_cpu_s": off_cpu_s}
        if devices is None:
            unreadable.append(entry)
        elif devices:
            if len(found) < MAX_STUCK:
                found.append({**entry, "devices": devices})
            else:
                more += 1
    return {"processes": found, "more": more, "unreadable": unreadable[:MAX_STUCK],
            "scanned": scanned}


def _stuck_thread(proc: Path, end: float) -> Path | None:
    """The folder of the process's first thread in D, its main thread not being in D (a
    PyTorch process waits in the driver on a worker thread while its main thread sleeps
    interruptibly: the process is just as unkillable), else None. At most MAX_TASKS
    threads of one process, within the scan's deadline."""
    try:
        tasks = os.listdir(proc / "task")
    except OSError:
        return None  # exited while we looked, or no task folder (a replayed tree)
    for tid in tasks[:MAX_TASKS]:
        if time.monotonic() > end:
            return None  # the scan's own bound says so when it stops
        if tid != proc.name and _state(proc / "task" / tid / "stat")[0] == "D":
            return proc / "task" / tid
    return None


def _state(path: Path) -> tuple[str | None, str | None]:
    """State and command name from /proc/PID/stat ("123 (name) D ..."; the name may hold
    spaces and parentheses: the state follows the last ')')."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None, None  # exited while we looked
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    if not head or not fields:
        return None, None
    comm = head.partition(b"(")[2].decode("utf-8", "replace")[:64]
    return fields[0].decode("ascii", "replace"), comm


def _nvidia_fds(fd_dir: Path) -> list[str] | None:
    """The /dev/nvidia* files the process holds (sorted, once each); None when its fds
    cannot be listed."""
    try:
        fds = os.listdir(fd_dir)
    except FileNotFoundError:
        return []  # exited
    except OSError:
        return None
    held: set[str] = set()
    for fd in fds[:MAX_FDS]:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            held.add(target)
    return sorted(held)


def _exec_start_ms(path: Path) -> float | None:
    try:
        with open(path, "rb") as f:
            found = _EXEC_START.search(f.read(16384))
    except OSError:
        return None
    return float(found.group(1)) if found else None


def _off_cpu_s(sched: Path, now_ms: float | None) -> float | None:
    """Seconds since the task last ran, on the scheduler's clock; None where it cannot be
    read (a kernel without /proc/PID/sched)."""
    last = _exec_start_ms(sched)
    if last is None or now_ms is None:
        return None
    return round(max(0.0, now_ms - last) / 1000.0, 1)


def modules(sysfs: Path) -> dict[str, str | None]:
    """Each module's /sys/module/NAME/initstate ("live", "coming", "going"), "builtin"
    for one built into the kernel (no initstate), None when it is not loaded."""
    out: dict[str, str | None] = {}
    for name in MODULES:
        base = sysfs / "module" / name
        try:
            with open(base / "initstate", "rb") as f:
                out[name] = f.read(64).decode("ascii", "replace").strip() or None
        except FileNotFoundError:
            out[name] = "builtin" if base.is_dir() else None
        except OSError as exc:
            out[name] = f"unreadable: {exc.strerror or exc}"
    return out


def rdma_nodes(rootfs: Path) -> list[str]:
    """The RDMA verbs devices (/dev/infiniband/uverbsN) GPUDirect RDMA moves data through."""
    try:
        return sorted(n for n in os.listdir(rootfs / "dev" / "infiniband")
                      if n.startswith("uverbs"))[:256]
    except OSError:
        return []
