"""The return-to-service gate through `gpuguard slurm health` on the fake Slurm (tests/slurm/
fake_slurm/) and a live host of the test's own on the fake NVML and libcuda (gated.py): the
qualification started detached and read back by a later run, a failing one, one killed and
retried, the events that tie it to its drain, an older gpuguard's drain record. The same
on a real slurmctld and slurmd: test_slurm_qualify_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, gpuguard
from tests.qualify.test_qualify_cli import FAKE_TARGETS
from tests.slurm import gated
from tests.slurm.test_slurm_scripts import FAKE_SLURM, stamp

QUICK_S = 10.0  # a health run on this 2-core VM: well under a second; slurmd allows 60


class Node:
    """n1 in the fake Slurm's table, its host and state dir in tmp_path."""

    def __init__(self, root: Path, env: dict[str, str], *kmsg: str) -> None:
        self.root = root
        self.host = gated.live_host(root, *kmsg)
        self.state = root / "state"
        self.env = env
        (root / "nodes").write_text("n1|IDLE|Unknown|gpu|none\n")

    def health(self, *extra: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "gpuguard", "slurm", "health", "--no-daemon",
             "--brake-jitter", "0", "--node", "n1", "--slurm-bin", str(FAKE_SLURM),
             "--slurm-conf", str(self.root / "slurm.conf"), *self.host, *gated.qualify_args(),
             *extra], capture_output=True, text=True, timeout=60, cwd=REPO,
            env={**os.environ, **(env or self.env)}, check=False)
        took = time.monotonic() - started
        assert done.returncode == 0 and took < QUICK_S, (took, done.stdout, done.stderr)
        return done

    def node(self) -> tuple[str, str]:
        fields = (self.root / "nodes").read_text().splitlines()[0].split("|")
        return fields[1], fields[4]

    def table(self, state: str, reason: str, ago_s: float = 30) -> None:
        (self.root / "nodes").write_text(f"n1|{state}|{stamp(ago_s)}|gpu|{reason}\n")

    def drained_then_reset(self) -> None:
        """Drained for GPU 0's Xid 48; then the reset line that clears it."""
        self.health()
        assert self.node() == ("IDLE+DRAIN", gated.DRAINED)
        gated.write_kmsg(self.root, gated.XID_48, gated.RESET_0)

    def plan(self, done: subprocess.CompletedProcess[str]) -> str:
        line = next(x for x in done.stdout.splitlines() if ": node n1 (" in x)
        return line.split("): ", 1)[1]


@pytest.fixture
def env(fake_nvml: Path, fake_cuda: Path) -> dict[str, str]:
    return gated.gpu_env(fake_nvml, fake_cuda)


@pytest.fixture
def node(tmp_path: Path, env: dict[str, str]) -> Node:
    return Node(tmp_path, env, gated.XID_48)


