"""`gpuguard slurm` against a real Slurm cluster on loopback (tests/slurm/cluster.py):
slurmd itself runs `gpuguard slurm health` as its HealthCheckProgram and the prolog and
epilog around real jobs; faults come from a replayed snapshot, the fake NVML and libcuda,
and a kernel log the job itself writes Xids into."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, mounted_tmpfs, own_host
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.cluster import FAKE_NODES, HEALTH_INTERVAL, Cluster, missing_tools
from tests.slurm.gated import gpu_env, qualify_args

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"needs Slurm and munge ({', '.join(missing_tools())} "
    "missing: scripts/test.sh installs slurmctld, slurmd, slurm-client and munge)")

# Slurm pauses its health checks at times (15-25 s after a resume or a re-ping): waits are
# long; "within two health intervals" is counted in slurmd's health runs (within_runs)
WITHIN_S = 90
FAKE_FLOORS = "active_probe:\n  floors_gbps:\n    NVIDIA H200: {pcie: 0.5, memory: 0.5, " \
              "nvlink: 0.5}\n"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        left = c.stop()
    assert not left, f"the cluster left processes behind: {left}"
    assert not c.root.exists()


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster as each test finds it: scripts off, every node resumed, no state."""
    for what in ("health", "prolog", "epilog"):
        cluster.switch(what, False)
    time.sleep(0.5)
    if cluster.node_line() != ("idle", "none"):
        cluster.resume_all()
        cluster.wait_for(cluster.steady, 90, "health runs every interval again")
    for path in (cluster.root / "gg-state").rglob("*"):
        if path.is_file():
            path.unlink()
    for name in ("health.out", "prolog.out", "epilog.out", "metrics.prom"):
        (cluster.root / name).unlink(missing_ok=True)
    yield cluster
    for what in ("health", "prolog", "epilog"):
        cluster.switch(what, False)
    cluster.cli("scancel", "--user=root")
    cluster.resume_all()  # the next test waits for the health runs to be regular again


def slurm_args(c: Cluster) -> list[str]:
    """How the health program finds Slurm (slurmd passes no SLURM_CONF), a short random
    wait before the brake's recount, the textfile metric."""
    return ["--slurm-conf", str(c.conf), "--brake-jitter", "0.02", "--metrics-file",
            str(c.root / "metrics.prom")]


def health_args(c: Cluster, *extra: str) -> list[str]:
    return ["--state-dir", str(c.root / "gg-state"), "--node", c.node, *slurm_args(c),
            *extra]


def replayed(c: Cluster, fault: bool, changes: dict[tuple[int, str], object] | None = None
             ) -> Path:
    """A 2-GPU host; with the fault, GPU 0 runs past T.Limit (thermal.margin critical,
    inspect_hardware); `changes`: other readings of the snapshot's."""
    path = c.root / "snap.json"
    faults = {(0, "temperature_tlimit_margin_c"): -5} if fault else {}
    write_snapshot(path, host_snapshot(2, {**faults, **(changes or {})} or None))
    return path


def runs_after(c: Cluster, n: int) -> None:
    """Wait for n more health runs by slurmd."""
    start = len(c.runs("health"))
    c.wait_for(lambda: len(c.runs("health")) >= start + n, WITHIN_S,
               f"{n} health runs")
    time.sleep(3)  # the last one decides and calls scontrol


