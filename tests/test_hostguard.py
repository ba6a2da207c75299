"""scripts/hostguard.py, the guard that proves a test run left the host as it found it:
no difference for an unchanged host, and each kind of leftover named when there is one.

Mounts, cgroups, processes and sockets are real (made and removed here, in `finally`);
the kernel log, the enabled-unit links and gpuguard's files come from an injected root,
so that no test writes the real kernel log or /etc. On a real host other activity can
add differences of its own between two snapshots: these tests look for theirs by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

GUARD = REPO / "scripts" / "hostguard.py"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mounts and cgroups need root")


def guard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GUARD), *args], capture_output=True, text=True,
                          timeout=60, check=False)


@dataclass
class Host:
    """The options that point the guard at a host: the real one, or parts made up."""

    options: list[str]
    tmp: Path

    def snapshot(self, name: str, *extra: str) -> Path:
        out = self.tmp / f"{name}.json"
        made = guard("snapshot", str(out), *self.options, *extra)
        assert made.returncode == 0, made.stderr
        return out

    def differences(self, before: Path, after: Path, *only: str) -> list[str]:
        proc = guard("compare", str(before), str(after), *(f"--only={s}" for s in only))
        assert proc.returncode in (0, 1), proc.stderr
        lines = proc.stdout.splitlines()
        assert proc.returncode == (1 if lines else 0), proc  # exit 1 exactly when differing
        return lines


def made_up_root(tmp: Path) -> Path:
    """/etc, /var and /run of a host with one enabled service and one gpuguard file."""
    root = tmp / "root"
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    (root / "etc/rc2.d").mkdir()
    (root / "etc/rc2.d/S01ssh").symlink_to("../init.d/ssh")
    (root / "etc/rc2.d/K01nginx").symlink_to("../init.d/nginx")  # disabled: not a start link
    (root / "etc/gpuguard").mkdir()
    (root / "etc/gpuguard/gpuguard.yaml").write_text("services: []\n")
    return root


def kmsg_file(tmp: Path) -> Path:
    """A saved kernel log in /dev/kmsg's format, one gpuguard line among others."""
    log = tmp / "kmsg.log"
    log.write_text("6,1,100,-;Linux version 6.1\n"
                   "4,2,200,-;gpuguard-selftest: an old line\n"
                   " SUBSYSTEM=pci\n"
                   "6,3,300,-;eth0: link up\n")
    return log


@pytest.fixture
def real_host(tmp_path: Path) -> Host:
    """The real /proc and /sys/fs/cgroup; a made-up root and kernel log."""
    return Host(["--root", str(made_up_root(tmp_path)),
                 "--kmsg-file", str(kmsg_file(tmp_path))], tmp_path)


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,size=4096k,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
35 22 0:40 / /mnt/with\\040space rw,relatime - tmpfs scratch rw
"""
PROC_CGROUP = "12:hugetlb:/\n8:pids:/\n1:cpu:/\n0::/\n"
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:24C4 00000000000000000000000000000000:0000 0A
"""
UDP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
  10: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0
  11: 0100007F:A000 0100007F:0035 01 00000000:00000000 00:00000000 00000000     0
"""
UNIX = """\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 1001 /run/gpuguard.sock
0000000000000000: 00000002 00000000 00010000 0001 01 1002 @containerd-shim/abc.sock
0000000000000000: 00000003 00000000 00000000 0001 03 1003 /run/connected.sock
0000000000000000: 00000002 00000000 00010000 0001 01 1004
"""


@pytest.fixture
def made_up_host(tmp_path: Path) -> Host:
    """Every root made up: a host nothing else can touch between two snapshots."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "net").mkdir()
    (proc / "self/mountinfo").write_text(MOUNTINFO)
    (proc / "self/cgroup").write_text(PROC_CGROUP)
    for name, text in (("tcp", TCP), ("tcp6", TCP6), ("udp", UDP), ("unix", UNIX)):
        (proc / "net" / name).write_text(text)
    cgroups = tmp_path / "cgroup"
    for directory in ("cpu", "pids/system.slice", "unified", "net_cls,net_prio"):
        (cgroups / directory).mkdir(parents=True)
    (cgroups / "net_cls").symlink_to("net_cls,net_prio")
    return Host(["--root", str(made_up_root(tmp_path)), "--proc", str(proc),
                 "--cgroup-root", str(cgroups), "--kmsg-file", str(kmsg_file(tmp_path))],
                tmp_path)


def test_an_unchanged_host_compares_equal(made_up_host: Host) -> None:
    before = made_up_host.snapshot("before")
    after = made_up_host.snapshot("after")
    assert made_up_host.differences(before, after) == []
    # and not because there was nothing to compare: every section has something in it
    # (processes aside: nothing is tracked without a run cgroup or marker)
    sections = json.loads(after.read_text())["sections"]
    assert [name for name, items in sections.items() if not items] == ["processes"]


