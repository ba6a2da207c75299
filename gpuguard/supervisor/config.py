"""Service definitions of the supervisor, in the daemon's config file:

    services:
      - name: llm
        failover_after: 3           # consecutive failed cycles (default 3)
        failback_after: 10          # consecutive healthy cycles (default 10)
        min_cpu_time: 300           # seconds on CPU before failing back (anti-flap)
        failback: auto              # or manual: only `gpuguard failover to gpu`
        failback_probe: active      # fail back only after an active probe passes on the
                                    # service's GPUs (docs/active-probe.md); default none;
                                    # qualify: after a hardware failover, only after a
                                    # `gpuguard qualify` passes (supervisor/qualify_config.py)
        rules: ["driver.*", "gpu.count"]   # default: the rules tagged `failover`
        gpus: [0, 1]                # default: every GPU counts
        probe: {http: "http://127.0.0.1:8000/health", status: 200, timeout: 60}
        # or a real request (service.inference judges it every fast cycle, too):
        # probe: {http: "http://127.0.0.1:8000/v1/completions", method: POST,
        #         body: {model: m, prompt: hi, max_tokens: 1},   # or body_file: /path
        #         headers: {Authorization: "Bearer x"}, status: 200,
        #         json_path: choices.0.text, request_timeout: 10, timeout: 60}
        # or probe: {docker_health: true, timeout: 60}
        backend: docker             # docker | systemd | exec
        docker:
          gpu: {name: llm-gpu, image: vllm:latest, command: [...], env: {...},
                ports: {"8000/tcp": 8001}, volumes: {...}, labels: {...},
                network_mode: bridge, gpus: all}
          cpu: {name: llm-cpu, image: vllm-cpu:latest, ...}
        systemd: {gpu: llm-gpu.service, cpu: llm-cpu.service}
        exec: {start_gpu: [...], stop_gpu: [...], start_cpu: [...], stop_cpu: [...],
               running_gpu: [...], running_cpu: [...],
               pid_file_gpu: /run/llm-gpu.pid, pid_file_cpu: /run/llm-cpu.pid}
        python_env: /opt/llm/.venv  # exec, systemd: the GPU variant's Python environment,
                                    # whose PyTorch CUDA build image.cuda judges
        engine: auto                # vllm, ..., none; or {name: vllm, metrics: URL}
        router:                     # optional: switch without lost requests
          nginx: {upstream_file: /etc/nginx/gpuguard/llm.conf,
                  gpu: "127.0.0.1:8001", cpu: "127.0.0.1:8002",
                  reload: [nginx, -s, reload], drain: 2}

The whole file is checked when it is loaded, against the Structs below (gpuguard.config.schema):
an unknown key at any depth or a value of the wrong type is `file:line: what is wrong`,
before anything is stopped or started. The Structs are the file's shape; the dataclasses
(Service, Probe, Nginx) are what the supervisor works with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from gpuguard.config import schema
from gpuguard.config.yamlfile import ConfigError, Mapping, load
from gpuguard.supervisor.engine_config import Engine, EngineField, engine_of
from gpuguard.supervisor.qualify_config import QualifySettings, QualifySpec, qualify_of

# --- the file's shape -------------------------------------------------------------------

Text = Annotated[str, msgspec.Meta(min_length=1)]
# a command is argv, never a shell string: a non-empty list of non-empty strings
Command = Annotated[list[Text], msgspec.Meta(min_length=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
GpuIndex = Annotated[int, msgspec.Meta(ge=0)]
# A service's name makes file names in the state directory (failover-<name>.json, owned
# by root), a metric label and a thread name: letters, digits, '_' and '-', at most 64,
# never '/' or '..' (a name like `/../../x` made root write outside the state dir). No
# dot either: `x.request` would be the state file of one service and the request file
# (failover-<name>.request.json) of another.
# (\A and \Z: `$` would also match before a final newline, and "llm\n" would pass)
SERVICE_NAME = r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z"
ServiceName = Annotated[str, msgspec.Meta(
    pattern=SERVICE_NAME, description="1 to 64 letters, digits, '_' or '-', starting with "
    "a letter or digit (it names files in the state directory)")]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class PerVariantUrl(_Strict):
    gpu: Text
    cpu: Text


class PerVariantCommand(_Strict):
    gpu: Command
    cpu: Command


class ProbeSpec(_Strict):
    http: Text | PerVariantUrl | None = None
    status: Annotated[int, msgspec.Meta(ge=100, le=599)] = 200
    docker_health: bool = False
    exec: Command | PerVariantCommand | None = None
    timeout: Seconds = 60.0
    # A real request instead of a health URL (service.inference): any of these makes it one.
    method: Literal["GET", "POST", "PUT"] | None = None
    body: dict[str, Any] | list[Any] | None = None
    body_file: Text | None = None
    headers: dict[str, str] | None = None
    json_path: Text | None = None
    # the deadline of one request, its response read included (`timeout` is how long
    # a starting variant may take to become ready)
    request_timeout: Seconds = 10.0


class DockerVariant(_Strict):
    name: Text
    image: Text
    command: Text | list[str] | None = None
    env: dict[str, str | int | float] | None = None
    # passed to the docker SDK as they are (its own shapes: ints, lists, mappings)
    ports: dict[str, Any] | None = None
    volumes: dict[str, Any] | list[str] | None = None
    labels: dict[str, str] | None = None
    network_mode: Text | None = None
    gpus: Literal["all", "none"] | list[GpuIndex] | None = None
    runtime: Text | None = None
    stop_timeout: Annotated[int, msgspec.Meta(ge=0)] | None = None


class DockerSection(_Strict):
    gpu: DockerVariant
    cpu: DockerVariant


class SystemdSection(_Strict):
    gpu: Text
    cpu: Text


class ExecSection(_Strict):
    start_gpu: Command
    stop_gpu: Command
    start_cpu: Command
    stop_cpu: Command
    running_gpu: Command | None = None
    running_cpu: Command | None = None
    # the main PID of each variant, written by its start command: service.* rules follow
    # it and its descendants
    pid_file_gpu: Text | None = None
    pid_file_cpu: Text | None = None
    # the log each variant's start command writes (`... >> /var/log/llm-gpu.log 2>&1 &`):
    # read incrementally for CUDA errors tied to the GPU (issue 23, service.gpu_errors)
    log_file_gpu: Text | None = None
    log_file_cpu: Text | None = None


class NginxSpec(_Strict):
    upstream_file: Text
    gpu: Text
    cpu: Text
    reload: Command = msgspec.field(default_factory=lambda: ["nginx", "-s", "reload"])
    drain: Annotated[float, msgspec.Meta(ge=0)] = 2.0


class RouterSpec(_Strict):
    nginx: NginxSpec


class ServiceSpec(_Strict):
    name: ServiceName
    # backend and failback are checked below, with messages that list the choices
    backend: str
    probe: ProbeSpec
    failover_after: Annotated[int, msgspec.Meta(ge=1)] = 3
    failback_after: Annotated[int, msgspec.Meta(ge=1)] = 10
    min_cpu_time: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    failback: str = "auto"
    failback_probe: Literal["none", "active", "qualify"] = "none"
    qualify: QualifySpec | None = None
    rules: list[Text] | None = None
    gpus: list[GpuIndex] | None = None
    docker: DockerSection | None = None
    systemd: SystemdSection | None = None
    exec: ExecSection | None = None
    router: RouterSpec | None = None
    python_env: Text | None = None
    # `engine: auto` or `engine: {name: vllm, ...}` (supervisor/engine_config.py)
    engine: EngineField = None


class ServicesFile(_Strict):
    services: list[ServiceSpec] | None = None


# --- what the supervisor works with -----------------------------------------------------


@dataclass
class Probe:
    # one URL (both variants on one port), or {gpu: URL, cpu: URL} behind a router
    http: str | dict[str, str] | None = None
    status: int = 200
    docker_health: bool = False
    # a command whose exit 0 means ready (one for both variants, or {gpu: [...], cpu: [...]})
    exec: list[str] | dict[str, list[str]] | None = None
    timeout: float = 60.0
    # a real request (probe.InferenceRequest); None: `http` is a plain health URL
    request: InferenceRequest | None = None


@dataclass(frozen=True)
class InferenceRequest:
    """An inference request the probe sends: ready only when it answers `status` with a
    JSON document that has `json_path` (dots; numbers index lists)."""

    method: str = "GET"
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    json_path: str | None = None
    timeout: float = 10.0


@dataclass
class Nginx:
    upstream_file: Path
    gpu: str
    cpu: str
    reload: list[str] = field(default_factory=lambda: ["nginx", "-s", "reload"])
    # `nginx -s reload` returns before the old workers stop taking requests: wait this
    # long after switching before the old variant is stopped (`drain:` in the file).
    drain: float = 2.0


@dataclass
class Service:
    name: str
    backend: str
    backend_config: dict[str, Any]
    probe: Probe
    failover_after: int = 3
    failback_after: int = 10
    min_cpu_time: float = 300.0
    manual_failback: bool = False
    failback_probe: str = "none"
    rules: list[str] | None = None
    gpus: list[int] | None = None
    nginx: Nginx | None = None
    origin: str = ""
    # the GPU variant's Python environment (exec, systemd): image.cuda judges its PyTorch
    python_env: str | None = None
    # its inference engine (issue 23); None: `engine: {name: none}`, nothing is read
    engine: Engine | None = field(default_factory=Engine)
    # `failback_probe: qualify`: how the qualification a failback waits for runs
    qualify: QualifySettings | None = None


def load_services(path: Path) -> list[Service]:
    doc = load(path)
    if doc is None:
        return []
    parsed = schema.convert(doc, ServicesFile, path)
    entries = doc.get("services") or []
    services = [_service(path, spec, entry)
                for spec, entry in zip(parsed.services or [], entries, strict=True)]
    seen: set[str] = set()
    for service, entry in zip(services, entries, strict=True):
        if service.name in seen:
            raise ConfigError(path, entry.line_of("name"),
                              f"service {service.name!r} is defined twice")
        seen.add(service.name)
    return services


def _service(path: Path, spec: ServiceSpec, entry: Mapping) -> Service:
    """The checks that span keys (a backend needs its section), on a well-typed entry."""
    name = spec.name

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(path, entry.line_of(key), f"{name}: {problem}")

    if spec.backend not in ("docker", "systemd", "exec"):
        raise fail("backend", "backend must be docker, systemd or exec")
    section = getattr(spec, spec.backend)
    if section is None:
        raise ConfigError(path, entry.line, f"{name}: backend {spec.backend} needs a "
                          f"`{spec.backend}:` section with its gpu and cpu variants")
    if spec.failback not in ("auto", "manual"):
        raise fail("failback", "failback must be auto or manual")
    probe = spec.probe
    kinds = [k for k, on in (("http", probe.http is not None), ("exec", probe.exec is not None),
                             ("docker_health", probe.docker_health)) if on]
    if len(kinds) != 1:
        problem = "probe needs" if not kinds else f"probe has {' and '.join(kinds)}: it takes"
        raise fail("probe", f"{problem} one of `http: URL`, `exec: [command]` or "
                   "`docker_health: true`")
    request = _request(spec, fail)
    nginx = None
    if spec.router is not None:
        raw = spec.router.nginx
        nginx = Nginx(Path(raw.upstream_file), raw.gpu, raw.cpu, list(raw.reload), raw.drain)
    # the backends take their section as plain data; unset options are left out
    backend_config = msgspec.to_builtins(section)
    if spec.backend == "docker":
        backend_config = {v: {k: x for k, x in backend_config[v].items() if x is not None}
                          for v in ("gpu", "cpu")}
    else:
        backend_config = {k: x for k, x in backend_config.items() if x is not None}
    return Service(
        name=name, backend=spec.backend, backend_config=backend_config,
        probe=Probe(http=_plain(probe.http), status=probe.status,
                    docker_health=probe.docker_health, exec=_plain(probe.exec),
                    timeout=probe.timeout, request=request),
        failover_after=spec.failover_after, failback_after=spec.failback_after,
        min_cpu_time=spec.min_cpu_time, manual_failback=spec.failback == "manual",
        failback_probe=spec.failback_probe, rules=spec.rules, gpus=spec.gpus, nginx=nginx,
        origin=f"{path}:{entry.line}", python_env=_python_env(spec, fail),
        engine=engine_of(spec.engine, spec.probe.http, fail),
        qualify=qualify_of(spec.failback_probe, spec.qualify, fail),
    )


def _python_env(spec: ServiceSpec, fail: Callable[[str, str], ConfigError]) -> str | None:
    """`python_env` belongs to exec and systemd services."""
    if spec.python_env is not None and spec.backend == "docker":
        raise fail("python_env", "python_env is for exec and systemd services: a "
                   "container's Python is in its image, which image.cuda judges")
    return spec.python_env


def _request(spec: ServiceSpec, fail: Callable[[str, str], ConfigError]) -> InferenceRequest | None:
    """The probe's request, when any of its keys is set; checks across its keys."""
    probe = spec.probe
    if not _asks_for_a_request(probe):
        return None
    if probe.http is None:
        raise fail("probe", "method, body, body_file, headers and json_path need `http: URL`")
    if probe.body is not None and probe.body_file is not None:
        raise fail("probe", "probe takes `body` or `body_file`, not both")
    body = _request_body(probe, fail)
    headers = dict(probe.headers or {})
    if body is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    method = probe.method or ("POST" if body is not None else "GET")
    return InferenceRequest(method, body, headers, probe.json_path, probe.request_timeout)


def _asks_for_a_request(probe: ProbeSpec) -> bool:
    """Whether the probe sends a real request (service.inference), not a plain health URL."""
    return any(value is not None for value in (probe.method, probe.body, probe.body_file,
                                               probe.json_path, probe.headers))


def _request_body(probe: ProbeSpec, fail: Callable[[str, str], ConfigError]) -> bytes | None:
    """`body` as JSON, or the bytes of `body_file` (read now: a missing file is a config
    error, not a probe that fails later); None without either."""
    if probe.body is not None:
        return msgspec.json.encode(probe.body)
    if probe.body_file is None:
        return None
    from gpuguard.io import bounded as boundedio

    try:
        return boundedio.read_bytes(probe.body_file, 1024 * 1024, 5.0)
    except OSError as exc:
        raise fail("probe", f"body_file: {exc}") from exc


def _plain(value: Any) -> Any:
    """A per-variant Struct as the {gpu: ..., cpu: ...} dict the supervisor reads."""
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value
