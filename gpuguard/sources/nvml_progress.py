"""Which NVML call each worker thread is in, in shared memory, so that the parent can name
the call that hung without a syscall per call. Standard library only (imported before
`gpuguard check` forks)."""

from __future__ import annotations

import mmap
import os

SLOT_SIZE = 128
GPU_SLOTS = 64
# slot 0: host calls; then one per GPU's sweep thread; then one per GPU's early InfoROM
# validation (nvml_early.py)
MAX_SLOTS = 1 + 2 * GPU_SLOTS


class Progress:
    """One slot per worker thread (slot 0: host calls, slot i+1: GPU i, slot 65+i: GPU i's
    early InfoROM validation) in shared memory:
    anonymous for a forked worker, a file for one spawned by the daemon."""

    def __init__(self, path: str | None = None) -> None:
        size = SLOT_SIZE * MAX_SLOTS
        if path is None:
            self.buf = mmap.mmap(-1, size)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, size)
                self.buf = mmap.mmap(fd, size)
            finally:
                os.close(fd)

    def set(self, slot: int, text: str) -> None:
        if slot >= MAX_SLOTS:
            return
        raw = text.encode()[: SLOT_SIZE - 1]
        start = slot * SLOT_SIZE
        self.buf[start : start + len(raw) + 1] = raw + b"\0"

    def active(self) -> list[str]:
        calls = []
        for slot in range(MAX_SLOTS):
            start = slot * SLOT_SIZE
            raw = bytes(self.buf[start : start + SLOT_SIZE]).split(b"\0", 1)[0]
            call = raw.decode(errors="replace")
            # a sweep thread waiting on its GPU's early validation names the same call
            if call and call not in calls:
                calls.append(call)
        return calls