def test_the_made_up_host_is_read_as_it_is_written(made_up_host: Host) -> None:
    sections = json.loads(made_up_host.snapshot("now").read_text())["sections"]
    assert "/mnt/with space tmpfs scratch rw,relatime rw" in sections["mounts"]
    assert ("/sys/fs/cgroup tmpfs tmpfs rw,relatime rw,size=4096k,mode=755"
            in sections["mounts"])
    assert sections["cgroups"] == ["cpu/", "net_cls -> net_cls,net_prio", "net_cls,net_prio/",
                                   "pids/", "pids/system.slice/", "unified/"]
    assert sections["cgroup_hierarchies"] == [
        "cgroup2 (hierarchy 0) mounted at /sys/fs/cgroup/unified",
        "cpu (hierarchy 1) mounted at /sys/fs/cgroup/cpu",
        "hugetlb (hierarchy 12) mounted at nowhere",  # left by a container, say
        "pids (hierarchy 8) mounted at /sys/fs/cgroup/pids"]
    # the LISTEN and the unbound ones; not the connection, nor the unnamed unix socket
    assert sections["sockets"] == ["tcp 127.0.0.1:8080", "tcp6 [::1]:9412", "udp 0.0.0.0:68",
                                   "unix /run/gpuguard.sock", "unix @containerd-shim/abc.sock"]
    assert sections["kernel_log"] == ["gpuguard-selftest: an old line"]
    assert sections["boot"] == [
        "/etc/rc2.d/S01ssh -> ../init.d/ssh",
        "/etc/systemd/system/multi-user.target.wants/ssh.service -> "
        "/lib/systemd/system/ssh.service"]
    assert sections["files"][0] == "/etc/gpuguard/"
    assert sections["files"][1].startswith("/etc/gpuguard/gpuguard.yaml (13 bytes, modified ")


def test_compare_only_looks_at_the_sections_asked(made_up_host: Host, tmp_path: Path) -> None:
    before = made_up_host.snapshot("before")
    (tmp_path / "root/var/lib/gpuguard").mkdir(parents=True)
    after = made_up_host.snapshot("after")
    assert made_up_host.differences(before, after, "boot", "mounts") == []
    assert made_up_host.differences(before, after, "files") == [
        "+ files: /var/lib/gpuguard/"]


def test_not_a_snapshot_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"kind": "gpuguard-snapshot"}')
    proc = guard("compare", str(other), str(other))
    assert proc.returncode not in (0, 1)
    assert "not a hostguard snapshot" in proc.stderr


@ROOT_ONLY
def test_a_mount_left_behind_is_named(real_host: Host, tmp_path: Path) -> None:
    point = tmp_path / "mnt"
    point.mkdir()
    before = real_host.snapshot("before")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "gpuguard-hostguard-test",
                    str(point)], check=True)
    try:
        during = real_host.snapshot("during")
    finally:
        subprocess.run(["umount", str(point)], check=True)
    ours = [line for line in real_host.differences(before, during, "mounts")
            if str(point) in line]
    assert len(ours) == 1 and ours[0].startswith(
        f"+ mounts: {point} tmpfs gpuguard-hostguard-test rw,"), ours
    after = real_host.snapshot("after")
    assert not [line for line in real_host.differences(before, after) if str(point) in line]


