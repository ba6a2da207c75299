"""The services file is checked whole when it is loaded: an unknown key at any depth or a
value of the wrong type is `file:line: what is wrong`, before anything is stopped."""

import json

import pytest

from gpuguard.config.yamlfile import ConfigError
from gpuguard.supervisor.config import load_services

GOOD = """\
services:
  - name: llm
    backend: exec
    gpus: [0, 1]
    probe:
      exec: [curl, -fs, http://127.0.0.1:8000/health]
      status: 200
      timeout: 5
    exec:
      start_gpu: [start, gpu]
      stop_gpu: [stop, gpu]
      start_cpu: [start, cpu]
      stop_cpu: [stop, cpu]
    router:
      nginx:
        upstream_file: /tmp/upstream.conf
        gpu: "127.0.0.1:8001"
        cpu: "127.0.0.1:8002"
        drain: 9
"""


def load_text(tmp_path, text):
    path = tmp_path / "gpuguard.yaml"
    path.write_text(text)
    return load_services(path)


def test_a_good_file_loads_with_the_documented_drain(tmp_path):
    [service] = load_text(tmp_path, GOOD)
    assert service.probe.exec == ["curl", "-fs", "http://127.0.0.1:8000/health"]
    assert service.probe.timeout == 5.0 and service.gpus == [0, 1]
    assert service.nginx is not None and service.nginx.drain == 9.0
    assert service.backend_config["start_cpu"] == ["start", "cpu"]
    assert "running_gpu" not in service.backend_config  # unset: the backend trusts its state


@pytest.mark.parametrize(("old", "new", "line", "problem"), [
    # YAML reads `true` as a boolean: the probe would only fail after the source stopped
    ("exec: [curl, -fs, http://127.0.0.1:8000/health]", "exec: [true]", 6,
     "services[0].probe.exec[0]: expected `str`, got `bool`"),
    ("exec: [curl, -fs, http://127.0.0.1:8000/health]", "exec: []", 6,
     "services[0].probe.exec: expected `array` of length >= 1"),
    ("timeout: 5", "timeot: 5", 8, "services[0].probe.timeot: unknown key"),
    ("drain: 9", "drain_s: 9", 19, "services[0].router.nginx.drain_s: unknown key"),
    ("status: 200", "status: ok", 7, "services[0].probe.status: expected `int`, got `str`"),
    ("status: 200", "status: 42", 7, "services[0].probe.status: expected `int` >= 100"),
    ("timeout: 5", "timeout: 0", 8, "services[0].probe.timeout: expected `float` > 0"),
    ("timeout: 5", "timeout: -1", 8, "services[0].probe.timeout: expected `float` > 0"),
    ("gpus: [0, 1]", "gpus: [0, -1]", 4, "services[0].gpus[1]: expected `int` >= 0"),
    ("gpus: [0, 1]", "gpus: all", 4, "services[0].gpus: expected `array | null`, got `str`"),
    ("start_cpu: [start, cpu]", "start_cpu: start cpu", 12,
     "services[0].exec.start_cpu: expected `array`, got `str`"),
    ("stop_cpu: [stop, cpu]", "stop_cpu: [stop, 3]", 13,
     "services[0].exec.stop_cpu[1]: expected `str`, got `int`"),
    ("stop_cpu: [stop, cpu]", "stop_cpu: [stop, cpu]\n      stop_gpus: [x]", 14,
     "services[0].exec.stop_gpus: unknown key"),
    ('gpu: "127.0.0.1:8001"', "gpu: 8001", 17,
     "services[0].router.nginx.gpu: expected `str`, got `int`"),
    ("    router:\n      nginx:", "    router:\n      haproxy: {}\n      nginx:", 15,
     "services[0].router.haproxy: unknown key"),
    ("exec: [curl, -fs, http://127.0.0.1:8000/health]",
     "exec: [curl]\n      http: http://127.0.0.1:8000/health", 5,
     "llm: probe has http and exec: it takes one of"),
])
def test_a_bad_value_anywhere_is_file_line_and_what(tmp_path, old, new, line, problem):
    assert old in GOOD
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, GOOD.replace(old, new, 1))
    assert caught.value.line == line, str(caught.value)
    assert caught.value.problem.startswith(problem), str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'gpuguard.yaml'}:{line}: ")


