"""Test images that carry the CUDA facts of NVIDIA's official images, made with `docker
import` (no registry, no build): busybox, optionally a stand-in CUDA forward-compatibility
library, and the official image's ENV and LABEL lines (tests/fixtures/cuda-images). And
Python environments with a PyTorch as pip lays it out (its version.py, its dist-info)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES

OFFICIAL = {i["image"]: i for i in json.loads(
    (FIXTURES / "cuda-images" / "official-images.json").read_text())["images"]}
COMPAT_LIB = "usr/local/cuda-{cuda}/compat/libcuda.so.{driver}"


def official_env(image: str, without: tuple[str, ...] = ()) -> dict[str, str]:
    return {k: v for k, v in OFFICIAL[image]["env"].items() if k not in without}


def rootfs(files: dict[str, bytes] | None = None) -> bytes:
    """A tar of busybox (what the supervisor tests' variants run) and the given files."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox is missing: ./scripts/test.sh installs Debian's busybox-static"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "echo", "cat", "sleep", "httpd", "wget", "mkdir"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for name, data in (files or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_image(docker_host: str, ref: str, env: dict[str, str],
               labels: dict[str, str] | None = None,
               files: dict[str, bytes] | None = None) -> str:
    """`docker import` with `--change 'ENV ...'` and `--change 'LABEL ...'`; the image's id."""
    import docker

    changes = [f"ENV {k}={json.dumps(v)}" for k, v in env.items()]
    changes += [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in (labels or {}).items()]
    repository, tag = ref.rsplit(":", 1)
    client = docker.DockerClient(base_url=docker_host)
    try:
        client.api.import_image_from_data(rootfs(files), repository=repository, tag=tag,
                                          changes=changes)
        image: Any = client.images.get(ref)
        return str(image.id)
    finally:
        client.close()


def compat_files(cuda: str = "12.8", driver: str = "570.124.06") -> dict[str, bytes]:
    """The compat package's library, as cuda-compat-12-8 installs it (its content is not
    read: the toolkit and gpuguard go by its name)."""
    return {COMPAT_LIB.format(cuda=cuda, driver=driver): b"\x7fELF stand-in\n"}


def pytorch(root: Path, version: str, cuda: str | None, style: str = "new") -> Path:
    """A virtualenv with torch/version.py as PyTorch's build writes it."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / f"torch-{version}.dist-info").mkdir()
    value = repr(cuda)
    line = f"cuda: Optional[str] = {value}" if style == "new" else f"cuda = {value}"
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\n\n__all__ = ['__version__', 'cuda']\n"
        f"__version__ = '{version}'\ndebug = False\n{line}\ngit_version = 'abc'\n"
        f"hip: Optional[str] = None\n")
    return root
