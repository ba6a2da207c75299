"""The multi-GPU readings of issue 11 (NVLink, fabric, P2P, HBM temperature, application
clocks, GSP, MIG) through the real nvidia-ml-py against the fake libnvidia-ml."""

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gpuguard, own_host


def snapshot(env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as root:  # a snapshot writes nothing there
        proc = gpuguard("snapshot", *own_host(Path(root)), env=env)
    assert proc.returncode == 0, proc.stderr
    snap: dict[str, Any] = json.loads(proc.stdout)
    assert snap["nvml"]["sweep_error"] is None and snap["nvml"]["hung_call"] is None
    return snap


def test_pcie_gpus_have_no_nvlink_and_no_fabric(fake_env):
    gpu = snapshot(fake_env(gpus=2))["gpus"][0]
    assert gpu["nvlink_links"]["state"] == "not_supported"
    assert "no NVLink" in gpu["nvlink_links"]["error"]
    for name in ("fabric_state", "fabric_status", "fabric_clique_id"):
        assert gpu[name]["state"] == "not_supported", name


def test_nvlink_links_as_the_real_pair_shows_them(fake_env):
    snap = snapshot(fake_env(gpus=2, nvlinks=18, nvlink_down="1:3,1:17"))
    links = [g["nvlink_links"] for g in snap["gpus"]]
    assert [len(x) for x in links] == [18, 18]  # the scan stops past the last link
    assert all(link["up"] for link in links[0])
    assert [link["link"] for link in links[1] if not link["up"]] == [3, 17]
    assert links[0][5] == {"link": 5, "up": True, "version": 6, "remote_pci": "FFFFFFFF:FF:FF.0",
                           "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 23}


def test_nvlink_counters_are_read_fresh_each_sweep(fake_env, tmp_path):
    counters = tmp_path / "counters"
    counters.write_text("0 1 0 0 0 23\n")
    env = fake_env(nvlinks=2, nvlink_counter_file=counters)
    assert snapshot(env)["gpus"][0]["nvlink_links"][1]["replay"] == 0
    counters.write_text("0 1 7 1 2 40\n")
    link = snapshot(env)["gpus"][0]["nvlink_links"][1]
    assert (link["replay"], link["recovery"], link["crc_flit"], link["crc_data"]) == (7, 1, 2, 40)


@pytest.mark.parametrize(("fabric", "state", "status"), [
    ("completed", "completed", "Success"),
    ("failed", "completed", "Unknown Error"),
    ("in_progress", "in_progress", None),
    ("not_started", "not_started", None),
])
def test_fabric_state_and_status(fake_env, fabric, state, status):
    gpu = snapshot(fake_env(fabric=fabric))["gpus"][0]
    # The fake refuses a struct without its version (the real driver crashed on one).
    assert gpu["fabric_state"] == state
    if status is None:  # valid only once completed
        assert gpu["fabric_status"]["state"] == "not_supported"
        assert gpu["fabric_clique_id"]["state"] == "not_supported"
    else:
        assert gpu["fabric_status"] == status
        assert gpu["fabric_clique_id"] == 0


def test_fabric_falls_back_to_the_unversioned_call(fake_env):
    gpu = snapshot(fake_env(fabric="in_progress", fabric_v1_only=1))["gpus"][0]
    assert gpu["fabric_state"] == "in_progress"


def test_p2p_status_of_every_pair(fake_env):
    snap = snapshot(fake_env(gpus=3))
    # The read index is the one nvidia-ml-py spells as a tuple: passed right, it reads ok.
    assert snap["gpus"][1]["p2p_status"] == [
        {"peer": 0, "read": "ok", "write": "ok", "nvlink": "ok", "atomics": "ok"},
        {"peer": 2, "read": "ok", "write": "ok", "nvlink": "ok", "atomics": "ok"},
    ]
    no_p2p = snapshot(fake_env(gpus=2, p2p="not_supported"))["gpus"][0]["p2p_status"]
    assert no_p2p == [{"peer": 1, "read": "chipset_not_supported", "write": "chipset_not_supported",
                       "nvlink": "not_supported", "atomics": "chipset_not_supported"}]
    assert snapshot(fake_env(gpus=1))["gpus"][0]["p2p_status"] == []


def test_memory_temperature_clocks_gsp_and_mig(fake_env):
    gpu = snapshot(fake_env(mem_temp=91, app_clock_sm=1410, mig_pending=1))["gpus"][0]
    assert (gpu["memory_temperature_c"], gpu["memory_temperature_max_c"]) == (91, 95)
    assert (gpu["clock_sm_app_mhz"], gpu["clock_sm_app_default_mhz"]) == (1410, 1980)
    assert (gpu["clock_mem_app_mhz"], gpu["clock_mem_app_default_mhz"]) == (3201, 3201)
    assert gpu["gsp_firmware_version"] == "580.159.04"
    assert (gpu["mig_mode_current"], gpu["mig_mode_pending"]) == (False, True)


def test_an_nvlink_call_that_fails_names_itself(fake_env, host_args):
    # A link that is up but whose counter call fails: the reading is an error naming the
    # call and the link, never a silent gap. The fake's GPU-lost switch covers calls it
    # routes through; here a hang past the deadline names the link call instead.
    proc = gpuguard("snapshot", *host_args, "--timeout", "2",
                    env=fake_env(nvlinks=4, hang="nvmlDeviceGetNvLinkErrorCounter"))
    snap = json.loads(proc.stdout)
    assert "nvmlDeviceGetNvLinkErrorCounter (GPU 0, link 0)" in snap["nvml"]["hung_call"]
