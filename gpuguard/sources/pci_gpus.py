"""The NVIDIA GPU functions on the PCI bus, read from sysfs (issue 36, item 2): what the
bus holds whatever NVML lists, so gpu.count can name a GPU the driver failed to bring up
without a profile's gpu_count or the daemon's memory of the GPUs.

A GPU is a function of vendor 0x10de whose class is a display controller: 0x0300xx (VGA)
or 0x0302xx (3D controller, the data-centre boards). NVSwitch bridges (0x0680xx) and the
boards' HDMI audio functions (0x0403xx) are not GPUs. Each carries the driver bound to it
(the basename of its `driver` link; None where none is): a GPU given to vfio-pci for
passthrough, or left unbound, is not NVML's to list.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuguard.model.snapshot import Reading

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
# a host has a few hundred PCI functions; far more is not a PCI bus read
MAX_FUNCTIONS = 4096


def read(sysfs: Path) -> Reading[list[dict[str, Any]]]:
    """[{"address", "class", "device", "driver"}] of each NVIDIA GPU function, by address."""
    devices = sysfs / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(devices))
    except FileNotFoundError:
        return Reading.not_supported(f"{devices} does not exist (no PCI bus in this sysfs)")
    except OSError as exc:
        return Reading.failed(f"cannot list {devices}: {exc.strerror or exc}")
    if len(names) > MAX_FUNCTIONS:
        return Reading.failed(f"{devices}: more than {MAX_FUNCTIONS} functions, not a PCI bus")
    gpus = []
    for name in names:
        node = devices / name
        if _attribute(node, "vendor") != NVIDIA_VENDOR:
            continue
        cls = _attribute(node, "class") or ""
        if not cls.startswith(GPU_CLASSES):
            continue
        gpus.append({"address": name, "class": cls, "device": _attribute(node, "device"),
                     "driver": _driver(node)})
    return Reading.ok(gpus)


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
