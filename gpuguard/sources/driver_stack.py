"""procfs and /dev: which kernel modules are loaded, their version, the device nodes,
and whether nvidia-persistenced runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuguard.model.snapshot import Reading

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


PERSISTENCED = "nvidia-persistenced"
# The nvidia-fabricmanager service runs /usr/bin/nv-fabricmanager (comm "nv-fabricmanage").
FABRICMANAGER = "nv-fabricmanager"


def persistenced_running(procfs: Path) -> Reading[bool]:
    return process_running(procfs, PERSISTENCED)


def fabricmanager_running(procfs: Path) -> Reading[bool]:
    """NVSwitch hosts need it for the GPU fabric; inside a VM the host may run it instead
    (the fabric state then says Completed with no such process here)."""
    return process_running(procfs, FABRICMANAGER)


def process_running(procfs: Path, program: str) -> Reading[bool]:
    """Scan <procfs>/*/comm. psutil would do it too, but importing it costs 33-38 ms on
    the critical path of `gpuguard check` (docs/benchmarks.md); this costs a few."""
    try:
        pids = [name for name in os.listdir(procfs) if name.isdigit()]
    except OSError as exc:
        return Reading.failed(f"cannot list processes in {procfs}: {exc.strerror or exc}")
    for pid in pids:
        try:
            # comm holds at most 15 characters ("nvidia-persiste"); cmdline settles it.
            if not program.startswith((procfs / pid / "comm").read_text().strip()):
                continue
            argv0 = (procfs / pid / "cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue  # exited while we looked
        if os.path.basename(argv0.decode(errors="replace")) == program:
            return Reading.ok(True)
    return Reading.ok(False)
