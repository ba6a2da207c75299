"""The image of packaging/docker/Dockerfile, built in the session's private Docker engine
(`docker_host`) on a base made here, and the DaemonSet's container read from its YAML.

The base is a Debian bookworm root with python3 and python3-venv (scripts/debian-root.sh
image-base, debootstrap, cached under /var/cache/gpuguard-tests like the systemd tests'
root), imported with `docker import`. gpuguard's wheel and its dependencies' are built on
the host (`pip wheel`, from the host's pip cache or index) into a build context of the
test's own, and the build runs with `--network none` (the engine has no bridge either):
the Dockerfile installs them with `pip --no-index`. The images are removed at the end, and
the stage images the build left (untagged) with them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

DOCKERFILE = REPO / "packaging" / "docker" / "Dockerfile"
DAEMONSET = REPO / "packaging" / "kubernetes" / "daemonset.yaml"


@dataclass
class Image:
    """The built image and the engine it is in."""

    tag: str
    docker_env: dict[str, str]

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              env=self.docker_env, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def image_base_root() -> Path:
    """The cached root tarball; built (about a minute, from Debian's registry) when missing."""
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap is missing: ./scripts/test.sh installs Debian's debootstrap")
    built = subprocess.run([str(REPO / "scripts" / "debian-root.sh"), "image-base"],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


def build_wheels(context: Path) -> None:
    """gpuguard's wheel and its dependencies' where the Dockerfile takes them from (what
    `make wheels` does, into the test's own context instead of the checkout's build/)."""
    wheels = context / "build" / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir",
                            str(wheels), str(REPO)], capture_output=True, text=True,
                           check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    assert sorted(wheels.glob("gpuguard-*.whl")), "pip wheel built no gpuguard wheel"


@pytest.fixture(scope="session")
def gpuguard_image(docker_host: str, image_base_root: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    env = {**os.environ, "DOCKER_HOST": docker_host, "DOCKER_BUILDKIT": "0"}
    run_id = uuid.uuid4().hex[:8]
    base = f"gpuguard-test/image-base:{image_base_root.stem.rsplit('-', 1)[-1]}"
    image = Image(f"gpuguard-test/gpuguard:{run_id}", env)
    context = tmp_path_factory.mktemp("image-context")
    build_wheels(context)
    dangling_before = set(image.docker("images", "--quiet", "--filter", "dangling=true")
                          .stdout.split())
    try:
        imported = image.docker("import", str(image_base_root), base)
        assert imported.returncode == 0, imported.stderr
        # the legacy builder (Debian's docker.io has no buildx); no network in the build
        built = image.docker("build", "--network", "none", "--build-arg", f"BASE={base}",
                             "--tag", image.tag, "--file", str(DOCKERFILE), str(context),
                             timeout=600)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        yield image
    finally:
        image.docker("image", "rm", "--force", image.tag, base)
        # the venv stage's untagged images (the legacy builder keeps them as its cache)
        left = set(image.docker("images", "--quiet", "--filter", "dangling=true").stdout.split())
        if left - dangling_before:
            image.docker("image", "rm", "--force", *sorted(left - dangling_before))


def daemonset_container() -> dict[str, Any]:
    """gpuguard's container of the DaemonSet, with the pod's volumes beside it."""
    spec = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    [container] = [c for c in spec["containers"] if c["name"] == "gpuguard"]
    return {**container, "volumes": {v["name"]: v for v in spec["volumes"]}}


def security_options(container: dict[str, Any]) -> list[str]:
    """`docker run` options for the container's securityContext: its user, capabilities,
    read-only root and no privilege escalation, as the kubelet sets them."""
    context = container.get("securityContext", {})
    options = []
    if "runAsUser" in context:
        group = context.get("runAsGroup")
        options += ["--user", f"{context['runAsUser']}" + (f":{group}" if group else "")]
    capabilities = context.get("capabilities", {})
    options += [arg for cap in capabilities.get("drop", []) for arg in ("--cap-drop", cap)]
    options += [arg for cap in capabilities.get("add", []) for arg in ("--cap-add", cap)]
    if context.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    memory = container.get("resources", {}).get("limits", {}).get("memory")
    if memory:
        options += ["--memory", memory.removesuffix("i").lower()]  # 128Mi: 128m
    return options + [arg for e in container.get("env", [])
                      for arg in ("--env", f"{e['name']}={e['value']}")]


def mount_options(container: dict[str, Any], host: Path) -> list[str]:
    """`docker run` options for the container's volumeMounts. A hostPath is the same path
    under `host`, a host of the test's own (the real /sys, /proc and /dev/kmsg are never
    given to it); an emptyDir is a tmpfs."""
    options = []
    for mount in container.get("volumeMounts", []):
        volume = container["volumes"][mount["name"]]
        if "emptyDir" in volume:
            options += ["--tmpfs", mount["mountPath"]]
            continue
        source = host / volume["hostPath"]["path"].lstrip("/")
        if volume["hostPath"].get("type") == "CharDevice":
            source.parent.mkdir(parents=True, exist_ok=True)
            source.touch()  # the kernel log: an empty file of the test's
        else:
            source.mkdir(parents=True, exist_ok=True)
        options += ["--volume", f"{source}:{mount['mountPath']}"
                    + (":ro" if mount.get("readOnly") else "")]
    return options
