"""A GPU that disappears while the daemon runs is critical (issue 20): the daemon remembers
the GPUs it saw since boot, in the state dir, across its own restarts within one boot."""

from __future__ import annotations

import json
from pathlib import Path

from gpuguard.assess.gpus_seen import FILE, SeenGpus
from gpuguard.model.snapshot import GpuSnapshot, Reading, Snapshot
from tests.conftest import TEST_BOOT_ID, gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

GPU1 = "GPU 1 (GPU-00000000-0000-0000-0000-000000000001, 00000000:28:00.0)"


def replay(start_daemon, tmp_path: Path, gpus: int = 2):
    """A daemon on a replayed host with no gpu_count in its profile (as shipped)."""
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(gpus))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--slow-interval", "5")
    return daemon, snap


def test_a_gpu_that_vanishes_is_critical_and_named_until_it_comes_back(start_daemon, tmp_path):
    daemon, snap = replay(start_daemon, tmp_path)
    assert daemon.result("gpu.count")["status"] == "ok"
    # GPU 1 leaves NVML; the host now reports one GPU, consistently, and no profile says 2
    write_snapshot(snap, host_snapshot(1))
    gone = daemon.wait_for(lambda: (r := daemon.result("gpu.count"))["status"] == "critical"
                           and r, what="gpu.count critical")
    assert GPU1 in gone["message"] and "seen since boot are gone" in gone["message"]
    assert gone["observed"]["names"] == [GPU1] and gone["observed"]["gpus"] == [1]
    # a restart of the daemon within the same boot remembers it
    daemon.stop()
    again = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--slow-interval", "5")
    assert again.result("gpu.count")["status"] == "critical"
    # it comes back: ok again
    write_snapshot(snap, host_snapshot(2))
    again.wait_for(lambda: again.result("gpu.count")["status"] == "ok", what="back")


def test_a_reboot_keeps_the_slots_and_a_sweep_that_cannot_tell_judges_nothing(tmp_path):
    def snapshot(*uuids: str, hung: bool = False) -> Snapshot:
        snap = Snapshot()
        for i, uuid in enumerate(uuids):
            snap.gpus.append(GpuSnapshot(index=i, uuid=Reading.ok(uuid),
                                         pci_bus_id=Reading.ok(f"00000000:{0x18 + i:02X}:00.0")))
        snap.nvml.hung_call = "nvmlDeviceGetTemperature (GPU 1)" if hung else None
        return snap

    seen = SeenGpus(tmp_path, "boot-a")
    assert seen.update(snapshot("GPU-a", "GPU-b")) == []
    assert [g["uuid"] for g in seen.update(snapshot("GPU-a"))] == ["GPU-b"]
    assert seen.update(snapshot("GPU-a", hung=True)) is None  # NVML hung: cannot tell
    saved = json.loads((tmp_path / FILE).read_text())
    assert saved["boot_id"] == "boot-a" and len(saved["gpus"]) == 2
    assert [g["uuid"] for g in SeenGpus(tmp_path, "boot-a").update(snapshot("GPU-a"))] == \
        ["GPU-b"]  # the same boot, a new daemon
    # a reboot (the one gpuguard asked for after Xid 79): GPU-b did not come back, and
    # is still missing, known by its slot; a board swapped into a slot is that slot's GPU
    rebooted = SeenGpus(tmp_path, "boot-b")
    [gone] = rebooted.update(snapshot("GPU-a"))
    assert (gone["uuid"], gone["earlier_boot"]) == ("GPU-b", True)
    assert SeenGpus(tmp_path / "x", "boot-b").update(snapshot("GPU-a")) == []
    assert SeenGpus(tmp_path, "boot-c").update(snapshot("GPU-a", "GPU-new")) == []
    # a GPU renumbered (index 0 now) is the same GPU: matched by UUID, not by index
    renumbered = SeenGpus(tmp_path / "r", "boot-a")
    renumbered.update(snapshot("GPU-a", "GPU-b"))
    assert renumbered.update(snapshot("GPU-b")) == [
        {"uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0", "index": 0, "name": None}]
    # a corrupt file is doubt, never a fresh start: gpu.count unknown this boot, also
    # after a restart of the daemon (the doubt is kept in the file); never a crash
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / FILE).write_text("{not json")
    doubt = SeenGpus(tmp_path / "c", "boot-a").reading(snapshot("GPU-a"))
    assert doubt is not None and doubt.state == "error" and "cannot be read" in doubt.error
    again = SeenGpus(tmp_path / "c", "boot-a").reading(snapshot("GPU-a"))
    assert again is not None and again.state == "error"
    # a GPU gone after the doubt began is still named (critical, not unknown)
    gone_too = SeenGpus(tmp_path / "c", "boot-a").reading(snapshot())
    assert gone_too is not None and gone_too.is_ok and len(gone_too.get()) == 1
    # the next boot starts from what this one saw, without the doubt
    assert SeenGpus(tmp_path / "c", "boot-b").reading(snapshot("GPU-a")).get() == []


def test_the_seen_file_keeps_the_tests_boot(start_daemon, tmp_path):
    replay(start_daemon, tmp_path)
    saved = json.loads((tmp_path / "state" / FILE).read_text())
    assert saved["boot_id"] == TEST_BOOT_ID and len(saved["gpus"]) == 2


def test_an_ack_of_gpu_count_forgets_exactly_the_gpus_it_covers(start_daemon, tmp_path, fake_env):
    """A GPU taken out on purpose: `gpuguard ack gpu.count` covers the missing set as the
    store recorded it, and the daemon stops expecting those GPUs (gpu.count ok again)."""
    gone = {"uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
            "pci_bus_id": "00000000:AA:00.0", "index": 2, "name": "NVIDIA H200"}
    state = tmp_path / "state"
    state.mkdir()
    # a daemon earlier in this boot saw a third GPU
    (state / FILE).write_text(json.dumps({"boot_id": TEST_BOOT_ID, "gpus": [gone]}))
    daemon = start_daemon("--fast-interval", "0.3", "--slow-interval", "5",
                          env=fake_env(gpus=2))
    missing = daemon.wait_for(lambda: (r := daemon.result("gpu.count"))["status"] == "critical"
                              and r, what="gpu.count critical for the third GPU")
    assert missing["action"] != "none" and len(missing["observed"]["names"]) == 1
    proc = tmp_path / "own-host" / "proc"
    out = gpuguard("ack", "gpu.count", "--reason", "GPU 2 pulled for RMA", "--state-dir",
                   str(state), "--path.procfs", str(proc))
    assert out.returncode == 0, out.stderr
    daemon.wait_for(lambda: daemon.result("gpu.count")["status"] == "ok", what="forgotten")
    saved = json.loads((state / FILE).read_text())
    assert [g["uuid"] for g in saved["gpus"]] == [
        f"GPU-fa4e0000-0000-0000-0000-00000000000{i}" for i in range(2)], saved


def test_a_corrupt_file_makes_gpu_count_unknown_not_ok(start_daemon, tmp_path):
    """A missing GPU, the daemon restarted, and the file is now 2 MB of garbage: it
    started afresh and gpu.count said ok (exit 0) with the evidence overwritten."""
    state = tmp_path / "state"
    state.mkdir()
    (state / FILE).write_bytes(b"x" * (2 << 20))
    daemon, _ = replay(start_daemon, tmp_path, gpus=1)
    result = daemon.wait_for(lambda: (r := daemon.result("gpu.count"))["status"] == "unknown"
                             and r, what="gpu.count unknown")
    assert "which GPUs this host had cannot be told" in result["message"], result
