"""One HTTP GET under one deadline and a size bound, for reads of a service's own
endpoints (an engine's /metrics, issue 23). The whole exchange, connecting, sending,
the head and the body, ends at the deadline: every receive waits at most what is left,
so a server that trickles its answer a byte at a time cannot stretch it. The answer is
read to its end (HTTP/1.0, the connection closed) and then parsed from memory by
http.client, which also undoes a chunked body."""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import ssl
import time
import urllib.parse


class GetError(OSError):
    """The GET did not give a complete answer: no connection, the deadline, the bound,
    bytes that are no HTTP."""


class _Replay:
    """The bytes received, as the socket http.client reads its answer from."""

    def __init__(self, data: bytes) -> None:
        self._file = io.BytesIO(data)

    def makefile(self, *args: object, **kwargs: object) -> io.BytesIO:
        return self._file


def get(url: str, deadline_s: float, max_bytes: int) -> tuple[int, bytes]:
    """The status and body of GET `url`; raises GetError for anything but a complete
    answer within `deadline_s` and `max_bytes` (head and body together)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GetError(f"not an http(s) URL: {url[:200]!r}")
    end = time.monotonic() + deadline_s
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rsplit("@", 1)[-1]
    request = (f"GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n"
               "User-Agent: gpuguard\r\nConnection: close\r\n\r\n").encode("latin-1")
    try:
        raw = socket.create_connection((parts.hostname, port), timeout=_left(end))
    except OSError as exc:
        raise GetError(f"cannot connect: {exc}") from exc
    sock: socket.socket = raw
    try:
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(raw, server_hostname=parts.hostname)
        sock.settimeout(_left(end))
        sock.sendall(request)
        data = _receive(sock, end, max_bytes)
    except (OSError, ssl.SSLError) as exc:
        if isinstance(exc, GetError):
            raise
        raise GetError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            sock.close()
        with contextlib.suppress(OSError):
            raw.close()
    return _parse(data)


def _receive(sock: socket.socket, end: float, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise GetError("no complete answer before the deadline")
        sock.settimeout(left)
        try:
            chunk = sock.recv(64 * 1024)
        except TimeoutError as exc:
            raise GetError("no complete answer before the deadline") from exc
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise GetError(f"the answer is larger than {max_bytes // 1024} KiB")
        chunks.append(chunk)


def _parse(data: bytes) -> tuple[int, bytes]:
    response = http.client.HTTPResponse(_Replay(data))  # type: ignore[arg-type]
    try:
        response.begin()
        return response.status, response.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise GetError(f"not an HTTP answer: {type(exc).__name__}: "
                       f"{str(exc)[:200]!r}") from exc


def _left(end: float) -> float:
    return max(end - time.monotonic(), 0.001)
