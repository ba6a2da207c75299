"""A /metrics page of vLLM V1's names, as `vllm serve` (0.10/0.11, one engine) writes it:
its gauges and counters, its histograms with their bucket lists (after vLLM's
vllm/v1/metrics/loggers.py: time to first token 22 buckets, inter-token latency 19, the
request phases 21, the token counts 1-2-5 up to the model length), prometheus-client's
process and GC families, and the HTTP families of the FastAPI instrumentator the API
server adds. Stdlib only: the every-feature bench serves it from a plain http.server.

The bucket lists were written from vLLM's code as recalled, not copied from a live
server; what matters here is the page's shape and size (mostly `_bucket` lines, the names
gpuguard reads a few lines among them), which the bench states in its output."""

from __future__ import annotations

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
       10.0, 20.0, 40.0, 80.0]
REQUEST_S = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKENS: list[float] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                       50000, 100000]
# the CUDA graph capture sizes up to 512, and the batch's token budget
ITERATION_TOKENS: list[float] = [1, 2, 4, *range(8, 257, 8), *range(272, 513, 16), 8192]
PARAMS_N: list[float] = [1, 2, 5, 10, 20]
HTTP_HIGHR = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5,
              4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0]
HANDLERS = ["/v1/completions", "/v1/chat/completions", "/metrics", "/health", "/v1/models"]

# (name, help, buckets) of the engine's histograms
HISTOGRAMS: list[tuple[str, str, list[float]]] = [
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL),
    ("vllm:time_per_output_token_seconds",
     "Histogram of time per output token in seconds. DEPRECATED.", ITL),
    ("vllm:e2e_request_latency_seconds",
     "Histogram of e2e request latency in seconds.", REQUEST_S),
    ("vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", REQUEST_S),
    ("vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_S),
    ("vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", REQUEST_S),
    ("vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", REQUEST_S),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS),
    ("vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", TOKENS),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
     TOKENS),
    ("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     ITERATION_TOKENS),
]

# The lines a read of the progress counter sees move: rendered at every GET
TOKENS_MARK = "@GENERATED@"


def _histogram(name: str, text: str, buckets: list[float], labels: str,
               requests: int) -> list[str]:
    lines = [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
    for i, le in enumerate(buckets):
        count = requests * (i + 1) // len(buckets)
        lines.append(f'{name}_bucket{{{labels},le="{float(le)}"}} {float(count)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(requests)}')
    lines.append(f"{name}_count{{{labels}}} {float(requests)}")
    lines.append(f"{name}_sum{{{labels}}} {requests * 0.37:.3f}")
    return lines


def _engine(engines: int, requests: int) -> list[str]:
    out: list[str] = []
    each = [f'engine="{e}",model_name="{MODEL}"' for e in range(engines)]

    def family(name: str, kind: str, text: str, value: str) -> None:
        out.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{{{labels}}} {value}" for labels in each)

    family("vllm:num_requests_running", "gauge",
           "Number of requests in model execution batches.", "2.0")
    family("vllm:num_requests_waiting", "gauge",
           "Number of requests waiting to be processed.", "0.0")
    family("vllm:kv_cache_usage_perc", "gauge",
           "KV-cache usage. 1 means 100 percent usage.", "0.31")
    family("vllm:num_preemptions_total", "counter",
           "Cumulative number of preemption from the engine.", "0.0")
    family("vllm:prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.", "4.8213e+06")
    family("vllm:prefix_cache_hits_total", "counter",
           "Prefix cache hits, in terms of number of cached tokens.", "1.6384e+06")
    family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
           "4.8213e+06")
    family("vllm:generation_tokens_total", "counter",
           "Number of generation tokens processed.", TOKENS_MARK)
    out += ["# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter"]
    for labels in each:
        for reason, n in (("stop", requests - 40), ("length", 35), ("abort", 5)):
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                       f"{float(n)}")
    out += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge"]
    out += [f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",'
            f'enable_prefix_caching="True",engine="{e}",gpu_memory_utilization="0.9",'
            f'num_cpu_blocks="None",num_gpu_blocks="29000",swap_space="4"}} 1.0'
            for e in range(engines)]
    for name, text, buckets in HISTOGRAMS:
        for labels in each:
            out += _histogram(name, text, buckets, labels, requests)
    return out


