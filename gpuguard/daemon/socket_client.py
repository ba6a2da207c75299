"""The client of the daemon's status socket (daemon/verdict_socket.py): one request, one
bounded reply under one deadline, answered only by root or this user. Standard library only
at the top: `gpuguard status` imports it before click (gpuguard/cli/status_client.py), and
`gpuguard slurm` asks the daemon's verdict through it."""

# `_socket`, not `socket` (which imports selectors and enum), and no json, typing or
# contextlib at the top: each costs on `gpuguard status`'s budget (docs/benchmarks.md).
import _socket
import os
import sys
import time

TYPE_CHECKING = False  # typing's own import costs 3 ms here; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

MAX_REPLY = 64 * 1024 * 1024  # an 8-GPU prometheus rendering is well under 1 MiB


class NoDaemon(Exception):
    """No daemon answered on the socket (the message says why)."""


def default_socket() -> str:
    from gpuguard.io.guard import host_default_text

    return host_default_text("run") + "/status.sock"


def ask(path: str, request: "dict[str, Any]", timeout: float = 5.0) -> "dict[str, Any]":
    """The daemon's JSON reply to one request; NoDaemon when none answers in `timeout`."""
    import json

    raw = exchange(path, json.dumps(request).encode(), timeout)
    try:
        reply = json.loads(raw)
    except ValueError:
        raise NoDaemon(f"the daemon on {path} sent no complete answer") from None
    if not isinstance(reply, dict):
        raise NoDaemon(f"the daemon on {path} sent an answer of the wrong shape")
    return reply


def ask_text(path: str, request: "dict[str, Any]", timeout: float = 5.0
              ) -> "dict[str, Any]":
    """The daemon's rendering, framed (`want: text`, daemon/verdict_socket.py), as the
    reply `show` takes: {"code", "text"} or {"error"}."""
    raw = exchange(path, encode({**request, "want": "text"}), timeout)
    head, newline, body = raw.partition(b"\n")
    word = head.split(b" ")
    if not newline or len(word) != 3 or word[0] != b"GGV1" or not word[2].isdigit() \
            or int(word[2]) != len(body):
        raise NoDaemon(f"the daemon on {path} sent no complete answer")
    text = body.decode("utf-8", "replace")
    if word[1] == b"error":
        return {"error": text}
    if word[1] not in (b"0", b"1", b"2", b"3"):
        raise NoDaemon(f"the daemon on {path} sent an answer of the wrong shape")
    return {"code": int(word[1]), "text": text}


def encode(value: object) -> str:
    """JSON for the request's plain values (str, bool, int, lists, dicts), written here
    so that the fast path needs no json module; every string escaped as RFC 8259 says."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # a lone surrogate (bytes of an argument that are not UTF-8, as Python keeps them)
        # is escaped as json.dumps escapes it: it has no UTF-8 form to send
        return '"' + "".join(ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or
                                                 0xD800 <= ord(c) <= 0xDFFF else c)
                             for c in value) + '"'
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{encode(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a request value: {type(value).__name__}")


ESCAPES = {'"': '\\"', "\\": "\\\\"}


def _check_peer(sock: _socket.socket, path: str) -> None:
    """The answer counts only from root or from this user (the daemon runs as root; a
    test's as its user): another user's program listening at a path we were given is not
    the daemon, and its "all ok" is not a verdict (SO_PEERCRED: pid, uid, gid)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    uid = int.from_bytes(cred[4:8], sys.byteorder)
    if uid not in (0, os.getuid()):
        raise NoDaemon(f"the program answering on {path} runs as uid {uid}, not root or "
                       "this user: not gpuguard's daemon")


def _connect(sock: _socket.socket, path: str, end: float) -> None:
    """Connect, again while the daemon's queue of connections is full, until the deadline:
    EAGAIN on a Unix socket, where other clients flood it with connections (the daemon
    closes those past their uid's share of its slots at once, daemon/verdict_socket.py,
    and drains its queue in microseconds)."""
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + 0.005 >= end:
                raise TimeoutError from None
            time.sleep(0.005)


def exchange(path: str, request: bytes | str, timeout: float) -> bytes:
    """Send one request line, read the reply to its end (at most MAX_REPLY bytes)."""
    data = request.encode() if isinstance(request, str) else request
    # one deadline for the whole exchange: a timeout per call would let a server that
    # trickles a byte a second hold the command for ever
    end = time.monotonic() + timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _connect(sock, path, end)
        _check_peer(sock, path)
        sock.sendall(data + b"\n")
        chunks, size = [], 0
        while size <= MAX_REPLY:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except FileNotFoundError:
        raise NoDaemon(f"no daemon answers on {path} (no such socket: is `gpuguard daemon "
                       "--status-socket` running?)") from None
    except ConnectionRefusedError:
        raise NoDaemon(f"no daemon answers on {path} (connection refused: the daemon "
                       "that made it is gone)") from None
    except PermissionError:
        raise NoDaemon(f"permission denied on {path}: the daemon's verdict is for root and "
                       "its group (--status-group, default gpuguard)") from None
    except TimeoutError:
        raise NoDaemon(f"the daemon on {path} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise NoDaemon(f"cannot ask the daemon on {path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if size > MAX_REPLY:
        raise NoDaemon(f"the daemon on {path} sent more than {MAX_REPLY} bytes")
    return b"".join(chunks)