def test_slurmd_runs_health_a_fault_drains_and_its_repair_resumes(slurm: Cluster) -> None:
    """GPUs 0 and 1 past T.Limit: drained ("GPU 0 (+1 more)"). GPU 0 repaired while GPU 1
    cannot be read (thermal.margin unknown there): no resume. Both fine: resumed (on the
    passive verdict: a replay has no board to qualify, hence --no-qualify; the gate on
    this cluster: test_slurm_qualify_cluster.py)."""
    c = slurm
    snap = replayed(c, True, {(1, "temperature_tlimit_margin_c"): -5})
    c.switch("health", True, health_args(c, "--input", str(snap), "--no-qualify"))
    runs, took = c.within_runs(lambda: c.reason().startswith("gpuguard:"), "the drain")
    assert c.node_line() == ("drained",
                             "gpuguard: inspect_hardware: thermal.margin GPU 0 (+1 more)")
    assert runs <= 2, f"{runs} health runs before the drain"
    print(f"fault -> drained in {took:.1f} s, {runs} health run(s) "
          f"(HealthCheckInterval {HEALTH_INTERVAL} s)")
    # health writes its metrics file after the scontrol that drained: wait for that run
    metrics_file, end = c.root / "metrics.prom", time.monotonic() + 30
    drained = f'gpuguard_slurm_drained{{node="{c.node}"}} 1'
    while not (metrics_file.exists() and drained in metrics_file.read_text()):
        assert time.monotonic() < end, "health wrote no metrics file after the drain"
        time.sleep(0.2)
    replayed(c, False, {(1, "temperature_tlimit_margin_c"):
                        {"state": "error", "error": "GPU is lost"}})
    runs_after(c, 2)
    assert c.state() == "drained", c.output("health")[-2000:]
    assert "thermal.margin on GPU GPU-00000000-0000-0000-0000-000000000001" in \
        c.output("health") and "is unknown" in c.output("health")
    replayed(c, fault=False)
    runs, took = c.within_runs(lambda: c.state() == "idle", "the resume")
    assert runs <= 2, f"{runs} health runs before the resume"
    print(f"repair -> resumed in {took:.1f} s, {runs} health run(s)")
    assert c.reason() == "none"
    assert "resumed" in c.output("health")


def test_a_drain_gpuguard_did_not_write_is_never_touched(slurm: Cluster) -> None:
    c = slurm
    c.drain(c.node, "admin: cable swap")
    snap = replayed(c, fault=True)
    c.switch("health", True, health_args(c, "--input", str(snap)))
    runs_after(c, 2)
    assert c.node_line() == ("drained", "admin: cable swap")  # not rewritten to ours
    replayed(c, fault=False)
    runs_after(c, 2)
    assert c.node_line() == ("drained", "admin: cable swap")  # not resumed either
    assert "drained by someone else" in c.output("health")


def test_an_administrators_redrain_of_a_gpuguard_drain_is_theirs(slurm: Cluster) -> None:
    c = slurm
    snap = replayed(c, fault=True)
    c.switch("health", True, health_args(c, "--input", str(snap)))
    c.wait_for(lambda: c.reason().startswith("gpuguard:"), WITHIN_S, "the drain")
    c.drain(c.node, "admin: RMA ticket 4711")
    replayed(c, fault=False)
    runs_after(c, 2)
    assert c.node_line() == ("drained", "admin: RMA ticket 4711")


def test_the_brake_holds_when_the_partition_has_its_share_drained(slurm: Cluster) -> None:
    """Two of the ten nodes already drained by gpuguard: a third would be 30 % >= 20 %.
    The node stays up; the critical fleet.brake result, the event and the textfile
    metric say so (no daemon runs here)."""
    c = slurm
    c.drain("gpu01", "gpuguard: reset_gpu: xid.recent GPU 3")
    c.drain("gpu02", "gpuguard: reboot: gpu.lost GPU 1")
    snap = replayed(c, fault=True)
    c.switch("health", True, health_args(c, "--input", str(snap)))
    c.wait_for(lambda: "fleet.brake" in c.output("health"), WITHIN_S, "the brake")
    runs_after(c, 1)
    assert c.state() == "idle"
    assert "CRITICAL fleet.brake: 3 of 10 node(s) with this one" in c.output("health")
    assert "gpu01, gpu02" in c.output("health")
    # the window on slurmctld's clock, from the real sdiag (the same host: in step)
    assert "brake: on slurmctld's clock (sdiag; this node in step)" in c.output("health")
    metrics = (c.root / "metrics.prom").read_text()
    assert f'gpuguard_slurm_brake_engaged{{node="{c.node}"}} 1' in metrics
    with sqlite3.connect(c.root / "gg-state" / "events.db") as db:
        rows = db.execute("SELECT status, message FROM events WHERE rule = 'fleet.brake'"
                          ).fetchall()
    assert rows and rows[0][0] == "critical"
    # the brake's exit, as the health program gives it to anyone running it
    direct = run_health(c, "--input", str(snap))
    assert direct.returncode == 2, direct.stdout + direct.stderr


