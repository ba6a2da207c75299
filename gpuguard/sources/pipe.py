"""Reading a forked worker's pipe until it closes or a deadline passes. Standard library
only: it is imported before the fork, on the critical path of `gpuguard check`."""

from __future__ import annotations

import os
import select
import time


def read_until(fd: int, end: float) -> tuple[bytes, bool]:
    """Everything written to `fd` by the monotonic time `end`, and whether the writer
    closed its end (finished) by then. Closes `fd`."""
    chunks: list[bytes] = []
    finished = False
    try:
        while (remaining := end - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                break
            data = os.read(fd, 65536)
            if not data:
                finished = True
                break
            chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks), finished
