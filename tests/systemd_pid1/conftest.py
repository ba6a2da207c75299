"""A Debian bookworm container with systemd as PID 1 and the project's .deb installed.

The root comes from scripts/systemd-root.sh (debootstrap, cached under
/var/cache/gpuguard-tests), is imported into the private Docker engine of the session
(`docker_host`), and booted with the options systemd needs without --privileged. The
container shares the host's network (the daemon listens on a free loopback port, never
9412), never its cgroups: it has a cgroup namespace of its own and an empty tmpfs at
/sys/fs/cgroup, where systemd mounts the hierarchies it wants, rooted at the container's
own cgroup (under the engine's cgroup parent). Given the host's /sys/fs/cgroup instead
(`--cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup`), systemd remounted the host's tmpfs
read-only and left new hierarchy directories in it (issue 18). It is removed at the end
of the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

BOOT_TIMEOUT_S = 120
FAKE_NVML_DIR = "/opt/fake-nvml"


@dataclass
class Machine:
    """One booted container: run commands in it, write files, ask systemd."""

    name: str
    docker_env: dict[str, str]

    def run(self, *args: str, input_text: str | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", "-i", self.name, *args], input=input_text,
                              capture_output=True, text=True, env=self.docker_env,
                              timeout=timeout, check=False)

    def ok(self, *args: str, input_text: str | None = None) -> str:
        proc = self.run(*args, input_text=input_text)
        assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
        return proc.stdout

    def write(self, path: str, text: str) -> None:
        self.ok("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write", path,
                input_text=text)

    def copy_in(self, source: Path, dest: str) -> None:
        self.ok("mkdir", "-p", os.path.dirname(dest))
        subprocess.run(["docker", "cp", str(source), f"{self.name}:{dest}"], check=True,
                       env=self.docker_env, capture_output=True)

    def inspect(self, template: str) -> str:
        """A field of `docker inspect` of the container, as the Go template picks it."""
        proc = subprocess.run(["docker", "inspect", "--format", template, self.name],
                              capture_output=True, text=True, env=self.docker_env, check=True)
        return proc.stdout.strip()

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.ok("systemctl", "show", unit, *(f"--property={p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.ok("journalctl", "--no-pager", "-o", "cat", "-u", unit)

    def wait_for(self, what: str, check: object, timeout: float = 90) -> None:
        """Poll `check()` until it is true; a generous bound that only proves "no hang"."""
        assert callable(check)
        end = time.monotonic() + timeout
        while not check():
            if time.monotonic() > end:
                raise AssertionError(f"not within {timeout} s: {what}")
            time.sleep(0.5)


def host_cgroup_mounts() -> list[str]:
    """The host's mounts at and under /sys/fs/cgroup, with the file system's own options
    (where a remount read-only of the tmpfs shows), and what lies in the tmpfs."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4].startswith("/sys/fs/cgroup"):
            mounts.append(" ".join([fields[4], *fields[fields.index("-", 6) + 1:]]))
    return sorted(mounts) + sorted(os.listdir("/sys/fs/cgroup"))


@pytest.fixture(scope="session")
def systemd_root() -> Path:
    """The cached root tarball; built (a minute or two, from Debian's registry) when missing."""
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap is missing: ./scripts/test.sh installs Debian's debootstrap")
    built = subprocess.run([str(REPO / "scripts" / "systemd-root.sh")], capture_output=True,
                           text=True, check=False)
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


@pytest.fixture(scope="session")
def gpuguard_deb() -> Path:
    """The .deb of this checkout, as `make package` builds it."""
    built = subprocess.run(["make", "package"], cwd=REPO, capture_output=True, text=True,
                           check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    debs = sorted((REPO / "dist").glob("gpuguard_*_amd64.deb"), key=lambda p: p.stat().st_mtime)
    assert debs, "make package built no .deb"
    return debs[-1]


@pytest.fixture(scope="module")
def machine(docker_host: str, systemd_root: Path, gpuguard_deb: Path, fake_nvml: Path
            ) -> Iterator[Machine]:
    env = {**os.environ, "DOCKER_HOST": docker_host}
    image = f"gpuguard-test/systemd:{systemd_root.stem.rsplit('-', 1)[-1]}"
    subprocess.run(["docker", "import", str(systemd_root), image], check=True, env=env,
                   capture_output=True)
    name = f"gpuguard-systemd-{uuid.uuid4().hex[:8]}"
    host_before = host_cgroup_mounts()
    started = subprocess.run(
        ["docker", "run", "--detach", "--name", name,
         # what systemd needs to run as PID 1 without --privileged (which is refused here)
         "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined",
         # cgroups of its own: the container's cgroup is the root of its namespace, and
         # systemd mounts the hierarchies on a tmpfs of the container's, not the host's
         "--cgroupns", "private", "--tmpfs", "/sys/fs/cgroup",
         "--tmpfs", "/run", "--tmpfs", "/run/lock", "--env", "container=docker",
         "--network", "host", image, "/lib/systemd/systemd"],
        capture_output=True, text=True, env=env, check=False)
    assert started.returncode == 0, started.stderr
    box = Machine(name, env)
    try:
        box.wait_for("systemctl is-system-running says running", lambda: box.run(
            "systemctl", "is-system-running").stdout.strip() in ("running", "degraded"),
            timeout=BOOT_TIMEOUT_S)
        state = box.run("systemctl", "is-system-running").stdout.strip()
        assert state == "running", box.run("systemctl", "--failed", "--no-pager").stdout
        # systemd's root is the container's own cgroup, never the host's root (that would
        # be systemd managing the host): seen from the host, the container's PID 1 is in
        # a cgroup named after the container in every hierarchy
        container_id = box.inspect("{{.Id}}")
        host_view = Path(f"/proc/{box.inspect('{{.State.Pid}}')}/cgroup").read_text()
        assert all(f"/{container_id}/" in line.split(":", 2)[2] + "/"
                   for line in host_view.splitlines()), host_view
        # and the host's cgroup mounts are as they were before the boot
        assert host_cgroup_mounts() == host_before, (host_before, host_cgroup_mounts())
        box.copy_in(gpuguard_deb, "/root/gpuguard.deb")
        box.ok("dpkg", "-i", "/root/gpuguard.deb")
        box.copy_in(fake_nvml / "libnvidia-ml.so.1", f"{FAKE_NVML_DIR}/libnvidia-ml.so.1")
        yield box
    finally:
        subprocess.run(["docker", "rm", "--force", "--volumes", name], env=env,
                       capture_output=True, check=False)
        subprocess.run(["docker", "image", "rm", "--force", image], env=env,
                       capture_output=True, check=False)
