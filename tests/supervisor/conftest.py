"""Real parts for the supervisor: an nginx of our own on a loopback port, variant
containers (busybox httpd saying which variant it is) on the private Docker engine,
and the daemon running the supervisor on a replayed H200 host."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import free_port, host_snapshot, start_daemon, write_snapshot

__all__ = ["start_daemon"]  # the daemon fixture, shared with these tests


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[dict[str, Any]]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.fail("nginx is missing: ./scripts/test.sh installs Debian's nginx-light")
    prefix = tmp_path / "nginx"
    (prefix / "logs").mkdir(parents=True)
    upstream = prefix / "upstream.conf"
    port = free_port()
    conf = prefix / "nginx.conf"
    temp = "\n".join(f"    {name}_temp_path {prefix}/{name};" for name in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf.write_text(f"""
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temp}
    include {upstream};
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://gpuguard_llm;
            proxy_next_upstream error timeout;
        }}
    }}
}}
""")
    # until gpuguard writes the real one, a placeholder so that nginx starts
    upstream.write_text("upstream gpuguard_llm { server 127.0.0.1:9; }\n")
    base = [binary, "-p", str(prefix), "-c", str(conf)]
    started = subprocess.run(base, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    yield {"url": f"http://127.0.0.1:{port}", "upstream": upstream,
           "reload": [*base, "-s", "reload"], "prefix": prefix}
    subprocess.run([*base, "-s", "quit"], capture_output=True, check=False)


def fetch(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode().strip()
    except OSError:
        return None


@pytest.fixture
def service_setup(tmp_path: Path, docker_host: str, busybox_image: str,
                  nginx: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Writes the daemon's services file; removes the test's containers at the end."""
    import docker

    tag = uuid.uuid4().hex[:8]
    ports = {"gpu": free_port(), "cpu": free_port()}
    names = {v: f"gg-test-llm-{v}-{tag}" for v in ports}

    def variant(v: str, image: str | None = None, port: int | None = None) -> dict[str, Any]:
        script = ("mkdir -p /www && echo $VARIANT > /www/variant && echo ok > /www/health "
                  "&& echo \"$NVIDIA_VISIBLE_DEVICES|$CUDA_VISIBLE_DEVICES\" > /www/env "
                  "&& exec httpd -f -p 127.0.0.1:$PORT -h /www")
        spec = {"name": names[v], "image": image or busybox_image,
                "command": ["sh", "-c", script],
                "env": {"VARIANT": v, "PORT": str(port or ports[v])},
                "network_mode": "host",
                # busybox httpd as PID 1 ignores SIGTERM: do not wait docker's 10 s for it
                "stop_timeout": 2}
        if v == "gpu":
            spec["gpus"] = "none"  # no GPU runtime on the test machine
        return spec

    def write(failback: str = "auto", cpu_image: str | None = None, cpu_probe_port: int | None
              = None, router: bool = True, failback_after: int = 3) -> Path:
        # Without a router both variants serve on the GPU variant's port, one at a time.
        cpu_port = ports["cpu"] if router else ports["gpu"]
        probe_cpu = f"http://127.0.0.1:{cpu_probe_port or cpu_port}/health"
        service: dict[str, Any] = {
            "name": "llm", "backend": "docker", "failover_after": 3,
            "failback_after": failback_after, "min_cpu_time": 0, "failback": failback,
            "probe": {"http": {"gpu": f"http://127.0.0.1:{ports['gpu']}/health",
                               "cpu": probe_cpu}, "timeout": 8},
            "docker": {"gpu": variant("gpu"), "cpu": variant("cpu", cpu_image, cpu_port)},
        }
        if router:
            service["router"] = {"nginx": {"upstream_file": str(nginx["upstream"]),
                                           "gpu": f"127.0.0.1:{ports['gpu']}",
                                           "cpu": f"127.0.0.1:{ports['cpu']}",
                                           "reload": nginx["reload"]}}
        path = tmp_path / "gpuguard.yaml"
        path.write_text(json.dumps({"services": [service]}))  # JSON is YAML
        return path

    client = docker.DockerClient(base_url=docker_host)
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2))

    def faulty(on: bool) -> None:
        write_snapshot(snap, host_snapshot(2, {(0, "remapped_rows_failure"): True} if on
                                           else None))

    def running() -> set[str]:
        found = set()
        for v, name in names.items():
            try:
                if client.containers.get(name).status == "running":
                    found.add(v)
            except docker.errors.NotFound:
                pass
        return found

    yield {"write": write, "snapshot": snap, "faulty": faulty, "ports": ports, "names": names,
           "running": running, "client": client, "nginx": nginx, "docker_host": docker_host,
           "state_dir": tmp_path / "state"}
    for name in names.values():
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)
    client.close()


def start_supervised(start_daemon: Any, setup: dict[str, Any], config: Path, *extra: str,
                     env: dict[str, str] | None = None, interval: str = "0.3") -> Any:
    return start_daemon("--input", str(setup["snapshot"]), "--config", str(config),
                        "--fast-interval", interval, "--slow-interval", "600", *extra,
                        env={"DOCKER_HOST": setup["docker_host"], **(env or {})})


def state_of(setup: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return json.loads((setup["state_dir"] / "failover-llm.json").read_text())
    except (OSError, ValueError):
        return None


def settled_on(setup: dict[str, Any], variant: str) -> bool:
    st = state_of(setup)
    return bool(st and st["active"] == variant and st["transition"] is None
                and setup["running"]() == {variant}
                and fetch(setup["nginx"]["url"] + "/variant") == variant)


def wait(predicate: Any, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False
