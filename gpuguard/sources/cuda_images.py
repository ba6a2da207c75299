"""A container image's CUDA facts, read through the Docker API without pulling or
starting it (issue 24; image.cuda judges them, docs/image-cuda.md).

From the image's configuration (`GET /images/{name}/json`): the environment the NVIDIA
runtime hook reads (CUDA_VERSION, NVIDIA_*), the `com.nvidia.*` labels, its id. Whether
it carries the CUDA forward-compatibility package: the official CUDA images' markers
first (`NV_CUDA_COMPAT_PACKAGE` in the environment; a `cuda-compat-X-Y` install in the
image's history, `GET /images/{name}/history`), else its layers (`GET
/images/{name}/get`, the tar `docker save` writes, read as a stream and never stored):
`usr/local/cuda*/compat/libcuda.so.<driver version>`, with later layers' whiteouts
applied. The layers are read only where the package could matter (the image's
requirement names driver branches, or it turns the requirement off), within a deadline
and a size bound; what an image id held is kept (an id is its content).
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from collections.abc import Iterator
from typing import IO, Any

from gpuguard.io.paths import Paths
from gpuguard.model.workload import Workload

# The environment the runtime hook reads, and the official images' compat marker: every
# name that starts with NVIDIA_, whatever follows (the toolkit's GetRequirements takes
# every NVIDIA_REQUIRE_ prefix: NVIDIA_REQUIRE_CUDA.OLD counts), and at most this many
_ENV_NAMES = ("CUDA_VERSION", "NV_CUDA_COMPAT_PACKAGE")
_ENV_PREFIX = "NVIDIA_"
_MAX_VALUE = 64 * 1024
_MAX_NVIDIA_NAMES = 256
_MAX_LABEL, _MAX_LABELS = 1024, 32  # the com.nvidia.* labels kept: informative only
_COMPAT_IN_HISTORY = re.compile(r"cuda-compat-\d+-\d+")
# a driver version's parts are short: a name of thousands of digits is no compat library
_COMPAT_LIB = re.compile(r"(?:\./)?(usr/local/cuda[^/]*/compat)/libcuda\.so\."
                         r"(\d{1,9}(?:\.\d{1,9})+)")
_WHITEOUT = ".wh."
# Reading the layers: at most this long and this much (an image's size is unbounded)
LAYER_SCAN_S = 5.0
LAYER_SCAN_BYTES = 16 * 1024**3
_SCANNED: dict[str, dict[str, Any]] = {}  # image id -> what its layers held
_SCANNED_MAX = 32


def read(workloads: list[Workload], paths: Paths, timeout: float) -> list[dict[str, Any]]:
    """One entry per image workload: its facts, or {"error"} when it cannot be read."""
    from gpuguard.sources.toolkit import docker_base_url

    # DOCKER_HOST first: the root filesystem is looked up only when it names no engine
    base_url = os.environ.get("DOCKER_HOST") or docker_base_url(paths.rootfs)
    if base_url is None:
        return [{**w.facts(), "error": "no Docker daemon is configured (no DOCKER_HOST, no "
                                       "/var/run/docker.sock)"} for w in workloads]
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout)
    except Exception as exc:  # the SDK raises requests', urllib3's and its own errors
        return [{**w.facts(), "error": f"Docker at {base_url}: {_short(exc)}"} for w in workloads]
    try:
        return [_one(client.api, w, timeout) for w in workloads]
    finally:
        client.close()


def _one(api: Any, workload: Workload, timeout: float) -> dict[str, Any]:
    import docker

    entry = workload.facts()
    try:
        info = api.inspect_image(workload.name)
        history = api.history(workload.name)
    except docker.errors.ImageNotFound:
        return {**entry, "error": "no such image on this host (gpuguard never pulls one)"}
    except Exception as exc:
        return {**entry, "error": _short(exc)}
    config = info.get("Config") or {}
    env = _environment(config.get("Env") or [])
    if isinstance(env, str):
        return {**entry, "error": env}
    env.update(dict(workload.env))
    labels = [(str(k), str(v)[:_MAX_LABEL]) for k, v in (config.get("Labels") or {}).items()
              if str(k).startswith("com.nvidia.")]
    entry.update(id=info.get("Id"), env=env, labels=dict(labels[:_MAX_LABELS]))
    compat = _marker(env, history)
    if compat is None and _compat_may_matter(env):
        compat = _scan_cached(api, str(info.get("Id")), min(LAYER_SCAN_S, timeout))
    if compat is not None:
        entry["compat"] = compat
    return entry


def _environment(pairs: list[str]) -> dict[str, str] | str:
    """The variables the runtime hook reads, by name as the image holds them (the text
    before the first "="); a value too long, or too many of them, is said, not judged."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, _, value = str(pair).partition("=")
        if name not in _ENV_NAMES and not name.startswith(_ENV_PREFIX):
            continue
        if len(value) > _MAX_VALUE:
            return (f"{_shown(name)} is longer than {_MAX_VALUE // 1024} KiB: not a value "
                    "to judge")
        env[name] = value
        if len(env) > _MAX_NVIDIA_NAMES:
            return (f"more than {_MAX_NVIDIA_NAMES} NVIDIA_* variables in the image: not an "
                    "environment to judge")
    return env


def _shown(name: str) -> str:
    return name if len(name) <= 80 else f"{name[:80]}... ({len(name)} characters)"