def test_a_service_defined_twice_names_the_second(tmp_path):
    second = GOOD.split("\n", 1)[1]
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, GOOD + second)
    assert caught.value.line == 20 and "'llm' is defined twice" in str(caught.value)


@pytest.mark.parametrize("name", [
    "/../../x", "../x", "a/b", "..", ".hidden", "x.request", "-x", "_x", "with space",
    "llm\n", "é", "a" * 65, "",
])
def test_a_name_that_is_not_safe_in_a_file_name_is_refused_at_load(tmp_path, name):
    """A service's name makes root's files in the state directory (failover-<name>.json):
    only letters, digits, '_' and '-' (docs/supervisor.md). `/../../x` used to make the
    daemon write failover-/../../x.json, outside the state directory."""
    text = GOOD.replace("  - name: llm", f"  - name: {json.dumps(name)}", 1)
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    assert caught.value.line == 2, str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'gpuguard.yaml'}:2: ")
    assert "name must be 1 to 64 letters, digits, '_' or '-'" in caught.value.problem \
        or (name == "" and "name" in caught.value.problem), caught.value.problem


@pytest.mark.parametrize("name", ["llm", "LLM-2", "vllm_8b", "0", "a" * 64])
def test_safe_names_load(tmp_path, name):
    [service] = load_text(tmp_path, GOOD.replace("  - name: llm", f"  - name: {name!r}", 1))
    assert service.name == name


ENGINE = """\
services:
  - name: llm
    backend: exec
    probe: {http: "http://127.0.0.1:9/health", timeout: 1}
    exec: {start_gpu: ["true"], stop_gpu: ["true"], start_cpu: ["true"], stop_cpu: ["true"]}
    engine: %s
"""


@pytest.mark.parametrize(("given", "name", "read"), [
    ("auto", None, True), ("none", None, False), ("vllm", "vllm", True),
    ("llamacpp", "llamacpp", True), ("{name: auto}", None, True),
    ("{name: none}", None, False), ("{name: sglang, timeout: 1}", "sglang", True),
])
def test_engine_is_a_name_alone_or_a_mapping(tmp_path, given, name, read):
    """Issue 28: `engine: auto|none|<name>` as the docs write it, besides the mapping
    (before, the loader refused the scalar: "expected `object | null`, got `str`")."""
    [service] = load_text(tmp_path, ENGINE % given)
    assert (service.engine is not None) is read
    if service.engine is not None:
        assert service.engine.name == name and service.engine.metrics is None


@pytest.mark.parametrize(("given", "problem"), [
    ("vlm", "llm: engine 'vlm' is not one gpuguard knows: llamacpp, sglang, tgi, triton, "
            "vllm, auto or none"),
    ("Auto", "llm: engine 'Auto' is not one gpuguard knows"),
    ("3", "services[0].engine: expected `str | object | null`, got `int`"),
    ("[vllm]", "services[0].engine: expected `str | object | null`, got `array`"),
    ("''", "services[0].engine: expected `str` of length >= 1"),
    ("{nam: vllm}", "services[0].engine.nam: unknown key (allowed: metrics, name, timeout)"),
])
def test_a_bad_engine_is_file_line_and_exit_3_from_the_daemon(tmp_path, given, problem):
    """As a user meets it: `gpuguard daemon` exits 3 with `file:line: what is wrong` (its
    config_invalid line), before anything is started, never a traceback."""
    import subprocess
    import sys

    from tests.conftest import FIXTURES, REPO
    from tests.daemon.conftest import free_port

    path = tmp_path / "gpuguard.yaml"
    path.write_text(ENGINE % given)
    done = subprocess.run(
        [sys.executable, "-m", "gpuguard", "daemon", "--config", str(path), "--input",
         str(FIXTURES / "h200-live" / "idle-snapshot.json"), "--no-udev",
         "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state")],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{path}:6: {problem}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "state" / "failover-llm.json").exists()  # nothing started
