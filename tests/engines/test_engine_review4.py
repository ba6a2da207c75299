"""Hostile review 4's engine findings (/work/notes/review4/engine_*.py), each held: pages
served by a real HTTP server on loopback, read by gpuguard's own read
(sources/engine_metrics.py), kept by its own watch (daemon/service_engine.py) and judged
by its own judge (judge/engine_state.py) and service.inference's `progressing`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuguard.checks.service import progressing
from gpuguard.config.engine_profiles import load_catalog
from gpuguard.config.yamlfile import ConfigError
from gpuguard.daemon.service_engine import EngineWatch
from gpuguard.judge.engine_state import Limits, Progress, judge
from gpuguard.model.engine_profile import SIGNALS
from gpuguard.sources import engine_metrics
from gpuguard.supervisor.config import load_services
from tests.engines.test_engine_metrics import server  # noqa: F401  (the loopback page)

LIMITS = Limits(stuck_after_s=120.0, kv_full=0.95)  # rules/service.yaml's defaults
CYCLE = 5.0


def vllm(running: Any, waiting: Any, tokens: Any) -> bytes:
    return (f"# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f"# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
            f"# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{model_name="m"}} {tokens}\n').encode()


def row(t: float, answer: dict[str, Any]) -> list[Any]:
    """A read as EngineWatch.record keeps it."""
    if "values" not in answer:
        return [t, answer.get("error", "none"), *(None for _ in SIGNALS)]
    return [t, None, *(answer["values"].get(s) for s in SIGNALS)]


def entry_of(reads: list[list[Any]], answer: dict[str, Any], engine: str) -> dict[str, Any]:
    profile = load_catalog().profiles[engine]
    return {"engine": {"reads": reads, "unit": profile.progress_unit, "progress": {
        "on_finish": answer.get("on_finish") is True, "floor_per_s": profile.floor_per_s,
        "per_request": profile.floor_per_request}}}


def replay(url: str, page: Any, pages: Any, cycles: int, engine: str = "vllm",
           timed_out: bool = True) -> tuple[dict[str, int], int, list[list[Any]]]:
    """Each cycle's page read and judged as the daemon does: the states seen, the cycles
    service.inference would call saturated (ok), the reads."""
    reads: list[list[Any]] = []
    states: dict[str, int] = {}
    saturated = 0
    for cycle in range(cycles):
        page.body = pages(cycle)
        answer = engine_metrics.read(url, load_catalog(), engine)
        reads = ([*reads, row(cycle * CYCLE, answer)])[-400:]
        entry = entry_of(reads, answer, engine)
        state = judge(reads, LIMITS, timed_out, "tokens",
                      progress=Progress.of(entry["engine"]))
        states[state.state] = states.get(state.state, 0) + 1
        saturated += bool(timed_out and progressing(entry, LIMITS.stuck_after_s))
    return states, saturated, reads


def test_a_counter_that_moves_on_finish_never_makes_a_long_answer_stuck(server):  # noqa: F811
    """Review 4 #3: llama.cpp's tokens_predicted_total moves when a request finishes; its
    n_decode_total at every step is read instead: one 137 s answer is not stuck. SGLang's
    generation_tokens_total (on finish) alone: unknown past stuck_after, never stuck."""
    url, page = server

    def llama(cycle: int) -> bytes:
        t, busy = cycle * CYCLE, cycle * CYCLE < 137
        return (f"# TYPE llamacpp:tokens_predicted_total counter\n"
                f"llamacpp:tokens_predicted_total {5120 if busy else 7168}\n"
                f"# TYPE llamacpp:n_decode_total counter\n"
                f"llamacpp:n_decode_total {5302 + int(15 * min(t, 137))}\n"
                f"# TYPE llamacpp:requests_processing gauge\n"
                f"llamacpp:requests_processing {int(busy)}\n"
                f"# TYPE llamacpp:requests_deferred gauge\n"
                f"llamacpp:requests_deferred {int(busy)}\n").encode()

    states, saturated, _ = replay(url, page, llama, 28, "llamacpp")  # the answer's 137 s
    assert "stuck" not in states and saturated == 27, (states, saturated)

    def sglang(cycle: int) -> bytes:
        tokens = 100000 if cycle * CYCLE < 180 else 100000 + 32 * 8192
        return (f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 32\n"
                f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 40\n"
                f"# TYPE sglang:generation_tokens counter\n"
                f"sglang:generation_tokens_total {tokens}\n").encode()

    states, _, reads = replay(url, page, sglang, 36, "sglang")
    assert "stuck" not in states and states.get("unknown", 0) > 0, states
    progress = Progress.of(entry_of(reads, {"on_finish": True}, "sglang")["engine"])
    message = judge(reads, LIMITS, True, "tokens", progress=progress).message
    assert "a long request cannot be told from a hang" in message


def test_a_creeping_counter_is_stuck_and_never_saturated(server):  # noqa: F811
    """Review 4 #5: a hung vLLM whose counter creeps a token every 115 s (under
    stuck_after 120 s) is stuck, and service.inference never calls it saturated."""
    url, page = server
    states, saturated, _ = replay(url, page, lambda c: vllm(8, 4, 1000 + c // 23), 60)
    assert states.get("stuck", 0) > 0 and saturated == 0, (states, saturated)


def test_a_slow_healthy_engine_is_neither_stuck_nor_refused_saturated(server):  # noqa: F811
    """No false alarm: 64 running at 0.1 token/s each (a long prefill, a huge model) is
    above the floor (0.05 per running request), so never stuck, and saturated."""
    url, page = server
    states, saturated, _ = replay(url, page, lambda c: vllm(64, 900, 1000 + 32 * c), 60)
    assert "stuck" not in states and saturated == 59, (states, saturated)


def test_two_pages_behind_one_url_are_unknown_not_ok(server):  # noqa: F811
    """Review 4 #6: a hung replica (flat at 100) and a healthy one (rising) answer in
    turn: the counter goes back every other read with the run the same: unknown."""
    url, page = server
    states, saturated, _ = replay(
        url, page, lambda c: vllm(4, 9, 100) if c % 2 else vllm(2, 0, 90000 + 50 * c), 60)
    # the first read alone is the healthy one's, ok; from the second on, unknown
    assert states == {"ok": 1, "unknown": 59} and saturated == 0, (states, saturated)


@pytest.mark.parametrize("running", ["NaN", "+Inf", "-5"])
def test_a_named_signal_with_no_count_is_unknown(server, running):  # noqa: F811
    """Review 4 #8 and weak 14: NaN, Inf or a negative count is no count; waiting 5 and
    running -5 must not sum to idle."""
    url, page = server
    states, saturated, reads = replay(url, page, lambda c: vllm(running, 5, 777), 30)
    assert set(states) == {"unknown"} and saturated == 0, states
    assert "vllm:num_requests_running holds" in reads[-1][1]


def test_more_series_than_the_cap_is_a_read_error(server):  # noqa: F811
    """Review 4 #10: the series past MAX_SERIES held the running requests: not read
    whole, unknown, never a silent 0 (idle)."""
    url, page = server
    cap = engine_metrics.MAX_SERIES
    many = "".join(f'vllm:num_requests_running{{model_name="l{i}"}} 0\n' for i in range(cap))
    page.body = ("# TYPE vllm:num_requests_running gauge\n" + many +
                 'vllm:num_requests_running{model_name="busy"} 12\n'
                 "# TYPE vllm:generation_tokens counter\n"
                 "vllm:generation_tokens_total 5\n").encode()
    answer = engine_metrics.read(url, load_catalog(), "vllm")
    assert "more than 4096 series" in answer["error"] and "values" not in answer


def test_idle_gauges_while_the_probe_times_out_are_unknown(server):  # noqa: F811
    """Review 4 held #1: the metrics say idle, the probe's request got no answer."""
    url, page = server
    states, _, _ = replay(url, page, lambda c: vllm(0, 0, 50), 5)
    assert states == {"unknown": 5}
    states, _, _ = replay(url, page, lambda c: vllm(0, 0, 50), 5, timed_out=False)
    assert states == {"ok": 5}


