"""An inference engine of the tests (issue 23): a real HTTP server on loopback that answers
/metrics with an engine's recorded metrics page (tests/fixtures/engines/) whose signal
lines replay a sequence, and /v1/completions as the engine would in that state.

    python tests/engines/engine_replay.py PORT FIXTURE ENGINE CONTROL [LOG]

CONTROL is a JSON file the test rewrites (atomically) to move the engine along:
{"mode": MODE, "rate": tokens per second, "log": a line to write to LOG once}. Modes:

- rising:    requests running, the progress counter rising at `rate`; completions answer
- flat:      requests running and waiting, the counter still; completions hang (stuck)
- saturated: many running and waiting, the counter rising fast; completions answer only
             after `slow` seconds (past the probe's request_timeout)
- capacity:  rising, KV cache at 97 %, preemptions rising; completions answer
- reset:     the counter starts again from 0 (a restarted engine), then rises
- down:      /metrics answers 503 (its metrics unreachable); completions answer
- idle:      nothing running, the counter still; completions answer (and count)

Every line of the page other than the signal lines is the fixture's, as recorded. Many
requests are served at once (a thread each).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuguard.config.engine_profiles import load_catalog

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")


def render(text: str, names: dict[str, tuple[str, ...]], values: dict[str, float]) -> str:
    """The page with each signal's first name present set to its value (the first series
    of it; the others of that name 0, so that a sum is the value)."""
    present = {m.group("name") for line in text.splitlines() if (m := SAMPLE.match(line))}
    chosen = {}
    for signal, value in values.items():
        for name in names.get(signal, ()):
            if name in present:
                chosen[name] = value
                break
    out, done = [], set()
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group("name") in chosen:
            name = m.group("name")
            value = chosen[name] if name not in done else 0.0
            done.add(name)
            line = f"{name}{m.group('labels') or ''} {value!r}"
        out.append(line)
    return "\n".join(out) + "\n"


class Engine:
    def __init__(self, fixture: str, engine: str, control: Path, log: Path | None) -> None:
        self.text = Path(fixture).read_text()
        self.names = load_catalog().profiles[engine].signals
        self.control = control
        self.log = log
        self.lock = threading.Lock()
        self.progress = 1000.0
        self.preemptions = 0.0
        self.last = time.monotonic()
        self.logged: set[str] = set()

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.control.read_text()))
        except (OSError, ValueError):
            return {"mode": "rising"}

    def advance(self) -> dict[str, Any]:
        state = self.state()
        mode = state.get("mode", "rising")
        with self.lock:
            now = time.monotonic()
            elapsed, self.last = now - self.last, now
            if mode == "reset" and not state.get("done_reset"):
                self.progress = 0.0
                state["done_reset"] = True
                self.control.write_text(json.dumps(state))
            if mode in ("rising", "saturated", "capacity", "reset", "down"):
                self.progress += float(state.get("rate", 200)) * elapsed
            if mode == "capacity":
                self.preemptions += max(1.0, 5 * elapsed)
            self._write_log(state)
        return state

    def _write_log(self, state: dict[str, Any]) -> None:
        line = state.get("log")
        if line and self.log is not None and line not in self.logged:
            self.logged.add(line)
            with self.log.open("a") as out:
                out.write(line + "\n")

    def page(self, mode: str) -> str:
        running, waiting, kv = {"flat": (3, 12, 0.4), "saturated": (256, 900, 0.9),
                                "capacity": (200, 40, 0.97), "idle": (0, 0, 0.02)
                                }.get(mode, (4, 0, 0.3))
        return render(self.text, self.names, {
            "running": running, "waiting": waiting, "progress": float(int(self.progress)),
            "kv_cache": kv, "preemptions": self.preemptions})

    def complete(self, mode: str, state: dict[str, Any]) -> bool:
        """Whether a completion answers (after its delay); False: it hangs until the mode
        changes, as a stuck engine's requests do."""
        if mode == "flat":
            while self.state().get("mode") == "flat":
                time.sleep(0.1)
            return False
        if mode == "saturated":
            time.sleep(float(state.get("slow", 3.0)))
        with self.lock:
            if mode != "flat":
                self.progress += 1
        return True


def serve(port: int, engine: Engine) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            state = engine.advance()
            mode = state.get("mode", "rising")
            if self.path == "/metrics":
                if mode == "down":
                    self._send(503, b"metrics unavailable\n", "text/plain")
                else:
                    self._send(200, engine.page(mode).encode(), "text/plain; version=0.0.4")
            else:
                self._send(200, b'{"status": "ok"}', "application/json")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state = engine.advance()
            if engine.complete(state.get("mode", "rising"), state):
                self._send(200, json.dumps({"choices": [{"text": "hi"}]}).encode(),
                           "application/json")

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    port, fixture, name, control = sys.argv[1:5]
    log = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    serve(int(port), Engine(fixture, name, Path(control), log))
