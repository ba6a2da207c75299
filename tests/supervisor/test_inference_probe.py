"""The probe as a real inference request: its config keys (file:line errors) and
readiness.send against real HTTP servers on loopback (status, JSON path, size and time bounds)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuguard.config.yamlfile import ConfigError
from gpuguard.supervisor import readiness
from gpuguard.supervisor.config import InferenceRequest, load_services

SERVICE = """\
services:
  - name: llm
    backend: exec
    probe:
{probe}
    exec:
      start_gpu: [start, gpu]
      stop_gpu: [stop, gpu]
      start_cpu: [start, cpu]
      stop_cpu: [stop, cpu]
"""


def load(tmp_path: Path, probe_lines: str) -> Any:
    path = tmp_path / "gpuguard.yaml"
    path.write_text(SERVICE.format(probe=probe_lines))
    return load_services(path)


def test_a_request_probe_loads(tmp_path: Path) -> None:
    [service] = load(tmp_path, """\
      http: http://127.0.0.1:8000/v1/completions
      body: {model: m, prompt: hi, max_tokens: 1}
      headers: {Authorization: Bearer x}
      json_path: choices.0.text
      request_timeout: 3""")
    request = service.probe.request
    assert request.method == "POST"  # a body without a method is a POST
    assert json.loads(request.body) == {"model": "m", "prompt": "hi", "max_tokens": 1}
    assert request.headers == {"Authorization": "Bearer x",
                               "Content-Type": "application/json"}
    assert request.json_path == "choices.0.text" and request.timeout == 3


def test_a_health_url_stays_a_plain_probe(tmp_path: Path) -> None:
    [service] = load(tmp_path, "      http: http://127.0.0.1:8000/health")
    assert service.probe.request is None


def test_body_file_is_read_at_load(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text('{"input": "hi"}')
    [service] = load(tmp_path, f"""\
      http: http://127.0.0.1:8000/v1/embeddings
      body_file: {body}
      json_path: data.0.embedding""")
    assert service.probe.request.body == b'{"input": "hi"}'


@pytest.mark.parametrize(("lines", "problem"), [
    ("      exec: [\"true\"]\n      method: POST",
     r":4: llm: method, body, body_file, headers and json_path need `http: URL`"),
    ("      http: http://x/\n      body: {a: 1}\n      body_file: /b",
     r":4: llm: probe takes `body` or `body_file`, not both"),
    ("      http: http://x/\n      body_file: /nonexistent/body.json",
     r":4: llm: body_file: .*nonexistent/body.json"),
    ("      http: http://x/\n      method: DELETE",
     r":6:.*method must be one of .GET., .POST., .PUT., not .DELETE."),
    ("      http: http://x/\n      request_timeout: 0", r":6:.*request_timeout"),
])
def test_bad_request_keys_are_file_line_errors(tmp_path: Path, lines: str,
                                               problem: str) -> None:
    with pytest.raises(ConfigError, match=r"gpuguard\.yaml" + problem):
        load(tmp_path, lines)


# --- readiness.send against real servers --------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    # what the test's server answers: (status, body bytes, seconds to wait first)
    answer: ClassVar[tuple[int, bytes, float]] = (200, b"{}", 0.0)
    seen: ClassVar[list[tuple[str, bytes, str | None]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self) -> None:
        status, body, wait = self.answer
        time.sleep(wait)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (the deadline test)
            self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Handler.seen.append((self.command, data, self.headers.get("Content-Type")))
        self._reply()

    def do_GET(self) -> None:
        Handler.seen.append((self.command, b"", None))
        self._reply()


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
    httpd.shutdown()
    httpd.server_close()


REQUEST = InferenceRequest("POST", b'{"prompt": "hi"}', {"Content-Type": "application/json"},
                  "choices.0.text", 2.0)


def answer(status: int, doc: Any, wait: float = 0.0) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    Handler.answer = (status, body, wait)


def test_send_ok_when_status_and_path_match(server: str) -> None:
    answer(200, {"choices": [{"text": ""}]})  # an empty text is present
    result = readiness.send(server, 200, REQUEST)
    assert result.ok and result.status == 200 and result.error is None
    assert 0 < result.latency_s < 2
    assert Handler.seen == [("POST", b'{"prompt": "hi"}', "application/json")]


def test_send_fails_on_another_status(server: str) -> None:
    answer(500, {"error": "CUDA error"})
    result = readiness.send(server, 200, REQUEST)
    assert not result.ok and result.status == 500 and not result.timed_out
    assert result.error == "answered 500, expected 200"


def test_send_fails_when_the_path_is_missing(server: str) -> None:
    answer(200, {"choices": []})
    result = readiness.send(server, 200, REQUEST)
    assert not result.ok and result.error == "the answer has no choices.0"
    answer(200, {"choices": [{"message": "x"}]})
    assert readiness.send(server, 200, REQUEST).error == "the answer has no choices.0.text"
    answer(200, b"<html>ok</html>")
    assert readiness.send(server, 200, REQUEST).error.startswith("the answer is not JSON")


def test_send_without_a_path_needs_only_the_status(server: str) -> None:
    answer(200, b"not json")
    assert readiness.send(server, 200, InferenceRequest("GET", None, {}, None, 2.0)).ok


def test_send_reads_at_most_a_mebibyte(server: str) -> None:
    answer(200, b" " * (readiness.MAX_BODY + 1))
    result = readiness.send(server, 200, REQUEST)
    assert not result.ok and "larger than 1024 KiB" in str(result.error)
    answer(200, json.dumps({"choices": [{"text": "x"}]}).encode().ljust(readiness.MAX_BODY))
    assert readiness.send(server, 200, REQUEST).ok


def test_send_gives_up_at_its_deadline(server: str) -> None:
    answer(200, {"choices": [{"text": "x"}]}, wait=5.0)
    started = time.monotonic()
    result = readiness.send(server, 200, InferenceRequest("POST", b"{}", {}, "choices", 0.5))
    assert not result.ok and result.timed_out and "timed out" in str(result.error)
    assert time.monotonic() - started < 3  # does not hang: well below the server's 5 s


def _trickle(head: bytes) -> tuple[str, threading.Event]:
    """A server on loopback that sends `head` whole, then one byte every 0.2 s until the
    client goes away (a slowloris answer); the event stops it."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    stop = threading.Event()

    def serve() -> None:
        with sock:
            conn, _ = sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(head)
                with contextlib.suppress(OSError):
                    while not stop.wait(0.2):
                        conn.sendall(b" ")

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions", stop


