"""Service definitions of the supervisor, in the daemon's config file:

    services:
      - name: llm
        failover_after: 3           # consecutive failed cycles (default 3)
        failback_after: 10          # consecutive healthy cycles (default 10)
        min_cpu_time: 300           # seconds on CPU before failing back (anti-flap)
        failback: auto              # or manual: only `gpuguard failover to gpu`
        rules: ["driver.*", "gpu.count"]   # default: the rules tagged `failover`
        gpus: [0, 1]                # default: every GPU counts
        probe: {http: "http://127.0.0.1:8000/health", status: 200, timeout: 60}
        # or probe: {docker_health: true, timeout: 60}
        backend: docker             # docker | systemd | exec
        docker:
          gpu: {name: llm-gpu, image: vllm:latest, command: [...], env: {...},
                ports: {"8000/tcp": 8001}, volumes: {...}, labels: {...},
                network_mode: bridge, gpus: all}
          cpu: {name: llm-cpu, image: vllm-cpu:latest, ...}
        systemd: {gpu: llm-gpu.service, cpu: llm-cpu.service}
        exec: {start_gpu: [...], stop_gpu: [...], start_cpu: [...], stop_cpu: [...],
               running_gpu: [...], running_cpu: [...]}
        router:                     # optional: switch without lost requests
          nginx: {upstream_file: /etc/nginx/gpuguard/llm.conf,
                  gpu: "127.0.0.1:8001", cpu: "127.0.0.1:8002",
                  reload: [nginx, -s, reload]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.yamlfile import ConfigError, Mapping, load

SERVICE_KEYS = {"name", "failover_after", "failback_after", "min_cpu_time", "failback", "rules",
                "gpus", "probe", "backend", "docker", "systemd", "exec", "router"}
DOCKER_VARIANT_KEYS = {"name", "image", "command", "env", "ports", "volumes", "labels",
                       "network_mode", "gpus", "runtime", "stop_timeout"}


@dataclass
class Probe:
    # one URL (both variants on one port), or {gpu: URL, cpu: URL} behind a router
    http: str | dict[str, str] | None = None
    status: int = 200
    docker_health: bool = False
    # a command whose exit 0 means ready (one for both variants, or {gpu: [...], cpu: [...]})
    exec: list[str] | dict[str, list[str]] | None = None
    timeout: float = 60.0


@dataclass
class Nginx:
    upstream_file: Path
    gpu: str
    cpu: str
    reload: list[str] = field(default_factory=lambda: ["nginx", "-s", "reload"])
    # `nginx -s reload` returns before the old workers stop taking requests: wait this
    # long after switching before the old variant is stopped.
    drain_s: float = 2.0


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
    rules: list[str] | None = None
    gpus: list[int] | None = None
    nginx: Nginx | None = None
    origin: str = ""


def load_services(path: Path) -> list[Service]:
    doc = load(path)
    if doc is None:
        return []
    if not isinstance(doc, Mapping) or set(doc) - {"services"}:
        raise ConfigError(path, getattr(doc, "line", 1), "expected a mapping with `services:`")
    entries = doc.get("services") or []
    if not isinstance(entries, list):
        raise ConfigError(path, doc.line_of("services"), "`services` must be a list")
    services = [_service(path, entry, doc.line_of("services")) for entry in entries]
    names = [s.name for s in services]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ConfigError(path, None, f"service {duplicate!r} is defined twice")
    return services


def _service(path: Path, entry: Any, line: int) -> Service:
    if not isinstance(entry, Mapping):
        raise ConfigError(path, line, "each service must be a mapping")

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(path, entry.line_of(key), problem)

    if (key := entry.first_unknown(SERVICE_KEYS)) is not None:
        raise fail(key, f"unknown service key {key!r}")
    for required in ("name", "backend", "probe"):
        if required not in entry:
            raise ConfigError(path, entry.line, f"service is missing {required!r}")
    name = entry["name"]
    backend = entry["backend"]
    if backend not in ("docker", "systemd", "exec"):
        raise fail("backend", f"{name}: backend must be docker, systemd or exec")
    if backend not in entry or not isinstance(entry[backend], Mapping):
        raise ConfigError(path, entry.line, f"{name}: backend {backend} needs a `{backend}:` "
                          "section with its gpu and cpu variants")
    section = entry[backend]
    if backend in ("docker", "systemd"):
        for variant in ("gpu", "cpu"):
            if variant not in section:
                raise fail(backend, f"{name}: {backend}.{variant} is missing")
        if backend == "docker":
            for variant in ("gpu", "cpu"):
                spec = section[variant]
                if not isinstance(spec, Mapping) or "name" not in spec or "image" not in spec:
                    raise ConfigError(path, section.line_of(variant),
                                      f"{name}: docker.{variant} needs a name and an image")
                if (key := spec.first_unknown(DOCKER_VARIANT_KEYS)) is not None:
                    raise ConfigError(path, spec.line_of(key),
                                      f"{name}: unknown docker.{variant} key {key!r}")
    else:
        for key in ("start_gpu", "stop_gpu", "start_cpu", "stop_cpu"):
            if not isinstance(section.get(key), list):
                raise ConfigError(path, section.line, f"{name}: exec.{key} must be a command "
                                  "list")
    probe_raw = entry["probe"]
    if not isinstance(probe_raw, Mapping) or \
            not ({"http", "docker_health", "exec"} & set(probe_raw)):
        raise fail("probe", f"{name}: probe needs `http: URL`, `exec: [command]` or "
                   "`docker_health: true`")
    http = probe_raw.get("http")
    probe = Probe(http=dict(http) if isinstance(http, Mapping) else http,
                  status=int(probe_raw.get("status", 200)),
                  docker_health=bool(probe_raw.get("docker_health", False)),
                  exec=(dict(probe_raw["exec"]) if isinstance(probe_raw.get("exec"), Mapping)
                        else probe_raw.get("exec")),
                  timeout=float(probe_raw.get("timeout", 60)))
    failback = entry.get("failback", "auto")
    if failback not in ("auto", "manual"):
        raise fail("failback", f"{name}: failback must be auto or manual")
    nginx = None
    if "router" in entry:
        router = entry["router"]
        if not isinstance(router, Mapping) or not isinstance(router.get("nginx"), Mapping):
            raise fail("router", f"{name}: router supports `nginx:`")
        raw = router["nginx"]
        for key in ("upstream_file", "gpu", "cpu"):
            if key not in raw:
                raise ConfigError(path, raw.line, f"{name}: router.nginx.{key} is missing")
        nginx = Nginx(Path(raw["upstream_file"]), str(raw["gpu"]), str(raw["cpu"]),
                      list(raw.get("reload", ["nginx", "-s", "reload"])),
                      float(raw.get("drain", 2.0)))
    for key in ("failover_after", "failback_after"):
        value = entry.get(key, 3 if key == "failover_after" else 10)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise fail(key, f"{name}: {key} must be a whole number >= 1")
    return Service(
        name=str(name), backend=backend, backend_config=dict(section), probe=probe,
        failover_after=entry.get("failover_after", 3),
        failback_after=entry.get("failback_after", 10),
        min_cpu_time=float(entry.get("min_cpu_time", 300)),
        manual_failback=failback == "manual",
        rules=list(entry["rules"]) if "rules" in entry else None,
        gpus=[int(g) for g in entry["gpus"]] if "gpus" in entry else None,
        nginx=nginx, origin=f"{path}:{entry.line}",
    )
