"""The probe as a real inference request: its config keys (file:line errors) and
probe.send against real HTTP servers on loopback (status, JSON path, size and time bounds)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuguard.supervisor import probe
from gpuguard.supervisor.config import Request, load_services
from gpuguard.yamlfile import ConfigError

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


# --- probe.send against real servers --------------------------------------------------

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


REQUEST = Request("POST", b'{"prompt": "hi"}', {"Content-Type": "application/json"},
                  "choices.0.text", 2.0)


def answer(status: int, doc: Any, wait: float = 0.0) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    Handler.answer = (status, body, wait)


def test_send_ok_when_status_and_path_match(server: str) -> None:
    answer(200, {"choices": [{"text": ""}]})  # an empty text is present
    result = probe.send(server, 200, REQUEST)
    assert result.ok and result.status == 200 and result.error is None
    assert 0 < result.latency_s < 2
    assert Handler.seen == [("POST", b'{"prompt": "hi"}', "application/json")]


def test_send_fails_on_another_status(server: str) -> None:
    answer(500, {"error": "CUDA error"})
    result = probe.send(server, 200, REQUEST)
    assert not result.ok and result.status == 500
    assert result.error == "answered 500, expected 200"


def test_send_fails_when_the_path_is_missing(server: str) -> None:
    answer(200, {"choices": []})
    result = probe.send(server, 200, REQUEST)
    assert not result.ok and result.error == "the answer has no choices.0"
    answer(200, {"choices": [{"message": "x"}]})
    assert probe.send(server, 200, REQUEST).error == "the answer has no choices.0.text"
    answer(200, b"<html>ok</html>")
    assert probe.send(server, 200, REQUEST).error.startswith("the answer is not JSON")


def test_send_without_a_path_needs_only_the_status(server: str) -> None:
    answer(200, b"not json")
    assert probe.send(server, 200, Request("GET", None, {}, None, 2.0)).ok


def test_send_reads_at_most_a_mebibyte(server: str) -> None:
    answer(200, b" " * (probe.MAX_BODY + 1))
    result = probe.send(server, 200, REQUEST)
    assert not result.ok and "larger than 1024 KiB" in str(result.error)
    answer(200, json.dumps({"choices": [{"text": "x"}]}).encode().ljust(probe.MAX_BODY))
    assert probe.send(server, 200, REQUEST).ok


def test_send_gives_up_at_its_deadline(server: str) -> None:
    answer(200, {"choices": [{"text": "x"}]}, wait=5.0)
    started = time.monotonic()
    result = probe.send(server, 200, Request("POST", b"{}", {}, "choices", 0.5))
    assert not result.ok and "timed out" in str(result.error)
    assert time.monotonic() - started < 3  # does not hang: well below the server's 5 s


def test_send_to_nothing_fails() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = probe.send(f"http://127.0.0.1:{port}/", 200, REQUEST)
    assert not result.ok and result.status is None and "refused" in str(result.error)


def test_send_to_a_bad_url_or_a_server_speaking_no_http_fails() -> None:
    import socket

    assert probe.send("not a url", 200, REQUEST).ok is False
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
        result = probe.send(f"http://127.0.0.1:{port}/", 200, REQUEST)
        thread.join(5)
    assert not result.ok and result.status is None and "BadStatusLine" in str(result.error)
