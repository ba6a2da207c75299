"""One judgement for every consumer (issue 27, "Done means"): over every recorded snapshot
× {no store, an ack, an escalated Xid, a GPUs-seen file with one GPU missing}, `check
--format json`, the daemon's /status after one cycle and `slurm health`'s cold verdict
give the same (rule, GPU, status, action), and health's plan is the drain reason those
results give; on the live fake NVML host, `status --cold` (which judges only this host:
it takes no --input) joins them.

The rules one consumer judges and the other cannot are left out, each named in
ONE_SIDED with why; nothing else may differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuguard.assess.gpus_seen import FILE
from gpuguard.assess.inputs import HostInputs, load_configuration
from gpuguard.assess.once import Judgement
from gpuguard.events import store as eventstore
from gpuguard.events.ack_command import record_ack
from gpuguard.events.recording import kernel_log_xids, rule_transitions
from gpuguard.events.writer import EventWriter
from gpuguard.io.paths import Paths
from gpuguard.judge.actions import of_xid
from gpuguard.judge.xids import grade
from gpuguard.sources import replay
from tests.conftest import REPO, TEST_BOOT_ID, gpuguard, own_host
from tests.daemon.conftest import DaemonProcess
from tests.slurm.test_slurm_scripts import FAKE_SLURM

FIXTURES = REPO / "tests" / "fixtures"


def recorded_snapshots() -> list[Path]:
    """Every snapshot and nvidia-smi XML dump in the repo that gpuguard replays."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix not in (".json", ".xml") or not path.is_file():
            continue
        try:
            replay.load(path, 5.0)
        except replay.InputError:
            continue  # a probe's output, an image list: not a host
        found.append(path)
    return found


SNAPSHOTS = recorded_snapshots()
STATES = ("no store", "an ack", "an escalated Xid", "a GPU missing")
# The rules judged over a window of the daemon's samples (gpud's rule: most minutes of a
# window, or growth between sweeps), where a cold path, with one sample, judges the instant
# (checks/*.py: `ctx.samples`); nvlink.errors only by growth: check does not read the
# NVLink counters at all (sources/collect.py).
WINDOWED = ("clocks.hw_slowdown", "clocks.power_cap", "nvlink.errors", "pcie.replays",
            "pcie.aer", "ecc.corrected")
ONE_SIDED = {rule: "judged over the daemon's samples; a cold path judges the instant"
             for rule in WINDOWED}
XID_48 = ("3,400,900000,-;NVRM: Xid (PCI:{bus}): 48, pid=1234, name=python3, An "
          "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
          "at partition 0, subpartition 0.\n")


class Case:
    """One snapshot in one state: its host (procfs with the boot, kernel log, state dir)."""

    def __init__(self, root: Path, snapshot: Path, state: str) -> None:
        self.snapshot, self.state_name = snapshot, state
        self.host = own_host(root / "host")
        self.proc = Path(self.host[1])
        self.kmsg = Path(self.host[7])
        self.state = Path(self.host[9])
        self.state.mkdir(parents=True, exist_ok=True)
        self.args = ["--input", str(snapshot), "--path.procfs", str(self.proc),
                     "--kmsg-file", str(self.kmsg), "--state-dir", str(self.state)]
        gpus = replay.load(snapshot, 5.0).gpus
        self.gpu0 = gpus[0]
        if state in ("an ack", "an escalated Xid"):
            bus = str(self.gpu0.pci_bus_id.get())[4:].rsplit(".", 1)[0]  # 0000:18:00
            self.kmsg.write_text(XID_48.format(bus=bus))
        if state == "an ack":
            self.ack_xid()
        if state == "an escalated Xid":
            self.xid_in_an_earlier_boot()
        if state == "a GPU missing":
            seen = [{"uuid": g.uuid.get_or(None), "pci_bus_id": g.pci_bus_id.get_or(None),
                     "index": g.index, "name": g.name.get_or(None)} for g in gpus]
            seen.append({"uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
                         "pci_bus_id": "00000000:AA:00.0", "index": len(gpus),
                         "name": "NVIDIA H200"})
            (self.state / FILE).write_text(json.dumps({"boot_id": TEST_BOOT_ID,
                                                       "gpus": seen}))

    def judged_here(self) -> Any:
        inputs = HostInputs(input_path=self.snapshot, procfs=self.proc, kmsg_file=self.kmsg)
        return Judgement(inputs).snapshot()

    def ack_xid(self) -> None:
        """xid.recent on GPU 0 recorded (as the daemon records it) and acknowledged."""
        from gpuguard.assess.once import judge

        profile, ruleset = load_configuration(None, ())
        results = [r for r in judge(self.judged_here(), profile, ruleset, only=["xid.recent"])
                   if r.gpu is not None and r.gpu.index == self.gpu0.index]
        assert results and results[0].status.value == "critical", results
        writer = EventWriter(eventstore.path_in(self.state), TEST_BOOT_ID)
        writer.record_all(rule_transitions(results, {}, "daemon"))
        writer.flush()
        writer.close()
        record_ack(self.state, Paths(procfs=self.proc), None, "xid.recent",
                   str(self.gpu0.index), "differential", 3600.0)

    def xid_in_an_earlier_boot(self) -> None:
        """The same Xid on the same board, recorded in an earlier boot: it escalates."""
        _, ruleset = load_configuration(None, ())
        catalog = ruleset.xid_catalog
        writer = EventWriter(eventstore.path_in(self.state), "an-earlier-boot")
        writer.record_all(kernel_log_xids(
            self.judged_here(), "daemon",
            lambda xid, text: (grade(xid, text, catalog).severity,
                               of_xid(xid, text, catalog).value)))
        writer.flush()
        writer.close()