def writable_hierarchy(fs_type: str, controller: str = "") -> Path | None:
    """Where a cgroup hierarchy of this type (with this controller) is mounted read-write,
    if root can write to it; None if there is none."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        sep = fields.index("-", 6)
        if fields[sep + 1] != fs_type or "ro" in fields[5].split(","):
            continue
        if controller and controller not in fields[sep + 3].split(","):
            continue
        if os.access(fields[4], os.W_OK):
            return Path(fields[4])
    return None


@ROOT_ONLY
def test_a_cgroup_left_behind_is_named(real_host: Host) -> None:
    hierarchy = writable_hierarchy("cgroup", "pids") or writable_hierarchy("cgroup", "cpu")
    if hierarchy is None or hierarchy.parent != Path("/sys/fs/cgroup"):
        pytest.skip("no writable cgroup v1 hierarchy mounted in /sys/fs/cgroup")
    cgroup = hierarchy / f"gpuguard-hostguard-test-{uuid.uuid4().hex[:8]}"
    before = real_host.snapshot("before")
    cgroup.mkdir()
    try:
        during = real_host.snapshot("during")
    finally:
        cgroup.rmdir()
    named = f"+ cgroups: {hierarchy.name}/{cgroup.name}/"
    assert named in real_host.differences(before, during, "cgroups")
    after = real_host.snapshot("after")
    assert not [line for line in real_host.differences(before, after) if cgroup.name in line]


@pytest.fixture
def run_cgroup() -> Iterator[Path]:
    """Where scripts/test.sh would make a run's cgroup (v2 first, else v1's pids), for the
    test to make after its first snapshot, as test.sh does; whatever is still in it is
    killed, and it is removed, at the end."""
    hierarchy = writable_hierarchy("cgroup2") or writable_hierarchy("cgroup", "pids")
    if os.geteuid() != 0 or hierarchy is None:
        pytest.skip("no writable cgroup hierarchy (root, and a v2 or a v1 pids hierarchy)")
    cgroup = hierarchy / f"gpuguard-hostguard-test-{uuid.uuid4().hex[:8]}"
    try:
        yield cgroup
    finally:
        end = time.monotonic() + 10
        while (cgroup.exists() and (pids := (cgroup / "cgroup.procs").read_text().split())
               and time.monotonic() < end):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # gone already
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)
        if cgroup.exists():
            cgroup.rmdir()


def test_a_daemon_left_in_the_run_cgroup_is_named(real_host: Host, run_cgroup: Path) -> None:
    before = real_host.snapshot("before", "--run-cgroup", str(run_cgroup))
    run_cgroup.mkdir()
    # a daemon as the worst of them start: double fork, a new session, an empty environment
    subprocess.run(["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec env -i setsid sh -c '
                    '"sleep 300 </dev/null >/dev/null 2>&1 &"', "sh", str(run_cgroup)],
                   check=True, timeout=10)
    [pid] = (run_cgroup / "cgroup.procs").read_text().split()
    during = real_host.snapshot("during", "--run-cgroup", str(run_cgroup))
    assert real_host.differences(before, during, "processes") == [
        f"+ processes: pid {pid}: sleep 300"]
    # the run's cgroup itself is the tracker, never reported as a cgroup left behind
    assert not [line for line in real_host.differences(before, during)
                if run_cgroup.name in line and not line.startswith("+ processes:")]


def test_without_a_cgroup_the_marker_names_a_leaked_process(real_host: Host) -> None:
    marker = f"GPUGUARD_TEST_RUN=hostguard-test-{uuid.uuid4().hex[:8]}"
    before = real_host.snapshot("before", "--run-marker", marker)
    name, value = marker.split("=")
    sleeper = subprocess.Popen(["sleep", "300"], env={**os.environ, name: value})
    try:
        during = real_host.snapshot("during", "--run-marker", marker)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert real_host.differences(before, during, "processes") == [
        f"+ processes: pid {sleeper.pid}: sleep 300"]


def test_a_new_kernel_log_line_is_named(real_host: Host, tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"  # the injected kernel log: never the real /dev/kmsg
    before = real_host.snapshot("before")
    with log.open("a") as kmsg:
        kmsg.write("3,4,400,-;gpuguard[1234]: NVML worker died\n")
    during = real_host.snapshot("during")
    assert real_host.differences(before, during, "kernel_log") == [
        "+ kernel_log: gpuguard[1234]: NVML worker died"]
    # a line the ring buffer overwrote is not something the run left behind
    log.write_text("6,5,500,-;eth0: link down\n")
    assert real_host.differences(before, real_host.snapshot("wrapped"), "kernel_log") == []


def test_a_listening_socket_left_open_is_named(real_host: Host, tmp_path: Path) -> None:
    before = real_host.snapshot("before")
    path = tmp_path / "left.sock"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        unix.bind(str(path))
        unix.listen()
        during = real_host.snapshot("during")
        port = tcp.getsockname()[1]
    found = real_host.differences(before, during, "sockets")
    assert f"+ sockets: tcp 127.0.0.1:{port}" in found, found
    assert f"+ sockets: unix {path}" in found, found
    after = real_host.snapshot("after")
    assert not [line for line in real_host.differences(before, after, "sockets")
                if line.endswith((f"127.0.0.1:{port}", str(path)))]


def test_an_enabled_unit_left_behind_is_named(real_host: Host, tmp_path: Path) -> None:
    root = tmp_path / "root"
    before = real_host.snapshot("before")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    (wants / "docker.service").symlink_to("/lib/systemd/system/docker.service")
    (root / "etc/rc2.d/S01docker").symlink_to("../init.d/docker")
    (root / "etc/rc2.d/S01ssh").unlink()  # and one that was enabled is no more
    during = real_host.snapshot("during")
    assert real_host.differences(before, during, "boot") == [
        "- boot: /etc/rc2.d/S01ssh -> ../init.d/ssh",
        "+ boot: /etc/rc2.d/S01docker -> ../init.d/docker",
        "+ boot: /etc/systemd/system/multi-user.target.wants/docker.service -> "
        "/lib/systemd/system/docker.service"]


def test_a_file_left_under_var_lib_gpuguard_is_named(real_host: Host, tmp_path: Path) -> None:
    root = tmp_path / "root"
    before = real_host.snapshot("before")
    (root / "var/lib/gpuguard").mkdir(parents=True)
    (root / "var/lib/gpuguard/failover-llm.json").write_text("{}\n")
    (root / "etc/gpuguard/gpuguard.yaml").write_text("services: [llm]\n")  # and one changed
    during = real_host.snapshot("during")
    found = real_host.differences(before, during, "files")
    assert [line.split(" (")[0] for line in found] == [
        "- files: /etc/gpuguard/gpuguard.yaml",
        "+ files: /etc/gpuguard/gpuguard.yaml",
        "+ files: /var/lib/gpuguard/",
        "+ files: /var/lib/gpuguard/failover-llm.json"]
    assert found[1].startswith("+ files: /etc/gpuguard/gpuguard.yaml (16 bytes, modified ")
    assert found[3].startswith("+ files: /var/lib/gpuguard/failover-llm.json (3 bytes, ")
