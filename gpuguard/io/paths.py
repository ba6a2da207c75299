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

import os
from pathlib import Path

FORBID_ENV = "GPUGUARD_FORBID_HOST"
# Distinct from the Nagios codes 0-3: not a verdict, a test that reached for the host.
EXIT_HOST_FORBIDDEN = 4

# kind -> (the host's path, the option that replaces it)
HOST_DEFAULTS: dict[str, tuple[Path, str]] = {
    "kmsg": (Path("/dev/kmsg"), "--kmsg-file"),
    "procfs": (Path("/proc"), "--path.procfs"),
    "sysfs": (Path("/sys"), "--path.sysfs"),
    "rootfs": (Path("/"), "--path.rootfs"),
    "etc": (Path("/etc/gpuguard"), "--profile, --rules or --config"),
    "state": (Path("/var/lib/gpuguard"), "--state-dir"),
    "boot_id": (Path("/proc/sys/kernel/random/boot_id"), "--path.procfs"),
    "udev": (Path("/run/udev"), "--no-udev"),
}


class HostPathForbidden(Exception):
    """A default host path was about to be used while GPUGUARD_FORBID_HOST is set."""

    def __init__(self, kind: str) -> None:
        path, option = HOST_DEFAULTS[kind]
        self.kind, self.path, self.option = kind, path, option
        super().__init__(f"refused to use the host's {path} ({FORBID_ENV} is set: a test "
                         f"reached for the host; give {option})")


def _switch() -> dict[str, str] | None:
    """None when the guard is off; else the kinds replaced by a path of the test's own."""
    value = os.environ.get(FORBID_ENV, "")
    if value in ("", "0"):
        return None
    redirects: dict[str, str] = {}
    for item in value.split(","):
        kind, sep, path = item.partition("=")
        if sep and kind in HOST_DEFAULTS and path:
            redirects[kind] = path
    return redirects


def host_default(kind: str) -> Path:
    """The host's own path of this kind, unless the guard refuses or replaces it."""
    redirects = _switch()
    if redirects is None:
        return HOST_DEFAULTS[kind][0]
    if kind in redirects:
        return Path(redirects[kind])
    raise HostPathForbidden(kind)


def forbidden() -> bool:
    """Whether the guard is on (for sources that are not a path, such as udev)."""
    return _switch() is not None


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
