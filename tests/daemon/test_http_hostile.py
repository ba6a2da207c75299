"""The daemon's HTTP side against hostile local clients: idle floods, slow and oversized
request heads, a failing handler, and `--listen` text that is not an address."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuguard.daemon import http
from gpuguard.daemon.http import parse_listen
from tests.conftest import REPO
from tests.daemon.conftest import LIVE, free_port, get

FLOOD = 1100
FD_LIMIT = 1024  # systemd's default soft limit for a service that sets none


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def own_fd_limit(wanted: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"the test needs {wanted} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def idle_connections(port: int, count: int) -> list[socket.socket]:
    """Connections that never send a byte, opened a few at a time the way a patient client
    would (a burst would only meet the listen backlog); non-blocking, so a server that
    stopped accepting cannot hang the test in connect()."""
    socks = []
    for i in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        assert code in (0, errno.EINPROGRESS), os.strerror(code)
        socks.append(sock)
        if i % 4 == 3:
            time.sleep(0.005)
    return socks


def watch_fds(pid: int, seconds: float) -> int:
    """The most fds `pid` held while the server worked through what it was sent."""
    most = fd_count(pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        most = max(most, fd_count(pid))
        time.sleep(0.05)
    return most


def limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_idle_flood_neither_blinds_the_daemon_nor_takes_its_fds(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "daemon.log"
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuguard", "daemon", "--input", str(LIVE),
             "--listen", f"127.0.0.1:{port}", "--no-udev", "--log-format", "json",
             "--state-dir", str(tmp_path / "state"), "--fast-interval", "1"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log_file,
            preexec_fn=limit_fds)
    socks: list[socket.socket] = []
    try:
        end = time.monotonic() + 15
        while get_or_none(port) != 200:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < end, "daemon not healthy: " + log_path.read_text()
            time.sleep(0.1)
        before = fd_count(proc.pid)
        with own_fd_limit(FLOOD + 256):
            socks = idle_connections(port, FLOOD)
            most = watch_fds(proc.pid, 2.0)
            started = time.monotonic()
            code, _ = get(f"http://127.0.0.1:{port}/healthz", timeout=3.0)
            answered_in = time.monotonic() - started
            most = max(most, fd_count(proc.pid))
            for sock in socks:
                sock.close()
            socks = []
        print(f"flood: {FLOOD} idle connections, fds {before} -> {most}, "
              f"/healthz {code} in {answered_in:.3f} s")
        assert code == 200
        assert answered_in < 2.0  # a generous bound: it proves "not blinded", no timing
        # The HTTP side holds at most its 64 connections, whatever the clients do.
        assert most <= before + 64 + 4, (before, most)
        assert proc.poll() is None
        text = log_path.read_text()
        assert "Too many open files" not in text
        assert all(line.startswith("{") for line in text.splitlines()), text[-2000:]
    finally:
        for sock in socks:
            sock.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def get_or_none(port: int) -> int | None:
    try:
        return get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)[0]
    except OSError:
        return None


@pytest.fixture
def server() -> Iterator[Any]:
    """serve() in-process with its default bounds; a healthy daemon behind it."""
    srv = http.serve("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {"ok": True}),
                     lambda: {"results": []})
    yield srv
    srv.shutdown()
    srv.server_close()


def read_until_closed(sock: socket.socket, limit: float) -> bytes:
    sock.settimeout(limit)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            data += chunk
    return data


def test_a_head_that_never_ends_is_dropped(server: Any) -> None:
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n")
        end = time.monotonic() + 12  # the deadline is a few seconds; this proves "dropped"
        answer = b""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while time.monotonic() < end:  # a byte now and then: each recv is quick
                sock.sendall(b"X")
                sock.settimeout(0.5)
                try:
                    chunk = sock.recv(4096)
                except TimeoutError:
                    continue
                answer += chunk
                if not chunk:
                    break
        assert time.monotonic() < end, "a trickling client held its connection"
    assert answer == b"" or answer.startswith(b"HTTP/1.0 408")
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200


def test_an_oversized_head_is_refused(server: Any) -> None:
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(b"GET /healthz HTTP/1.0\r\nX-Junk: " + b"a" * 40000)
        answer = read_until_closed(sock, 10.0)
    assert answer.startswith(b"HTTP/1.0 431"), answer[:100]
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200


def test_idle_connections_do_not_delay_a_prompt_client(server: Any) -> None:
    port = server.server_address[1]
    threads = threading.active_count()
    socks = idle_connections(port, 200)  # far past the 64 the server holds
    try:
        time.sleep(1.0)  # for a thread per connection to show
        assert threading.active_count() <= threads + 16  # no thread waits on an idle one
        started = time.monotonic()
        assert get(f"http://127.0.0.1:{port}/healthz", timeout=4.0)[0] == 200
        # The head deadline is 5 s; well under it means the idle ones made room.
        assert time.monotonic() - started < 2.5
    finally:
        for sock in socks:
            sock.close()


def test_ipv6_loopback() -> None:
    srv = http.serve("::1", 0, CollectorRegistry(), lambda: (True, {}), dict)
    try:
        assert get(f"http://[::1]:{srv.server_address[1]}/healthz")[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


FAILING_STATUS = """
import json, sys, urllib.error, urllib.request
from prometheus_client import CollectorRegistry
from gpuguard.daemon import http, logs