def run_health(c: Cluster, *extra: str, timeout_s: str = "10"
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuguard", "slurm", "health",
                           *health_args(c, "--slurm-timeout", timeout_s, *extra)],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PATH": "/nonexistent"}, check=False)


def test_slurm_not_answering_changes_nothing(slurm: Cluster) -> None:
    """slurmctld stopped (SIGSTOP: it accepts, never answers): scontrol passes its deadline,
    the run is unknown (exit 3) and nothing is drained; a wrong port the same."""
    c = slurm
    snap = replayed(c, fault=True)
    ctld = int((c.root / "slurmctld.pid").read_text().split()[0])
    os.kill(ctld, signal.SIGSTOP)
    try:
        started = time.monotonic()
        frozen = run_health(c, "--input", str(snap), timeout_s="2")
        took = time.monotonic() - started
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert frozen.returncode == 3, frozen.stdout + frozen.stderr
    assert "UNKNOWN slurm: scontrol did not answer within 2 s: nothing changed" in frozen.stdout
    assert took < 20
    elsewhere = c.root / "elsewhere.conf"
    elsewhere.write_text(c.conf.read_text().replace("SlurmctldPort=", "SlurmctldPort=1"))
    wrong = subprocess.run([sys.executable, "-m", "gpuguard", "slurm", "health",
                            *health_args(c, "--input", str(snap)), "--slurm-conf",
                            str(elsewhere)], capture_output=True, text=True, timeout=60,
                           cwd=REPO, check=False)
    assert wrong.returncode == 3 and "UNKNOWN slurm" in wrong.stdout
    c.wait_for(lambda: c.state() == "idle", WITHIN_S, "slurmctld back")
    assert c.reason() == "none"


def fake_gpu_env(c: Cluster, fake_nvml: Path, fake_cuda: Path, **switches: str) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
            "FAKE_NVML_MEM_TOTAL_MIB": "1000", **switches}


def live_args(c: Cluster, kmsg: str = "") -> list[str]:
    """A host of the test's own on the fake NVML (tests/conftest.py own_host), its profile
    with the fake libcuda's bandwidth floors, the driver's device minors of its two GPUs
    (the GRES indexes Slurm gives the prolog), the cluster for the fleet brake."""
    host = c.root / "host"
    profile = c.root / "profile.yaml"
    profile.write_text(FAKE_FLOORS)
    args = own_host(host, kmsg=kmsg)
    for minor in (0, 1):  # the fake NVML's GPU i sits on bus 0x10 + i
        info = host / "proc" / "driver" / "nvidia" / "gpus" / f"0000:{0x10 + minor:02x}:00.0"
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(f"Model: NVIDIA H200\nDevice Minor: {minor}\n")
        # the GPU in sysfs (no AER counters: not supported) and a module list: health
        # resumes only when no drain-capable rule (pcie.aer, driver.nouveau) is unknown
        (host / "sys" / "bus" / "pci" / "devices" / info.name).mkdir(parents=True,
                                                                       exist_ok=True)
    (host / "proc" / "modules").write_text("nvidia 104071168 0 - Live 0x0000000000000000\n")
    args = [a for i, a in enumerate(args) if a != "--state-dir" and
            (i == 0 or args[i - 1] != "--state-dir")]
    return [*args, "--profile", str(profile), "--state-dir", str(c.root / "gg-state"),
            "--node", c.node, "--slurm-conf", str(c.conf)]


