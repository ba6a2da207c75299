"""Reading a forked worker's pipe until it closes or a deadline passes, and its exit code.
Standard library only: it is imported before the fork, on the critical path of `gpuguard
check`."""

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


def exit_code(pid: int, until: float) -> int | None:
    """The worker's exit code (negative: the signal), waiting at most until the monotonic
    time `until` (its pipe is closed, so it is exiting; a core dump may still be being
    written); None when it has not ended by then or is not this process's child."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= until:
            return None
        time.sleep(0.002)
