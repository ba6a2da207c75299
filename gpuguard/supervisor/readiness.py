"""Readiness of a variant: an HTTP status, a real inference request, or the container's
Docker health status."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.io.text import printable
from gpuguard.supervisor.backends import command as backend_command
from gpuguard.supervisor.config import InferenceRequest

# An answer longer than this is not a one-token completion: read no further.
MAX_BODY = 1024 * 1024


def http_ready(url: str, status: int, timeout: float = 2.0) -> bool:
    """Whether `url` answers GET with `status` (its own answer: a redirect is not followed),
    its body read (at most MAX_BODY), all within `timeout`. Never raises: whatever the
    server sends, or does not, is an answer of False (see send)."""
    return send(url, status, InferenceRequest("GET", None, {}, None, timeout)).ok


def command_ready(command: list[str], timeout: float = 30.0) -> bool:
    """Whether the probe command exits 0 within `timeout`. Its output is not read (a
    command that leaves something running in the background would hold a pipe open), and
    at the deadline it is killed with what it started (backends/command.py)."""
    return backend_command.run(command, timeout, keep_stderr=False).code == 0


def wait(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


@dataclass(frozen=True)
class Answer:
    """How one inference request went (service.inference, the latency metric)."""

    ok: bool
    latency_s: float
    status: int | None
    error: str | None = None
    # no complete answer within the deadline (connect, headers or body): a saturated
    # server and a hung one look alike here, so service.inference says unknown
    timed_out: bool = False


def send(url: str, status: int, request: InferenceRequest) -> Answer:
    """Send the request; ok when it answers `status` within its deadline with a JSON body
    (read up to MAX_BODY) that has `json_path`. Returns within about `request.timeout`
    whatever the server does: the socket is shut down at the deadline, so a server that
    trickles its headers or body a byte at a time cannot hold it. Never raises: anything
    the server sends (bytes that are no HTTP, 200 headers, JSON nested 100,000 deep, a body
    without end) is the service's failure, and the caller (a daemon cycle, a transition
    waiting for its target) carries on."""
    started = time.monotonic()
    cut = threading.Event()
    try:
        code, body = _exchange(url, request, started + request.timeout, cut)
    except Exception as exc:  # what the server sent decides this answer, and nothing else
        if cut.is_set() or isinstance(exc, TimeoutError):
            return _timed_out(started, None, request)
        return Answer(False, time.monotonic() - started, None,
                      f"{type(exc).__name__}: {printable(str(exc)[:200])}")
    if cut.is_set():  # the deadline passed as the answer ended: it may be cut short
        return _timed_out(started, code, request)
    return _judge(code, body, status, request.json_path, time.monotonic() - started)


def _timed_out(started: float, code: int | None, request: InferenceRequest) -> Answer:
    return Answer(False, time.monotonic() - started, code,
                  f"TimeoutError: the request timed out after {request.timeout:g} s",
                  timed_out=True)


def _judge(code: int, body: bytes, status: int, json_path: str | None,
           latency: float) -> Answer:
    """A complete answer: the status, then the JSON path."""
    if code != status:
        return Answer(False, latency, code, f"answered {code}, expected {status}")
    if json_path is None:
        return Answer(True, latency, code)
    try:
        doc = json.loads(body)
    except RecursionError:
        # the C parser counts its depth and stops at the interpreter's limit (1,000)
        return Answer(False, latency, code, "the answer is not JSON: nested too deeply")
    except ValueError as exc:
        return Answer(False, latency, code, f"the answer is not JSON: {str(exc)[:100]}")
    missing = _missing(doc, json_path)
    if missing is not None:
        return Answer(False, latency, code, f"the answer has no {missing}")
    return Answer(True, latency, code)


def _exchange(url: str, request: InferenceRequest, end: float, cut: threading.Event
              ) -> tuple[int, bytes]:
    """The status and body (at most MAX_BODY) of one request, under one deadline, `end`.
    The socket's own timeout bounds each read only (a byte every 0.5 s never trips it), so
    a timer shuts the connection down at `end` and sets `cut`: the TLS handshake, sending,
    the status line, the headers and the body all end there. Connecting is bounded by the
    socket's timeout (what is left at the start); resolving a name is not (a cycle never
    waits past its own deadline for it: gpuguard/daemon/services.py)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url[:200]!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    raw = socket.create_connection((parts.hostname, port), timeout=_left(end))
    # The timer holds a second descriptor of the same connection: TLS takes the first one
    # over (the wrapped socket detaches it), and a shutdown through either ends both.
    hold = raw.dup()
    timer = threading.Timer(_left(end), _shut, (hold, cut))
    timer.daemon = True
    timer.start()
    try:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=_left(end))
        conn.sock = (raw if parts.scheme == "http" else ssl.create_default_context()
                     .wrap_socket(raw, server_hostname=parts.hostname))
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request(request.method, path, body=request.body, headers=request.headers)
            resp = conn.getresponse()
            return resp.status, _read_bounded(resp)
        finally:
            conn.close()
    finally:
        timer.cancel()
        hold.close()
        raw.close()


def _left(end: float) -> float:
    return max(end - time.monotonic(), 0.001)


def _shut(sock: socket.socket, cut: threading.Event) -> None:
    cut.set()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _read_bounded(resp: http.client.HTTPResponse) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read1(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_BODY:
            raise ValueError(f"the answer is larger than {MAX_BODY // 1024} KiB")
        chunks.append(chunk)


def _missing(doc: Any, path: str) -> str | None:
    """None when `path` (dots; numbers index lists) is present in doc; else the part of
    the path that is not."""
    here = doc
    walked: list[str] = []
    for part in path.split("."):
        walked.append(part)
        if isinstance(here, list) and part.isdigit() and int(part) < len(here):
            here = here[int(part)]
        elif isinstance(here, dict) and part in here:
            here = here[part]
        else:
            return ".".join(walked)
    return None
