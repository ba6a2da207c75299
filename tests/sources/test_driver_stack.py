"""procfs scans of the driver stack: nvidia-fabricmanager (issue 11), found as
nvidia-persistenced is, by comm (15 characters) and then argv[0]."""

import json
import shutil
import subprocess
import time
from pathlib import Path

from gpuguard.sources import driver_stack
from tests.conftest import FIXTURES, gpuguard


def process(procfs: Path, pid: int, comm: str, argv: list[str]) -> None:
    (procfs / str(pid)).mkdir()
    (procfs / str(pid) / "comm").write_text(comm + "\n")
    (procfs / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_fabricmanager_by_comm_and_argv0(tmp_path):
    process(tmp_path, 1, "systemd", ["/sbin/init"])
    # same first 15 characters, another program: not the fabric manager
    process(tmp_path, 40, "nv-fabricmanage", ["/opt/tools/nv-fabricmanage-probe"])
    (tmp_path / "self").mkdir()  # not a pid: skipped
    assert driver_stack.fabricmanager_running(tmp_path).get() is False
    process(tmp_path, 4242, "nv-fabricmanage",
            ["/usr/bin/nv-fabricmanager", "-c", "/usr/share/nvidia/nvswitch/fabricmanager.cfg"])
    assert driver_stack.fabricmanager_running(tmp_path).get() is True
    assert driver_stack.persistenced_running(tmp_path).get() is False


def test_unlistable_procfs_is_an_error(tmp_path):
    reading = driver_stack.fabricmanager_running(tmp_path / "missing")
    assert reading.state == "error" and "cannot list processes" in reading.describe()


def test_a_real_fabricmanager_process_in_the_snapshot(tmp_path):
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs-match", procfs)
    proc = gpuguard("snapshot", "--path.procfs", str(procfs), "--input",
                    str(FIXTURES / "h200x2" / "nvidia-smi-q.xml"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["host"]["fabricmanager_running"] is False

    binary = tmp_path / "nv-fabricmanager"  # a copy of sleep under the real name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    real = subprocess.Popen([str(binary), "30"])
    try:
        comm = Path(f"/proc/{real.pid}/comm")
        for _ in range(100):  # until exec, the child still carries its parent's name
            if comm.read_text().strip() == "nv-fabricmanage":
                break
            time.sleep(0.05)
        assert driver_stack.fabricmanager_running(Path("/proc")).get() is True
    finally:
        real.kill()
        real.wait()
