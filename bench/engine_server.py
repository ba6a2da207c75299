"""A small inference engine of gpuguard's own for the H200 test host (issue 23): PyTorch and
the standard library only (no vLLM there, no network). It serves /v1/completions-like
requests by continuous batching, one real GPU step per generated token (a matmul chain
over the running batch), and exposes vLLM's metric names on /metrics, so that gpuguard's
vLLM profile (rules/engines/vllm.yaml) reads it as it reads vLLM:

    vllm:num_requests_running, vllm:num_requests_waiting (gauges),
    vllm:generation_tokens_total, vllm:num_preemptions_total (counters),
    vllm:kv_cache_usage_perc (running / max batch: its "cache" is its batch slots)

It hangs on command and recovers: POST /admin/hang stops its step loop (requests stay
running and waiting, the token counter stays flat, /health still answers 200, as a
deadlocked engine's does); POST /admin/recover starts it again. Many requests are served
at once (a thread each; the step loop batches them).

    python3 bench/engine_server.py --port 8100 --device cuda [--log FILE]
    python3 bench/engine_server.py --port 8101 --device cpu --dim 256
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch


@dataclass
class Request:
    max_tokens: int
    made: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, device: str, dim: int, max_batch: int, layers: int) -> None:
        self.device = torch.device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.weights = [torch.randn(dim, dim, device=self.device, dtype=dtype) / dim ** 0.5
                        for _ in range(layers)]
        self.state = torch.randn(max_batch, dim, device=self.device, dtype=dtype)
        self.max_batch = max_batch
        self.waiting: queue.Queue[Request] = queue.Queue()
        self.running: list[Request] = []
        self.lock = threading.Lock()
        self.tokens = 0
        self.preemptions = 0
        self.hung = threading.Event()

    def step_loop(self) -> None:
        while True:
            if self.hung.is_set():
                time.sleep(0.05)  # held: nothing made, nothing taken, nothing answered
                continue
            with self.lock:
                while len(self.running) < self.max_batch:
                    try:
                        self.running.append(self.waiting.get_nowait())
                    except queue.Empty:
                        break
                batch = len(self.running)
            if batch == 0:
                time.sleep(0.005)
                continue
            x = self.state[:batch]
            for w in self.weights:  # one token for every running request
                x = torch.tanh(x @ w)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            with self.lock:
                self.tokens += batch
                for request in self.running:
                    request.made += 1
                finished = [r for r in self.running if r.made >= r.max_tokens]
                self.running = [r for r in self.running if r.made < r.max_tokens]
            for request in finished:
                request.done.set()

    def metrics(self) -> str:
        with self.lock:
            running, waiting = len(self.running), self.waiting.qsize()
            tokens, preempted = self.tokens, self.preemptions
        model = 'model_name="gpuguard-bench"'
        return "".join([
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n",
            "# TYPE vllm:num_requests_running gauge\n",
            f"vllm:num_requests_running{{{model}}} {float(running)}\n",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n",
            "# TYPE vllm:num_requests_waiting gauge\n",
            f"vllm:num_requests_waiting{{{model}}} {float(waiting)}\n",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n",
            "# TYPE vllm:kv_cache_usage_perc gauge\n",
            f"vllm:kv_cache_usage_perc{{{model}}} {running / self.max_batch}\n",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n",
            "# TYPE vllm:generation_tokens_total counter\n",
            f"vllm:generation_tokens_total{{{model}}} {float(tokens)}\n",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n",
            "# TYPE vllm:num_preemptions_total counter\n",
            f"vllm:num_preemptions_total{{{model}}} {float(preempted)}\n",
        ])


def serve(engine: Engine, port: int, log: str | None) -> None:
    def note(line: str) -> None:
        if log:
            with open(log, "a") as out:
                out.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, engine.metrics().encode(), "text/plain; version=0.0.4")
            else:  # /health: 200 whatever the step loop does (the complaint of issue 23)
                self._send(200, b'{"status": "ok"}')

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/admin/hang":
                engine.hung.set()
                note("engine: step loop held (hang on command)")
                self._send(200, b'{"hung": true}')
                return
            if self.path == "/admin/recover":
                engine.hung.clear()
                note("engine: step loop resumed")
                self._send(200, b'{"hung": false}')
                return
            try:
                asked = json.loads(body or b"{}")
            except ValueError:
                self._send(400, b'{"error": "not JSON"}')
                return
            request = Request(max(1, min(int(asked.get("max_tokens") or 16), 4096)))
            engine.waiting.put(request)
            request.done.wait()  # no deadline of its own: a hung engine holds it
            self._send(200, json.dumps({"choices": [{"text": "x" * request.made}]}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 1024
    note(f"engine: serving on {port} ({engine.device})")
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--log")
    args = parser.parse_args()
    engine = Engine(args.device, args.dim, args.max_batch, args.layers)
    threading.Thread(target=engine.step_loop, daemon=True, name="steps").start()
    serve(engine, args.port, args.log)


if __name__ == "__main__":
    main()
