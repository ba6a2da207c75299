"""An engine's metrics read as the daemon reads them (gpuguard/sources/engine_metrics.py):
the recorded pages of real releases (tests/fixtures/engines/README.md names each source)
served by a real HTTP server on loopback, parsed by prometheus-client's parser, each
engine recognised from its own names, and vLLM's two KV-cache generations both read."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuguard.config.engine_profiles import load_catalog
from gpuguard.config.yamlfile import ConfigError
from gpuguard.io.http_get import GetError, get
from gpuguard.sources import engine_metrics
from tests.conftest import FIXTURES

PAGES = FIXTURES / "engines"


class Page:
    """What the loopback server answers next: a status and a body."""

    def __init__(self) -> None:
        self.status, self.body, self.trickle = 200, b"", 0.0


@pytest.fixture
def server() -> Iterator[tuple[str, Page]]:
    page = Page()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(page.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page.body)))
            self.end_headers()
            if page.trickle:
                for byte in page.body:  # a byte at a time: the deadline must still hold
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(page.trickle)
            else:
                self.wfile.write(page.body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics", page
    finally:
        httpd.shutdown()
        httpd.server_close()


EXPECTED = {
    # fixture: engine, progress, running, waiting, kv_cache, the KV metric read
    "vllm-0.8.5.prom": ("vllm", 3210.0, 4.0, 0.0, 0.25, "vllm:gpu_cache_usage_perc"),
    "vllm-0.11.prom": ("vllm", 27453.0, 8.0, 0.0, 0.31, "vllm:kv_cache_usage_perc"),
    "sglang-docs.prom": ("sglang", 7557572.0, 162.0, 2826.0, 0.28, "sglang:token_usage"),
    "tgi-3.x.prom": ("tgi", 40306.0, 6.0, 0.0, None, None),
    "triton-24.x.prom": ("triton", 161.0, None, 0.0, None, None),
    "llamacpp-server.prom": ("llamacpp", 5302.0, 2.0, 0.0, None, None),
}


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_each_recorded_page_is_recognised_and_read(server, fixture):
    url, page = server
    page.body = (PAGES / fixture).read_bytes()
    engine, progress, running, waiting, kv, kv_name = EXPECTED[fixture]
    read = engine_metrics.read(url, load_catalog(), None)
    assert read["engine"] == engine, read
    values = read["values"]
    assert (values["progress"], values.get("running"), values.get("waiting"),
            values.get("kv_cache")) == (progress, running, waiting, kv)
    assert read["metrics"].get("kv_cache") == kv_name
    # named, it is read the same
    assert engine_metrics.read(url, load_catalog(), engine)["values"] == values


def test_a_vllm_page_with_both_kv_generations_reads_the_newer(server):
    """vLLM 0.10 shows both names (the old one deprecated): the newer is the one read."""
    url, page = server
    old = (PAGES / "vllm-0.8.5.prom").read_text()
    new_lines = "# TYPE vllm:kv_cache_usage_perc gauge\n" \
        'vllm:kv_cache_usage_perc{model_name="m"} 0.77\n'
    page.body = (old + new_lines).encode()
    read = engine_metrics.read(url, load_catalog(), "vllm")
    assert read["values"]["kv_cache"] == 0.77
    assert read["metrics"]["kv_cache"] == "vllm:kv_cache_usage_perc"


def test_series_of_one_name_are_summed(server):
    """Two models (or data-parallel ranks) on one server: requests and tokens add up."""
    url, page = server
    page.body = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3
vllm:num_requests_running{model_name="b"} 4
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="a"} 10
vllm:generation_tokens_total{model_name="b"} 5
"""
    values = engine_metrics.read(url, load_catalog(), None)["values"]
    assert values["running"] == 7.0 and values["progress"] == 15.0


def test_a_page_of_no_known_engine_is_no_engine(server):
    url, page = server
    page.body = b"# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 3.0\n"
    assert engine_metrics.read(url, load_catalog(), None) == {
        "engine": None, "answered": True, "url": url}


def test_what_goes_wrong_is_an_error_of_the_read(server):
    url, page = server
    page.status, page.body = 503, b"down"
    assert engine_metrics.read(url, load_catalog(), "vllm")["error"] == "answered 503"
    page.status, page.body = 200, b"this is { not prometheus text\n"
    assert "not Prometheus text" in engine_metrics.read(url, load_catalog(), "vllm")["error"]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    read = engine_metrics.read(f"http://127.0.0.1:{port}/metrics", load_catalog(), "vllm")
    assert read["error"].startswith("cannot connect")


def test_one_deadline_holds_against_a_server_that_trickles(server):
    url, page = server
    page.body, page.trickle = (PAGES / "vllm-0.11.prom").read_bytes(), 0.01
    started = time.monotonic()
    with pytest.raises(GetError, match="deadline"):
        get(url, 0.5, 1 << 20)
    # every receive waits what is left: the whole GET ends near its deadline, not after
    # one timeout per byte (generous: the machine is shared)
    assert time.monotonic() - started < 3.0


def test_the_size_bound_holds(server):
    url, page = server
    page.body = b"x" * (300 * 1024)
    with pytest.raises(GetError, match="larger than 256 KiB"):
        get(url, 5.0, 256 * 1024)


def test_a_hung_server_is_cut_at_the_deadline():
    """A server that accepts and never answers (a stuck engine's /metrics can)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        started = time.monotonic()
        read = engine_metrics.read(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics",
                                   load_catalog(), "vllm", 0.5)
        assert "deadline" in read["error"], read
        assert time.monotonic() - started < 3.0
    finally:
        listener.close()


def test_metrics_url_keeps_the_probes_origin():
    assert engine_metrics.metrics_url("http://10.0.0.2:8000/v1/completions", "/metrics") \
        == "http://10.0.0.2:8000/metrics"
    assert engine_metrics.metrics_url("unix:///run/x.sock", "/metrics") is None


def test_every_profile_cites_its_source_and_has_a_progress_counter():
    catalog = load_catalog()
    assert {"vllm", "sglang", "tgi", "triton", "llamacpp"} <= set(catalog.profiles)
    for profile in catalog.profiles.values():
        text = Path(profile.origin).read_text()
        assert "https://" in text.split("\nengine:")[0], f"{profile.name} cites no page"
        assert profile.names("progress"), profile.name
    vllm = catalog.profiles["vllm"]
    assert vllm.names("kv_cache") == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def test_a_bad_profile_is_file_and_line(tmp_path):
    (tmp_path / "x.yaml").write_text(
        "engine: x\ntitle: X\nmetrics_path: /metrics\nrecognise: [a]\n"
        "signals:\n  progress: [{metric: a, versions: all}]\n  lag: []\n"
        "progress_unit: tokens\n")
    with pytest.raises(ConfigError) as caught:
        load_catalog.__wrapped__(tmp_path)
    assert "x.yaml" in str(caught.value) and "lag" in str(caught.value)
