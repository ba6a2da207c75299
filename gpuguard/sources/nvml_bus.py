"""NVML asked by bus id for the GPUs its list leaves out (issue 36, items 2 and 3).

nvidia-smi enumerates the PCI bus and asks nvmlDeviceGetHandleByPciBusId_v2 for each GPU;
on a host whose GPU failed to initialise it prints `Unable to determine the device handle
for GPU 0000:09:00.0: Unknown Error`. The by-index sweep never sees such a GPU (NVML does
not count it): gpu.count names it missing from the PCI bus against NVML's list. Asking
NVML by its bus id tells more: an error other than not found or not supported (Unknown
Error, GPU is lost) is NVML's own answer that the GPU is there and unreachable (gpu.lost
names it); a handle is a GPU NVML reaches by bus id but does not count (gpu.count says
so); not found leaves it to gpu.count's "missing".

Runs in the NVML worker after the by-index sweep, which gives the bus ids NVML lists
(`Listing`). The worker reads the bus itself (sources/pci_gpus.py, under the same
--path.sysfs root) rather than being told by the parent: `check` forks its worker before
the CLI has parsed its options (cli/entry.py) and the daemon's worker answers one-word
commands, neither with a channel for the parent's sysfs read, and the bus is a listdir
and a few small files, read only in the worker's own process. Only the GPUs the by-index
list lacks are asked, at most the bus's GPUs (MAX_LOOKUPS), one call at a time, each named
on the progress board's host slot (nvml_progress.py) so that a call that hangs is named
by the worker's deadline as any other is.
"""

from __future__ import annotations

import threading
from pathlib import Path

from gpuguard.model.pci import normalise_pci

TYPE_CHECKING = False  # typing only for the checker (nvml_read.py: the worker's path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuguard.sources.nvml_progress import Progress

CALL = "nvmlDeviceGetHandleByPciBusId_v2"
# a host has at most a few dozen GPUs; the bus read is bounded too (pci_gpus.MAX_FUNCTIONS)
MAX_LOOKUPS = 64


class Listing:
    """An emit that notes the bus id of each GPU line it passes on (from any GPU thread):
    the GPUs NVML's by-index list holds."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self.listed: set[str] = set()

    def __call__(self, obj: dict[str, Any]) -> None:
        if obj.get("t") == "gpu" and isinstance(obj.get("pci_bus_id"), str):
            with self._lock:
                self.listed.add(key(obj["pci_bus_id"]))
        self._emit(obj)


def on_the_bus(sysfs: str | None, procfs: str) -> list[dict[str, Any]]:
    """The bus's NVIDIA GPUs (sources/pci_gpus.py), read while the GPUs' threads sweep;
    none where sysfs is not read (None), has no PCI bus (not supported) or cannot be read."""
    if sysfs is None:
        return []
    from gpuguard.sources import pci_gpus

    try:
        return pci_gpus.scan(Path(sysfs), Path(procfs))
    except pci_gpus.Unread:
        return []


def look_up(nv: Any, listing: Listing, progress: Progress, bus: list[dict[str, Any]]) -> None:
    """Ask NVML by bus id for each NVIDIA GPU on the bus (on_the_bus), bound to the nvidia
    driver and given to this host or container (the driver's procfs lists it), that the
    by-index list lacks; one {"t": "bus", "pci_handles": [...]} line when any was asked.
    Nothing missing (or no bus read): no call at all."""
    wanted = [g["address"] for g in bus
              if g.get("driver") == "nvidia" and g.get("in_driver_procfs") is not False
              and g.get("excluded") is not True  # the driver left it out on purpose
              and key(g["address"]) not in listing.listed][:MAX_LOOKUPS]
    if not wanted:
        return
    answers = []
    for address in wanted:
        progress.set(0, f"{CALL} ({address})")
        answers.append(ask(nv, address))
    progress.set(0, "")
    listing({"t": "bus", "pci_handles": answers})


def ask(nv: Any, address: str) -> dict[str, Any]:
    """{"address", "state": found | not_found | not_supported | error, "error"?}."""
    try:
        nv.nvmlDeviceGetHandleByPciBusId(address)
    except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
        return {"address": address, "state": "not_supported"}
    except nv.NVMLError_NotFound:
        return {"address": address, "state": "not_found"}
    except nv.NVMLError as exc:
        return {"address": address, "state": "error", "error": f"{CALL}: {exc}"}
    return {"address": address, "state": "found"}


def key(address: str) -> str:
    """NVML's "00000000:11:00.0" and sysfs's "0000:11:00.0" as one; a bus id of another
    shape as it is (it matches none)."""
    try:
        return normalise_pci(address)
    except (ValueError, IndexError):
        return address.lower()
