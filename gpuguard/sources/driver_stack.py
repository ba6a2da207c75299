"""procfs and /dev: which kernel modules are loaded, their version, the device nodes,
and whether nvidia-persistenced runs."""

from __future__ import annotations

import re
from pathlib import Path

from gpuguard.snapshot import Reading

_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
_MODULES = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "nouveau")


def module_version(procfs: Path) -> Reading[str]:
    path = procfs / "driver" / "nvidia" / "version"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Reading.not_supported(f"no {path}: the nvidia module is not loaded, or "
                                     "/proc/driver is not visible here")
    except OSError as exc:
        return Reading.failed(f"cannot read {path}: {exc.strerror or exc}")
    match = _NVRM.search(text)
    if not match:
        return Reading.failed(f"{path}: no `NVRM version` line")
    return Reading.ok(match.group(1))


def loaded_modules(procfs: Path) -> Reading[list[str]]:
    path = procfs / "modules"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        return Reading.failed(f"cannot read {path}: {exc.strerror or exc}")
    names = {line.split(" ", 1)[0] for line in lines if line}
    return Reading.ok(sorted(names & set(_MODULES)))


def device_nodes(rootfs: Path) -> Reading[list[str]]:
    dev = rootfs / "dev"
    try:
        return Reading.ok(sorted(p.name for p in dev.iterdir() if p.name.startswith("nvidia")))
    except OSError as exc:
        return Reading.failed(f"cannot list {dev}: {exc.strerror or exc}")


def persistenced_running(procfs: Path) -> Reading[bool]:
    import psutil

    # psutil reads processes from PROCFS_PATH; point it at the injected root.
    previous = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(procfs)
    try:
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] == "nvidia-persistenced":
                return Reading.ok(True)
        return Reading.ok(False)
    except Exception as exc:  # psutil fails in odd ways on a procfs with no processes
        return Reading.failed(f"cannot list processes in {procfs}: "
                              f"{type(exc).__name__}: {exc}")
    finally:
        psutil.PROCFS_PATH = previous
