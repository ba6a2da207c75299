"""The NVML source: the worker's process naming, and the whole source against fake NVML."""

import json
from types import SimpleNamespace

from gpuguard.sources import nvml_read
from tests.conftest import gpuguard


def test_process_names_from_procfs(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("vllm\n")
    listed = [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30),
              SimpleNamespace(pid=77, usedGpuMemory=None)]  # exited since NVML listed it
    assert nvml_read.processes(listed, str(tmp_path)) == [
        {"pid": 4242, "used_memory_bytes": 1 << 30, "name": "vllm"},
        {"pid": 77, "used_memory_bytes": None, "name": None},
    ]


def test_cuda_version():
    assert nvml_read.cuda_version(13000) == "13.0"
    assert nvml_read.cuda_version(12080) == "12.8"


def test_snapshot_through_fake_nvml(fake_env, host_args):
    proc = gpuguard("snapshot", *host_args, env=fake_env(gpus=3, temp=55, width=8))
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(proc.stdout)
    assert snap["host"]["driver_version"] == "580.159.04"
    assert snap["host"]["cuda_driver_version"] == "13.0"
    assert [g["index"] for g in snap["gpus"]] == [0, 1, 2]
    gpu = snap["gpus"][2]
    assert gpu["pci_bus_id"] == "00000000:12:00.0"
    assert gpu["temperature_c"] == 55
    assert gpu["temperature_slowdown_c"] == 89
    assert gpu["pcie_link_width_current"] == 8
    # Exported by neither the fake nor old drivers: not supported, never an error.
    assert gpu["pcie_replay_counter"]["state"] == "not_supported"
    assert gpu["retired_pages_pending"] == {"state": "not_supported"}
    assert snap["nvml"]["hung_call"] is None and snap["nvml"]["init_error"] is None


def test_init_error_is_a_result(fake_env, host_args):
    proc = gpuguard("snapshot", *host_args, env=fake_env(init_error=9))
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(proc.stdout)
    assert snap["nvml"]["init_error_kind"] == "NVMLError_DriverNotLoaded"
    assert snap["gpus"] == []
