"""What a service answers is that service's result, never an exception or a hang of the
caller (issue 20, item 7): readiness.send (the inference request) and readiness.http_ready
(a plain health URL) against hostile servers on loopback (tests/supervisor/hostile.py),
and a supervisor waiting for a variant whose health URL trickles its answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuguard.supervisor import readiness
from gpuguard.supervisor.config import InferenceRequest, load_services
from gpuguard.supervisor.service import Supervisor
from tests.supervisor import hostile

DEADLINE_S = 1.0
REQUEST = InferenceRequest("POST", b'{"prompt": "hi"}', {"Content-Type": "application/json"},
                           "choices.0.text", DEADLINE_S)
# no hang: the call ends near its deadline; the rest is slack for a busy machine
LIMIT_S = DEADLINE_S + 9


@pytest.mark.parametrize("kind", [*hostile.FAILS, *hostile.TIMES_OUT])
def test_send_turns_every_hostile_answer_into_the_services_result(kind: str) -> None:
    with hostile.servers(kind) as started:
        server = started[kind]
        how, value, took = hostile.timed(lambda: readiness.send(server.url, 200, REQUEST),
                                         LIMIT_S)
        assert how == "returned", f"{kind}: {how} {value!r} after {took:.1f} s"
        assert isinstance(value, readiness.Answer)
        assert value.ok is False and value.error, value
        # an answer that came is failed; none within the deadline is a time-out (unknown)
        assert value.timed_out is (kind in hostile.TIMES_OUT), value
        assert took < DEADLINE_S + 3, took
        # the exchange is over: the client closed its connection
        assert _closed(server), f"{kind}: {server.open_now} connections still open"


# A plain health URL: the status is what counts, so a 200 whose body is nested JSON is an
# answer; a body that never ends or a head that never does is not.
HEALTH = {"nested": True, "garbage": False, "headers": False, "endless": False,
          "trickle": False, "silent": False, "healthy": True}


@pytest.mark.parametrize("kind", sorted(HEALTH))
def test_http_ready_answers_within_its_deadline_whatever_the_server_sends(kind: str) -> None:
    with hostile.servers(kind) as started:
        server = started[kind]
        how, value, took = hostile.timed(
            lambda: readiness.http_ready(server.url, 200, DEADLINE_S), LIMIT_S)
        assert how == "returned", f"{kind}: {how} {value!r} after {took:.1f} s"
        assert value is HEALTH[kind], kind
        assert took < DEADLINE_S + 3, took
        assert _closed(server), f"{kind}: {server.open_now} connections still open"


def _closed(server: hostile.Server, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        with server.lock:
            if server.connections and server.open_now == 0:
                return True
        time.sleep(0.05)
    return False


def test_a_target_whose_health_url_trickles_fails_its_transition_in_time(
        tmp_path: Path) -> None:
    """The supervisor waits for the target's probe for `timeout` (2 s here): a health URL
    that sends one header byte every 0.5 s used to hold it for ever (a deadline per read,
    not per request), so the service could never be moved again. Now the transition
    fails within its timeout and the source is put back."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "gpu").write_text("")

    def commands(v: str) -> dict[str, list[str]]:
        return {f"start_{v}": ["touch", str(marks / v)], f"stop_{v}": ["rm", "-f", str(marks / v)],
                f"running_{v}": ["test", "-f", str(marks / v)]}

    with hostile.servers("trickle", "healthy") as started:
        config = tmp_path / "gpuguard.yaml"
        config.write_text(json.dumps({"services": [{
            "name": "llm", "backend": "exec", "min_cpu_time": 0,
            "probe": {"http": {"gpu": started["healthy"].url, "cpu": started["trickle"].url},
                      "timeout": 2},
            "exec": {**commands("gpu"), **commands("cpu")}}]}))
        [service] = load_services(config)
        supervisor = Supervisor(service, tmp_path / "state", set())
        how, value, took = hostile.timed(lambda: supervisor.transition("cpu", "test"), 30)
        assert how == "returned", f"the transition is still waiting after {took:.0f} s"
        assert value is False and took < 2 + 2 + 5, (value, took)
        assert supervisor.state.active == "gpu" and supervisor.state.errors == 1
        assert sorted(p.name for p in marks.iterdir()) == ["gpu"]  # put back as it was
