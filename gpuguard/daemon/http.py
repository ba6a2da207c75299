"""/metrics (Prometheus), /healthz (alive and fresh), /status (the last results as
`check --format json` prints them) and, when it is on, the status page at /, on a small
HTTP server that no local client can blind.

Why not a plain ThreadingHTTPServer: it gives every accepted connection a thread that waits
for the request with no deadline, so 1,100 connections that never send a request take every
file descriptor the daemon has (the kernel-log source then fails with EMFILE) and spin the
accept loop at 100% CPU. Here one selector thread reads request heads from non-blocking
sockets under a deadline and a size bound; only a complete head is handed to a worker
thread. Connections are bounded: when the bound is reached the oldest connection still
sending its head is dropped for the new one, so a flood of idle connections cannot keep a
probe that sends its request at once from being answered.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import ipaddress
import json
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = structlog.get_logger("gpuguard.http")

# code, content type, body, extra headers
Answer = tuple[int, str, bytes, tuple[tuple[str, str], ...]]

DEFAULT_HOST = "127.0.0.1"  # a bare port never exposes the daemon beyond the host
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def parse_listen(text: str) -> tuple[str, int]:
    """`PORT`, `:PORT`, `HOST:PORT` or `[IPV6]:PORT` -> (host, port); no host means
    loopback. Anything else is a ValueError that says what is wrong."""
    spec = text.strip()
    if spec.startswith("["):
        match = re.fullmatch(r"\[([^\]]*)\]:([^:]*)", spec)
        if match is None:
            raise ValueError(f"--listen {text!r}: expected [IPV6]:PORT, e.g. [::1]:9412")
        host, port_text = match.group(1), match.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"--listen {text!r}: {host!r} is not an IPv6 address") from None
    elif ":" not in spec:
        host, port_text = DEFAULT_HOST, spec
    else:
        host, _, port_text = spec.rpartition(":")
        if ":" in host:
            raise ValueError(f"--listen {text!r}: write an IPv6 address in brackets, "
                             "e.g. [::1]:9412")
        host = host or DEFAULT_HOST
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"--listen {text!r}: {host!r} is not an IPv4 address"
                                 ) from None
        elif _HOSTNAME.fullmatch(host) is None:
            raise ValueError(f"--listen {text!r}: {host!r} is not a host name or address")
    if re.fullmatch(r"[0-9]{1,5}", port_text) is None or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {text!r}: the port must be a number from 1 to 65535, "
                         f"not {port_text!r}")
    return host, int(port_text)


class HeadHandler(BaseHTTPRequestHandler):
    """A request handler fed a request head that was already read (under a deadline)."""

    def __init__(self, request: socket.socket, client_address: Any, server: Any,
                 head: bytes) -> None:
        self.head = head
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's reader: the head was read already, nothing else is
        self.rfile = io.BytesIO(self.head)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every 15 s are not news


class GuardedHTTPServer(HTTPServer):
    """One selector thread reads request heads; at most `max_workers` threads answer.

    Sockets held at any time: the listening socket, the wake-up pair and at most
    `max_connections` client connections (those still sending a head plus those being
    answered), whatever clients do.
    """

    request_queue_size = 128  # listen backlog: bursts of scrapes and probes wait, not fail

    def __init__(self, address: tuple[str, int], handler: type[HeadHandler], *,
                 max_connections: int = 64, max_workers: int = 16,
                 head_timeout: float = 5.0, head_bytes: int = 16384,
                 write_timeout: float = 10.0) -> None:
        family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)[0][0]
        self.address_family = family
        super().__init__(address, handler)
        self.handler_class = handler
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.head_bytes = head_bytes
        self.write_timeout = write_timeout
        self._workers = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._answering = 0  # connections handed to a worker, guarded by _lock
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._dropped: collections.Counter[str] = collections.Counter()
        self._dropped_logged = time.monotonic() - 60.0  # the first drop is logged at once

    # --- the selector loop ------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self.socket.setblocking(False)
        self._wake_r.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(self.socket, selectors.EVENT_READ, None)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        # Oldest first (insertion order); all share one timeout, so the first expires first.
        pending: dict[socket.socket, _Pending] = {}
        try:
            while not self._stop.is_set():
                timeout = poll_interval
                if pending:
                    oldest = next(iter(pending.values()))
                    timeout = min(timeout, max(0.0, oldest.deadline - time.monotonic()))
                try:
                    for key, _ in selector.select(timeout):
                        if key.fileobj is self.socket:
                            self._accept(selector, pending)
                        elif key.fileobj is self._wake_r:
                            _drain(self._wake_r)
                        else:
                            self._read(selector, pending, key.data)
                    self._expire(selector, pending)
                    self._log_dropped()
                except Exception as exc:  # a bug here must not end /healthz for good
                    with contextlib.suppress(Exception):
                        log.error("http_loop_failed", error_type=type(exc).__name__,
                                  error=str(exc))
                    time.sleep(0.1)  # and must not spin
        finally:
            for conn in pending:
                conn.close()
            selector.close()
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # a full pair: the loop is awake already
            self._wake_w.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a multi-line traceback to stderr; the log is one JSON line
        # per event.
        exc = _current_exception()
        log.error("http_handler_failed", client=_client(client_address),
                  error_type=type(exc).__name__, error=str(exc))

    def _accept(self, selector: selectors.BaseSelector,
                pending: dict[socket.socket, _Pending]) -> None:
        # Bounded per wake-up, so deadlines are kept during a flood; always accept, even
        # when full: a connection left in the backlog keeps the selector busy and waits.
        for _ in range(self.max_connections):
            try:
                conn, peer = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: drop nothing we hold, try later
                self._count("accept_failed")
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # do not spin on a backlog we cannot take
                return
            with self._lock:
                answering = self._answering
            if len(pending) + answering >= self.max_connections:
                if not pending:  # every slot is being answered: no one to make room
                    _refuse(conn, b"503 Service Unavailable")
                    self._count("busy")
                    continue
                oldest = next(iter(pending))
                selector.unregister(oldest)
                del pending[oldest]
                oldest.close()
                self._count("evicted")
            conn.setblocking(False)
            pending[conn] = _Pending(peer, time.monotonic() + self.head_timeout)
            selector.register(conn, selectors.EVENT_READ, conn)

    def _read(self, selector: selectors.BaseSelector,
              pending: dict[socket.socket, _Pending], conn: socket.socket) -> None:
        entry = pending[conn]
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            entry.head += data
            if _head_complete(entry.head):
                selector.unregister(conn)
                del pending[conn]
                self._dispatch(conn, entry)
                return
            if len(entry.head) <= self.head_bytes:
                return
            _refuse(conn, b"431 Request Header Fields Too Large")
            self._count("too_large")
        selector.unregister(conn)
        del pending[conn]
        conn.close()

    def _expire(self, selector: selectors.BaseSelector,
                pending: dict[socket.socket, _Pending]) -> None:
        now = time.monotonic()
        while pending:
            conn, entry = next(iter(pending.items()))
            if entry.deadline > now:
                return
            selector.unregister(conn)
            del pending[conn]
            _refuse(conn, b"408 Request Timeout")
            self._count("timed_out")

    def _dispatch(self, conn: socket.socket, entry: _Pending) -> None:
        if not self._workers.acquire(blocking=False):
            _refuse(conn, b"503 Service Unavailable")
            self._count("busy")
            return
        with self._lock:
            self._answering += 1
        threading.Thread(target=self._answer, args=(conn, entry), name="http-worker",
                         daemon=True).start()

    def _answer(self, conn: socket.socket, entry: _Pending) -> None:
        try:
            # sendall's timeout bounds the whole answer: a client that does not read
            # cannot hold a worker longer than this.
            conn.settimeout(self.write_timeout)
            self.handler_class(conn, entry.peer, self, bytes(entry.head))
        except OSError:
            pass  # the client went away or stopped reading: its loss
        except Exception:
            self.handle_error(conn, entry.peer)
        finally:
            conn.close()
            with self._lock:
                self._answering -= 1
            self._workers.release()

    # --- dropped connections: counted, logged at most once a minute ---------------------

    def _count(self, reason: str) -> None:
        self._dropped[reason] += 1

    def _log_dropped(self) -> None:
        now = time.monotonic()
        if self._dropped and now - self._dropped_logged >= 60.0:
            counts = dict(self._dropped)
            self._dropped.clear()
            self._dropped_logged = now
            log.warning("http_connections_dropped", **counts)


class _Pending:
    __slots__ = ("deadline", "head", "peer")

    def __init__(self, peer: Any, deadline: float) -> None:
        self.peer = peer
        self.deadline = deadline
        self.head = bytearray()


def _head_complete(head: bytearray) -> bool:
    # http.client's header parser takes bare LF line ends too, so either blank line ends it
    return b"\r\n\r\n" in head or b"\n\n" in head


def _refuse(conn: socket.socket, status: bytes) -> None:
    """A short answer that never blocks (it fits an empty send buffer), then close."""
    try:
        conn.setblocking(False)
        conn.send(b"HTTP/1.0 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    except OSError:
        pass
    conn.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(64):
            pass
    except OSError:
        pass


def _client(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _current_exception() -> BaseException:
    exc = sys.exc_info()[1]
    return exc if exc is not None else RuntimeError("unknown error")


def serve(host: str, port: int, registry: CollectorRegistry,
          health: Callable[[], tuple[bool, dict[str, Any]]],
          status: Callable[[], dict[str, Any]], *,
          page: Callable[[str], Answer | None] | None = None,
          extra_metrics: Callable[[], bytes] | None = None,
          max_connections: int = 64, max_workers: int = 16,
          head_timeout: float = 5.0, head_bytes: int = 16384,
          write_timeout: float = 10.0) -> GuardedHTTPServer:
    class Handler(HeadHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            try:
                code, content_type, body, headers = route(path, query)
            except Exception as exc:
                # One line in the log, a 500 to the client, and the server goes on.
                log.error("http_handler_failed", path=path,
                          client=_client(self.client_address),
                          error_type=type(exc).__name__, error=str(exc))
                code, content_type, body, headers = 500, "text/plain", b"internal error\n", ()
            self._send(code, content_type, body, headers)

        def _send(self, code: int, content_type: str, body: bytes,
                  headers: tuple[tuple[str, str], ...]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def route(path: str, query: str) -> Answer:
        if path == "/metrics":
            body = generate_latest(registry)
            # the compat series (daemon/metrics.py compat_text), text of their own
            if extra_metrics is not None:
                body += extra_metrics()
            return 200, CONTENT_TYPE_LATEST, body, ()
        if path == "/healthz":
            healthy, detail = health()
            return 200 if healthy else 503, "application/json", json.dumps(detail).encode(), ()
        if path == "/status":
            return 200, "application/json", json.dumps(status(), indent=2).encode(), ()
        answer = page(query) if page is not None and path == "/" else None
        if answer is not None:
            return answer
        return 404, "text/plain", b"try /metrics, /healthz or /status\n", ()

    server = GuardedHTTPServer((host, port), Handler, max_connections=max_connections,
                               max_workers=max_workers, head_timeout=head_timeout,
                               head_bytes=head_bytes, write_timeout=write_timeout)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
