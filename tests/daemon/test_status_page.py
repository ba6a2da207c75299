"""The status page served by a real daemon (issue 31): off unless turned on, its policy
admits its own style alone, it renders at most once per fast cycle under a flood, and
the flood leaves /healthz and /metrics answering. The page in a real browser:
tests/browser/."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpuguard.outputs.page_style import CSP, HEADERS
from tests.daemon.conftest import LIVE, free_port, get, metric_lines


def fetch(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def code_of(url: str) -> int:
    """The answer's code, 0 while nothing listens yet."""
    try:
        return get(url)[0]
    except OSError:
        return 0


def counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(text, name))


def test_the_page_is_off_unless_turned_on(start_daemon: Any) -> None:
    daemon = start_daemon("--input", str(LIVE), "--fast-interval", "0.5")
    code, _, body = fetch(daemon.url + "/")
    assert code == 404 and "/metrics" in body
    assert not metric_lines(daemon.metrics(), "gpuguard_status_page_renders_total")


def test_the_policy_admits_the_pages_own_style_and_nothing_else(start_daemon: Any) -> None:
    daemon = start_daemon("--input", str(LIVE), "--fast-interval", "0.5", "--status-page")
    code, headers, body = fetch(daemon.url + "/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    for name, value in HEADERS:
        assert headers[name] == value, name
    assert headers["Content-Security-Policy"] == CSP
    styles = re.findall(r"<style>(.*?)</style>", body, re.S)
    assert len(styles) == 1, "one inline style, the one the policy names"
    digest = base64.b64encode(hashlib.sha256(styles[0].encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}';" in CSP
    assert "default-src 'none'" in CSP and "script" not in body.lower()
    assert re.search(r'<meta http-equiv="refresh" content="\d+">', body)
    # the same page without the timer, for whoever needs it to hold still (WCAG 2.2.1)
    code, headers, still = fetch(daemon.url + "/?refresh=off")
    assert code == 200 and headers["Content-Security-Policy"] == CSP
    assert 'http-equiv="refresh"' not in still and 'id="gpu-0"' in still
    # the replayed H200: its card, from the daemon's verdict
    assert 'id="gpu-0"' in body and "NVIDIA H200" in body and 'data-state="fresh"' in body


def test_the_profiles_key_turns_it_on_on_loopback_only(start_daemon: Any,
                                                       tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text("status_page: true\n")
    on = start_daemon("--input", str(LIVE), "--fast-interval", "0.5", "--profile",
                      str(profile))
    assert fetch(on.url + "/")[0] == 200
    # the same profile on every interface: off, and the log says how to turn it on
    port = free_port()
    wide = start_daemon("--input", str(LIVE), "--fast-interval", "0.5", "--profile",
                        str(profile), "--listen", f"0.0.0.0:{port}", healthy=False)
    local = f"http://127.0.0.1:{port}"
    wide.wait_for(lambda: code_of(local + "/healthz") == 200, 15, "the wide daemon healthy")
    assert fetch(local + "/")[0] == 404
    assert "status_page_off" in wide.log.read_text() and "--status-page" in \
        wide.log.read_text()
    # the explicit switch serves it there
    port = free_port()
    switched = start_daemon("--input", str(LIVE), "--fast-interval", "0.5", "--profile",
                            str(profile), "--listen", f"0.0.0.0:{port}", "--status-page",
                            healthy=False)
    local = f"http://127.0.0.1:{port}"
    switched.wait_for(lambda: code_of(local + "/healthz") == 200, 15, "the switched daemon")
    assert fetch(local + "/")[0] == 200

def test_a_flood_of_page_requests_costs_one_render_per_cycle(start_daemon: Any) -> None:
    """100 requests a second to / for 4 s: the page is rendered at most once per fast
    cycle (plus the first), and every /healthz and /metrics asked meanwhile is answered."""
    daemon = start_daemon("--input", str(LIVE), "--fast-interval", "0.5", "--status-page")
    before = daemon.metrics()
    stop = threading.Event()
    codes: list[int] = []
    probes: list[tuple[str, int]] = []

    def flood() -> None:
        while not stop.is_set():
            started = time.monotonic()
            codes.append(fetch(daemon.url + "/")[0])
            time.sleep(max(0.0, 0.04 - (time.monotonic() - started)))  # 25/s a thread

    def probe() -> None:
        while not stop.is_set():
            for path in ("/healthz", "/metrics"):
                probes.append((path, get(daemon.url + path, timeout=5)[0]))
            time.sleep(0.1)

    threads = [threading.Thread(target=flood) for _ in range(4)] + \
        [threading.Thread(target=probe)]
    for t in threads:
        t.start()
    time.sleep(4.0)
    stop.set()
    for t in threads:
        t.join()
    after = daemon.metrics()
    renders = counter(after, "gpuguard_status_page_renders_total") - \
        counter(before, "gpuguard_status_page_renders_total")
    cycles = counter(after, "gpuguard_cycles_total") - counter(before, "gpuguard_cycles_total")
    assert len(codes) >= 200 and set(codes) == {200}, (len(codes), set(codes))
    assert 1 <= renders <= cycles + 1, (renders, cycles, len(codes))
    assert probes and all(code == 200 for _, code in probes), probes
