"""The daemon's OpenAPI document (gpuguard/daemon/openapi.yaml, issue 34): valid OpenAPI
3.1 by openapi-spec-validator, its paths and methods the routes of gpuguard/daemon/http.py
(read from the code), its enums the code's, and real answers of a running daemon valid
against it by openapi-core: healthy, stale, not yet fresh (503), the page on and off."""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_core.validation.response.exceptions import InvalidData
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
from prometheus_client import CollectorRegistry

from gpuguard.daemon import http
from gpuguard.daemon.app import Daemon
from gpuguard.daemon.metrics import compat_text, registry_of
from gpuguard.daemon.settings import DAEMON_INPUTS, DaemonConfig
from gpuguard.io.atomic import write_text
from gpuguard.judge.actions import ACTIONS
from gpuguard.model.results import FAIL_ON, SEVERITIES, Result, Status
from gpuguard.outputs import json_out
from gpuguard.sources.host import HostOptions
from tests.daemon.conftest import LIVE, host_snapshot, write_snapshot
from tests.daemon.openapi_http import api, document, exchange, validated


def schemas(doc: dict[str, Any]) -> dict[str, Any]:
    found = doc["components"]["schemas"]
    assert isinstance(found, dict)
    return found


def served_routes() -> tuple[set[str], set[str]]:
    """The paths and methods gpuguard/daemon/http.py's serve() answers, read from its code:
    every `path == "..."` comparison of its router and every `do_METHOD` of its handler.
    A route written another way (`in`, startswith) fails here rather than go unseen."""
    tree = ast.parse(inspect.getsource(http.serve))
    paths: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                and node.left.id == "path":
            right = node.comparators[0]
            assert len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq) and \
                isinstance(right, ast.Constant) and isinstance(right.value, str), \
                f"a route this test cannot read: {ast.unparse(node)}"
            paths.add(right.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "path":
            raise AssertionError(f"a route this test cannot read: {ast.unparse(node)}")
    methods = {node.name.removeprefix("do_").lower() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name.startswith("do_")}
    return paths, methods


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1.")
    validate(doc)
    broken = copy.deepcopy(doc)  # the validator is no rubber stamp: a path must start with /
    broken["paths"]["healthz"] = broken["paths"].pop("/healthz")
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_the_documents_paths_are_the_servers_routes() -> None:
    paths, methods = served_routes()
    assert "/healthz" in paths and "get" in methods  # the reader found the router
    doc = document()
    assert set(doc["paths"]) == paths
    for path, operations in doc["paths"].items():
        assert set(operations) == methods, path


def test_the_documents_words_are_the_codes() -> None:
    """What a field may hold, as the code spells it: a status, severity, action or fail_on
    added in the code without the document fails here, and so does a field of a result."""
    found = schemas(document())
    assert found["Status"]["enum"] == [s.value for s in Status]
    assert found["Result"]["properties"]["severity"]["enum"] == [s.value for s in SEVERITIES]
    assert found["Result"]["properties"]["action"]["enum"] == list(ACTIONS)
    assert found["Summary"]["properties"]["fail_on"]["enum"] == list(FAIL_ON)
    assert found["StatusDocument"]["properties"]["schema"]["const"] == json_out.SCHEMA
    result = Result("thermal.margin", Status.OK, Status.WARNING, "fine").to_json()
    assert set(found["Result"]["properties"]) == set(result) == set(found["Result"]["required"])


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    """A daemon built in this process, its cycles run by the test, served by http.serve
    on loopback exactly as Daemon.run serves it (the page off: no --status-page)."""
    path = tmp_path / "host.json"
    write_snapshot(path, host_snapshot(2))
    host = HostOptions(state_dir=tmp_path, kernel_log=False, procfs=False, sysfs=False,
                       rootfs=False)
    daemon = Daemon(DaemonConfig(inputs=dataclasses.replace(DAEMON_INPUTS, input_path=path),
                                 host=host, udev=False))
    daemon.use_config(daemon.load_config())
    server = http.serve("127.0.0.1", 0, registry_of(daemon), daemon.health,
                        daemon.status_document, page=daemon.page.answer,
                        extra_metrics=compat_text(daemon))
    try:
        yield daemon, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_answers_before_the_first_cycle_and_after_it_match(
        in_process: tuple[Daemon, str]) -> None:
    daemon, url = in_process
    checker = api()
    health = validated(checker, url + "/healthz")  # no fast cycle yet: 503, the age null
    assert health.status_code == 503
    assert json.loads(health.data)["last_successful_cycle_age_s"] is None
    empty = json.loads(validated(checker, url + "/status").data)
    assert empty["results"] == [] and empty["host"]["driver_version"] is None
    daemon.fast_cycle()
    assert validated(checker, url + "/healthz").status_code == 200
    doc = json.loads(validated(checker, url + "/status").data)
    assert doc["results"] and doc["stale"] is False
    assert validated(checker, url + "/metrics").status_code == 200
    page_off = validated(checker, url + "/?refresh=off")
    assert page_off.status_code == 404
    # a path outside the document: the same 404 text as the page that is off
    _, nowhere = exchange(url + "/status/")
    assert nowhere.status_code == 404
    assert nowhere.text == schemas(document())["NotFoundText"]["const"]
    # the document lists GET alone: anything else is http.server's 501
    assert exchange(url + "/status", "POST")[1].status_code == 501
    assert exchange(url + "/healthz", "HEAD")[1].status_code == 501


def test_a_renamed_field_fails_validation(in_process: tuple[Daemon, str]) -> None:
    """The document is strict enough to be wrong: a field of /status or /healthz renamed
    in it (or in the code) makes the real answer invalid."""
    daemon, url = in_process
    daemon.fast_cycle()
    request, status = exchange(url + "/status")
    health_request, health = exchange(url + "/healthz")
    api().validate_response(request, status)
    for schema, field in (("Result", "message"), ("StatusDocument", "stale_reason"),
                          ("Host", "driver_version"), ("Summary", "exit_code")):
        doc = document()
        properties = schemas(doc)[schema]["properties"]
        properties[field + "_renamed"] = properties.pop(field)
        required = schemas(doc)[schema]["required"]
        required[required.index(field)] = field + "_renamed"
        with pytest.raises(InvalidData):
            api(doc).validate_response(request, status)
    doc = document()
    health_schema = schemas(doc)["Health"]
    health_schema["properties"]["fresh_for_s"] = health_schema["properties"].pop(
        "fresh_within_s")
    health_schema["required"].remove("fresh_within_s")
    with pytest.raises(InvalidData):
        api(doc).validate_response(health_request, health)


def test_a_running_daemons_answers_match_the_document(start_daemon: Any,
                                                      tmp_path: Path) -> None:
    """The real daemon, replaying the H200 recording with the page on: every endpoint,
    then stale (its input turned unreadable: the cycles go on, the results say stale)."""
    path = tmp_path / "live.json"
    write_text(path, LIVE.read_text())
    daemon = start_daemon("--input", str(path), "--fast-interval", "0.5", "--status-page")
    checker = api()
    assert validated(checker, daemon.url + "/healthz").status_code == 200
    status = json.loads(validated(checker, daemon.url + "/status").data)
    assert status["host"]["gpu_count"] == 1 and status["results"][0]["gpu"] is not None
    metrics = validated(checker, daemon.url + "/metrics")
    assert metrics.content_type.startswith("text/plain; version=")
    assert "gpuguard_status_page_renders_total" in metrics.text
    for query in ("", "?refresh=off"):
        page = validated(checker, daemon.url + "/" + query)
        assert page.status_code == 200 and 'id="gpu-0"' in page.text

    write_text(path, "{ not a snapshot")
    daemon.wait_for(lambda: daemon.status()["stale"], what="the results stale")
    stale = json.loads(validated(checker, daemon.url + "/status").data)
    assert isinstance(stale["stale_reason"], str)
    health = validated(checker, daemon.url + "/healthz")
    assert health.status_code == 200 and json.loads(health.data)["stale_results"] is True


def test_a_daemon_on_the_fake_nvml_answers_as_documented(start_daemon: Any, fake_env: Any
                                                          ) -> None:
    """A live sweep (the C fake of libnvidia-ml, two GPUs), not a replay."""
    daemon = start_daemon("--fast-interval", "0.5", env=fake_env(gpus=2))
    checker = api()
    assert validated(checker, daemon.url + "/healthz").status_code == 200
    status = json.loads(validated(checker, daemon.url + "/status").data)
    assert status["host"]["source"] == "nvml" and status["host"]["gpu_count"] == 2
    assert validated(checker, daemon.url + "/metrics").status_code == 200


def test_a_route_that_raises_is_the_documented_500() -> None:
    """http.serve's own answer when what it serves raises (here: the status callable)."""
    def broken() -> dict[str, Any]:
        raise RuntimeError("the status document exploded")

    server = http.serve("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {}), broken)
    try:
        answer = validated(api(), f"http://127.0.0.1:{server.server_address[1]}/status")
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status_code == 500