def sbatch(c: Cluster, *args: str) -> str:
    done = c.cli("sbatch", "--parsable", "-w", c.node, "-D", str(c.root), "-o",
                 str(c.root / "job-%j.out"), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_a_prolog_failure_requeues_the_job_and_health_takes_the_drain_over(
        slurm: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    """The probe reads wrong data back on GPU 1 (the fake libcuda): the prolog fails, Slurm
    requeues the job and drains the node ("Prolog error"); the next health run rewrites
    the reason to gpuguard's and, once GPU 1 passes again and a qualification of both
    GPUs it then starts has passed, resumes the node."""
    c = slurm
    faulty = fake_gpu_env(c, fake_nvml, fake_cuda, FAKE_CUDA_CORRUPT="compute",
                          FAKE_CUDA_FAULT_GPU="1")
    c.switch("prolog", True, live_args(c), faulty)
    job = sbatch(c, "--gres=gpu:2", "--requeue", "--wrap", "true")
    c.wait_for(lambda: c.reason() == "Prolog error", WITHIN_S, "Slurm's prolog drain")
    assert f"job {job}: the probe failed on GPU(s) [0, 1]" in c.output("prolog")
    shown = c.cli("scontrol", "show", "job", job).stdout
    assert "Restarts=1" in shown or "JobState=PENDING" in shown, shown
    record = json.loads((c.root / "gg-state" / "slurm" / "script-failure.json").read_text())
    assert record["job"] == job and record["gpus"] == [0, 1]
    c.cli("scancel", job)
    gate = qualify_args()  # inspect_hardware: back after a qualification (the fake's)
    c.switch("health", True, [*live_args(c), "--no-daemon", *slurm_args(c), *gate], faulty)
    c.wait_for(lambda: c.reason().startswith("gpuguard:"), WITHIN_S, "the takeover")
    assert c.reason() == "gpuguard: inspect_hardware: gpu.compute GPU 1"
    c.switch("health", True, [*live_args(c), "--no-daemon", *slurm_args(c), *gate],
             gpu_env(fake_nvml, fake_cuda))
    c.wait_for(lambda: c.state() == "idle", WITHIN_S, "the resume after a pass")
    assert "keep: qualifying since" in c.output("health")
    assert not (c.root / "gg-state" / "slurm" / "script-failure.json").exists()


XID_LINE = "[{t:11.6f}] NVRM: Xid (PCI:0000:10:00): {xid}, pid=4242, name=python3, {text}"


def test_the_epilog_drains_for_hardware_xids_and_only_records_application_ones(
        slurm: Cluster, fake_nvml: Path, fake_cuda: Path) -> None:
    c = slurm
    args = live_args(c, kmsg=XID_LINE.format(t=100.0, xid=79, text="old, before the job") + "\n")
    kmsg = c.root / "host" / "kmsg.log"
    env = fake_gpu_env(c, fake_nvml, fake_cuda)
    c.switch("prolog", True, args, env)
    c.switch("epilog", True, args, env)
    # the job itself hits an application fault (Xid 13: restart_app in the catalog)
    line = XID_LINE.format(t=500.0, xid=13, text="Graphics SM Warp Exception")
    done = c.cli("srun", "-w", c.node, "--gres=gpu:1", "sh", "-c",
                 f"echo '{line}' >> {kmsg}", timeout=60)
    assert done.returncode == 0, done.stderr
    c.wait_for(lambda: "no hardware finding during the job" in c.output("epilog"), 30,
               "the epilog")
    assert "application Xid 13 during the job" in c.output("epilog")
    # not drained: idle once slurmd has reported the epilog's end (completing till then)
    c.wait_for(lambda: c.state() == "idle", 30, "the job's end")
    with sqlite3.connect(c.root / "gg-state" / "events.db") as db:
        rows = db.execute("SELECT code, action, data FROM events WHERE kind = 'xid'").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(13, "restart_app")]
    assert json.loads(rows[0][2])["job_id"]
    # then a hardware fault during the next job (Xid 79: reboot): Slurm drains for it
    line = XID_LINE.format(t=900.0, xid=79, text="GPU has fallen off the bus.")
    c.cli("srun", "-w", c.node, "--gres=gpu:1", "sh", "-c", f"echo '{line}' >> {kmsg}",
          timeout=60)
    c.wait_for(lambda: c.reason() == "Epilog error", WITHIN_S, "Slurm's epilog drain")
    assert "HARDWARE Xid 79 during the job" in c.output("epilog")
    c.switch("health", True, [*args, "--no-daemon", *slurm_args(c)], env)
    c.wait_for(lambda: c.reason().startswith("gpuguard:"), WITHIN_S, "the takeover")
    assert c.reason().startswith("gpuguard: reboot: xid.recent")


def shown(c: Cluster, name: str) -> tuple[str, frozenset[str], str]:
    """A node's base state, flags (but NOT_RESPONDING, which Slurm itself sets and clears
    as it pings) and `Reason=...` as `scontrol show node -o` prints them."""
    line = c.cli("scontrol", "show", "node", "-o", name).stdout.strip()
    state = line.split(" State=", 1)[1].split(" ", 1)[0].split("+")
    return state[0], frozenset(state[1:]) - {"NOT_RESPONDING"}, line.partition(" Reason=")[2]


def scontrol_update(c: Cluster, name: str, *args: str) -> None:
    done = c.cli("scontrol", "update", f"NodeName={name}", *args)
    assert done.returncode == 0, done.stderr


def test_a_down_or_failed_node_with_a_fault_is_never_touched(slurm: Cluster) -> None:
    """An administrator's DOWN node (gpu01, never up) and FAIL node (this one), with a
    critical fault and then without: state and reason stay as they are. Before, health
    saw no "drain" in sinfo's `down*` or `fail`: it drained over the administrator's
    reason and, once the GPU read fine, resumed the node (`down` -> drained -> idle)."""
    c = slurm
    hot, cool = replayed(c, True), c.root / "cool.json"
    write_snapshot(cool, host_snapshot(2))
    scontrol_update(c, "gpu01", "State=DOWN", "Reason=admin: PSU swap")
    scontrol_update(c, c.node, "State=FAIL", "Reason=admin: failing fan")
    for name, down in (("gpu01", ("DOWN", frozenset())), (c.node, ("IDLE", {"FAIL"}))):
        before = shown(c, name)
        assert before[:2] == down and before[2].startswith("admin: "), before
        for snap in (hot, cool):
            done = run_health(c, "--input", str(snap), "--node", name)
            assert done.returncode == 0, done.stdout + done.stderr
            assert shown(c, name) == before, done.stdout
            assert "not gpuguard's to change" in done.stdout, done.stdout
    assert not (c.root / "gg-state" / "slurm" / "drain.json").exists()  # never drained


RESTART_APP_RULE = """rules:
  - id: site.engine_wedged
    scope: gpu
    severity: critical
    summary: the inference engine on this GPU no longer answers
    when: "temperature_c > 85"
    message: "$name at $temperature_c C"
    remediation: Restart the engine.
    tags: [failover]
    action: restart_app
"""


def test_a_restart_app_drain_is_resumed_after_the_repair(slurm: Cluster) -> None:
    """A site's failover rule whose action is restart_app: slurmd's health run drains with
    `gpuguard: restart_app: ...`, and resumes once the GPU reads fine. Before, gpuguard
    did not recognise that reason as its own: drained for good (and never counted by
    the brake)."""
    c = slurm
    rules = c.root / "rules.d"
    rules.mkdir(exist_ok=True)
    (rules / "site.yaml").write_text(RESTART_APP_RULE)
    snap = replayed(c, False, {(0, "temperature_c"): 90})
    c.switch("health", True, health_args(c, "--input", str(snap), "--rules", str(rules)))
    c.within_runs(lambda: c.reason().startswith("gpuguard:"), "the drain")
    assert c.node_line() == ("drained", "gpuguard: restart_app: site.engine_wedged GPU 0")
    replayed(c, fault=False)
    runs, took = c.within_runs(lambda: c.state() == "idle", "the resume")
    print(f"restart_app repair -> resumed in {took:.1f} s, {runs} health run(s)")
    assert runs <= 2 and c.reason() == "none"


def test_the_fake_scontrol_prints_a_node_as_slurm_does(slurm: Cluster, tmp_path: Path) -> None:
    """tests/slurm/fake_slurm/scontrol against this Slurm's own line for the same node:
    the same fields in the same order, read the same by gpuguard."""
    from gpuguard.integrations.slurm import ctl

    c = slurm
    c.drain(c.node, "admin: a | b [x@y] State=DOWN")
    real = c.cli("scontrol", "show", "node", "-o", c.node).stdout.strip()
    node = ctl.parse_node(real)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(node.reason_time))
    (tmp_path / "nodes").write_text(f"{c.node}|{node.state}|{when}|"
                                    f"{','.join(node.partitions)}|{node.reason}\n")
    fake = subprocess.run([str(REPO / "tests" / "slurm" / "fake_slurm" / "scontrol"), "show",
                           "node", "-o", c.node], capture_output=True, text=True, check=True,
                          env={"SLURM_CONF": str(tmp_path / "slurm.conf")}).stdout.strip()

    def keys(line: str) -> list[str]:
        head = line.partition(" Reason=")[0]
        return [*re.findall(r"(?:^| )([A-Za-z_]+)=", head), "Reason"]

    assert keys(fake) == keys(real), (fake, real)
    assert ctl.parse_node(fake) == node
    assert node.state == "IDLE+DRAIN" and node.reason == "admin: a | b [x@y] State=DOWN"
    assert real.endswith(f" Reason={node.reason} [root@{when}]") and fake.endswith(
        f" Reason={node.reason} [root@{when}]")


