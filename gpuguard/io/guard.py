"""The test guard's switch (GPUGUARD_FORBID_HOST, gpuguard/io/paths.py explains it), and the
error it raises. Standard library only, no pathlib: `gpuguard check` reads it before it
forks its NVML worker."""

from __future__ import annotations

import os

FORBID_ENV = "GPUGUARD_FORBID_HOST"
# Distinct from the Nagios codes 0-3: not a verdict, a test that reached for the host.
EXIT_HOST_FORBIDDEN = 4

# kind -> (the host's path, the option that replaces it)
HOST_DEFAULTS: dict[str, tuple[str, str]] = {
    "kmsg": ("/dev/kmsg", "--kmsg-file"),
    "procfs": ("/proc", "--path.procfs"),
    "sysfs": ("/sys", "--path.sysfs"),
    "rootfs": ("/", "--path.rootfs"),
    "etc": ("/etc/gpuguard", "--profile, --rules or --config"),
    "state": ("/var/lib/gpuguard", "--state-dir"),
    "boot_id": ("/proc/sys/kernel/random/boot_id", "--path.procfs"),
    "udev": ("/run/udev", "--no-udev"),
    "run": ("/run/gpuguard", "--socket"),  # the daemon's status socket (gpuguard status)
}


class HostPathForbidden(Exception):
    """A default host path was about to be used while GPUGUARD_FORBID_HOST is set."""

    def __init__(self, kind: str) -> None:
        path, option = HOST_DEFAULTS[kind]
        self.kind, self.path, self.option = kind, path, option
        super().__init__(f"refused to use the host's {path} ({FORBID_ENV} is set: a test "
                         f"reached for the host; give {option})")


def switch() -> dict[str, str] | None:
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


def host_default_text(kind: str) -> str:
    """The host's own path of this kind, unless the guard refuses or replaces it."""
    redirects = switch()
    if redirects is None:
        return HOST_DEFAULTS[kind][0]
    if kind in redirects:
        return redirects[kind]
    raise HostPathForbidden(kind)


def forbidden() -> bool:
    """Whether the guard is on (for sources that are not a path, such as udev)."""
    return switch() is not None
