"""The daemon's verdict on a local Unix socket, for `gpuguard status` and `gpuguard slurm
health`: nothing on the network, readable by root and one group (`gpuguard` by default;
root alone where the group does not exist), so a job's user cannot read the host's
findings.

One request per connection: a JSON line of at most 4 KiB, read within 2 s, answered with
one JSON document (or, for `want: text`, a frame: `GGV1 <code> <bytes>` or `GGV1 error
<bytes>`, a newline, then the rendering or the error as it is), then closed. At most 8 connections
are served at once; a ninth is closed at once. A client that never sends, never reads or
sends garbage costs one of the 8 for at most the deadline and never stops the cycles or
the other clients.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from gpuguard.daemon.verdict_view import BadRequest, DaemonView, Request, answer

log = structlog.get_logger("gpuguard.daemon")

MAX_REQUEST = 4096
DEADLINE_S = 2.0
MAX_CLIENTS = 8
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


class VerdictSocket:
    def __init__(self, path: Path, group: str | None, view: DaemonView) -> None:
        self.path = path
        self.group = group
        self.view = view
        self._sock: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
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
        sock.listen(32)
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
        except OSError:
            os.unlink(self.path)  # nobody answers: a dead daemon's
            return
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
            if not self._slots.acquire(blocking=False):
                self.refused += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + DEADLINE_S
            reply, framed = self._reply(_read_request(conn, deadline))
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(frame(reply) if framed else json.dumps(reply).encode() + b"\n")
            self.served += 1
        except OSError:
            pass  # a client that went away or never read: its loss
        except Exception:  # a bug in one answer never stops the socket
            log.exception("status_request_failed")
        finally:
            conn.close()
            self._slots.release()

    def _reply(self, raw: bytes | None) -> tuple[dict[str, Any], bool]:
        """The reply, and whether it goes framed (the client asked for `text`)."""
        if raw is None:
            return {"error": f"no request within {DEADLINE_S:g} s or over {MAX_REQUEST} "
                             "bytes"}, False
        try:
            req = Request.from_json(json.loads(raw))
        except (ValueError, BadRequest) as exc:
            return {"error": f"bad request: {str(exc)[:200]}"}, False
        return answer(self.view, req), req.want == "text"


def frame(reply: dict[str, Any]) -> bytes:
    """A rendering as `gpuguard status` reads it without a JSON parser."""
    body = str(reply["error"] if "error" in reply else reply["text"]).encode()
    word = "error" if "error" in reply else str(int(reply["code"]))
    # the body's length, so that a cut answer is told from a whole one
    return f"GGV1 {word} {len(body)}\n".encode() + body


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """One line of at most MAX_REQUEST bytes before the deadline, else None."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > MAX_REQUEST:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(MAX_REQUEST + 1 - len(data))
        except TimeoutError:
            return None
        if not chunk:
            break
        data += chunk
    line = data.split(b"\n", 1)[0]
    return line if len(line) <= MAX_REQUEST else None
