"""Host memory source: available memory and swap in use, from psutil (host.memory).

psutil reads /proc/meminfo; its module-wide PROCFS_PATH is set to `--path.procfs` for the
read and put back after it (under a lock), so the source runs on a host's /proc mounted
elsewhere (a container) and on a fixture tree, and other users of psutil in the process
(psutil.Process) keep the /proc they expect. psutil is imported here, inside the read:
`gpuguard check` imports it only with --host-resources (off the default check's path).
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

from gpuguard.io import deadline
from gpuguard.model.snapshot import Reading

# PROCFS_PATH is one global of psutil: one read at a time changes it.
_PROCFS_LOCK = threading.Lock()


def read(procfs: Path, timeout_s: float) -> Reading[dict[str, Any]]:
    """Sizes in bytes: total, available (free plus what the kernel can reclaim at once,
    page cache included: MemAvailable), swap total and swap in use."""
    try:
        return Reading.ok(deadline.call(f"meminfo:{procfs}", lambda: _read(procfs), timeout_s))
    except deadline.DeadlineExceeded as exc:
        return Reading.failed(f"{procfs}/meminfo: {exc}")
    except (OSError, ValueError, KeyError, IndexError, RuntimeWarning) as exc:
        return Reading.failed(f"cannot read {procfs}/meminfo: {type(exc).__name__}: {exc}")


def _read(procfs: Path) -> dict[str, Any]:
    import psutil

    with _PROCFS_LOCK:
        saved = psutil.PROCFS_PATH
        psutil.PROCFS_PATH = str(procfs)
        try:
            return _sizes(psutil)
        finally:
            psutil.PROCFS_PATH = saved


def _sizes(psutil: Any) -> dict[str, Any]:
    with warnings.catch_warnings():
        # psutil warns (and reports 0) when a field it needs is missing: an error here,
        # never a 0 that reads as "out of memory"
        warnings.simplefilter("error", RuntimeWarning)
        memory = psutil.virtual_memory()
        try:
            swap = psutil.swap_memory()
        except RuntimeWarning:  # no pswpin/pswpout in vmstat: the sizes are still right
            warnings.simplefilter("ignore", RuntimeWarning)
            swap = psutil.swap_memory()
    return {"total_bytes": int(memory.total), "available_bytes": int(memory.available),
            "swap_total_bytes": int(swap.total), "swap_used_bytes": int(swap.used)}
