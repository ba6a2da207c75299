"""Container toolkit source: CDI specs, nvidia-container-cli, nvidia-ctk, and Docker.

A driver upgrade that leaves the toolkit or a CDI spec behind breaks every GPU
container while nvidia-smi on the host looks fine; these facts let toolkit.parity
see it. Docker is read through the docker SDK, imported only when a daemon is
configured (DOCKER_HOST, or the default socket exists).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpuguard.model.snapshot import Reading

CDI_DIRS = ("etc/cdi", "var/run/cdi")
_SO_VERSION = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
_HOST_DRIVER = re.compile(r"--host-driver-version=(\S+)")
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"


def cdi_specs(rootfs: Path) -> Reading[list[dict[str, Any]]]:
    """One summary per spec file; a file that cannot be read keeps its error, so one bad
    file makes the rule unknown without hiding what the others say."""
    specs: list[dict[str, Any]] = []
    for folder in CDI_DIRS:
        directory = rootfs / folder
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
                continue
            import yaml  # only where there is a spec to read
            shown = "/" + str(path.relative_to(rootfs))
            try:
                doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader(yaml))
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{shown}:{mark.line + 1}" if mark else shown
                specs.append({"path": shown, "error": f"{where}: not a CDI spec "
                              f"({getattr(exc, 'problem', None) or exc})"})
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                specs.append({"path": shown, "error": f"{shown}: not a CDI spec (no `kind`)"})
                continue
            specs.append(_summarise_spec(doc, shown, rootfs))
    return Reading.ok(specs)


def _loader(yaml: Any) -> Any:
    # The C parser reads a real spec (hundreds of lines) about ten times faster.
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _summarise_spec(doc: dict[str, Any], shown: str, rootfs: Path) -> dict[str, Any]:
    versions: dict[str, list[str]] = {}
    host_paths: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "hostPath" and isinstance(value, str):
                    host_paths.append(value)
                if key in ("hostPath", "containerPath", "path") and isinstance(value, str) \
                        and (m := _SO_VERSION.search(value)):
                    versions.setdefault(m.group(1), []).append(value)
                if key == "args" and isinstance(value, list):
                    for arg in value:
                        if isinstance(arg, str) and (m := _HOST_DRIVER.search(arg)):
                            versions.setdefault(m.group(1), []).append(arg)
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(doc)
    devices = [d.get("name") for d in doc.get("devices") or [] if isinstance(d, dict)]
    missing = sorted({p for p in host_paths if not (rootfs / p.lstrip("/")).exists()})
    return {"path": shown, "kind": doc.get("kind"), "cdi_version": doc.get("cdiVersion"),
            "devices": devices, "versions": versions, "missing_host_paths": missing}


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def container_cli(timeout: float = 5.0) -> Reading[dict[str, Any]]:
    exe = shutil.which("nvidia-container-cli")
    if exe is None:
        return Reading.not_supported("nvidia-container-cli is not installed")
    try:
        code, out = _run([exe, "info"], timeout)
    except subprocess.TimeoutExpired:
        return Reading.failed(f"`nvidia-container-cli info` did not answer in {timeout:g} s")
    if code != 0:
        return Reading.ok({"ok": False, "error": out.strip()[-500:]})
    facts: dict[str, Any] = {"ok": True}
    for key, label in (("nvrm_version", "NVRM version"), ("cuda_version", "CUDA version")):
        if m := re.search(rf"^{label}:\s*(\S+)", out, re.MULTILINE):
            facts[key] = m.group(1)
    return Reading.ok(facts)


def ctk_version(timeout: float = 5.0) -> Reading[str]:
    exe = shutil.which("nvidia-ctk")
    if exe is None:
        return Reading.not_supported("nvidia-ctk is not installed")
    try:
        _, out = _run([exe, "--version"], timeout)
    except subprocess.TimeoutExpired:
        return Reading.failed(f"`nvidia-ctk --version` did not answer in {timeout:g} s")
    if m := re.search(r"version\s+(\S+)", out):
        return Reading.ok(m.group(1))
    return Reading.failed(f"`nvidia-ctk --version` said: {out.strip()[:200]}")


def docker_base_url(rootfs: Path) -> str | None:
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    socket = rootfs / DEFAULT_DOCKER_SOCKET.lstrip("/")
    return f"unix://{socket}" if socket.exists() else None


def docker_info(rootfs: Path, timeout: float = 3.0) -> Reading[dict[str, Any]]:
    base_url = docker_base_url(rootfs)
    if base_url is None:
        return Reading.not_supported("no Docker daemon configured (no DOCKER_HOST, no "
                                     f"{DEFAULT_DOCKER_SOCKET})")
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout)
        try:
            info = client.info()
        finally:
            client.close()
    except Exception as exc:  # the SDK raises requests', urllib3's and its own errors
        return Reading.ok({"host": base_url, "reachable": False, "error": _short(exc)})
    return Reading.ok({
        "host": base_url,
        "reachable": True,
        "server_version": info.get("ServerVersion"),
        "runtimes": sorted(info.get("Runtimes") or {}),
        "default_runtime": info.get("DefaultRuntime"),
        "cdi_spec_dirs": info.get("CDISpecDirs"),
    })


def probe_image(rootfs: Path, image: str, timeout: float) -> Reading[dict[str, Any]]:
    """Run nvidia-smi in a throwaway container with all GPUs; the container is always removed."""
    base_url = docker_base_url(rootfs)
    if base_url is None:
        return Reading.failed("--probe-image needs a Docker daemon, and none is configured")
    import docker
    from docker.types import DeviceRequest

    command = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    client = docker.DockerClient(base_url=base_url, timeout=timeout)
    container = None
    try:
        # create, then start: when start fails (no GPU runtime) the container still exists
        # and must be removed, which run() would leave us no handle for.
        container = client.containers.create(
            image, command, labels={"io.gpuguard.probe": "1"},
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])])
        container.start()
        status = container.wait(timeout=timeout)
        output = container.logs().decode(errors="replace").strip()
        if status.get("StatusCode") != 0:
            return Reading.ok({"image": image, "ok": False,
                               "error": f"exit {status.get('StatusCode')}: {output[-300:]}"})
        versions = sorted({line.strip() for line in output.splitlines() if line.strip()})
        return Reading.ok({"image": image, "ok": True, "driver_versions": versions})
    except Exception as exc:
        return Reading.ok({"image": image, "ok": False, "error": _short(exc)})
    finally:
        if container is not None:
            # Best effort; the io.gpuguard.probe label lets an operator find a leftover.
            with contextlib.suppress(Exception):
                container.remove(force=True)
        client.close()


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:400]
