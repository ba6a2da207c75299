"""Events that start a cycle at once: a GPU leaving or joining the PCI bus (udev).

The handler is a plain function of (action, properties), so tests and replays feed it
events; on `remove` the sysfs node is already gone, so only the event's own properties
(PCI_ID=10DE:xxxx, PCI_SLOT_NAME, DRIVER) are read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("gpuguard.events")

NVIDIA_VENDOR = "10DE"
ACTIONS = {"add", "remove", "bind", "unbind", "change"}

Trigger = Callable[[str], None]


def is_nvidia(action: str, properties: Mapping[str, str]) -> bool:
    if properties.get("PCI_ID", "").upper().startswith(NVIDIA_VENDOR + ":"):
        return True
    # an unbind names the driver that let go of the device
    return action in ("bind", "unbind") and properties.get("DRIVER", "") == "nvidia"


def handle_udev(action: str, properties: Mapping[str, str], trigger: Trigger) -> bool:
    """Start a cycle for an NVIDIA PCI device's add/remove/bind/unbind; True if it did."""
    if action not in ACTIONS or not is_nvidia(action, properties):
        return False
    slot = properties.get("PCI_SLOT_NAME", "?")
    log.warning("gpu_pci_event", action=action, pci_slot=slot, pci_id=properties.get("PCI_ID"))
    trigger(f"udev {action} {slot}")
    return True


def start_udev(trigger: Trigger) -> Any | None:
    """Listen to udev's PCI events; None (logged) where netlink is not available."""
    try:
        import pyudev

        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context)
        monitor.filter_by("pci")
        observer = pyudev.MonitorObserver(
            monitor, callback=lambda device: handle_udev(device.action or "",
                                                         dict(device.properties), trigger),
            name="udev-monitor")
        observer.daemon = True
        observer.start()
        return observer
    except Exception as exc:  # no netlink in a container, no libudev: run without events
        log.warning("udev_unavailable", error=f"{type(exc).__name__}: {exc}")
        return None


# A udev event is a few hundred bytes; a longer line is skipped, never held in memory.
MAX_EVENT_LINE = 64 * 1024


def _skip_line(handle: Any, read: int) -> int | None:
    """Bytes up to the end of an overlong line, or None while its end is not written."""
    while more := handle.readline(MAX_EVENT_LINE):
        read += len(more)
        if more.endswith(b"\n"):
            return read
    return None


def follow_file(path: Path, trigger: Trigger, stop: threading.Event) -> threading.Thread:
    """Events recorded as JSON lines ({"action": ..., "properties": {...}}) appended to a
    file: a replay of a udev log, and how the tests drive the daemon."""

    def run() -> None:
        offset = 0
        complained = False
        while not stop.is_set():
            try:
                if not path.exists() or not path.is_file():  # never block on a FIFO
                    raise FileNotFoundError(path)
                with path.open("rb") as handle:
                    handle.seek(offset)
                    while line := handle.readline(MAX_EVENT_LINE):
                        if not line.endswith(b"\n"):
                            if len(line) < MAX_EVENT_LINE:
                                break  # the rest of the line is still being written
                            skipped = _skip_line(handle, len(line))
                            if skipped is None:
                                break
                            offset += skipped
                            log.warning("bad_event_line", file=str(path),
                                        error=f"longer than {MAX_EVENT_LINE} bytes")
                            continue
                        offset += len(line)
                        try:
                            event = json.loads(line)
                            handle_udev(event["action"], event.get("properties", {}), trigger)
                        except (ValueError, KeyError, TypeError, AttributeError,
                                RecursionError) as exc:
                            log.warning("bad_event_line", file=str(path), error=str(exc)[:200])
                complained = False
            except OSError as exc:
                if not complained and not isinstance(exc, FileNotFoundError):
                    log.warning("events_file_unreadable", file=str(path), error=str(exc))
                complained = True
            time.sleep(0.05)

    thread = threading.Thread(target=run, name="event-file", daemon=True)
    thread.start()
    return thread
