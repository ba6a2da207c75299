"""The image of packaging/docker/Dockerfile runs (issue 35): `gpuguard check` in it on the
fake NVML answers as on the host, and the daemon runs as the DaemonSet runs it: its
arguments, environment, user, capabilities, read-only root, memory limit and mounts read
from packaging/kubernetes/daemonset.yaml (so the two cannot drift), its probes answered,
its status page off.

Two things of the DaemonSet the test does not give it: the host's PID namespace (hostPID:
the daemon would read the host's processes) and the host's network (hostNetwork: the
daemon listens on :9412, which the test may not take on this machine). The container has a
network of its own with nothing but loopback, and the probes are made from inside it, on
the port and path the DaemonSet's probes name. The nvidia runtime's part, the driver's
libnvidia-ml.so.1 mounted in, is played by the fake NVML.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_BOOT_ID, gpuguard, own_host
from tests.image.conftest import (
    Image,
    daemonset_container,
    mount_options,
    security_options,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap and dockerd need root")

FAKE_NVML_IN_IMAGE = "/opt/fake-nvml"
# Run with the image's own python: a GET of each path on loopback, as the kubelet's
# httpGet probe makes it; prints {path: [status, body]} (status 0: no answer).
PROBE = """
import json, sys, urllib.error, urllib.request
port, answers = sys.argv[1], {}
for path in sys.argv[2:]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            answers[path] = [resp.status, resp.read().decode()]
    except urllib.error.HTTPError as exc:
        answers[path] = [exc.code, exc.read().decode()]
    except OSError as exc:
        answers[path] = [0, str(exc)]
print(json.dumps(answers))
"""
CAP_SYSLOG = 34
# driver.responsive says how long NVML took: a measurement of this run, not the output
NVML_TIME = re.compile(r"NVML answered in \d+\.\d+ s")


def untimed(text: str) -> str:
    return NVML_TIME.sub("NVML answered in (time) s", text)


@pytest.mark.parametrize("switches", [{}, {"temp": 95}, {"lost_gpu": 0}],
                         ids=["healthy", "hot", "lost"])
def test_check_in_the_image_answers_as_on_the_host(
        gpuguard_image: Image, fake_nvml: Path, fake_env: Callable[..., dict[str, str]],
        tmp_path: Path, switches: dict[str, int]) -> None:
    """The same command and environment, on the same own host (its folders mounted at the
    same paths, the fake NVML too), as the DaemonSet's user and capabilities: the same exit
    code and the same output, byte for byte."""
    args = ["check", *own_host(tmp_path / "own-host")]
    env = fake_env(**switches)
    on_host = gpuguard(*args, env=env)
    env_options = [arg for name, value in {**env, "NO_COLOR": "1"}.items()
                   for arg in ("--env", f"{name}={value}")]
    in_image = gpuguard_image.docker(
        "run", "--rm", "--network", "none", "--hostname", socket.gethostname(),
        *security_options(daemonset_container()),
        "--volume", f"{tmp_path}:{tmp_path}", "--volume", f"{fake_nvml}:{fake_nvml}:ro",
        *env_options, "--entrypoint", "gpuguard", gpuguard_image.tag, *args)
    for stream in ("stdout", "stderr"):
        got, want = (untimed(getattr(run, stream)) for run in (in_image, on_host))
        assert got == want, "".join(difflib.unified_diff(
            want.splitlines(True), got.splitlines(True), "on the host", "in the image"))
    assert in_image.returncode == on_host.returncode
    assert on_host.returncode == (3 if not switches else 2)  # unknowns; a critical


def probe_port(container: dict[str, Any]) -> int:
    ports = {p["containerPort"] for p in container["ports"]}
    probed = {container[p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")}
    assert probed <= ports, (probed, ports)
    [port] = probed
    return int(port)


class Pod:
    """The DaemonSet's container, started detached from the image in the private engine."""

    def __init__(self, image: Image, container: dict[str, Any], host: Path,
                 fake_nvml: Path) -> None:
        self.image, self.container = image, container
        self.name = f"gpuguard-image-{uuid.uuid4().hex[:8]}"
        started = image.docker(
            "run", "--detach", "--name", self.name, "--network", "none",
            *security_options(container), *mount_options(container, host),
            "--volume", f"{fake_nvml}:{FAKE_NVML_IN_IMAGE}:ro",
            "--env", f"LD_LIBRARY_PATH={FAKE_NVML_IN_IMAGE}",
            image.tag, *container["args"])
        assert started.returncode == 0, started.stderr

    def get(self, *paths: str) -> dict[str, list[Any]]:
        done = self.image.docker("exec", self.name, "python3", "-c", PROBE,
                                 str(probe_port(self.container)), *paths)
        assert done.returncode == 0, done.stderr + self.logs()
        answers: dict[str, list[Any]] = json.loads(done.stdout)
        return answers

    def wait_ready(self, timeout: float = 90) -> None:
        """Until the readiness probe passes: a generous bound that only proves "no hang"."""
        path = self.container["readinessProbe"]["httpGet"]["path"]
        end = time.monotonic() + timeout
        while self.get(path)[path][0] != 200:
            running = self.image.docker("inspect", "--format", "{{.State.Running}}", self.name)
            assert running.stdout.strip() == "true", "the daemon exited:\n" + self.logs()
            assert time.monotonic() < end, "not ready within the bound:\n" + self.logs()
            time.sleep(1)

    def status_of_pid1(self) -> dict[str, str]:
        text = self.image.docker("exec", self.name, "cat", "/proc/1/status").stdout
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)

    def logs(self) -> str:
        done = self.image.docker("logs", self.name)
        return done.stdout + done.stderr

    def remove(self) -> None:
        self.image.docker("rm", "--force", "--volumes", self.name)


