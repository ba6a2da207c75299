"""Issue 36, items 2 and 3 through the command line: NVML asked by bus id for a GPU on the
PCI bus that its list lacks (sources/nvml_bus.py). tests/fixtures/sysfs-pci-display
(its README): 10:00.0, the fake's GPU 0, and 11:00.0 (class 0x0380) bound to nvidia,
absent where the fake counts one GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES, gpuguard, own_host
from tests.test_lost_gpu_cli import by_gpu

SYSFS = FIXTURES / "sysfs-pci-display"
MISSING = "0000:11:00.0"


def check(root: Path, env: dict[str, str], sysfs: Path | None = SYSFS, *extra: str) -> Any:
    where = ("--path.sysfs", str(sysfs)) if sysfs is not None else ()
    return gpuguard("check", "--format", "json", *own_host(root), *where, *extra, env=env)


def asked(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


def test_a_gpu_nvml_does_not_list_whose_bus_id_lookup_fails_is_gpu_lost(tmp_path, fake_env):
    """nvidia-smi's "Unable to determine the device handle for GPU ...: Unknown Error": the
    by-PCI lookup's Unknown Error is gpu.lost critical on that bus id; gpu.count still
    names it missing; only the GPU the list lacks is asked."""
    calls = tmp_path / "calls"
    proc = check(tmp_path, fake_env(gpus=1, bus_handle_error=999,
                                    bus_handle_error_bus=MISSING, bus_calls=calls))
    lost = by_gpu(proc, "gpu.lost")
    assert lost["host"]["status"] == "critical", lost["host"]["message"]
    assert "nvmlDeviceGetHandleByPciBusId_v2: Unknown Error" in lost["host"]["message"]
    assert MISSING in lost["host"]["message"]
    assert lost["host"]["observed"]["pci_bus_ids"] == [MISSING]
    assert lost[0]["status"] == "ok", lost[0]["message"]
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "critical" and MISSING in count["message"], count["message"]
    assert asked(calls) == [MISSING]
    assert proc.returncode == 2


def test_gpu_is_lost_from_the_lookup_is_gpu_lost_too(tmp_path, fake_env):
    proc = check(tmp_path, fake_env(gpus=1, bus_handle_error=15))
    lost = by_gpu(proc, "gpu.lost")["host"]
    assert lost["status"] == "critical", lost["message"]
    assert "GPU is lost" in lost["message"] and MISSING in lost["message"]


def test_not_found_by_bus_id_leaves_it_to_gpu_count_as_today(tmp_path, fake_env):
    calls = tmp_path / "calls"
    proc = check(tmp_path, fake_env(gpus=1, bus_calls=calls))  # the fake: not found
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "critical", count["message"]
    assert f"not in NVML's list: {MISSING} " in count["message"]
    assert "reachable by bus id" not in count["message"]
    assert set(by_gpu(proc, "gpu.lost")) == {0}  # no host result: nothing to say
    assert asked(calls) == [MISSING]


def test_not_supported_by_bus_id_is_no_lost_gpu(tmp_path, fake_env):
    proc = check(tmp_path, fake_env(gpus=1, bus_handle_error=3))
    assert set(by_gpu(proc, "gpu.lost")) == {0}
    assert by_gpu(proc, "gpu.count")["host"]["status"] == "critical"


def test_a_handle_nvml_gives_by_bus_id_for_a_gpu_it_does_not_count_is_named(tmp_path,
                                                                           fake_env):
    proc = check(tmp_path, fake_env(gpus=1, bus_uncounted=1))
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "critical", count["message"]
    assert count["message"].endswith(f"NVML reachable by bus id but not counted: {MISSING}")
    assert set(by_gpu(proc, "gpu.lost")) == {0}


def test_a_healthy_bus_and_a_host_without_a_pci_bus_ask_nothing(tmp_path, fake_env):
    """Every GPU on the bus listed, or no PCI bus in sysfs (not supported): no lookup, and
    the results are those of before."""
    for name, gpus, sysfs in (("listed", 2, SYSFS), ("no-bus", 1, None)):
        calls = tmp_path / f"{name}.calls"
        proc = check(tmp_path / name, fake_env(gpus=gpus, bus_handle_error=999,
                                               bus_calls=calls), sysfs)
        assert asked(calls) == [], name
        assert set(by_gpu(proc, "gpu.lost")) == set(range(gpus)), name
        assert by_gpu(proc, "gpu.count")["host"]["status"] == "ok", name


def test_a_by_pci_lookup_that_hangs_is_named_by_the_deadline(tmp_path, fake_env):
    """The lookup runs under the worker's deadline and is named on its progress board."""
    proc = check(tmp_path, fake_env(gpus=1, hang="nvmlDeviceGetHandleByPciBusId_v2"),
                 SYSFS, "--timeout", "1.5")
    responsive = by_gpu(proc, "driver.responsive")["host"]
    assert responsive["status"] == "critical", responsive["message"]
    assert f"nvmlDeviceGetHandleByPciBusId_v2 ({MISSING})" in responsive["message"]


