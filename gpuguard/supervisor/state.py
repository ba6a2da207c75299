"""The supervisor's state on disk: which variant serves, since when, why, and the step of
a transition in progress. Written atomically and fsynced before every step, so a restart
after SIGKILL knows where it stopped. A file that cannot be read is moved aside and
reported, never trusted and never silently replaced by "gpu".

This module is the only reader and writer of the state directory's supervisor files:
the daemon (service.py) and the command line (`gpuguard failover to`; `status` through
state_view.py) both go through it. Every read is of a regular file only, opened without
blocking (a FIFO must not hang the daemon) and bounded in size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec

from gpuguard.io import clock
from gpuguard.io.atomic import write_text
from gpuguard.supervisor.config import SERVICE_NAME

# A state file is a few hundred bytes; a request less. Anything bigger is not ours.
MAX_FILE_BYTES = 64 * 1024
# Counters are bounded: a state file written by hand (or by a very long outage) must not
# make a number the bookkeeping cannot handle.
MAX_COUNT = 1_000_000_000
MAX_REASON_CHARS = 500
MAX_BOOT_ID_CHARS = 64  # a boot id is a UUID: 36


@dataclass
class Transition:
    to: str  # "cpu" or "gpu"
    step: str
    reason: str
    started: float
    action: str = "none"  # the suggested action that moved it (a resumed one keeps it)


@dataclass
class ServiceState:
    active: str = "gpu"
    # Wall times (since, on_cpu_since, next_retry, last_transition, transition.started)
    # are for display and the metrics' timestamps only; what the supervisor decides with
    # is measured on CLOCK_BOOTTIME below (a step of the wall clock changes nothing).
    since: float = field(default_factory=time.time)
    reason: str = "initial"
    transition: Transition | None = None
    failed_cycles: int = 0
    healthy_cycles: int = 0
    on_cpu_since: float | None = None
    # every failed transition or convergence, for gpuguard_failover_errors_total
    errors: int = 0
    # failed transitions since the last one that worked: the retry backoff grows with it
    failures_in_row: int = 0
    next_retry: float = 0.0
    transitions: dict[str, int] = field(default_factory=lambda: {"to_cpu": 0, "to_gpu": 0})
    last_transition: float | None = None
    # The boot the CLOCK_BOOTTIME readings below were taken in (io/clock.boottime): when
    # the service went to CPU (min_cpu_time counts from it, across restarts of the daemon
    # within the boot) and when the next try may come after a failed transition. A file
    # of another boot, or written before these fields (wall times only), is rebased when
    # loaded (service.Supervisor.recover): its time on CPU counts from the restart.
    boot_id: str | None = None
    on_cpu_boottime: float | None = None
    retry_boottime: float = 0.0
    # `failback_probe: qualify`: the wall time of the hardware finding (the failover's,
    # or a later one on CPU) a qualification must have started after; None: none needed
    qualify_after: float | None = None
    # why the last automatic failback was held back, for `failover status`
    failback_blocked: str | None = None


# keys without which a file says nothing we can trust (a missing `active` is not "gpu")
_REQUIRED = ("active", "since", "reason")


class Unreadable(Exception):
    """A supervisor file that is not what it must be; `reason` says what it is instead."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CorruptState(Exception):
    def __init__(self, path: Path, moved_to: Path | None, reason: str) -> None:
        self.path, self.moved_to, self.reason = path, moved_to, reason
        where = f"moved aside to {moved_to}" if moved_to else "could not be moved aside"
        super().__init__(f"{path}: {reason}; {where}")


class CannotAccess(Exception):
    """The state directory cannot be read or written: `cannot write PATH: why`."""


class NoSuchService(Exception):
    pass


@dataclass
class MoveRequest:
    """`gpuguard failover to`: move the service to `to`."""

    to: str
    reason: str


class BadRequest(Exception):
    """A request file that is not read; it was moved aside (moved_to) or left (None)."""

    def __init__(self, path: Path, reason: str, moved_to: Path | None) -> None:
        self.path, self.reason, self.moved_to = path, reason, moved_to
        super().__init__(f"{path}: {reason}")


def path_for(state_dir: Path, service: str) -> Path:
    return state_dir / f"failover-{service}.json"


def request_path(state_dir: Path, service: str) -> Path:
    return state_dir / f"failover-{service}.request.json"