logs.configure("json")

def status():
    raise RuntimeError("status broke\\non two lines")

srv = http.serve("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {}), status)
url = f"http://127.0.0.1:{srv.server_address[1]}"
codes = []
for path in ("/status", "/healthz", "/status", "/healthz"):
    try:
        with urllib.request.urlopen(url + path, timeout=5) as resp:
            codes.append(resp.status)
    except urllib.error.HTTPError as exc:
        codes.append(exc.code)
srv.shutdown()
print(json.dumps(codes))
"""


def test_a_failing_handler_logs_one_line_answers_500_and_serves_on() -> None:
    proc = subprocess.run([sys.executable, "-c", FAILING_STATUS], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [500, 200, 500, 200]
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr  # one per failed request, no traceback
    for line in lines:
        event = json.loads(line)
        assert event["event"] == "http_handler_failed"
        assert event["path"] == "/status" and event["error_type"] == "RuntimeError"
        assert event["error"] == "status broke\non two lines"
        assert event["client"].startswith("127.0.0.1:")


EXCEPTION_LOG = """
import structlog
from gpuguard.daemon import logs
logs.configure(__import__("sys").argv[1])
try:
    raise ValueError("bad\\nvalue")
except ValueError:
    structlog.get_logger("t").exception("cycle_failed", detail="a\\nb")
"""


def test_an_exception_logged_in_json_mode_is_one_line() -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", EXCEPTION_LOG, "json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    event = json.loads(lines[0])
    assert event["event"] == "cycle_failed" and "ValueError: bad\nvalue" in event["exception"]


def test_an_exception_logged_in_console_mode_shows_the_traceback() -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", EXCEPTION_LOG, "console"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "cycle_failed" in proc.stderr and "ValueError" in proc.stderr


@pytest.mark.parametrize(("text", "wanted"), [
    ("19502", ("127.0.0.1", 19502)),
    (":19503", ("127.0.0.1", 19503)),
    ("127.0.0.1:9412", ("127.0.0.1", 9412)),
    ("0.0.0.0:9412", ("0.0.0.0", 9412)),
    ("localhost:1", ("localhost", 1)),
    ("[::1]:9412", ("::1", 9412)),
    ("[::]:65535", ("::", 65535)),
])
def test_parse_listen(text: str, wanted: tuple[str, int]) -> None:
    assert parse_listen(text) == wanted


@pytest.mark.parametrize(("text", "says"), [
    ("127.0.0.1:99999", "1 to 65535"),
    ("127.0.0.1:0", "1 to 65535"),
    ("127.0.0.1:http", "1 to 65535"),
    ("127.0.0.1:", "1 to 65535"),
    ("127.0.0.1:-1", "1 to 65535"),
    ("", "1 to 65535"),
    ("::1:9412", "brackets"),
    ("[::1]", "[IPV6]:PORT"),
    ("[127.0.0.1]:9412", "not an IPv6 address"),
    ("300.1.1.1:9412", "not an IPv4 address"),
    ("bad host:9412", "not a host name"),
    ("a/b:9412", "not a host name"),
])
def test_parse_listen_refuses(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_listen(text)