def test_a_gpu_another_container_was_given_is_not_asked_for(tmp_path, fake_env):
    """Bound to nvidia but not in this container's /proc/driver/nvidia/gpus: another
    container's (gpu.count says so), not asked, not lost."""
    (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:10:00.0").mkdir(parents=True)
    calls = tmp_path / "calls"
    proc = check(tmp_path, fake_env(gpus=1, bus_handle_error=999, bus_calls=calls))
    assert asked(calls) == []
    assert set(by_gpu(proc, "gpu.lost")) == {0}
    assert by_gpu(proc, "gpu.count")["host"]["status"] == "ok"


# -- no false alarm (the review of issue 36): a handle refused for permission, and a GPU
# the driver excludes on purpose

def test_a_handle_refused_for_permission_is_unknown_not_a_lost_gpu(tmp_path, fake_env):
    """NVML_ERROR_NO_PERMISSION (4): this process may not open the GPU (a device cgroup, a
    file mode, a Slurm step's ConstrainDevices), which says nothing of the GPU: unknown,
    by index and by bus id; any other error stays critical (the tests above)."""
    by_index = check(tmp_path / "index", fake_env(gpus=2, handle_error=4,
                                                  handle_error_gpu=1), None)
    lost = by_gpu(by_index, "gpu.lost")
    assert lost[1]["status"] == "unknown", lost[1]["message"]
    assert "Insufficient Permissions" in lost[1]["message"]
    assert lost[0]["status"] == "ok"
    by_bus = check(tmp_path / "bus", fake_env(gpus=1, bus_handle_error=4))
    host = by_gpu(by_bus, "gpu.lost")["host"]
    assert host["status"] == "unknown", host["message"]
    assert MISSING in host["message"] and "Insufficient Permissions" in host["message"]


def excluded_procfs(root: Path, excluded: str) -> None:
    """The driver's procfs as own_host's tree lacks it: both GPUs listed, 11:00.0 with
    `GPU Excluded:` `excluded` (the driver's own spacing: a tab, then a space)."""
    for address, value in (("0000:10:00.0", "No"), (MISSING, excluded)):
        folder = root / "proc" / "driver" / "nvidia" / "gpus" / address
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t NVIDIA H200\nBus Location: \t {address}\nDevice Minor: \t 0\n"
            f"GPU Excluded:\t {value}\n")


def test_a_gpu_the_driver_excludes_is_named_not_missing_and_not_asked(tmp_path, fake_env):
    """NVreg_ExcludedGpus: the GPU is bound to nvidia and in the driver's procfs, which says
    "GPU Excluded: Yes", and NVML leaves it out on purpose: named, not counted, not asked
    for by bus id. The same GPU with "No" is missing, as before."""
    for excluded, status in (("Yes", "ok"), ("No", "critical")):
        root = tmp_path / excluded
        own_host(root)
        excluded_procfs(root, excluded)
        calls = root / "calls"
        proc = check(root, fake_env(gpus=1, bus_calls=calls))
        count = by_gpu(proc, "gpu.count")["host"]
        assert count["status"] == status, (excluded, count["message"])
        if excluded == "Yes":
            assert f"excluded by the driver (NVreg_ExcludedGpus), not counted: {MISSING}" \
                in count["message"]
            assert asked(calls) == []
        else:
            assert asked(calls) == [MISSING]
