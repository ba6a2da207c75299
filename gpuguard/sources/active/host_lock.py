"""One active probe per host at a time, across processes: two `check --active` at once, or
one beside the daemon's, would share the PCIe links and HBM and each read low. An flock
on a file in the state dir; the second waits within its own deadline, then reports its
GPUs unknown. A state dir that cannot hold the file leaves the probe unlocked (a
coordination aid must not stop a probe), and says so in the log line it returns."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time


class HostLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.why: str | None = None  # why the file could not be had (acquire gave None)

    def acquire(self, until: float) -> bool | None:
        """True once held, False when another holds it at the monotonic time `until`, None
        when the file cannot be had (no lock to wait for)."""
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600)
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            return None
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= until:
                    self.release()
                    return False
                time.sleep(0.02)

    def close_in_child(self) -> None:
        """In a forked worker: its copy of the descriptor is not its to hold (a worker stuck
        in the driver would otherwise keep every later probe out)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
