"""The daemon's verdict on a local Unix socket, for `gpuguard status` and `gpuguard slurm
health`: nothing on the network, readable by root and one group (`gpuguard` by default;
root alone where the group does not exist), so a job's user cannot read the host's
findings.

One request per connection: a JSON line of at most 4 KiB, read within 2 s, answered with
one JSON document (or, for `want: text`, a frame: `GGV1 <code> <bytes>` or `GGV1 error
<bytes>`, a newline, then the rendering or the error as it is), then closed. A request
that is not UTF-8, not JSON, nested too deep, over the size or too late gets an error
reply, never a traceback; what clients cause is logged one line a minute (LogQuota).

At most 8 connections are served at once, counted per peer uid (SO_PEERCRED, as the
kernel tells it): one uid holds at most 6, and one of the 8 is kept for root, so group
members that keep idle connections open and renew them never push root's `status` and
`slurm health` onto their cold path (issue 27). A connection over its uid's share is
closed at once; root, finding all 8 taken (which only its own requests can make so),
waits for one within the deadline. A slot kept rather than one taken by eviction:
evicting closes a connection another thread is serving, perhaps a member's `status` that
has sent its request, and root's answer would hang on there being a victim; a kept slot
is a count under one lock, and costs the group one of 8. A client that never sends,
never reads or sends garbage costs one of its uid's slots for at most the deadline and
never stops the cycles or the other clients.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gpuguard.daemon.verdict_view import BadRequest, DaemonView, Request, answer

log = structlog.get_logger("gpuguard.daemon")

MAX_REQUEST = 4096
DEADLINE_S = 2.0
MAX_CLIENTS = 8
MAX_PER_UID = 6  # one member's share: the other 2 stay for the others and root
ROOT = 0
ROOT_KEPT = 1  # slots no uid but root's may take
MAX_ROOT_WAITING = 8  # root's requests waiting for a slot its own others hold
UNKNOWN_UID = -1  # no SO_PEERCRED answer: a uid of its own, never root
LOG_EVERY_S = 60.0
LISTEN_BACKLOG = 256
SOCKET_MODE = 0o660  # root and the group: read and connect; nobody else


def group_id(group: str | None) -> int | None:
    """The gid of `group` (a name or a number), None where there is no such group."""
    if not group:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid as the kernel tells it (SO_PEERCRED: pid, uid, gid)."""
    try:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    except OSError:
        return UNKNOWN_UID
    return int(struct.unpack("iII", cred)[1])