def test_fake_nodes_answer_nothing(cluster: Cluster) -> None:
    """The brake's partition: nine configured nodes that never come up (not this host)."""
    out = cluster.cli("sinfo", "-h", "-N", "-n", FAKE_NODES, "-o", "%N %T").stdout
    assert len(out.split("\n")) >= 9 and "idle " not in out.replace("idle*", "")


def test_gpuguards_restart_app_reasons_on_phantom_nodes_brake_the_real_nodes_fault(
        slurm: Cluster) -> None:
    """A phantom node of the partition drained with gpuguard's restart_app reason (a
    failover rule whose action is restart_app: on d7c609d such a drain was not counted,
    and ten of ten nodes drained): with it, the real node's drain would be 2 of 10, the
    20 % brake holds, exit 2."""
    c = slurm
    c.drain("gpu03", "gpuguard: restart_app: recovery.action GPU 0")
    snap = replayed(c, fault=True)
    c.switch("health", True, health_args(c, "--input", str(snap)))
    c.wait_for(lambda: "fleet.brake" in c.output("health"), WITHIN_S, "the brake")
    runs_after(c, 1)
    assert c.state() == "idle", c.output("health")[-2000:]
    assert "CRITICAL fleet.brake: 2 of 10 node(s) with this one drained by gpuguard within " \
           "600 s" in c.output("health")
    assert "(others: gpu03)" in c.output("health")
    direct = run_health(c, "--input", str(snap))
    assert direct.returncode == 2, direct.stdout + direct.stderr


