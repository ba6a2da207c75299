"""A loopback HTTP server of fixed pages for the browser tests (the harness's own pages,
the status page rendered from hostile text): each path answers its page with the given
headers, any other path 404; stopped and joined at the end."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator, Mapping, Sequence


@contextlib.contextmanager
def serve(pages: Mapping[str, bytes], headers: Sequence[tuple[str, str]] = ()
          ) -> Iterator[str]:
    """The server's base URL while the block runs."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            for name, value in headers:
                self.send_header(name, value)
            data = body if body is not None else b"not here"
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