def events_table(state: Path) -> str:
    out = gpuguard("events", "--state-dir", str(state), env={"COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_drained_for_an_xid_reset_then_qualified_detached_then_resumed(node: Node) -> None:
    node.health()
    record = gated.drain_record(node.state)
    assert node.node() == ("IDLE+DRAIN", gated.DRAINED)
    # the GPUs by UUID and serial, the drain's time and boot: what the gate reads
    assert [g["serial"] for g in record["gpus"]] == list(gated.FAKE_SERIALS)
    assert record["drained_at"] <= time.time() and record["boot_id"]
    # still drained: no qualification while the finding stands
    kept = node.health()
    assert node.plan(kept).startswith("keep: the finding is still there")
    gated.write_kmsg(node.root, gated.XID_48, gated.RESET_0)
    started = node.health()
    assert node.plan(started).startswith("keep: qualifying since ")
    assert "(attempt 1 of 2, GPU(s) 0, 1)" in started.stdout
    running = gated.wait_running(node.state)
    assert os.getsid(running["pid"]) == running["pid"]  # its own session: setsid
    assert running["gate"] > record["drained_at"]  # counted from the reset after the drain
    waiting = node.health()
    if gated.running(running):  # a 1 s load on the fake: it may be done already
        assert "keep: qualifying since" in waiting.stdout and "pid" in waiting.stdout
    gated.wait_ended(node.state)
    resumed = node.health()
    assert node.node() == ("IDLE", "none"), resumed.stdout
    assert "every GPU passed a standard qualification since a GPU reset at" in resumed.stdout
    assert not (node.state / "slurm" / "drain.json").exists()
    # the pair in the store: the drain, the qualification it started, its passes (with
    # their bundles, for the drain), the resume naming them
    passes = gated.qualify_events(node.state)
    assert sorted(q.index for q in passes) == [0, 1]
    assert all(q.passed and q.bundle and Path(q.bundle).is_file() for q in passes)
    why = passes[0].purpose
    assert why.startswith("slurm resume of n1 drained at ") and why.endswith(" for reset_gpu")
    said = gated.slurm_events(node.state)
    assert [m.split(": ")[1] for m in said] == ["drain", "qualify started", "resume"]
    assert why in said[1] and why in said[2]
    table = events_table(node.state)
    assert f"standard: pass; for {why}" in table and "gpu reset" in table
    resume = json.loads(gpuguard("events", "--state-dir", str(node.state), "--format",
                                 "json").stdout)["events"][0]
    assert resume["data"]["drain"]["reason"] == gated.DRAINED
    assert sorted(q["bundle"] for q in resume["data"]["qualifications"]) == \
        sorted(q.bundle for q in passes)


def test_a_failing_qualification_keeps_the_node_drained_for_its_finding(
        node: Node, fake_nvml: Path, fake_cuda: Path) -> None:
    """GPU 1 reads a flipped bit back in the memory test: the reason becomes the qualify
    finding, no new run is started for it; an operator's passing `gpuguard qualify`,
    after the repair, resumes it."""
    faulty = gated.gpu_env(fake_nvml, fake_cuda, fake_cuda_corrupt="memtest",
                           fake_cuda_fault_gpu=1)
    node.health(env=faulty)
    gated.write_kmsg(node.root, gated.XID_48, gated.RESET_0)
    assert "keep: qualifying since" in node.health(env=faulty).stdout
    gated.wait_ended(node.state)
    failed = node.health(env=faulty)
    assert node.node() == ("IDLE+DRAIN", "gpuguard: inspect_hardware: qualify.memtest GPU 1")
    assert "did not pass" in failed.stdout and "qualify.memtest" in failed.stdout
    again = node.health(env=faulty)
    assert node.plan(again).startswith("keep: the standard qualification of GPU 1")
    assert gated.attempt(node.state)["number"] == 1  # not started again
    said = gated.slurm_events(node.state)
    assert [m.split(": ")[1] for m in said] == ["drain", "qualify started", "qualify failed"]
    # the board replaced and qualified by hand: a pass after the failure resumes
    by_hand = gpuguard("qualify", *node.host, "--seconds", "1", "--targets", str(FAKE_TARGETS),
                       "--purpose", "after the RMA", env=node.env, timeout=120)
    assert by_hand.returncode == 0, by_hand.stdout[-2000:]
    node.health()
    assert node.node() == ("IDLE", "none")


def kill_attempt(node: Node, sig: int) -> dict[str, Any]:
    """Kill the running qualification midway: once both GPUs' workers have loaded their
    kernels (the fake libcuda's log says so) and a second more."""
    found = gated.wait_running(node.state)
    log, until = node.root / "cuda.log", time.monotonic() + 60
    while log.read_text().count("take module") < 2 if log.exists() else True:
        assert time.monotonic() < until and gated.running(found), "no worker under load"
        time.sleep(0.1)
    time.sleep(1)
    os.kill(found["pid"], sig)
    ended = gated.wait_ended(node.state)
    log.unlink()
    return ended


def test_a_qualification_killed_midway_is_retried_then_reported(node: Node) -> None:
    node.env["FAKE_CUDA_LOG"] = str(node.root / "cuda.log")
    node.drained_then_reset()
    long = ["--qualify-seconds", "60"]
    assert "attempt 1 of 2" in node.health(*long).stdout
    first = kill_attempt(node, signal.SIGKILL)  # nothing recorded: it died
    assert gated.qualify_events(node.state) == []
    retried = node.health(*long)
    assert "keep: qualifying since" in retried.stdout and "attempt 2 of 2" in retried.stdout
    second = kill_attempt(node, signal.SIGTERM)  # stopped: its GPUs unknown, recorded
    assert second["pid"] != first["pid"]
    stopped = gated.qualify_events(node.state)
    assert sorted(q.index for q in stopped) == [0, 1]
    assert all(q.status == "unknown" and not q.passed for q in stopped), stopped
    given_up = node.health(*long)
    assert node.node() == ("IDLE+DRAIN", gated.DRAINED)
    plan = node.plan(given_up)
    assert plan.startswith("keep: not qualified: 2 attempt(s) since a GPU reset at ")
    assert "did not finish (the last: standard: no pass: qualify.run unknown" in plan
    node.health(*long)  # said once in the store, not at every run
    said = [m.split(": ")[1] for m in gated.slurm_events(node.state)]
    assert said == ["drain", "qualify started", "qualify started", "qualify given up"]
    assert gated.attempt(node.state)["number"] == 2


def test_a_qualification_from_before_the_reset_does_not_count(node: Node) -> None:
    """Run by hand after the drain but before the reset line: the GPU was not cleared
    yet. The gate counts from the reset: a qualification of its own is started."""
    node.health()
    early = gpuguard("qualify", *node.host, "--seconds", "1", "--targets", str(FAKE_TARGETS),
                     env=node.env, timeout=120)
    assert early.returncode == 0, early.stdout[-2000:]
    time.sleep(1.1)  # the reset line is recorded at the next second or later
    gated.write_kmsg(node.root, gated.XID_48, gated.RESET_0)
    assert "keep: qualifying since" in node.health().stdout
    gated.wait_ended(node.state)
    node.health()
    assert node.node() == ("IDLE", "none")
    assert len(gated.qualify_events(node.state)) == 4  # the early run's two, the gate's two


def test_a_busy_drained_node_and_no_qualify(node: Node) -> None:
    """Jobs still running on a drained node: no qualification under them; --no-qualify
    resumes on the passive verdict alone (the drain before issue 30)."""
    node.drained_then_reset()
    node.table("MIXED+DRAIN", gated.DRAINED)
    busy = node.health()
    assert node.plan(busy) == "keep: waiting for the node's jobs to end before qualifying " \
        "its GPUs"
    assert not (node.state / "slurm" / "drain.json").read_text().count('"pid"')
    node.health("--no-qualify")
    assert node.node() == ("MIXED", "none")


def test_an_older_gpuguards_drain_record_is_read_and_given_its_time(node: Node) -> None:
    """A record without the drain's time, boot, serials or attempt: its time becomes
    Slurm's reason time, and the gate runs as for a new one."""
    gated.write_kmsg(node.root, gated.XID_48, gated.RESET_0)
    node.table("IDLE+DRAIN", gated.DRAINED, ago_s=120)
    gpus = [{"index": i, "uuid": f"GPU-fa4e0000-0000-0000-0000-00000000000{i}",
             "pci_bus_id": f"00000000:1{i}:00.0"} for i in (0, 1)]
    (node.state / "slurm").mkdir(parents=True)
    (node.state / "slurm" / "drain.json").write_text(json.dumps(
        {"node": "n1", "reason": gated.DRAINED, "gpus": gpus,
         "findings": [{"rule": "xid.recent", "gpu": gpus[0]}]}))
    started = node.health()
    assert "keep: qualifying since" in started.stdout, started.stdout
    record = gated.drain_record(node.state)
    assert abs(record["drained_at"] - (time.time() - 120)) < 10
    gated.wait_ended(node.state)
    node.health()
    assert node.node() == ("IDLE", "none")
