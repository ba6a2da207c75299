"""The NVIDIA GPU functions on the PCI bus, read from sysfs (issue 36, item 2): what the
bus holds whatever NVML lists, so gpu.count can name a GPU the driver failed to bring up
without a profile's gpu_count or the daemon's memory of the GPUs.

A GPU is a function of vendor 0x10de whose class is a display controller: 0x0300xx (VGA),
0x0302xx (3D controller, the data-centre boards) or 0x0380xx ("Display controller", base
class 03 subclass 80: some boards show so in lspci, tests/fixtures/sysfs-pci-display).
NVSwitch bridges (0x0680xx) and the boards' HDMI audio functions (0x0403xx) are not GPUs.
Each carries the driver bound to it (the basename of its `driver` link; None where none
is): a GPU given to vfio-pci for passthrough, or left unbound, is not NVML's to list.

Each also says whether the nvidia driver's procfs lists it (`/proc/driver/nvidia/gpus/
<address>`, under --path.procfs), or None where that folder was not read. In a container
the NVIDIA container toolkit mounts a tmpfs over /proc/driver/nvidia and binds back only
the given GPUs' entries (NVIDIA/libnvidia-container src/nvc_mount.c at ef9042c:
mount_procfs, mount_procfs_gpu), while /sys shows the host's whole bus: a GPU bound to
nvidia that the driver's procfs does not list is another container's, not a lost one. On
a host every GPU the driver probed is there (nv_pci_probe adds it), lost or not.

A GPU the driver was told to leave out (the NVreg_ExcludedGpus module parameter) is bound
to nvidia and in its procfs, whose `information` says "GPU Excluded: Yes", and NVML does
not list it: `excluded` says so (None where that file was not read or does not say).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TYPE_CHECKING = False  # the NVML worker reads the bus too (nvml_bus.py): no model import
if TYPE_CHECKING:
    from gpuguard.model.snapshot import Reading

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302", "0x0380")
# a host has a few hundred PCI functions; far more is not a PCI bus read
MAX_FUNCTIONS = 4096
# the driver's `information` file is a dozen short lines
MAX_INFORMATION_BYTES = 4096


class Unread(Exception):
    """The bus could not be read; `supported` False: this sysfs has no PCI bus."""

    def __init__(self, why: str, supported: bool = True) -> None:
        super().__init__(why)
        self.supported = supported


def read(sysfs: Path, procfs: Path | None = None) -> Reading[list[dict[str, Any]]]:
    """[{"address", "class", "device", "driver", "in_driver_procfs"}] of each NVIDIA GPU
    function, by address; `procfs` None: the driver's procfs is not read (a replay)."""
    from gpuguard.model.snapshot import Reading

    try:
        return Reading.ok(scan(sysfs, procfs))
    except Unread as exc:
        return Reading.failed(str(exc)) if exc.supported else Reading.not_supported(str(exc))


def scan(sysfs: Path, procfs: Path | None = None) -> list[dict[str, Any]]:
    """read()'s list, or Unread saying why not."""
    devices = sysfs / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(devices))
    except FileNotFoundError:
        raise Unread(f"{devices} does not exist (no PCI bus in this sysfs)", False) from None
    except OSError as exc:
        raise Unread(f"cannot list {devices}: {exc.strerror or exc}") from None
    if len(names) > MAX_FUNCTIONS:
        raise Unread(f"{devices}: more than {MAX_FUNCTIONS} functions, not a PCI bus")
    attached = driver_procfs_gpus(procfs) if procfs is not None else None
    gpus = []
    for name in names:
        node = devices / name
        if _attribute(node, "vendor") != NVIDIA_VENDOR:
            continue
        cls = _attribute(node, "class") or ""
        if not cls.startswith(GPU_CLASSES):
            continue
        listed = None if attached is None else attached.get(_short(name))
        gpus.append({"address": name, "class": cls, "device": _attribute(node, "device"),
                     "driver": _driver(node),
                     "in_driver_procfs": None if attached is None else listed is not None,
                     "excluded": None if listed is None else _excluded(procfs, listed)})
    return gpus


def _attribute(node: Path, name: str) -> str | None:
    try:
        return (node / name).read_text(errors="replace")[:64].strip().lower()
    except OSError:
        return None


def _driver(node: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(node / "driver"))
    except OSError:
        return None


def driver_procfs_gpus(procfs: Path) -> dict[str, str] | None:
    """The addresses the nvidia driver's procfs lists (four-digit domain, lower case), each
    to its folder's own name, or None where it cannot be read (no driver loaded, no
    procfs)."""
    folder = procfs / "driver" / "nvidia" / "gpus"
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    return {_short(name): name for name in names[:MAX_FUNCTIONS]}


def _excluded(procfs: Path | None, name: str) -> bool | None:
    """Whether the driver left the GPU out on purpose (the NVreg_ExcludedGpus module
    parameter): its procfs `information` says "GPU Excluded: Yes", and NVML does not list
    it. None where the file cannot be read or does not say (older drivers)."""
    if procfs is None:
        return None
    try:
        with open(procfs / "driver" / "nvidia" / "gpus" / name / "information", "rb") as f:
            text = f.read(MAX_INFORMATION_BYTES).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "gpu excluded":
            return value.strip().lower() == "yes"
    return None


def _short(address: str) -> str:
    """"0000:18:00.0" and "00000000:18:00.0" (the driver's procfs has used both widths of
    the PCI domain) as one: a four-digit domain, lower case."""
    parts = address.lower().split(":")
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}" if len(parts) == 3 \
            else address.lower()
    except ValueError:
        return address.lower()
