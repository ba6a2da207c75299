"""The return-to-service gate (issue 30) on a real Slurm on loopback (tests/slurm/cluster.py,
the fixtures of test_slurm_cluster.py: a cluster of this module's own): slurmd runs
`gpuguard slurm health` every 3 s on a live host of the test's own, the fake NVML and
libcuda (gated.py). Drained for an Xid 48 line, a reset line, then `keep: qualifying`, the
qualification detached, and a later run resumes on its recorded pass; a failing one keeps
the node with its finding; one that outlasts slurmd's 60 s never makes a health run
overrun; one killed midway is retried, then reported."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.integrations.slurm.qualifying import stop
from tests.slurm import gated
from tests.slurm.cluster import Cluster, missing_tools
from tests.slurm.test_slurm_cluster import WITHIN_S, cluster, slurm, slurm_args

__all__ = ["cluster", "slurm"]  # the fixtures, used by name
pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason="needs Slurm and munge (scripts/test.sh installs "
    "slurmctld, slurmd, slurm-client and munge)")

QUICK_S = 10.0  # the longest a health run may take here (slurmd's limit: 60 s)


@pytest.fixture
def gate(slurm: Cluster, fake_nvml: Path, fake_cuda: Path) -> Iterator[Cluster]:
    """The cluster for a test of the gate; at its end no qualification is left running
    (the cluster's teardown counts every process under its folder)."""
    yield slurm
    slurm.switch("health", False)
    try:
        found = gated.attempt(slurm.root / "gg-state")
    except (OSError, AssertionError, ValueError):
        return
    if gated.running(found):
        stop(found["pid"])


def turn_on(c: Cluster, fake_nvml: Path, fake_cuda: Path, *extra: str,
            **switches: object) -> None:
    """slurmd's health runs on the live host, its kernel log with GPU 0's Xid 48."""
    host = gated.live_host(c.root, gated.XID_48, state=c.root / "gg-state")
    c.switch("health", True, [*host, "--node", c.node, "--no-daemon", *slurm_args(c),
                              *gated.qualify_args(), *extra],
             gated.gpu_env(fake_nvml, fake_cuda, **switches))


def drained_then_reset(c: Cluster) -> float:
    """slurmd's health run drains for GPU 0's Xid 48; the reset line; when it was written."""
    c.wait_for(lambda: c.reason() == gated.DRAINED, WITHIN_S, "the drain for the Xid")
    gated.write_kmsg(c.root, gated.XID_48, gated.RESET_0)
    return time.time()


def health_said(c: Cluster, text: str, what: str) -> None:
    c.wait_for(lambda: text in c.output("health"), WITHIN_S, what)


def no_overrun(c: Cluster, since: float) -> list[float]:
    """Every health run since then returned in seconds, and slurmd killed none."""
    took = c.took("health", since)
    assert took and max(took) < QUICK_S, took
    log = (c.root / "log" / "slurmd.log").read_text()
    assert not re.search(r"health.*(timeout|timed out|killed)", log, re.IGNORECASE), log[-3000:]
    return took


def test_an_xid_drain_resumes_after_its_detached_qualification_passed(
        gate: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    c = gate
    turn_on(c, fake_nvml, fake_cuda)
    reset_at = drained_then_reset(c)
    health_said(c, "keep: qualifying since", "the qualification started")
    runs, took = c.within_runs(lambda: c.state() == "idle", "the resume on the pass")
    print(f"reset line -> resumed in {took:.1f} s, {runs} health run(s) after it started")
    passes = gated.qualify_events(c.root / "gg-state")
    assert sorted((q.index, q.passed) for q in passes) == [(0, True), (1, True)]
    assert all(q.started_at >= reset_at - 1 for q in passes)
    assert passes[0].purpose.startswith(f"slurm resume of {c.node} drained at ")
    said = gated.slurm_events(c.root / "gg-state")
    assert [m.split(": ")[1] for m in said] == ["drain", "qualify started", "resume"]
    no_overrun(c, reset_at)


def test_a_failing_qualification_keeps_the_node_drained_with_its_finding(
        gate: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    c = gate
    turn_on(c, fake_nvml, fake_cuda, fake_cuda_corrupt="memtest", fake_cuda_fault_gpu=1)
    drained_then_reset(c)
    health_said(c, "keep: qualifying since", "the qualification started")
    finding = "gpuguard: inspect_hardware: qualify.memtest GPU 1"
    c.wait_for(lambda: c.reason() == finding, WITHIN_S * 2, "the qualify finding")
    start = len(c.runs("health"))
    c.wait_for(lambda: len(c.runs("health")) >= start + 2, WITHIN_S, "two more runs")
    time.sleep(3)
    assert c.node_line() == ("drained", finding)
    assert gated.attempt(c.root / "gg-state")["number"] == 1  # no run started again


def test_a_qualification_past_60_s_never_overruns_the_health_program(
        gate: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    """70 s of load: slurmd starts ~25 health runs meanwhile, each returns in seconds
    (it reads the attempt, alive: keep); a later one resumes on the pass."""
    c = gate
    turn_on(c, fake_nvml, fake_cuda, "--qualify-seconds", "70")
    reset_at = drained_then_reset(c)
    health_said(c, "keep: qualifying since", "the qualification started")
    c.wait_for(lambda: c.state() == "idle", 240, "the resume after the long qualification")
    passes = gated.qualify_events(c.root / "gg-state")
    assert passes and min(q.time - q.started_at for q in passes) > 60, passes
    took = no_overrun(c, reset_at)
    assert len(took) >= 10, took  # slurmd kept running health all along
    print(f"qualification {passes[0].time - passes[0].started_at:.0f} s; {len(took)} health "
          f"runs meanwhile, the longest {max(took):.1f} s")


def kill_midway(c: Cluster, sig: int) -> dict[str, object]:
    state = c.root / "gg-state"
    found = gated.wait_running(state, timeout=WITHIN_S)
    log, until = c.root / "cuda.log", time.monotonic() + 60
    while (log.read_text().count("take module") if log.exists() else 0) < 2:
        assert time.monotonic() < until and gated.running(found), "no worker under load"
        time.sleep(0.1)
    time.sleep(1)
    pid = found["pid"]
    assert isinstance(pid, int)
    os.kill(pid, sig)
    ended = gated.wait_ended(state)
    log.unlink()
    return ended


def test_a_qualification_killed_midway_is_retried_then_reported(
        gate: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    c = gate
    turn_on(c, fake_nvml, fake_cuda, "--qualify-seconds", "60",
            fake_cuda_log=c.root / "cuda.log")
    drained_then_reset(c)
    first = kill_midway(c, signal.SIGKILL)
    second = kill_midway(c, signal.SIGTERM)
    assert (first["number"], second["number"]) == (1, 2)
    health_said(c, "keep: not qualified: 2 attempt(s) since a GPU reset at",
                "the give-up")
    assert c.node_line() == ("drained", gated.DRAINED)
    said = [m.split(": ")[1] for m in gated.slurm_events(c.root / "gg-state")]
    assert said == ["drain", "qualify started", "qualify started", "qualify given up"]
