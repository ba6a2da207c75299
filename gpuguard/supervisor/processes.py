"""Which processes are a supervised service: the process tree of its running variant.

- docker: the container's processes as the engine lists them (`top`, host PIDs); its
  identity is the container id and State.StartedAt, so a restart or a new container
  is a new run.
- systemd: the unit's cgroup (`ControlGroup` from `systemctl show`) and its
  `cgroup.procs`; its identity is the unit's InvocationID (new at every start).
- exec: the main PID from the variant's pid file (`exec.pid_file_gpu` / `pid_file_cpu`:
  the user's start command backgrounds the service, so gpuguard has no child of its own)
  and its descendants (supervisor/proc_tracker.py: kept from cycle to cycle when the
  caller gives its tracker, so that not every process is read each cycle); its identity
  is that PID and its start in clock ticks since boot (field 22 of /proc/PID/stat): the
  boot clock, so a wall-clock step (which moves psutil's create_time, boot time + ticks)
  invents no restart.

Every read is bounded: files through boundedio, commands and the Docker API with a
timeout. psutil is imported here, on the daemon's path only.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuguard.io import bounded as boundedio
from gpuguard.supervisor.config import Service
from gpuguard.supervisor.proc_tracker import ProcessTracker, parse_stat

_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")

MAX_PID_FILE = 64
MAX_PROCS_FILE = 1024 * 1024


class TreeError(Exception):
    """The service's processes could not be told (not running, no pid file, no answer)."""


@dataclass(frozen=True)
class Tree:
    identity: str  # changes when the service restarts: its samples start over
    started_at: float | None  # Unix time the current run began (warm-up is counted from it)
    pids: list[int]


def tree(service: Service, variant: str, deadline_s: float,
         cgroupfs: str = "/sys/fs/cgroup", tracker: ProcessTracker | None = None) -> Tree:
    """The service's processes now. `tracker` (exec only) is the one the caller keeps
    for this service across cycles; without one, a new one reads every process."""
    cfg = service.backend_config
    if service.backend == "exec":
        return _exec_tree(cfg.get(f"pid_file_{variant}"), variant, deadline_s, tracker)
    if service.backend == "systemd":
        return _systemd_tree(str(cfg[variant]), deadline_s, cgroupfs)
    if service.backend == "docker":
        return _docker_tree(str(cfg[variant]["name"]), deadline_s)
    raise TreeError(f"backend {service.backend} has no process tree")


def new_tracker() -> ProcessTracker:
    """A tracker of an exec service's tree, on the procfs psutil reads (the PIDs are of
    gpuguard's own PID namespace, and their RSS comes from psutil)."""
    import psutil

    return ProcessTracker(psutil.PROCFS_PATH)


def _exec_tree(pid_file: str | None, variant: str, deadline_s: float,
               tracker: ProcessTracker | None) -> Tree:
    import psutil

    if tracker is None:
        tracker = new_tracker()

    if not pid_file:
        raise TreeError(f"exec.pid_file_{variant} is not configured: the service's "
                        "processes are not known")
    try:
        text = boundedio.read_text(pid_file, MAX_PID_FILE, deadline_s).strip()
    except OSError as exc:
        raise TreeError(f"cannot read the pid file: {exc}") from exc
    if not text.isdigit() or int(text) <= 0:
        raise TreeError(f"{pid_file} holds no PID ({text[:20]!r})")
    try:
        main = psutil.Process(int(text))
        started = main.create_time()
        tracked = tracker.update(main.pid, deadline_s)
    except (psutil.Error, OSError) as exc:
        raise TreeError(f"PID {text} from {pid_file} is not running ({exc})") from exc
    return Tree(f"pid {main.pid} start ticks {tracked.start_ticks}", started, tracked.pids)


def start_ticks(pid: int, deadline_s: float) -> int:
    """When the process started, in clock ticks since boot (field 22 of /proc/PID/stat):
    unlike wall time it never moves for a process that did not restart."""
    import psutil

    text = boundedio.read_text(f"{psutil.PROCFS_PATH}/{pid}/stat", 4096, deadline_s)
    return parse_stat(text, pid).start_ticks