def _process() -> list[str]:
    out = ["# HELP python_gc_objects_collected_total Objects collected during gc",
           "# TYPE python_gc_objects_collected_total counter"]
    out += [f'python_gc_objects_collected_total{{generation="{g}"}} 1234.0' for g in range(3)]
    out += ['# HELP python_info Python platform information', "# TYPE python_info gauge",
            'python_info{implementation="CPython",major="3",minor="12",patchlevel="3",'
            'version="3.12.3"} 1.0']
    for name, kind, value in (("process_virtual_memory_bytes", "gauge", "3.2e+10"),
                              ("process_resident_memory_bytes", "gauge", "4.1e+09"),
                              ("process_start_time_seconds", "gauge", "1.7e+09"),
                              ("process_cpu_seconds_total", "counter", "1234.5"),
                              ("process_open_fds", "gauge", "210.0"),
                              ("process_max_fds", "gauge", "1.048576e+06")):
        out += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return out


def _http(requests: int) -> list[str]:
    out = ["# HELP http_requests_total Total number of requests by method, status and handler.",
           "# TYPE http_requests_total counter"]
    out += [f'http_requests_total{{handler="{h}",method="{m}",status="2xx"}} {float(requests)}'
            for h in HANDLERS for m in ("GET", "POST")]
    for name in ("http_request_size_bytes", "http_response_size_bytes"):
        out += [f"# HELP {name} Content length of incoming requests by handler.",
                f"# TYPE {name} summary"]
        for h in HANDLERS:
            out += [f'{name}_count{{handler="{h}"}} {float(requests)}',
                    f'{name}_sum{{handler="{h}"}} {requests * 512.0}']
    out += _histogram("http_request_duration_highr_seconds",
                      "Latency with many buckets but no API specific labels.",
                      HTTP_HIGHR, 'instance="api"', requests)
    out += ["# HELP http_request_duration_seconds Latency with only few buckets by handler.",
            "# TYPE http_request_duration_seconds histogram"]
    for h in HANDLERS:
        for m in ("GET", "POST"):
            out += _histogram("http_request_duration_seconds",
                              "Latency with only few buckets by handler.", [0.1, 0.5, 1.0],
                              f'handler="{h}",method="{m}"', requests)[2:]
    return out


def page(engines: int = 1, requests: int = 5000) -> str:
    """The page's text with TOKENS_MARK where the progress counter's value goes."""
    lines = _process() + _engine(engines, requests) + _http(requests)
    return "\n".join(lines) + "\n"


def render(template: str, generated: int) -> bytes:
    return template.replace(TOKENS_MARK, f"{float(generated)}").encode()


def serve(port: int, engines: int) -> None:
    """The engine of the bench's exec service: GET /metrics (the page, its token counter
    moving 40 a read), GET /health, POST /v1/completions (one choice: what the probe's
    json_path asks). Loopback only; runs until killed."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    template = page(engines)
    generated = [27453]
    lock = threading.Lock()
    answer = json.dumps({"id": "cmpl-bench", "object": "text_completion", "model": MODEL,
                         "choices": [{"index": 0, "text": " pong", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                with lock:
                    generated[0] += 40
                    body = render(template, generated[0])
                self._send(body, "text/plain; version=0.0.4; charset=utf-8")
            elif self.path.startswith("/health"):
                self._send(b"", "text/plain")
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/v1/completions"):
                self._send(answer, "application/json")
            else:
                self.send_error(404)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    import sys

    serve(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
