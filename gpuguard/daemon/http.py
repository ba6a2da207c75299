"""/metrics (Prometheus), /healthz (alive and fresh) and /status (the last results as
`check --format json` prints them), on a small threading HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve(host: str, port: int, registry: CollectorRegistry,
          health: Callable[[], tuple[bool, dict[str, Any]]],
          status: Callable[[], dict[str, Any]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/healthz":
                healthy, detail = health()
                self._send(200 if healthy else 503, "application/json",
                           json.dumps(detail).encode())
            elif path == "/status":
                self._send(200, "application/json", json.dumps(status(), indent=2).encode())
            else:
                self._send(404, "text/plain", b"try /metrics, /healthz or /status\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every 15 s are not news

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