def seen(results: list[dict[str, Any]]) -> set[tuple[str, int | None, str, str]]:
    return {(r["rule"], (r["gpu"] or {}).get("index"), r["status"], r["action"])
            for r in results if r["rule"] not in ONE_SIDED}


def by_check(case: Case) -> list[dict[str, Any]]:
    out = gpuguard("check", *case.args, "--format", "json")
    assert out.returncode in (0, 1, 2, 3) and "Traceback" not in out.stderr, out.stderr
    return list(json.loads(out.stdout)["results"])


def by_daemon(case: Case, tmp: Path) -> list[dict[str, Any]]:
    """/status after the daemon's first fast and first slow cycle (30 s apart: no second)."""
    tmp.mkdir(exist_ok=True)
    # the sources check reads by default: not Docker, not host memory and disks
    daemon = DaemonProcess([*case.args, "--fast-interval", "30", "--slow-interval", "30",
                            "--no-docker", "--no-host-resources"], {}, tmp)
    try:
        daemon.wait_healthy()
        daemon.wait_for(lambda: all(f'gpuguard_cycles_total{{cadence="{c}"}} 1.0' in
                                    daemon.metrics() for c in ("fast", "slow")),
                        what="the first fast and slow cycles")
        return list(daemon.status()["results"])
    finally:
        daemon.stop()


def by_slurm(case: Case, tmp: Path) -> tuple[list[dict[str, Any]], str]:
    """health's cold verdict (what its plan is judged on), and the plan it printed."""
    from gpuguard.integrations.slurm import ctl as slurm_ctl
    from gpuguard.integrations.slurm.brake import BrakeSettings
    from gpuguard.integrations.slurm.health import HealthRun, verdict

    inputs = HostInputs(input_path=case.snapshot, procfs=case.proc, kmsg_file=case.kmsg,
                        state_dir=case.state, docker_default="off")
    run = HealthRun("n1", slurm_ctl.SlurmSettings(None, None, 10.0), BrakeSettings(20, 600),
                    inputs, case.state, None)
    results = [r.to_json() for r in verdict(run).results]
    (tmp / "nodes").write_text("n1|IDLE|Unknown|gpu|none\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpuguard", "slurm", "health", "--no-daemon", "--brake-jitter",
         "0", "--node", "n1", "--slurm-bin", str(FAKE_SLURM), "--slurm-conf",
         str(tmp / "slurm.conf"), *case.args],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ),
        check=False)
    assert "Traceback" not in out.stderr, out.stderr
    return results, out.stdout


