"""Root paths, injectable as node_exporter does, so every source runs on fixture trees;
and the guard that keeps the tests off the host's own paths.

Every default host path (the kernel log, /proc, /sys, the root filesystem, /etc/gpuguard,
/var/lib/gpuguard, udev's netlink socket, the boot id) is taken through host_default().
With GPUGUARD_FORBID_HOST set (the tests' conftest sets it), a default is refused with
HostPathForbidden, which the command line turns into exit 4 naming the path and the
option to give instead: a test that reaches for the host fails on every machine, not
only on one whose host happens to differ (an unreadable path would only give unknown).
The switch may also replace a default with a path of the test's own:

    GPUGUARD_FORBID_HOST=1                                   refuse every default
    GPUGUARD_FORBID_HOST=etc=/tmp/empty,kmsg=/tmp/xids.log   refuse the rest

Live tests lift the switch explicitly (tests/conftest.py: `live`).
"""

from __future__ import annotations

from pathlib import Path

# the switch and its error live in io/guard (no pathlib: read before check's fork)
from gpuguard.io.guard import EXIT_HOST_FORBIDDEN as EXIT_HOST_FORBIDDEN
from gpuguard.io.guard import FORBID_ENV as FORBID_ENV
from gpuguard.io.guard import HostPathForbidden as HostPathForbidden
from gpuguard.io.guard import forbidden as forbidden
from gpuguard.io.guard import host_default_text


def host_default(kind: str) -> Path:
    """The host's own path of this kind, unless the guard refuses or replaces it."""
    return Path(host_default_text(kind))


def profile_or_default(path: Path | None) -> Path | None:
    """The profile given, else /etc/gpuguard/profile.yaml where it exists, else None."""
    return _file_or_default(path, "profile.yaml")


def config_or_default(path: Path | None) -> Path | None:
    """The services file given, else /etc/gpuguard/gpuguard.yaml where it exists."""
    return _file_or_default(path, "gpuguard.yaml")


def _file_or_default(path: Path | None, name: str) -> Path | None:
    if path is not None:
        return path
    default = host_default("etc") / name
    return default if default.exists() else None


def rules_dirs_or_default(dirs: list[Path] | tuple[Path, ...]) -> list[Path]:
    if dirs:
        return list(dirs)
    default = host_default("etc") / "rules.d"
    return [default] if default.is_dir() else []


def state_dir_or_default(path: Path | None) -> Path:
    return path if path is not None else host_default("state")


class Paths:
    """The roots of the host sources. A root not given is the host's own, looked up only
    when a source uses it (a replay that reads no procfs never asks for /proc)."""

    def __init__(self, sysfs: Path | None = None, procfs: Path | None = None,
                 rootfs: Path | None = None) -> None:
        self._sysfs, self._procfs, self._rootfs = sysfs, procfs, rootfs

    @property
    def sysfs(self) -> Path:
        return self._sysfs if self._sysfs is not None else host_default("sysfs")

    @property
    def procfs(self) -> Path:
        return self._procfs if self._procfs is not None else host_default("procfs")

    @property
    def rootfs(self) -> Path:
        return self._rootfs if self._rootfs is not None else host_default("rootfs")

    @property
    def boot_id_file(self) -> Path:
        """The boot id: under --path.procfs when given, else the host's."""
        if self._procfs is not None:
            return self._procfs / "sys" / "kernel" / "random" / "boot_id"
        return host_default("boot_id")

    def __repr__(self) -> str:
        return (f"Paths(sysfs={self._sysfs}, procfs={self._procfs}, "
                f"rootfs={self._rootfs})")