def _systemd_tree(unit: str, deadline_s: float, cgroupfs: str) -> Tree:
    try:
        proc = subprocess.run(
            ["systemctl", "show", "-p", "ControlGroup", "-p", "InvocationID",
             "-p", "ExecMainStartTimestampMonotonic", unit],
            capture_output=True, text=True, timeout=deadline_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TreeError(f"systemctl show {unit}: {exc}") from exc
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    group = props.get("ControlGroup", "")
    if proc.returncode != 0 or not group:
        raise TreeError(f"{unit} has no control group (not running?)")
    procs = Path(cgroupfs) / group.lstrip("/") / "cgroup.procs"
    try:
        text = boundedio.read_text(procs, MAX_PROCS_FILE, deadline_s)
    except OSError as exc:
        raise TreeError(f"cannot read {procs}: {exc}") from exc
    pids = sorted(int(x) for x in text.split() if x.isdigit())
    started = _boot_time() + int(props.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    return Tree(f"unit {unit} invocation {props.get('InvocationID', '')}", started, pids)


def _docker_tree(name: str, deadline_s: float) -> Tree:
    import docker

    client = None
    try:
        client = docker.from_env(timeout=max(1, int(deadline_s)))
        container = client.containers.get(name)
        if container.status != "running":
            raise TreeError(f"container {name} is {container.status}")
        top: dict[str, Any] = container.top()
    except (docker.errors.DockerException, OSError) as exc:
        raise TreeError(f"Docker: {exc}") from exc
    finally:
        if client is not None:
            client.close()  # a client per cycle: its connections must not pile up
    titles = top.get("Titles") or []
    if "PID" not in titles:
        raise TreeError(f"Docker's top of {name} has no PID column")
    column = titles.index("PID")
    pids = sorted(int(row[column]) for row in top.get("Processes") or []
                  if str(row[column]).isdigit())
    started_text = str(container.attrs.get("State", {}).get("StartedAt", ""))
    return Tree(f"container {container.id[:12]} started {started_text}",
                _docker_time(started_text), pids)


def _docker_time(text: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, `Z`) as Unix time; None when unreadable."""
    match = _RFC3339.match(text)
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    try:
        stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return stamp.timestamp() + float("0" + (fraction or ""))


def _boot_time() -> float:
    import psutil

    return float(psutil.boot_time())


def rss_bytes(pids: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """The resident memory summed over the PIDs, and each process (pid, name, rss_bytes).
    A process that exited since it was listed is left out (not a fault)."""
    import psutil

    total = 0
    each: list[dict[str, Any]] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                rss = int(proc.memory_info().rss)
                name = proc.name()
        except psutil.Error:
            continue
        total += rss
        each.append({"pid": pid, "name": name, "rss_bytes": rss})
    return total, each


def host_headroom_bytes(pids: list[int], cgroupfs: str = "/sys/fs/cgroup",
                        deadline_s: float = 1.0) -> int:
    """How much more host memory the service can take: the host's available memory, or
    less when its cgroup (v2, of the first PID) has a memory.max closer to its usage."""
    import psutil

    headroom = int(psutil.virtual_memory().available)
    if not pids:
        return headroom
    try:
        text = boundedio.read_text(f"/proc/{pids[0]}/cgroup", 64 * 1024, deadline_s)
        group = next((line.split("::", 1)[1] for line in text.splitlines()
                      if line.startswith("0::")), None)
        if group is None:
            return headroom
        base = os.path.join(cgroupfs, group.strip().lstrip("/"))
        limit = boundedio.read_text(os.path.join(base, "memory.max"), 64, deadline_s).strip()
        used = boundedio.read_text(os.path.join(base, "memory.current"), 64, deadline_s).strip()
    except (OSError, StopIteration):
        return headroom
    if limit.isdigit() and used.isdigit():
        headroom = min(headroom, max(int(limit) - int(used), 0))
    return headroom