def planned(results: list[dict[str, Any]]) -> str:
    """The reason health drains with for these results ("" when nothing drains)."""
    from gpuguard.integrations.slurm.plan import drain_worthy, reason_for

    tagged = load_configuration(None, ())[1].failover_rules()
    found = drain_worthy(results, tagged)
    return reason_for(found) if found else ""


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_consumer_gets_the_same_verdict(snapshot: Path, state: str,
                                              tmp_path: Path) -> None:
    case = Case(tmp_path, snapshot, state)
    checked = seen(by_check(case))
    daemon = seen(by_daemon(case, tmp_path / "daemon"))
    slurm_results, plan_line = by_slurm(case, tmp_path)
    assert checked == daemon, (sorted(checked - daemon), sorted(daemon - checked))
    assert checked == seen(slurm_results), sorted(checked ^ seen(slurm_results))
    reason = planned(slurm_results)
    if reason:
        assert f"drained: {reason!r}" in plan_line, (reason, plan_line)
    else:
        assert "nothing to drain for" in plan_line, plan_line
    if state == "an ack":
        assert ("xid.recent", case.gpu0.index, "critical", "none") in checked
    if state == "an escalated Xid":
        assert ("xid.recent", case.gpu0.index, "critical", "inspect_hardware") in checked
    if state == "a GPU missing":
        assert any(rule == "gpu.count" and status == "critical"
                   for rule, _, status, _ in checked)


def test_the_differential_covers_every_recorded_snapshot() -> None:
    """No recorded host is left out for being hard to replay, and the rules left out are
    exactly those that read the daemon's samples."""
    assert len(SNAPSHOTS) >= 7, SNAPSHOTS
    windowed = set()
    for path in (REPO / "gpuguard" / "checks").glob("*.py"):
        text = path.read_text()
        for block in text.split("@gpu_check(")[1:]:
            if "ctx.samples" in block.split("\n@", 1)[0]:
                windowed.add(block.split('"')[1])
    assert windowed == set(WINDOWED)


@pytest.mark.parametrize("state", ("no store", "a GPU missing"))
def test_status_cold_joins_them_on_the_live_host(state: str, tmp_path: Path,
                                                 fake_env: Any) -> None:
    """The live fake NVML host (2 GPUs): `check`, `status --cold` (no daemon answers; it
    takes no --input, so the host's default paths are this test's, through the guard's
    redirects) and the daemon's first cycle agree (slurm health's cold verdict is the
    same Judgement as check's: the replays above hold it)."""
    host = own_host(tmp_path / "host")
    proc, sysfs, rootfs, kmsg, state_dir = (Path(host[i]) for i in (1, 3, 5, 7, 9))
    state_dir.mkdir(parents=True, exist_ok=True)
    env = fake_env(gpus=2)
    if state == "a GPU missing":
        gone = {"uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
                "pci_bus_id": "00000000:AA:00.0", "index": 2, "name": "NVIDIA H200"}
        (state_dir / FILE).write_text(json.dumps({"boot_id": TEST_BOOT_ID, "gpus": [gone]}))
    out = gpuguard("check", *host, "--format", "json", env=env)
    checked = seen(json.loads(out.stdout)["results"])
    redirects = (f"procfs={proc},sysfs={sysfs},rootfs={rootfs},kmsg={kmsg},"
                 f"state={state_dir},run={tmp_path / 'no-daemon'},etc={tmp_path / 'etc'},"
                 f"boot_id={proc / 'sys/kernel/random/boot_id'}")
    (tmp_path / "etc").mkdir()
    cold = gpuguard("status", "--cold", "--format", "json",
                    env={**env, "GPUGUARD_FORBID_HOST": redirects})
    assert "checking this host now" in cold.stderr, cold.stderr
    assert seen(json.loads(cold.stdout)["results"]) == checked
    daemon = DaemonProcess(["--fast-interval", "30", "--slow-interval", "30", "--no-docker",
                            "--no-host-resources", *host], env, tmp_path / "daemon")
    try:
        daemon.wait_healthy()
        daemon.wait_for(lambda: all(f'gpuguard_cycles_total{{cadence="{c}"}} 1.0' in
                                    daemon.metrics() for c in ("fast", "slow")),
                        what="the first fast and slow cycles")
        by_daemon_live = seen(daemon.status()["results"])
    finally:
        daemon.stop()
    assert by_daemon_live == checked, (sorted(checked - by_daemon_live),
                                       sorted(by_daemon_live - checked))
    if state == "a GPU missing":
        assert any(r == "gpu.count" and s == "critical" for r, _, s, _ in checked)