# --- the daemon's state file ----------------------------------------------------------


def save(path: Path, state: ServiceState) -> None:
    os.makedirs(path.parent, exist_ok=True)
    write_text(path, json.dumps(asdict(state), indent=1) + "\n", mode=0o600)


def read(path: Path) -> ServiceState | None:
    """None when there is no file; Unreadable when there is one we cannot trust. Changes
    nothing (the command line reads with it too)."""
    try:
        data, _ = _read_regular(path, follow=True)
    except FileNotFoundError:
        return None
    return _parse_state(data)


def load(path: Path) -> ServiceState | None:
    """The daemon's read: None when there is no file yet; CorruptState when there is one we
    cannot trust, after moving it aside so that the next save can take its place."""
    try:
        return read(path)
    except Unreadable as exc:
        moved = _move_aside(path, "corrupt")
        raise CorruptState(path, moved, f"not a valid state file ({exc.reason})") from exc


def _parse_state(data: bytes) -> ServiceState:
    try:
        raw = msgspec.json.decode(data)
        if not isinstance(raw, dict):
            raise Unreadable(f"a JSON {type(raw).__name__}, not an object")
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise Unreadable(f"{', '.join(missing)} missing")
        state = msgspec.convert(raw, ServiceState)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unreadable(str(exc)) from exc
    except RecursionError:  # msgspec's own depth limit raises it, not a DecodeError
        raise Unreadable("JSON nested too deep") from None
    _check_values(state)
    return state


