"""SIGTERM while the active probe waits on a worker hung in a CUDA call (issue 20, item
10): the daemon kills the probe's workers at once and is gone within seconds, whatever
the probe's deadline (it used to wait the probe out: 7-8 s with the default 10 s
deadline, 37 s with 40 s, past the unit's TimeoutStopSec=15). The fake NVML and the fake
libcuda, whose cuMemcpyHtoD_v2 never returns."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.sources.test_active_probe import FAKE_FLOORS


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_with_a_probe_hung_in_a_call_stops_at_once_and_leaves_no_worker(
        start_daemon, fake_nvml, fake_cuda, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(FAKE_FLOORS + "  buffer_mib: 4\n  pattern_mib: 2\n  deadline_s: 40\n")
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
           "FAKE_NVML_MEM_TOTAL_MIB": "1000", "FAKE_CUDA_HANG": "cuMemcpyHtoD_v2"}
    daemon = start_daemon("--fast-interval", "0.5", "--active-probe-interval", "1",
                          "--profile", str(profile), env=env)
    own = cmdline(daemon.proc.pid)

    def workers() -> list[int]:
        # forked, not exec'd: a probe worker has the daemon's own command line (the NVML
        # worker is `python -m gpuguard.sources.nvml_worker`)
        return [p for p in children_of(daemon.proc.pid) if cmdline(p) == own]

    hung = daemon.wait_for(lambda: len(workers()) == 2 and workers(), 20,
                           "two probe workers")
    time.sleep(1.5)  # well inside cuMemcpyHtoD_v2 by now, which never returns
    assert all(alive(p) for p in hung)

    took = daemon.stop()
    assert took < 5, f"SIGTERM took {took:.1f} s with a probe hung in a call"
    assert daemon.proc.returncode == 0
    deadline = time.monotonic() + 1  # the daemon killed and reaped them before it exited
    while any(alive(p) for p in hung) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in hung if alive(p)], "a probe worker outlived the daemon"
    assert '"active_probe_stopped"' in daemon.log.read_text()