class Slots:
    """The 8 slots by peer uid: a uid other than root takes one while it holds fewer than
    MAX_PER_UID and all of them together fewer than MAX_CLIENTS - ROOT_KEPT; root takes
    any free one."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}
        self._changed = threading.Condition()
        self.root_waiting = 0

    def _admits(self, uid: int) -> bool:
        used = sum(self._held.values())
        if uid == ROOT:
            return used < MAX_CLIENTS
        others = used - self._held.get(ROOT, 0)
        return self._held.get(uid, 0) < MAX_PER_UID and others < MAX_CLIENTS - ROOT_KEPT

    def _take(self, uid: int) -> None:
        self._held[uid] = self._held.get(uid, 0) + 1

    def take(self, uid: int) -> bool:
        """A slot for `uid` now, or False."""
        with self._changed:
            if not self._admits(uid):
                return False
            self._take(uid)
            return True

    def queue_root(self) -> bool:
        """Whether one more root request may wait for a slot (take_root_within)."""
        with self._changed:
            if self.root_waiting >= MAX_ROOT_WAITING:
                return False
            self.root_waiting += 1
            return True

    def take_root_within(self, timeout: float) -> bool:
        """A slot for a root request queued by queue_root, once one is free, or False."""
        with self._changed:
            try:
                if not self._changed.wait_for(lambda: self._admits(ROOT), timeout):
                    return False
                self._take(ROOT)
                return True
            finally:
                self.root_waiting -= 1

    def give(self, uid: int) -> None:
        with self._changed:
            self._held[uid] -= 1
            if not self._held[uid]:
                del self._held[uid]
            self._changed.notify_all()

    def held(self) -> dict[int, int]:
        """Slots held now, by uid."""
        with self._changed:
            return dict(self._held)


class LogQuota:
    """One log line per interval for what clients cause (a bad request, a connection over
    its share, a failing answer); the others in the interval are counted by event and the
    counts said on the next line (`untold`). A client sending garbage in a loop costs the
    log a line a minute, never a line (nor a traceback) a request."""

    def __init__(self, every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock  # monotonic: a wall-clock jump neither floods nor mutes it
        self._next: float | None = None
        self._untold: dict[str, int] = {}
        self._lock = threading.Lock()

    def _due(self, event: str) -> dict[str, int] | None:
        """The counts untold so far where this event gets its line, else None."""
        with self._lock:
            now = self._clock()
            if self._next is not None and now < self._next:
                self._untold[event] = self._untold.get(event, 0) + 1
                return None
            self._next = now + self.every_s
            untold, self._untold = self._untold, {}
            return untold

    def warning(self, event: str, **fields: Any) -> None:
        untold = self._due(event)
        if untold is not None:
            log.warning(event, **fields, untold=untold, every_s=self.every_s)

    def exception(self, event: str, **fields: Any) -> None:
        """As warning, with the traceback of the exception being handled."""
        untold = self._due(event)
        if untold is not None:
            log.exception(event, **fields, untold=untold, every_s=self.every_s)


class VerdictSocket:
    def __init__(self, path: Path, group: str | None, view: DaemonView) -> None:
        self.path = path
        self.group = group
        self.view = view
        self._sock: socket.socket | None = None
        self.slots = Slots()
        self.quota = LogQuota()
        self._stopped = threading.Event()
        self.served = 0
        self.refused = 0

    def start(self) -> None:
        """Bind and listen (OSError when it cannot: the daemon does not start without it,
        as without its HTTP port); the accept loop runs in a thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # born 0600: nobody else connects before the chmod below
        try:
            sock.bind(str(self.path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        gid = group_id(self.group)
        if gid is None:
            log.warning("status_group_missing", group=self.group, socket=str(self.path),
                        meaning="only root can read the daemon's verdict")
        else:
            try:
                os.chown(self.path, -1, gid)
                os.chmod(self.path, SOCKET_MODE)
            except PermissionError as exc:  # no CAP_CHOWN: root only, and said so
                log.warning("status_group_not_set", group=self.group, error=str(exc),
                            meaning="only root can read the daemon's verdict")
        # room for a burst of clients; one that finds it full tries again (socket_client)
        sock.listen(LISTEN_BACKLOG)
        self._sock = sock
        threading.Thread(target=self._accept, name="verdict-socket", daemon=True).start()

    def _remove_stale(self) -> None:
        """A socket left by a daemon that died goes; anything else there is not ours."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise OSError(f"{self.path} exists and is not a socket: not removing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(str(self.path))
        except ConnectionRefusedError:
            os.unlink(self.path)  # nobody listens: a dead daemon's
            return
        except OSError as exc:  # EAGAIN: its queue is full (a flood), so it is alive
            raise OSError(f"another daemon listens on {self.path} and does not take a "
                          f"connection ({exc.strerror or exc}): not removing it") from None
        finally:
            probe.close()
        raise OSError(f"another daemon answers on {self.path}")

    def stop(self) -> None:
        self._stopped.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.05)  # EMFILE and the like: the cycles go on; try again
                continue
            uid = peer_uid(conn)
            if self.slots.take(uid):
                threading.Thread(target=self._serve, args=(conn, uid), daemon=True).start()
            elif uid == ROOT and self.slots.queue_root():
                threading.Thread(target=self._serve_root_later, args=(conn,),
                                 daemon=True).start()
            else:
                self.refused += 1
                self.quota.warning("status_client_refused", uid=uid,
                                   held=self.slots.held(), meaning=f"one uid holds at "
                                   f"most {MAX_PER_UID} of {MAX_CLIENTS} slots, one is "
                                   "root's")
                conn.close()

    def _serve_root_later(self, conn: socket.socket) -> None:
        """Root's request once one of the slots root's own others hold is free."""
        if self.slots.take_root_within(DEADLINE_S):
            self._serve(conn, ROOT)
        else:
            self.refused += 1
            conn.close()

    def _serve(self, conn: socket.socket, uid: int) -> None:
        try:
            deadline = time.monotonic() + DEADLINE_S
            replied = self._reply(conn, deadline, uid)
            if replied is None:
                return  # it closed without a byte: gone, nothing to answer or log
            reply, framed = replied
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(frame(reply) if framed else json.dumps(reply).encode() + b"\n")
            self.served += 1
        except OSError:
            pass  # a client that went away or never read: its loss
        except Exception:  # a bug past the answer: logged as one, never a dead thread's
            self.quota.exception("status_request_failed", uid=uid)  # traceback a request
        finally:
            conn.close()
            self.slots.give(uid)

    def _reply(self, conn: socket.socket, deadline: float, uid: int
               ) -> tuple[dict[str, Any], bool] | None:
        """The reply, and whether it goes framed (the client asked for `text`)."""
        try:
            line = _read_request(conn, deadline)
            if line is None:
                return None
            req = Request.from_line(line)
        except BadRequest as exc:
            self.quota.warning("status_request_refused", uid=uid, reason=str(exc)[:200])
            return {"error": f"bad request: {str(exc)[:200]}"}, False
        try:
            return answer(self.view, req), req.want == "text"
        except Exception as exc:  # a bug in one answer: an error, never a stopped socket
            self.quota.exception("status_request_failed", uid=uid)
            return {"error": f"the daemon could not answer ({type(exc).__name__}); its "
                             "log says why"}, req.want == "text"


def frame(reply: dict[str, Any]) -> bytes:
    """A rendering as `gpuguard status` reads it without a JSON parser."""
    # a lone surrogate (a replayed name, a message) must not make the frame unsendable
    body = str(reply["error"] if "error" in reply else reply["text"]).encode(
        "utf-8", "replace")
    word = "error" if "error" in reply else str(int(reply["code"]))
    # the body's length, so that a cut answer is told from a whole one
    return f"GGV1 {word} {len(body)}\n".encode() + body


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """One line of at most MAX_REQUEST bytes before the deadline (BadRequest saying why
    not), or None where the client closed without sending a byte."""
    data = b""
    while b"\n" not in data and len(data) <= MAX_REQUEST:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadRequest(f"no request line within {DEADLINE_S:g} s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(MAX_REQUEST + 1 - len(data))
        except TimeoutError:
            raise BadRequest(f"no request line within {DEADLINE_S:g} s") from None
        if not chunk:
            if not data:
                return None
            break
        data += chunk
    line = data.split(b"\n", 1)[0]
    if len(line) > MAX_REQUEST:
        raise BadRequest(f"the request is over {MAX_REQUEST} bytes")
    return line