@pytest.mark.parametrize("head", [
    # the body: 100,000 bytes promised, one sent every 0.2 s
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
    # the headers: never finished, one byte of a header every 0.2 s
    b"HTTP/1.1 200 OK\r\nX-Slow: ",
], ids=["body", "headers"])
def test_send_has_one_deadline_for_the_whole_answer(head: bytes) -> None:
    """Every read is shorter than the 1 s request_timeout, so only a deadline over the
    whole exchange stops the request: it ends near 1 s, timed out, not failed."""
    url, stop = _trickle(head)
    result: list[readiness.Answer] = []
    thread = threading.Thread(
        target=lambda: result.append(readiness.send(url, 200, InferenceRequest("POST", b"{}", {},
                                                                  "choices", 1.0))),
        daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(10)
    stop.set()
    assert result, "readiness.send still reading after 10 s with request_timeout 1 s"
    assert time.monotonic() - started < 5  # does not hang
    [answer] = result
    assert not answer.ok and answer.timed_out and "timed out" in str(answer.error)


def test_send_to_nothing_fails() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = readiness.send(f"http://127.0.0.1:{port}/", 200, REQUEST)
    assert not result.ok and not result.timed_out and "refused" in str(result.error)


def test_send_to_a_bad_url_or_a_server_speaking_no_http_fails() -> None:
    import socket

    assert readiness.send("not a url", 200, REQUEST).ok is False
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]

        def garbage() -> None:
            conn, _ = sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")

        thread = threading.Thread(target=garbage, daemon=True)
        thread.start()
        result = readiness.send(f"http://127.0.0.1:{port}/", 200, REQUEST)
        thread.join(5)
    assert not result.ok and result.status is None and "BadStatusLine" in str(result.error)


def test_a_variant_whose_inference_fails_is_never_ready(tmp_path: Path) -> None:
    """Readiness (a failover's target, a failback) waits for the request, not for a port
    that answers: the GPU variant here answers GET with 200 but POST with 500, so failing
    back to it fails and the CPU variant keeps serving."""
    from gpuguard.supervisor.service import Supervisor
    from tests.daemon.conftest import free_port

    script = tmp_path / "server.py"
    script.write_text(
        "import sys\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def log_message(self, *a): pass\n"
        "    def _send(self, code, body):\n"
        "        self.send_response(code); self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers(); self.wfile.write(body)\n"
        "    def do_GET(self): self._send(200, b'{}')\n"
        "    def do_POST(self):\n"
        "        self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
        "        self._send(int(sys.argv[2]), b'{\"choices\": [{\"text\": \"x\"}]}')\n"
        "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    ports = {"gpu": free_port(), "cpu": free_port()}
    codes = {"gpu": 500, "cpu": 200}

    def commands(v: str) -> dict[str, list[str]]:
        pid = tmp_path / f"{v}.pid"
        return {
            f"start_{v}": ["sh", "-c", f"{sys.executable} {script} {ports[v]} {codes[v]} "
                                       f">/dev/null 2>&1 & echo $! > {pid}"],
            f"stop_{v}": ["sh", "-c", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}; true"],
            f"running_{v}": ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"]}

    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "min_cpu_time": 0, "failback_after": 1,
        "probe": {"http": {v: f"http://127.0.0.1:{p}/v1/completions" for v, p in ports.items()},
                  "body": {"prompt": "hi"}, "json_path": "choices.0.text",
                  "request_timeout": 2, "timeout": 3},
        "exec": {**commands("gpu"), **commands("cpu")}}]}))
    [service] = load_services(config)
    supervisor = Supervisor(service, tmp_path / "state", set())
    try:
        assert supervisor.transition("cpu", "test")  # the CPU variant answers: ready
        assert supervisor.state.active == "cpu"
        assert not supervisor.transition("gpu", "failback")  # its inference fails
        assert supervisor.state.active == "cpu" and supervisor.state.errors == 1
        # put back (started again: without a router both variants share nothing)
        cpu = f"http://127.0.0.1:{ports['cpu']}/v1/completions"
        assert readiness.wait(lambda: readiness.send(cpu, 200, service.probe.request).ok, 10)
    finally:
        for v in ports:
            supervisor.backend.stop(v)