def _check_values(state: ServiceState) -> None:
    """Unreadable for a value no state of ours holds; counts capped at MAX_COUNT."""
    if state.active not in ("gpu", "cpu"):
        raise Unreadable(f"active is {state.active!r}")
    if state.transition is not None and state.transition.to not in ("gpu", "cpu"):
        raise Unreadable(f"transition.to is {state.transition.to!r}")
    for name in ("since", "next_retry", "on_cpu_since", "last_transition",
                 "on_cpu_boottime", "retry_boottime", "qualify_after"):
        value = getattr(state, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise Unreadable(f"{name} is {value!r}")
    if state.boot_id is not None and len(state.boot_id) > MAX_BOOT_ID_CHARS:
        raise Unreadable("boot_id is too long to be one")
    for name in ("failed_cycles", "healthy_cycles", "errors", "failures_in_row"):
        if getattr(state, name) < 0:
            raise Unreadable(f"{name} is negative")
        setattr(state, name, min(getattr(state, name), MAX_COUNT))


def rebase(st: ServiceState, boot_id: str | None, longest_wait_s: float) -> str | None:
    """A loaded state's CLOCK_BOOTTIME readings made this boot's (changed in place);
    what was rebased, for the log, or None when the file is of this boot.

    Within one boot, the time on CPU and the retry wait go on from the file's readings
    (a restart of the daemon loses none of it). From another boot, or from a file written
    before the boot clock (wall times only), they cannot be told: the wall clock may have
    stepped since (a failover made under a clock in the future would never fail back),
    and CLOCK_BOOTTIME started again at 0. So the time on CPU counts from now, the
    restart: `min_cpu_time` holds the service on CPU at most that long again, never for
    ever. A retry wait is what the wall clock says is left, at most `longest_wait_s`."""
    now_boot, now_wall = clock.boottime(), time.time()
    if boot_id is not None and st.boot_id == boot_id:
        if st.active == "cpu" and (st.on_cpu_boottime is None or st.on_cpu_boottime > now_boot):
            st.on_cpu_boottime = now_boot  # a reading ahead of this boot's clock: not one
        st.retry_boottime = min(st.retry_boottime, now_boot + longest_wait_s)
        return None
    why = "written before the boot clock" if st.boot_id is None else "of another boot"
    st.on_cpu_boottime = now_boot if st.active == "cpu" else None
    left = min(max(st.next_retry - now_wall, 0.0), longest_wait_s) if st.next_retry else 0.0
    st.retry_boottime = now_boot + left if left > 0 else 0.0
    st.boot_id = boot_id
    return why


# --- requests from `gpuguard failover to` ---------------------------------------------


def write_request(state_dir: Path, service: str, to: str, reason: str) -> Path:
    """Ask the daemon to move `service`; NoSuchService when it has no state here, and
    CannotAccess (`cannot write PATH: why`) when the request cannot be written."""
    if re.fullmatch(SERVICE_NAME, service) is None:  # never a path of its own
        raise NoSuchService(f"{service!r} is not a service name (1 to 64 letters, digits, "
                            "'_' or '-')")
    try:
        os.lstat(path_for(state_dir, service))
    except FileNotFoundError as exc:
        raise NoSuchService(f"no supervised service {service!r} in {state_dir}") from exc
    except OSError as exc:
        raise CannotAccess(f"cannot read {state_dir}: {exc.strerror or exc}") from exc
    path = request_path(state_dir, service)
    text = json.dumps({"to": to, "reason": reason[:MAX_REASON_CHARS], "at": time.time()})
    try:
        write_text(path, text, mode=0o600)
    except OSError as exc:
        raise CannotAccess(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def move_done(state_dir: Path, service: str, to: str) -> bool:
    """Has the daemon taken the request and finished the move to `to`?"""
    if os.path.lexists(request_path(state_dir, service)):
        return False
    try:
        current = read(path_for(state_dir, service))
    except Unreadable:
        return False
    return current is not None and current.active == to and current.transition is None


def take_request(state_dir: Path, service: str) -> MoveRequest | None:
    """The pending request, consumed; None when there is none. A request path that is not
    a small regular file of ours, or not a valid request, is moved aside and BadRequest
    raised: it is never read twice, and never blocks (a FIFO) or fills memory."""
    path = request_path(state_dir, service)
    try:
        data, info = _read_regular(path, follow=False)
        _check_trusted(path, info)
        raw = json.loads(data)
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        raise _reject(path, exc.reason) from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise _reject(path, f"not JSON ({exc})") from None
    except RecursionError:  # not a ValueError: 4 KiB of `[` is 4,000 levels
        raise _reject(path, "not JSON (nested too deep)") from None
    to = raw.get("to") if isinstance(raw, dict) else None
    reason = raw.get("reason") if isinstance(raw, dict) else None
    if to not in ("gpu", "cpu") or not isinstance(reason, str | None):
        raise _reject(path, 'not a request ({"to": "gpu" or "cpu", "reason": text})')
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return MoveRequest(str(to), (reason or "manual")[:MAX_REASON_CHARS])


def _check_trusted(path: Path, info: os.stat_result) -> None:
    """Only the daemon's user (or root) may ask it to move a service; in a directory
    others can write to, the file must not be writable by them either."""
    if info.st_uid not in (os.geteuid(), 0):
        raise Unreadable(f"owned by uid {info.st_uid}, not by the daemon's user or root")
    try:
        dir_mode = os.stat(path.parent).st_mode
    except OSError as exc:
        raise Unreadable(f"its directory cannot be read ({exc.strerror})") from exc
    others = stat.S_IWGRP | stat.S_IWOTH
    if dir_mode & others and info.st_mode & others:
        raise Unreadable("writable by group or others, in a directory they can write to")


def _reject(path: Path, reason: str) -> BadRequest:
    return BadRequest(path, reason, _move_aside(path, "rejected"))


def _move_aside(path: Path, why: str) -> Path | None:
    """`path` renamed to `path.WHY-TIME` (a rename never opens, so never blocks on a
    FIFO); None when it cannot be moved."""
    moved = path.with_name(f"{path.name}.{why}-{int(time.time())}")
    try:
        os.replace(path, moved)
    except OSError:
        return None
    return moved


# --- reading ---------------------------------------------------------------------------


def _read_regular(path: Path, follow: bool) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most MAX_FILE_BYTES. FileNotFoundError when there
    is none; Unreadable for anything else (a directory, a FIFO, a device, too big)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if not follow and os.path.islink(path):
            raise Unreadable("a symbolic link") from exc
        raise Unreadable(exc.strerror or str(exc)) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"not a regular file but {_kind(info.st_mode)}")
        if info.st_size > MAX_FILE_BYTES:
            raise Unreadable(f"{info.st_size} bytes, more than {MAX_FILE_BYTES}")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, MAX_FILE_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # it grew while we read
                raise Unreadable(f"more than {MAX_FILE_BYTES} bytes")
        return b"".join(chunks), info
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
             stat.S_ISLNK: "a symbolic link"}
    return next((name for test, name in kinds.items() if test(mode)), "not a file")
