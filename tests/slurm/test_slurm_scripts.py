"""`gpuguard slurm health|prolog|epilog` run as slurmd runs them, against a fake scontrol
(tests/slurm/fake_slurm/: the node table is a `nodes` file beside --slurm-conf,
`name|State|reason time|partition|reason` a line, printed as Slurm 22.05's `scontrol show
node -o` does; an update changes the node's line; every call is logged): every row of the
state table, and the cases of a whole fleet, of a GPU gone, of another site's prolog, which
the real cluster (test_slurm_cluster.py) cannot set up cheaply. One command each, a second or
two; the GPUs are a replayed snapshot or the fake NVML and libcuda."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.integrations.slurm import states
from tests.conftest import REPO, own_host
from tests.daemon.conftest import host_snapshot, write_snapshot

FAKE_SLURM = Path(__file__).parent / "fake_slurm"
GONE = {"state": "error", "error": "nvmlDeviceGetRemappedRows: GPU is lost"}
FLOORS = "active_probe:\n  floors_gbps:\n    NVIDIA H200: {pcie: 0.5, memory: 0.5, nvlink: 0.5}\n"


def stamp(ago_s: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - ago_s))


class Fleet:
    """The fake Slurm's node table and gpuguard's state dir, in tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.write([("n1", "IDLE", "Unknown", "none")])

    def write(self, rows: list[tuple[str, str, str, str]]) -> None:
        (self.root / "nodes").write_text("".join(f"{n}|{s}|{t}|gpu|{r}\n"
                                                 for n, s, t, r in rows))

    def node(self, name: str = "n1") -> tuple[str, str]:
        """(State, reason) of the node."""
        for line in (self.root / "nodes").read_text().splitlines():
            fields = line.split("|", 4)
            if fields[0] == name:
                return fields[1], fields[4]
        raise AssertionError(f"no node {name}")

    def slurm_args(self, node: str = "n1") -> list[str]:
        return ["--node", node, "--slurm-bin", str(FAKE_SLURM), "--slurm-conf",
                str(self.root / "slurm.conf"), "--state-dir", str(self.root / "state")]

    def gpuguard(self, *args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuguard", "slurm", *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, **(env or {})}, check=False)

    def health(self, snapshot: dict[str, Any], *extra: str, node: str = "n1"
               ) -> subprocess.CompletedProcess[str]:
        path = self.root / "snap.json"
        write_snapshot(path, snapshot)
        return self.gpuguard("health", "--no-daemon", "--input", str(path), "--brake-jitter",
                             "0", *self.slurm_args(node), *extra)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_health_does_not_resume_while_another_drained_gpu_is_unknown(fleet: Fleet) -> None:
    """Drained for memory.row_remap on GPUs 0 and 3 ("GPU 0 (+1 more)"); then GPU 0 reads
    fine and GPU 3 cannot be read: no resume. Both fine: resumed."""
    bad = fleet.health(host_snapshot(8, {(0, "remapped_rows_failure"): True,
                                         (3, "remapped_rows_failure"): True}))
    assert fleet.node() == ("IDLE+DRAIN",
                            "gpuguard: inspect_hardware: memory.row_remap GPU 0 (+1 more)"), bad
    unread = {(3, f"remapped_rows_{k}"): GONE
              for k in ("failure", "uncorrectable", "correctable", "pending")}
    kept = fleet.health(host_snapshot(8, unread))
    assert fleet.node()[0] == "IDLE+DRAIN", kept.stdout
    assert "memory.row_remap on GPU GPU-00000000-0000-0000-0000-000000000003" in kept.stdout
    # both fine: a replay is no board to qualify (the gate: tests/slurm/test_qualify_gate.py),
    # so only --no-qualify resumes on it
    whole = fleet.health(host_snapshot(8))
    assert fleet.node()[0] == "IDLE+DRAIN", whole.stdout
    assert "keep: a replayed snapshot (--input) is not this host" in whole.stdout
    fleet.health(host_snapshot(8), "--no-qualify")
    assert fleet.node() == ("IDLE", "none")


def test_health_does_not_resume_after_the_drained_gpu_fell_off_the_bus(fleet: Fleet) -> None:
    """GPU 3 (bus 0x48) drained for; it falls off, NVML renumbers: "GPU 3" is now the healthy
    board of bus 0x58, and the shipped profile sets no gpu_count. No resume."""
    before = host_snapshot(8, {(3, "remapped_rows_failure"): True})
    fleet.health(before)
    assert fleet.node() == ("IDLE+DRAIN", "gpuguard: inspect_hardware: memory.row_remap GPU 3")
    now = host_snapshot(8)
    del now["gpus"][3]
    for i, gpu in enumerate(now["gpus"]):
        gpu["index"] = i
    now["host"]["gpu_count"] = 7
    kept = fleet.health(now)
    assert fleet.node()[0] == "IDLE+DRAIN", kept.stdout
    assert "00000000:48:00.0), present at the drain, is missing" in kept.stdout
    # the administrator pulls the board and resumes by hand: the record goes with the drain
    fleet.write([("n1", "IDLE", "Unknown", "none")])
    fleet.health(now)
    assert not (fleet.root / "state" / "slurm" / "drain.json").exists()


def test_a_stale_failure_record_never_claims_another_prologs_drain(fleet: Fleet) -> None:
    """gpuguard's epilog failed a day ago (the admin resumed the node by hand); today the
    site's other prolog fails and Slurm drains "Prolog error": not gpuguard's, left as it
    is. Seen not drained, the old record is dropped."""
    from gpuguard.integrations.slurm import state as slurm_state

    state = fleet.root / "state"
    slurm_state.record_failure(state, "epilog", "n1", "1001", [
        {"rule": "xid.recent", "status": "critical", "action": "reset_gpu",
         "gpu": {"index": 0}}], [0])
    path = slurm_state.folder(state) / slurm_state.FAILURE
    raw = json.loads(path.read_text())
    raw["time"] = time.time() - 86400
    path.write_text(json.dumps(raw))
    fleet.write([("n1", "IDLE+DRAIN", stamp(), "Prolog error")])
    for _ in range(2):
        out = fleet.health(host_snapshot(2))
        assert fleet.node()[1] == "Prolog error", out.stdout
    assert "drained by someone else" in out.stdout and path.exists()
    fleet.write([("n1", "IDLE", "Unknown", "none")])
    fleet.health(host_snapshot(2))
    assert not path.exists()


def test_an_administrators_reason_in_gpuguards_words_is_theirs(fleet: Fleet) -> None:
    reason = "gpuguard: inspect_hardware: memory.row_remap GPU 3 RMA-4711 keep out"
    fleet.write([("n1", "IDLE+DRAIN", stamp(), reason)])
    out = fleet.health(host_snapshot(8))
    assert fleet.node() == ("IDLE+DRAIN", reason), out.stdout
    assert "drained by someone else" in out.stdout


def test_the_brake_caps_the_nodes_gpuguard_holds_drained(fleet: Fleet) -> None:
    """8 of 10 nodes drained by gpuguard 11 minutes ago (past the window): no 9th."""
    fleet.write([("n1", "IDLE", "Unknown", "none"),
                 *((f"n{i}", "IDLE+DRAIN", stamp(660), "gpuguard: reset_gpu: xid.recent GPU 0")
                   for i in range(2, 10)), ("n10", "IDLE", "Unknown", "none")])
    out = fleet.health(host_snapshot(8, {(0, "remapped_rows_failure"): True}))
    assert out.returncode == 2, out.stdout
    assert fleet.node() == ("IDLE", "none")
    assert "CRITICAL fleet.brake: 8 of 10 node(s) already drained by gpuguard (any age) " \
           "reach the cap of 3 (30 %)" in out.stdout


def live(fleet: Fleet, fake_nvml: Path, fake_cuda: Path, slurm: bool = False,
         **env: str) -> tuple[list[str], dict[str, str]]:
    """Options and variables of a prolog or epilog on the fake NVML and libcuda (with the
    fake Slurm when it may fail, for the brake)."""
    (fleet.root / "profile.yaml").write_text(FLOORS)
    args = [*own_host(fleet.root / "host"), "--node", "n1"]
    args[args.index("--state-dir") + 1] = str(fleet.root / "state")
    if slurm:
        args += fleet.slurm_args()
    return [*args, "--profile", str(fleet.root / "profile.yaml")], \
        {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
         "FAKE_NVML_MEM_TOTAL_MIB": "1000", "SLURM_JOB_ID": "77", **env}


def test_a_prolog_whose_state_dir_cannot_be_written_passes(fleet: Fleet, fake_nvml: Path,
                                                           fake_cuda: Path) -> None:
    args, env = live(fleet, fake_nvml, fake_cuda, CUDA_VISIBLE_DEVICES="0")
    (fleet.root / "full").write_text("")
    args = [*args, "--state-dir", str(fleet.root / "full" / "state")]  # the last one counts
    out = fleet.gpuguard("prolog", *args, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "GPU(s) [0] passed the probe" in out.stdout
    assert "cannot note the job's start" in out.stdout and "Traceback" not in out.stderr
    out = fleet.gpuguard("epilog", *args, env=env)
    assert out.returncode == 0 and "no record of its start" in out.stdout


def test_a_prolog_failure_consults_the_fleet_brake(fleet: Fleet, fake_nvml: Path,
                                                   fake_cuda: Path) -> None:
    """The probe reads wrong data back on GPU 1: exit 1 (Slurm drains) while the fleet has
    room; with two of ten nodes just drained by gpuguard, it passes and says why."""
    args, env = live(fleet, fake_nvml, fake_cuda, True, CUDA_VISIBLE_DEVICES="0,1",
                     FAKE_CUDA_CORRUPT="compute", FAKE_CUDA_FAULT_GPU="1")
    rows = [("n1", "IDLE", "Unknown", "none"), *((f"n{i}", "IDLE", "Unknown", "none")
                                                 for i in range(2, 11))]
    fleet.write(rows)
    out = fleet.gpuguard("prolog", *args, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "fleet brake: 1 of 10 node(s) with this one" in out.stderr
    rows[1:3] = [(f"n{i}", "IDLE+DRAIN", stamp(30), "Prolog error") for i in (2, 3)]
    fleet.write(rows)
    out = fleet.gpuguard("prolog", *args, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CRITICAL fleet.brake: 3 of 10 node(s) with this one drained by gpuguard" in out.stdout
    assert "not failing job 77" in out.stdout and "gpu.compute GPU 1" in out.stdout


def test_the_prolog_maps_the_jobs_gpus_by_uuid_and_device_minor(
        fleet: Fleet, fake_nvml: Path, fake_cuda: Path) -> None:
    """CUDA_VISIBLE_DEVICES with a GPU UUID is that GPU; a MIG instance is unknown, never
    "no GPU"; SLURM_JOB_GPUS (GRES: device minors) maps by the driver's minor number and
    is unknown where the driver lists none (never taken as NVML's index)."""
    args, env = live(fleet, fake_nvml, fake_cuda)
    uuid = {"CUDA_VISIBLE_DEVICES": "GPU-fa4e0000-0000-0000-0000-000000000001"}
    out = fleet.gpuguard("prolog", *args, env={**env, **uuid})
    assert "GPU(s) [1] passed the probe" in out.stdout, out.stdout + out.stderr
    out = fleet.gpuguard("prolog", *args, env={**env, "CUDA_VISIBLE_DEVICES": "MIG-a1b2c3"})
    assert out.returncode == 0 and "no GPU allocated" not in out.stdout
    assert "UNKNOWN job GPU MIG-a1b2c3: a MIG instance" in out.stdout
    out = fleet.gpuguard("prolog", *args, env={**env, "SLURM_JOB_GPUS": "0"})
    assert out.returncode == 0 and "UNKNOWN job GPU GRES GPU '0'" in out.stdout, out.stdout
    gpus = fleet.root / "host" / "proc" / "driver" / "nvidia" / "gpus"
    for bus, minor in (("0000:10:00.0", 1), ("0000:11:00.0", 0)):  # minors cross the indexes
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(f"Model: NVIDIA H200\nDevice Minor: {minor}\n")
    out = fleet.gpuguard("prolog", *args, env={**env, "SLURM_JOB_GPUS": "0"})
    assert "GPU(s) [1] passed the probe" in out.stdout, out.stdout + out.stderr


REMAP = {(0, "remapped_rows_failure"): True}  # memory.row_remap on GPU 0: inspect_hardware


def as_row(fleet: Fleet, row: states.Row) -> None:
    """The row's example on n1 (its reason set now), nine idle nodes beside it (the brake
    has room), a drain record of gpuguard's for the example's finding, and the recorded
    epilog failure that makes an "Epilog error" set now gpuguard's."""
    from gpuguard.integrations.slurm import resume as slurm_resume
    from gpuguard.integrations.slurm import state as slurm_state

    state, reason = row.example
    fleet.write([("n1", state, stamp() if reason else "Unknown", reason or "none"),
                 *((f"n{i}", "IDLE", "Unknown", "none") for i in range(2, 11))])
    store = fleet.root / "state"
    finding = {"rule": "memory.row_remap", "status": "critical", "action": "inspect_hardware",
               "gpu": host_snapshot(2)["gpus"][0] | {"index": 0}}
    gpus = [{"rule": "memory.row_remap", "gpu": g} for g in host_snapshot(2)["gpus"]]
    slurm_state.save_drain(store, "n1", slurm_resume.record_of(states.EXAMPLE_REASON,
                                                               [finding], gpus, None))
    if row.owner == states.Owner.SCRIPT:
        slurm_state.record_failure(store, "epilog", "n1", "41", [finding], [0])
    else:
        slurm_state.clear_failure(store)


def after(fleet: Fleet, row: states.Row, do: str, before: tuple[str, str]) -> None:
    now = fleet.node()
    if do == "none" or do == "keep":
        assert now == before, (do, before, now)
    elif do in ("drain", "update"):
        assert "+DRAIN" in now[0] and now[1] == states.EXAMPLE_REASON, now
    else:
        assert do == "resume" and now == ("IDLE", "none"), now


@pytest.mark.parametrize("row", states.TABLE, ids=lambda r: f"{r.example[0]}-{r.owner}")
def test_health_on_each_row_of_the_state_table(fleet: Fleet, row: states.Row) -> None:
    """What `gpuguard slurm health` does, as its plan line says and as scontrol shows it
    after: with the fault, then (the row set up again) with every GPU fine."""
    for snapshot, do in ((host_snapshot(2, REMAP), row.with_fault),
                         (host_snapshot(2), row.when_whole)):
        as_row(fleet, row)
        before = fleet.node()
        out = fleet.health(snapshot)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"): {do}: " in out.stdout, out.stdout
        after(fleet, row, do, before)
        log = fleet.root / "log"
        changes = [line for line in (log.read_text() if log.exists() else "").splitlines()
                   if line.startswith("scontrol update")]
        assert (changes != []) is (do in ("drain", "update", "resume")), changes
        log.unlink(missing_ok=True)


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


def test_ten_nodes_with_restart_app_faults_drain_no_more_than_the_brakes_share(
        fleet: Fleet) -> None:
    """A site's failover rule whose action is restart_app, critical on every node (a bad
    push): one health run on each of ten nodes drains one (20 %: the second would make
    two of ten). Before, gpuguard did not know its own restart_app reason: 10 of 10."""
    rules = fleet.root / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text(RESTART_APP_RULE)
    fleet.write([(f"n{i}", "IDLE", "Unknown", "none") for i in range(1, 11)])
    hot = host_snapshot(2, {(0, "temperature_c"): 90})
    codes = [fleet.health(hot, "--rules", str(rules), node=f"n{i}").returncode
             for i in range(1, 11)]
    drained = [f"n{i}" for i in range(1, 11) if "+DRAIN" in fleet.node(f"n{i}")[0]]
    assert drained == ["n1"], (drained, codes)
    assert fleet.node("n1")[1] == "gpuguard: restart_app: site.engine_wedged GPU 0"
    assert codes == [0] + [2] * 9
    # repaired: n1 is resumed (its reason is gpuguard's), and a next node may drain
    out = fleet.health(host_snapshot(2), "--rules", str(rules))
    assert fleet.node("n1") == ("IDLE", "none"), out.stdout


@pytest.mark.parametrize("shape", ["lost-multi-line.log", "lost-init-failed.log"])
def test_health_drains_for_a_gpu_lost_without_an_xid_and_keeps_it_while_missing(
        fleet: Fleet, shape: str) -> None:
    """Issue 36: the open module's three-line "fallen off the bus" record with no Xid, and
    a failed start (tests/fixtures/kmsg/lost-*, moved to this snapshot's GPU 1 at 28:00):
    drained with the lost GPU's reason; the GPU then gone from NVML and the log: no resume,
    not even with --no-qualify."""
    log = fleet.root / "kmsg.log"
    log.write_text((REPO / "tests" / "fixtures" / "kmsg" / shape).read_text()
                   .replace("0000:11:00.0", "0000:28:00.0"))
    fleet.health(host_snapshot(8), "--kmsg-file", str(log))
    assert fleet.node() == ("IDLE+DRAIN", "gpuguard: reboot: xid.recent GPU 1"), fleet.node()
    now = host_snapshot(8)
    del now["gpus"][1]
    for i, gpu in enumerate(now["gpus"]):
        gpu["index"] = i
    now["host"]["gpu_count"] = 7
    log.write_text("")
    kept = fleet.health(now, "--kmsg-file", str(log), "--no-qualify")
    assert fleet.node()[0] == "IDLE+DRAIN", kept.stdout
    assert "00000000:28:00.0), present at the drain, is missing" in kept.stdout
