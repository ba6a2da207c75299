"""Issue 27, item 5: resume only a whole node. The GPUs-seen memory the daemon keeps in the
state dir is what every cold path reads (`check`, `slurm health` when no daemon answers):
a GPU missing from it blocks the resume, also when the daemon is not up, after a daemon
restart and after a reboot; the way back with fewer GPUs is `gpuguard ack gpu.count` (or
an administrator's resume). The fake NVML lists 2 GPUs; the memory knew a third."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.assess.gpus_seen import FILE
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.integrations.slurm.resume import DrainRecord
from tests.conftest import REPO, TEST_BOOT_ID, gpuguard, own_host
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import FAKE_SLURM, stamp

GONE = {"uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
        "pci_bus_id": "00000000:AA:00.0", "index": 2, "name": "NVIDIA H200"}
PRESENT = [{"uuid": f"GPU-fa4e0000-0000-0000-0000-00000000000{i}",
            "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0", "index": i,
            "name": "NVIDIA H200"} for i in range(2)]
REASON = "gpuguard: reboot: gpu.count"


class Node:
    def __init__(self, root: Path, fake_env: dict[str, str]) -> None:
        self.root = root
        self.host = own_host(root / "host")
        # health judges a recording of the same two boards (a live fake host has no
        # sysfs: its drain-capable PCIe rules would be unknown and hold every resume),
        # with this host's state dir and boot
        (root / "host" / "proc" / "modules").write_text(
            "nvidia 1 0 - Live 0x0000000000000000 (POE)\n")  # the boot's procfs: loaded
        self.replay = root / "two-gpus.json"
        write_snapshot(self.replay, host_snapshot(2, {(i, "uuid"): g["uuid"]
                                                     for i, g in enumerate(PRESENT)}))
        self.state = root / "host" / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.env = fake_env

    def remember(self, gpus: list[dict[str, object]], boot: str = TEST_BOOT_ID) -> None:
        (self.state / FILE).write_text(json.dumps({"boot_id": boot, "gpus": gpus}))

    def table(self, state: str, reason: str) -> None:
        (self.root / "nodes").write_text(f"n1|{state}|{stamp(30)}|gpu|{reason}\n")

    def node(self) -> tuple[str, str]:
        first = (self.root / "nodes").read_text().splitlines()[0].split("|")
        return first[1], first[4]

    def health(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuguard", "slurm", "health", "--no-daemon",
             "--brake-jitter", "0", "--node", "n1", "--slurm-bin", str(FAKE_SLURM),
             "--slurm-conf", str(self.root / "slurm.conf"), "--input", str(self.replay),
             "--state-dir", str(self.state), "--path.procfs", self.host[1]],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env={**os.environ, **self.env}, check=False)

    def check(self, *extra: str) -> dict[str, object]:
        out = gpuguard("check", *self.host, "--only", "gpu.count", "--format", "json",
                       *extra, env=self.env)
        return dict(json.loads(out.stdout))

    def drained_with_present_gpus_only(self) -> None:
        """The node as an earlier health run left it: drained for the vanished GPU, on
        the daemon's verdict, the record naming the GPUs present then (the two)."""
        self.table("IDLE+DRAIN", REASON)
        slurm_state.save_drain(self.state, "n1", DrainRecord(
            REASON, [{"rule": "gpu.count", "gpu": None}],
            [{k: g[k] for k in ("index", "uuid", "pci_bus_id")} for g in PRESENT]))


@pytest.fixture
def node(tmp_path: Path, fake_env) -> Node:  # type: ignore[no-untyped-def]
    return Node(tmp_path, fake_env(gpus=2))


def gpu_count(doc: dict[str, object]) -> dict[str, object]:
    results = doc["results"]
    assert isinstance(results, list)
    return next(r for r in results if r["rule"] == "gpu.count")


def test_a_cold_check_reads_the_gpus_the_daemon_saw(node: Node) -> None:
    """`check` without a daemon: the third GPU is missing, critical, by name; after a
    reboot (another boot id in the file) it is one seen in an earlier boot."""
    node.remember([*PRESENT, GONE])
    found = gpu_count(node.check())
    assert found["status"] == "critical", found
    assert "GPU-00000000-0000-0000-0000-0000000000aa" in str(found["message"])
    node.remember([*PRESENT, GONE], boot="an-earlier-boot")
    rebooted = gpu_count(node.check())
    assert rebooted["status"] == "critical" and "earlier boot" in str(rebooted["message"])
    # read, never written: the file is as the daemon left it
    assert json.loads((node.state / FILE).read_text())["boot_id"] == "an-earlier-boot"


def test_health_never_resumes_a_node_missing_a_gpu_the_daemon_saw(node: Node) -> None:
    """Drained for the vanished GPU; the daemon does not answer (not up yet after a
    reboot, or its slots busy): the cold check reads the memory and keeps the drain,
    run after run. (Before: it had no memory of the third GPU and resumed with two.)"""
    node.remember([*PRESENT, GONE])
    node.drained_with_present_gpus_only()
    for _ in range(2):
        kept = node.health()
        assert kept.returncode == 0, kept.stderr
        assert node.node() == ("IDLE+DRAIN", REASON), kept.stdout
    assert "the finding is still there" in kept.stdout
    # after a reboot the memory still expects the board in its slot
    node.remember([*PRESENT, GONE], boot="an-earlier-boot")
    node.health()
    assert node.node() == ("IDLE+DRAIN", REASON)


def test_a_drain_record_names_the_gpus_the_memory_misses(node: Node) -> None:
    """The drain itself (cold): the record names the missing GPU as well, so a later
    verdict that cannot see the memory (a file lost) still waits for it."""
    node.remember([*PRESENT, GONE])
    node.table("IDLE", "none")
    drained = node.health()
    assert node.node() == ("IDLE+DRAIN", REASON), drained.stdout
    record = slurm_state.drain_record(node.state, "n1")
    assert record is not None
    assert GONE["uuid"] in [g["uuid"] for g in record.gpus]
    (node.state / FILE).unlink()  # the memory lost: the record still waits for the board
    kept = node.health()
    assert node.node() == ("IDLE+DRAIN", REASON), kept.stdout
    assert "0000000000aa (00000000:AA:00.0), present at the drain, is missing" in kept.stdout


def test_the_way_back_with_fewer_gpus_is_an_ack_of_gpu_count(node: Node) -> None:
    """The board was pulled on purpose: `gpuguard ack gpu.count` covering exactly the
    missing set. The cold path forgets it (for the daemon too), and the next health run
    resumes the node with two GPUs."""
    node.remember([*PRESENT, GONE])
    node.drained_with_present_gpus_only()
    assert gpu_count(node.check("--record"))["status"] == "critical"
    acked = gpuguard("ack", "gpu.count", "--reason", "GPU 2 pulled for RMA", "--state-dir",
                     str(node.state), "--path.procfs", node.host[1])
    assert acked.returncode == 0, acked.stderr
    first = node.health()  # the ack applies: the memory forgets the board
    assert node.node()[0] == "IDLE+DRAIN", first.stdout
    saved = json.loads((node.state / FILE).read_text())
    assert [g["uuid"] for g in saved["gpus"]] == [g["uuid"] for g in PRESENT]
    assert [g["uuid"] for g in saved["forgotten"]] == [GONE["uuid"]]
    resumed = node.health()
    assert node.node() == ("IDLE", "none"), resumed.stdout
    assert gpu_count(node.check())["status"] == "ok"