def test_two_engines_names_alike_are_unknown_not_alphabetical(server):  # noqa: F811
    """Review 4 held #8: `auto` on a page with vLLM's and SGLang's names alike."""
    url, page = server
    page.body = vllm(3, 0, 10) + (
        b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
        b"# TYPE sglang:generation_tokens counter\nsglang:generation_tokens_total 5\n")
    answer = engine_metrics.read(url, load_catalog(), None)
    assert answer.get("ambiguous") and "sglang and vllm" in answer["error"], answer
    watch, sup = EngineWatch(load_catalog()), supervisor(url)
    for cycle in range(10):
        assert watch.due(sup, "run1", cycle * CYCLE)
        entry = watch.record(sup, "run1", watch.read(sup, None), cycle * CYCLE)
        assert entry is not None
        assert judge(entry["reads"], LIMITS, False, "x").state == "unknown"


def supervisor(metrics: str | None, http: str | None = None, name: str | None = None) -> Any:
    service = SimpleNamespace(name="llm", engine=SimpleNamespace(
        name=name, metrics=metrics, timeout=2.0), probe=SimpleNamespace(http=http))
    return SimpleNamespace(service=service,
                           view=lambda: SimpleNamespace(state=SimpleNamespace(active="gpu")))


def test_auto_is_not_settled_by_a_503_while_the_engine_loads(server):  # noqa: F811
    """Review 4 #12: one 503 settled `auto` as no engine for the whole run."""
    url, page = server
    page.status, page.body = 503, b"loading\n"
    watch, sup = EngineWatch(load_catalog()), supervisor(url)
    now, judged = 0.0, None
    for cycle in range(20):
        now += CYCLE
        if cycle == 1:
            page.status, page.body = 200, vllm(3, 2, 100)
        if watch.due(sup, "run1", now):
            judged = watch.record(sup, "run1", watch.read(sup, None), now) or judged
    assert watch.engine_of(sup, "run1") == "vllm" and judged is not None


def test_a_named_engine_with_no_metrics_url_is_a_config_error(tmp_path: Path):
    """Review 4 #12: a named engine whose probe is a command has no /metrics to find."""
    config = tmp_path / "gpuguard.yaml"
    run = ["true"]
    config.write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "engine": {"name": "vllm"},
        "probe": {"exec": run},
        "exec": {"start_gpu": run, "stop_gpu": run, "start_cpu": run, "stop_cpu": run}}]}))
    with pytest.raises(ConfigError) as raised:
        load_services(config)
    assert "needs `metrics: URL`" in str(raised.value)
    assert str(raised.value).startswith(f"{config}:")