@pytest.fixture
def daemonset_pod(gpuguard_image: Image, fake_nvml: Path, tmp_path: Path) -> Iterator[Pod]:
    host = tmp_path / "host"
    boot_id = host / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text(TEST_BOOT_ID + "\n")
    pod = Pod(gpuguard_image, daemonset_container(), host, fake_nvml)
    try:
        yield pod
    finally:
        pod.remove()


def test_the_daemon_runs_as_the_daemonset_runs_it(daemonset_pod: Pod, tmp_path: Path) -> None:
    pod, container = daemonset_pod, daemonset_pod.container
    pod.wait_ready()
    live = container["livenessProbe"]["httpGet"]["path"]
    answers = pod.get(live, "/metrics", "/")
    assert answers[live][0] == 200, answers[live]
    assert answers["/metrics"][0] == 200
    assert 'gpuguard_gpu_temperature_celsius{' in answers["/metrics"][1]  # the fake GPU
    # the status page is off: / is not served (its switch is not in the arguments)
    assert answers["/"] == [404, "try /metrics, /healthz or /status\n"]

    # as the DaemonSet's user, with its capabilities and no others
    context = container["securityContext"]
    pid1 = pod.status_of_pid1()
    assert pid1["Uid"].split()[0] == str(context.get("runAsUser", 0))
    wanted = sum(1 << {"SYSLOG": CAP_SYSLOG}[cap] for cap in context["capabilities"]["add"])
    assert int(pid1["CapEff"], 16) == wanted, pid1["CapEff"]

    # the verdict files are on the host, where node-problem-detector's pod reads them, and
    # so is the status socket
    args = container["args"]
    host = tmp_path / "host"
    npd = host / args[args.index("--npd-dir") + 1].lstrip("/")
    end = time.monotonic() + 30  # written after each cycle; a bound that proves "no hang"
    while not (npd / "gpu-hardware").exists() and time.monotonic() < end:
        time.sleep(0.5)
    assert (npd / "gpu-hardware").exists(), sorted(host.rglob("*"))
    assert (npd / "gpu-hardware").read_text().startswith("status=")
    assert (host / args[args.index("--status-socket") + 1].lstrip("/")).is_socket()

    # the logs are JSON lines (the entrypoint's --log-format json), and SIGTERM stops it
    stopped = pod.image.docker("stop", "--time", "20", pod.name)
    assert stopped.returncode == 0, stopped.stderr
    code = pod.image.docker("inspect", "--format", "{{.State.ExitCode}}", pod.name)
    logs = pod.logs()
    assert code.stdout.strip() == "0", logs
    lines = logs.splitlines()
    assert lines and all(json.loads(line) for line in lines), logs[-2000:]
