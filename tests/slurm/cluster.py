"""A real Slurm cluster on loopback for the tests (shared/examples/slurm-on-loopback.sh made
a fixture): munged with its own socket and key, slurmctld and slurmd from Debian with
private ports, state, spool, logs and pid files in one temp folder, one real node (this
host, with two GPU GRES on character devices the fixture makes) and nine configured nodes
that never come up (the partition the fleet brake counts; a port of their own where
nothing listens, else slurmd answers for them too and runs the health program for each).
slurmd runs gpuguard's wrapper scripts as HealthCheckProgram, Prolog and Epilog; the tests
steer them through files in the folder. stop() ends every process by its pid and removes
the folder."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import REPO

TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "srun")
HEALTH_INTERVAL = 3  # seconds between slurmd's health runs
FAKE_NODES = "gpu[01-09]"


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t, path="/usr/sbin:/usr/bin") is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


WRAPPER = """#!/bin/sh
# gpuguard slurm {what}, as slurmd runs it: an almost empty environment, no arguments.
# The test's switches: {root}/{what}.env (exported variables), {root}/{what}.args (options).
echo "$(date +%s.%N) ${{SLURM_JOB_ID:-}}" >> {root}/{what}.runs
[ -e {root}/{what}.off ] && exit 0
export GPUGUARD_FORBID_HOST='{guard}'
[ -f {root}/{what}.env ] && . {root}/{what}.env
cd {repo}
set -- $(cat {root}/{what}.args 2>/dev/null)
# how long each run took (start, end, exit status): slurmd kills a health program at 60 s,
# and a run it killed leaves no line
start=$(date +%s.%N)
{python} -m gpuguard slurm {what} "$@" >> {root}/{what}.out 2>&1
code=$?
echo "$start $(date +%s.%N) $code" >> {root}/{what}.took
exit $code
"""


class Cluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpuguard-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf), "PATH": "/usr/sbin:/usr/bin:/bin"}
        self.pids: list[int] = []

    # --- setup ---------------------------------------------------------------------

    def start(self) -> None:
        root = self.root
        for sub in ("state", "spool", "log", "munge", "dev", "gg-state"):
            (root / sub).mkdir()
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in (0, 1):  # GRES needs character devices; major 195 is nvidia's, no driver
            os.mknod(root / "dev" / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        self._wrappers()
        self._write_conf()
        self._run(["munged", "--force", f"--key-file={key}",
                   f"--socket={root}/munge/munge.sock", f"--pid-file={root}/munge/munged.pid",
                   f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/seed"])
        self._remember(root / "munge" / "munged.pid")
        self._run(["slurmctld", "-f", str(self.conf), "-i"])
        self._remember(root / "slurmctld.pid")
        self._run(["slurmd", "-f", str(self.conf), "-N", self.node])
        self._remember(root / "slurmd.pid")
        self.wait_for(lambda: self.state() in ("idle", "drained", "draining"), 30,
                      "the node to come up")
        # slurmctld spaces the first health checks out (12-13 s apart here), and pauses them
        # for about 15 s after a node is resumed; from then on they come every
        # HealthCheckInterval, which is what the tests time against
        self.wait_for(self.steady, 90, "health runs every HealthCheckInterval")

    def steady(self) -> bool:
        times = [float(line.split()[0]) for line in self.runs("health")]
        gaps = [b - a for a, b in itertools.pairwise(times)][-2:]
        return len(gaps) == 2 and all(abs(g - HEALTH_INTERVAL) <= 1.0 for g in gaps)

    def _wrappers(self) -> None:
        guard = os.environ.get("GPUGUARD_FORBID_HOST", "1")
        for what in ("health", "prolog", "epilog"):
            path = self.root / f"{what}.sh"
            path.write_text(WRAPPER.format(what=what, root=self.root, guard=guard, repo=REPO,
                                           python=sys.executable))
            path.chmod(0o755)
            (self.root / f"{what}.off").touch()  # each test turns on what it uses

    def _write_conf(self) -> None:
        r, cpus = self.root, os.cpu_count()
        self.conf.write_text(f"""ClusterName=gg
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
MpiDefault=none
GresTypes=gpu
HealthCheckProgram={r}/health.sh
HealthCheckInterval={HEALTH_INTERVAL}
HealthCheckNodeState=ANY
Prolog={r}/prolog.sh
Epilog={r}/epilog.sh
JobRequeue=1
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName={FAKE_NODES} NodeAddr=127.0.0.2 Port={free_port()} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (r / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={r}/dev/nvidia[0-1]\n")

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} did not start: {done.stderr}\n{self.logs()}")

    def _remember(self, pid_file: Path) -> None:
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                self.pids.append(int(pid_file.read_text().split()[0]))
                return
            time.sleep(0.05)
        raise RuntimeError(f"no {pid_file}\n{self.logs()}")

    # --- use -----------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        # in the cluster's folder: a batch job writes its output where it was submitted
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.root)

    def node_line(self, name: str | None = None) -> tuple[str, str]:
        """(state, reason) of a node as sinfo shows it."""
        out = self.cli("sinfo", "-h", "-N", "-n", name or self.node, "-o", "%T|%E").stdout
        state, _, reason = out.strip().partition("|")
        return state, reason

    def state(self) -> str:
        return self.node_line()[0]

    def reason(self, name: str | None = None) -> str:
        return self.node_line(name)[1]

    def drain(self, name: str, reason: str) -> None:
        done = self.cli("scontrol", "update", f"NodeName={name}", "State=DRAIN",
                        f"Reason={reason}")
        assert done.returncode == 0, done.stderr

    def resume_all(self) -> None:
        for name in (self.node, FAKE_NODES):
            self.cli("scontrol", "update", f"NodeName={name}", "State=RESUME")

    def switch(self, what: str, on: bool, args: list[str] | None = None,
               env: dict[str, str] | None = None) -> None:
        """Turn a wrapper on (with these options and variables) or off."""
        (self.root / f"{what}.args").write_text("\n".join(args or []) + "\n")
        (self.root / f"{what}.env").write_text(
            "".join(f"export {k}='{v}'\n" for k, v in (env or {}).items()))
        off = self.root / f"{what}.off"
        if on:
            off.unlink(missing_ok=True)
        else:
            off.touch()

    def runs(self, what: str) -> list[str]:
        path = self.root / f"{what}.runs"
        return path.read_text().splitlines() if path.exists() else []

    def took(self, what: str, since: float = 0.0) -> list[float]:
        """Seconds each run of `what` that started after `since` (wall clock) took."""
        path = self.root / f"{what}.took"
        lines = path.read_text().splitlines() if path.exists() else []
        return [float(b) - float(a) for a, b, _ in (x.split() for x in lines)
                if float(a) >= since]

    def output(self, what: str) -> str:
        path = self.root / f"{what}.out"
        return path.read_text() if path.exists() else ""

    def wait_for(self, predicate: object, timeout: float, what: str) -> float:
        """Seconds it took; AssertionError naming what did not happen, with the logs."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():  # type: ignore[operator]
                return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; node "
                             f"{self.node_line()}\n{self.logs()}")

    def within_runs(self, predicate: object, what: str, timeout: float = 90
                    ) -> tuple[int, float]:
        """Wait for `predicate`; how many health runs slurmd started meanwhile, and the
        seconds. Slurm pauses its health checks now and then (after a resume, when it
        re-pings a node), so "within two health intervals" is counted in health runs."""
        before = len(self.runs("health"))
        took = self.wait_for(predicate, timeout, what)
        return len(self.runs("health")) - before, took

    def logs(self) -> str:
        now = time.time()
        parts = ["health runs (s ago): " + " ".join(
            f"{now - float(line.split()[0]):.1f}" for line in self.runs("health")[-8:])]
        for name in ("health.out", "prolog.out", "epilog.out", "log/slurmd.log",
                     "log/slurmctld.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-25:]))
        return "\n".join(parts)

    # --- teardown --------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Every process ended by its pid (TERM, then KILL); the folder removed. What was
        still running after that, if anything."""
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        end = time.monotonic() + 15
        left = list(self.pids)
        while left and time.monotonic() < end:
            left = [p for p in left if _alive(p)]
            time.sleep(0.1)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        stray = _processes_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        return [f"{pid} still alive" for pid in left] + stray


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _processes_under(root: Path) -> list[str]:
    """Processes whose command line names the cluster's folder (a slurmstepd, a script)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmd and _alive(int(entry)):
            found.append(f"{entry}: {cmd[:200]}")
    return found
