"""Running a user's command (the exec backend's start, stop and running commands, an
`exec:` probe): a deadline on the command itself, never on its output.

A start command usually leaves the service running in the background
(`server & echo $! > /run/llm-gpu.pid`, as docs/supervisor.md shows). That child inherits
the command's stdout and stderr: were they a pipe gpuguard reads to its end, the read would
last as long as the service (subprocess.run waited out its whole timeout, 300 s, then gave
up), and once gpuguard closed its end, the service's next line of log would kill it
(SIGPIPE). So a command's stdin and stdout are /dev/null, and its stderr is /dev/null or a
temporary file that gpuguard reads once the command has exited (never a pipe). Each command
runs in a session of its own: a Ctrl-C or a signal to the daemon's process group never
reaches the services it started, and a command past its deadline is killed with its whole
group, what it started in the background included (a start that did not finish has failed,
and the transition puts the source back).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from typing import IO

# The last characters of a command's stderr kept for its error message.
ERROR_TAIL = 300


@dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit status, or None when it was killed at its deadline
    or could not start (`error` says which); the tail of its stderr when it was kept."""

    code: int | None
    stderr: str = ""
    error: str | None = None


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
        keep_stderr: bool = True) -> Outcome:
    """Run `argv` until it exits or `timeout` passes. `keep_stderr`: read its stderr
    (a temporary file) for the error message; leave it False for a command that starts
    something that outlives it (a start command), whose stderr is then /dev/null."""
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(tempfile.TemporaryFile()) if keep_stderr else None
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL if err is None else err,
                                    env=env, start_new_session=True)
        except (OSError, ValueError) as exc:  # not found, not executable, a NUL in argv
            return Outcome(None, error=f"could not start: {exc}")
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Outcome(None, _tail(err), f"did not exit within {timeout:g} s: killed, "
                           "with what it started")
        return Outcome(code, _tail(err))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # the command leads its own session and group (start_new_session): its pid is the
    # group's id, so this reaches nothing of the daemon's
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(err: IO[bytes] | None) -> str:
    """The end of what the command wrote to its stderr ("" when it was not kept). Read
    from the end: a command may have written far more than is kept."""
    if err is None:
        return ""
    try:
        size = err.seek(0, os.SEEK_END)
        err.seek(max(size - 4 * ERROR_TAIL, 0))
        text = err.read()
    except OSError:
        return ""
    return text.decode("utf-8", "replace").strip()[-ERROR_TAIL:]
