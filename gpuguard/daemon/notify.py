"""The systemd notify protocol: one datagram of KEY=VALUE lines to $NOTIFY_SOCKET.

Documented as stable and small enough that a native dependency is not worth it.
"""

from __future__ import annotations

import os
import socket
import time


def notify(*lines: str) -> bool:
    """Send READY=1, STATUS=..., WATCHDOG=1, ... Returns False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    # Non-blocking: a datagram socket queues only net.unix.max_dgram_qlen messages, and
    # a reader that fell behind must never stall the main loop (and with it SIGTERM or
    # the watchdog). A message that does not fit is dropped.
    with socket.socket(socket.AF_UNIX,
                       socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
        try:
            sock.connect(address)
            sock.send("\n".join(lines).encode())
        except OSError:
            return False
    return True


def reloading() -> bool:
    # RELOADING=1 must carry the monotonic time for Type=notify-reload; harmless otherwise.
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}")


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when not asked."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
