"""The shipped units pass `systemd-analyze verify`; --fail-on gates ExecStartPre."""

import re
import shutil
import subprocess

import pytest

from tests.conftest import FIXTURES, H200_XML, REPO, gpuguard


def test_textfile_timer_units_verify(tmp_path):
    exe = shutil.which("gpuguard") or str(REPO / ".venv" / "bin" / "gpuguard")
    for unit in ("gpuguard-textfile.service", "gpuguard-textfile.timer"):
        text = (REPO / "systemd" / unit).read_text().replace("/usr/bin/gpuguard", exe)
        (tmp_path / unit).write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "gpuguard-textfile.timer"),
                           str(tmp_path / "gpuguard-textfile.service")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("unit", ["gpuguard.service"])
def test_unit_verifies(tmp_path, unit):
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: ./scripts/test.sh installs Debian's systemd")
    exe = shutil.which("gpuguard") or str(REPO / ".venv" / "bin" / "gpuguard")
    text = (REPO / "systemd" / unit).read_text().replace("/usr/bin/gpuguard", exe)
    (tmp_path / unit).write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=true",
                               str(tmp_path / unit)], capture_output=True, text=True,
                              check=False)
    assert "Overall exposure level" in security.stdout
    exposure = float(security.stdout.split("Overall exposure level for")[1].split(":")[1]
                     .split()[0])
    assert exposure <= 3.0, security.stdout  # "OK"; docs/daemon.md records the details
    # docs/daemon.md states what this measures (issue 28: it said 2.7, this measured 2.9),
    # and its table of what stays flagged adds up to every item flagged
    doc = " ".join((REPO / "docs" / "daemon.md").read_text().split())
    stated = re.search(r"overall exposure ([\d.]+) ", doc)
    assert stated is not None and float(stated[1]) == exposure, (stated, exposure)
    table = doc.split("What it still flags, and why it stays:", 1)[1].split("[`systemd/", 1)[0]
    flagged = [float(x) for x in re.findall(r"^\u2717 .*?(\d\.\d)\s*$", security.stdout, re.M)]
    documented = [float(x) for x in re.findall(r"\((\d\.\d)\)", table)]
    assert flagged and documented, security.stdout
    assert round(sum(documented), 1) == round(sum(flagged), 1), (documented, flagged)


def test_preflight_drop_in_gates_on_critical_only():
    drop_in = (REPO / "systemd" / "inference-preflight.conf").read_text()
    assert "ExecStartPre=/usr/bin/gpuguard check --quiet --fail-on critical" in drop_in
    warn_only = FIXTURES / "nvidia-smi-v11-two-gpus.xml"
    # warnings alone pass the gate...
    proc = gpuguard("check", "--input", str(warn_only), "--quiet", "--fail-on", "critical",
                    "--only", "persistence.mode", "--only", "power.limit")
    assert proc.returncode == 0 and "persistence.mode" in proc.stdout
    # ...a critical stops the start
    proc = gpuguard("check", "--input", str(warn_only), "--quiet", "--fail-on", "critical")
    assert proc.returncode == 2
    assert gpuguard("check", "--input", str(H200_XML), "--fail-on", "warning").returncode == 0


def test_daemon_unit_raises_the_open_file_limit():
    # systemd's default soft limit (1,024) is what local clients and many GPU processes
    # would share; the unit sets its own.
    unit = (REPO / "systemd" / "gpuguard.service").read_text()
    limits = [line.split("=", 1)[1] for line in unit.splitlines()
              if line.startswith("LimitNOFILE=")]
    assert len(limits) == 1 and int(limits[0]) >= 65536, limits
