"""`make package` builds a .deb and an .rpm; the .deb installs with dpkg, runs, and is
removed cleanly. Needs root and dpkg (the test machine is Debian, as root)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import H200_XML, REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dpkg") is None,
                                reason="installing a .deb needs root and dpkg")


def run(*args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)


def test_deb_installs_runs_and_removes(tmp_path):
    if run("dpkg", "-s", "gpuguard").returncode == 0:
        pytest.skip("a gpuguard package is already installed on this machine")
    built = run("make", "package", cwd=REPO)
    assert built.returncode == 0, built.stdout + built.stderr
    debs = sorted((REPO / "dist").glob("gpuguard_*_amd64.deb"))
    rpms = sorted((REPO / "dist").glob("gpuguard-*.x86_64.rpm"))
    assert debs and rpms
    listing = run("dpkg-deb", "--contents", str(debs[-1])).stdout
    for path in ("./usr/bin/gpuguard", "./lib/systemd/system/gpuguard.service",
                 "./etc/gpuguard/profile.yaml", "./opt/gpuguard/wheels/"):
        assert path in listing, path
    conffiles = run("dpkg-deb", "--info", str(debs[-1]), "conffiles").stdout
    assert "/etc/gpuguard/profile.yaml" in conffiles  # an upgrade keeps the admin's copy

    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    had_group = run("getent", "group", "gpuguard").returncode == 0
    installed = run("dpkg", "-i", str(debs[-1]), env=env)
    try:
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert Path("/opt/gpuguard/venv/bin/gpuguard").exists()
        checked = run("/usr/bin/gpuguard", "check", "--input", str(H200_XML), env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "0 critical, 0 warning, 0 unknown" in checked.stdout
        # the rule pack travels inside the wheel
        explained = run("/usr/bin/gpuguard", "rules", "explain", "pcie.link_width", env=env)
        assert "/opt/gpuguard/venv/" in explained.stdout and "_rules/pcie.yaml" in explained.stdout
        # the status socket's group (issue 22), made only where missing
        assert run("getent", "group", "gpuguard").returncode == 0
    finally:
        removed = run("dpkg", "--purge", "gpuguard", env=env)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert not Path("/usr/bin/gpuguard").exists()
    assert not Path("/opt/gpuguard").exists()
    assert not Path("/lib/systemd/system/gpuguard.service").exists()
    # a group the package made goes with it; one that was there stays
    assert (run("getent", "group", "gpuguard").returncode == 0) is had_group
