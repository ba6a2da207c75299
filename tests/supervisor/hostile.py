"""Hostile HTTP servers on loopback, written with raw sockets: what a broken or malicious
service may answer a health check or an inference request with (issue 20, item 7).

Each server reads the whole request first (a server that closes with unread bytes makes
the kernel send a reset, and the client would see that instead of the answer), then
answers in its way, and keeps every connection until the client closes it, so a client
that never gives up shows as a connection that stays open (`open_now`, `open_max`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

# A one-token completion: what a healthy server answers (the CPU variants of the tests).
COMPLETION = b'{"choices": [{"text": "hi"}]}'


def _head(status: bytes = b"200 OK", extra: bytes = b"", length: int | None = None) -> bytes:
    size = b"" if length is None else b"Content-Length: %d\r\n" % length
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n" + size + extra
            + b"\r\n")


def _nested(conn: socket.socket, stop: threading.Event) -> None:
    """A JSON body nested 100,000 deep: valid JSON, and more than any recursive parser takes."""
    body = b"[" * 100_000 + b"]" * 100_000
    conn.sendall(_head(length=len(body)) + body)


def _garbage(conn: socket.socket, stop: threading.Event) -> None:
    """Bytes that are no HTTP at all (a TLS record, binary noise), then the end."""
    conn.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(256)) * 8)


def _headers(conn: socket.socket, stop: threading.Event) -> None:
    """200 headers (http.client takes 100), around a body that would otherwise pass."""
    many = b"".join(b"X-Header-%d: %d\r\n" % (i, i) for i in range(200))
    conn.sendall(_head(extra=many, length=len(COMPLETION)) + COMPLETION)


def _trickle(conn: socket.socket, stop: threading.Event) -> None:
    """The status line, then one byte of a header every 0.5 s for ever: every read is
    quick, so only a deadline on the whole exchange ends it."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while not stop.wait(0.5):
        conn.sendall(b"a")


def _endless(conn: socket.socket, stop: threading.Event) -> None:
    """200 and a body without a length, sent as fast as the client reads, for ever."""
    conn.sendall(_head(extra=b"Connection: close\r\n"))
    chunk = b" " * 65536
    while not stop.is_set():
        conn.sendall(chunk)


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    """Takes the request and never answers."""


def _healthy(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(_head(length=len(COMPLETION)) + COMPLETION)


ANSWERS: dict[str, Callable[[socket.socket, threading.Event], None]] = {
    "nested": _nested, "garbage": _garbage, "headers": _headers, "trickle": _trickle,
    "endless": _endless, "silent": _silent, "healthy": _healthy,
}
# What each hostile answer is to the service.inference rule: an answer that came and is
# wrong is a failure; no answer within the deadline is not known (docs/supervisor.md).
FAILS = ("nested", "garbage", "headers", "endless")
TIMES_OUT = ("trickle", "silent")


class Server:
    """One hostile server: `url`, and how many connections it took and holds."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.answer = ANSWERS[kind]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1/completions"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.connections = 0
        self.open_now = 0
        self.open_max = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.open_now += 1
                self.open_max = max(self.open_max, self.open_now)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, contextlib.suppress(OSError):
                conn.settimeout(None)
                _read_request(conn)
                self.answer(conn, self.stop)
                if self.kind != "silent":  # the end of the answer (silent: there is none)
                    conn.shutdown(socket.SHUT_WR)
                # hold the connection until the client closes it (or the test ends)
                conn.settimeout(0.5)
                while not self.stop.is_set():
                    try:
                        if not conn.recv(65536):
                            break
                    except TimeoutError:
                        continue
        finally:
            with self.lock:
                self.open_now -= 1

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()


def _read_request(conn: socket.socket) -> None:
    """The head and the Content-Length body of one request (the client's, so small)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextlib.contextmanager
def servers(*kinds: str, **named: str) -> Iterator[dict[str, Server]]:
    """A server of each kind, by its kind; and one of each `name=kind`, by its name."""
    started = {kind: Server(kind) for kind in kinds}
    started.update({name: Server(kind) for name, kind in named.items()})
    try:
        yield started
    finally:
        for server in started.values():
            server.close()


def timed(call: Callable[[], object], limit_s: float) -> tuple[str, object, float]:
    """("returned", value, seconds), ("raised", the exception, seconds), or ("running",
    None, limit_s) when the call is still running after `limit_s` (it is left behind, in
    a daemon thread)."""
    out: list[tuple[str, object, float]] = []
    started = time.monotonic()

    def run() -> None:
        try:
            value = call()
        except BaseException as exc:  # the test names it
            out.append(("raised", exc, time.monotonic() - started))
        else:
            out.append(("returned", value, time.monotonic() - started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    return out[0] if out else ("running", None, limit_s)