def _marker(env: dict[str, str], history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The compat package the official CUDA images name: in their environment (11.x to
    12.4) or the install command their history records (all of them)."""
    if env.get("NV_CUDA_COMPAT_PACKAGE"):
        return {"found": True, "package": env["NV_CUDA_COMPAT_PACKAGE"],
                "from": "the image's NV_CUDA_COMPAT_PACKAGE"}
    for step in history or []:
        found = _COMPAT_IN_HISTORY.search(str(step.get("CreatedBy") or ""))
        if found:
            return {"found": True, "package": found.group(0), "from": "the image's history"}
    return None


def _compat_may_matter(env: dict[str, str]) -> bool:
    """Forward compatibility can serve an image only where its requirement names driver
    branches (the runtime refuses it otherwise) or is turned off."""
    required = " ".join(v for k, v in env.items() if k.startswith("NVIDIA_REQUIRE_"))
    return "driver" in required or "NVIDIA_DISABLE_REQUIRE" in env


def _scan_cached(api: Any, image_id: str, budget_s: float) -> dict[str, Any]:
    if image_id in _SCANNED:
        return _SCANNED[image_id]
    found = scan_layers(api.get_image(image_id), budget_s, LAYER_SCAN_BYTES)
    if "error" not in found:
        if len(_SCANNED) >= _SCANNED_MAX:
            _SCANNED.pop(next(iter(_SCANNED)))
        _SCANNED[image_id] = found
    return found


def scan_layers(chunks: Iterator[bytes], budget_s: float, max_bytes: int) -> dict[str, Any]:
    """The compat library the layers of a `docker save` stream leave, within the budget."""
    stream = _Chunks(chunks, time.monotonic() + budget_s, max_bytes)
    layers: dict[str, list[tuple[str, str | None]]] = {}  # layer -> [(path, version|None)]
    order: list[str] = []
    try:
        with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 20), mode="r|") as outer:
            for member in outer:
                if member.name == "manifest.json" and member.size < 1 << 20:
                    order = _layer_order(outer.extractfile(member))
                elif member.isfile() and member.size > 0:
                    seen = _layer_paths(outer.extractfile(member), stream)
                    if seen is not None:
                        layers[member.name] = seen
    except _Stop as exc:
        return {"error": str(exc)}
    except (tarfile.TarError, OSError, ValueError) as exc:
        return {"error": f"the image's layers could not be read: {_short(exc)}"}
    if not order or any(name not in layers for name in order):
        # docker save writes every layer and manifest.json: a stream without them ended early
        return {"error": "the image's layers came incomplete (the stream ended early)"}
    return _left_after(layers, order)


def _layer_order(handle: IO[bytes] | None) -> list[str]:
    try:
        manifest = json.loads(handle.read() if handle else b"[]")
        return [str(layer) for layer in manifest[0]["Layers"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return []


def _layer_paths(handle: IO[bytes] | None, stream: _Chunks) -> list[tuple[str, str | None]] | None:
    """The compat libraries and whiteouts in one layer; None when it is no tar (a config)."""
    if handle is None:
        return None
    seen: list[tuple[str, str | None]] = []
    opened = False
    try:
        with tarfile.open(fileobj=handle, mode="r|*") as layer:
            opened = True
            for member in layer:
                stream.check()
                name = member.name.removeprefix("./")
                base = name.rsplit("/", 1)[-1]
                if base.startswith(_WHITEOUT):
                    seen.append((name, None))
                elif (match := _COMPAT_LIB.fullmatch(name)) and not member.isdir():
                    seen.append((name, match.group(2)))
    except tarfile.TarError:
        if opened:  # a layer cut short: what it holds is not known
            raise
        return None
    return seen


def _left_after(layers: dict[str, list[tuple[str, str | None]]],
                order: list[str]) -> dict[str, Any]:
    """The libraries left once each layer's whiteouts removed what the layers below held
    (`.wh.NAME` removes NAME, `.wh..wh..opq` empties its folder)."""
    kept: dict[str, str] = {}
    for layer in order:
        for path, version in layers[layer]:
            if version is not None:
                kept[path] = version
                continue
            folder, _, base = path.rpartition("/")
            gone = folder if base == ".wh..wh..opq" else f"{folder}/{base[len(_WHITEOUT):]}"
            kept = {p: v for p, v in kept.items() if p != gone and not p.startswith(gone + "/")}
    if not kept:
        return {"found": False, "from": "the image's layers"}
    path, version = max(kept.items(), key=lambda item: [int(n) for n in item[1].split(".")])
    return {"found": True, "libcuda": version, "path": "/" + path, "from": "the image's layers"}


class _Stop(Exception):
    pass


class _Chunks(io.RawIOBase):
    """The response's chunks as a file, stopping at the deadline or the size bound."""

    def __init__(self, chunks: Iterator[bytes], deadline: float, max_bytes: int) -> None:
        self._chunks = chunks
        self._view = memoryview(b"")
        self._deadline = deadline
        self._left = max_bytes
        self._budget = max_bytes

    def readable(self) -> bool:
        return True

    def check(self) -> None:
        if time.monotonic() > self._deadline:
            raise _Stop("the image's layers were not read within the deadline (a large "
                        "image: whether it carries the compat package is not known)")

    def readinto(self, target: Any) -> int:
        while not self._view:
            self.check()
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left -= len(chunk)
            if self._left < 0:
                raise _Stop(f"the image is larger than {self._budget // 1024**3} GiB")
            self._view = memoryview(chunk)
        size = min(len(target), len(self._view))
        target[:size] = self._view[:size]
        self._view = self._view[size:]
        return size


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:400]
