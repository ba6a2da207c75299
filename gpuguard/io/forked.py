"""One way to run work in a forked child that may hang or crash: fork, a result pipe, the
child dies with its parent, the parent reads until a deadline, kills what is left and
reaps it. The NVML sweep of `check`, the host facts and the active probe's workers all
start here.

Why a fork and not a thread: a call stuck inside a driver (D state) cannot be interrupted,
and a thread stuck there keeps the whole process from exiting. Why the child dies with
its parent (PR_SET_PDEATHSIG): a `check` killed by `timeout` or a Slurm prolog must not
leave workers behind holding a GPU context.

Standard library only: imported before `gpuguard check` forks its NVML worker.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

# prctl from the C library. A child of a threaded parent (the daemon) must not dlopen
# (another thread may have held the loader's lock at the fork): such a parent calls
# prepare() first; a single-threaded one (`check`) lets its child look prctl up itself.
_PRCTL: list[Any] = []
PR_SET_PDEATHSIG = 1


def prepare() -> None:
    """Look prctl up now, in the parent, before any fork of a threaded process."""
    if not _PRCTL:
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)


def die_with_parent(parent: int) -> None:
    """In a child just forked: the kernel kills it (SIGKILL) when its parent goes."""
    if not _PRCTL:
        prepare()
    if _PRCTL:
        with contextlib.suppress(Exception):
            _PRCTL[0](PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent went before prctl took effect
        os._exit(1)


def fork(body: Callable[[], None]) -> int:
    """Fork a child that dies with us, runs `body` and exits (0, or 1 when `body` raised:
    the parent learns the rest from what the child wrote and how it ended); its pid."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            die_with_parent(parent)
            body()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


class Worker:
    """A forked child writing text lines to a pipe of its own: `body(out)` runs in the
    child; the parent takes what was written by a deadline (`read`), then how the child
    ended (`ending`), killing it when it did not finish."""

    def __init__(self, body: Callable[[TextIO], None]) -> None:
        self.started = time.monotonic()
        read_fd, write_fd = os.pipe()

        def child() -> None:
            os.close(read_fd)
            with os.fdopen(write_fd, "w", buffering=1) as out:
                body(out)

        self.pid = fork(child)
        os.close(write_fd)
        self._read_fd = read_fd
        self.finished = False

    def read(self, until: float) -> bytes:
        """Everything the child wrote by the monotonic time `until`; `finished` says
        whether it closed its end (done) by then. Once only: the pipe is closed."""
        data, self.finished = read_until(self._read_fd, until)
        return data

    def kill(self) -> None:
        """SIGKILL, not waited for: a child in D state cannot be reaped until the kernel
        lets go of it (init reaps it if we are gone first)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.reap()

    def reap(self) -> bool:
        """Whether the child is gone (reaped now, or not ours to reap)."""
        return reaped(self.pid)

    def exit_code(self, until: float) -> int | None:
        return exit_code(self.pid, until)


def read_until(fd: int, end: float, stop: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> tuple[bytes, bool]:
    """Everything written to `fd` by the monotonic time `end`, and whether the writer
    closed its end (finished) by then. Closes `fd`. With `stop`, it is asked every
    `poll_s` and a true answer ends the read at once (a stopped qualify run)."""
    chunks: list[bytes] = []
    finished = False
    try:
        while (remaining := end - time.monotonic()) > 0:
            if stop is not None and stop():
                break
            wait = remaining if stop is None else min(remaining, poll_s)
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                if stop is None:
                    break
                continue
            data = os.read(fd, 65536)
            if not data:
                finished = True
                break
            chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks), finished


def reaped(pid: int) -> bool:
    """Whether the child is gone (reaped now, or not this process's child any more)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def exit_code(pid: int, until: float) -> int | None:
    """The child's exit code (negative: the signal), waiting at most until the monotonic
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


def describe_ending(code: int | None) -> str | None:
    """How a child ended, in words: None when it exited by itself with 0 (or could not be
    told); else the code or the signal it died of."""
    if code is None or code == 0:
        return None
    if code > 0:
        return f"exited with code {code}"
    try:
        return f"died of {signal.Signals(-code).name}"
    except ValueError:
        return f"died of signal {-code}"