def test_a_read_only_state_dir_with_a_fault_still_drains(slurm: Cluster) -> None:
    """The state dir on a read-only tmpfs (a stateless node; as root a mode is no bar):
    no lock, no record; slurmd's health run still drains for the fault, says what it
    lost (its stderr, which the wrapper keeps with its output) and sets the metric."""
    c = slurm
    snap = replayed(c, fault=True)
    with mounted_tmpfs(c.root / "ro", "size=64k", read_only=True) as ro:
        c.switch("health", True, health_args(c, "--input", str(snap), "--state-dir",
                                             str(ro / "gg-state")))
        runs, _ = c.within_runs(lambda: c.reason().startswith("gpuguard:"), "the drain")
        c.switch("health", False)
    assert c.node_line() == ("drained",
                             "gpuguard: inspect_hardware: thermal.margin GPU 0"), \
        c.output("health")[-2000:]
    assert runs <= 2, f"{runs} health runs before the drain"
    # the run prints its lines when it ends, after the drain it made: wait for them
    said = f"state: the state dir {ro / 'gg-state'} cannot be made (Read-only file system)"
    end = time.monotonic() + 30
    while said not in (out := c.output("health")):
        assert time.monotonic() < end, out[-2000:]
        time.sleep(0.2)
    assert "Traceback" not in out
    lost = f'gpuguard_slurm_state_lost{{node="{c.node}"}} 1'
    metrics, end = c.root / "metrics.prom", time.monotonic() + 30
    while not (metrics.exists() and lost in metrics.read_text()):  # written after the drain
        assert time.monotonic() < end, "no gpuguard_slurm_state_lost 1 after the drain"
        time.sleep(0.2)
