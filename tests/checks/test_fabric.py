"""fabric.state and fabric.manager on the real 2 x H200 host (fabric Completed, no fabric
manager inside the VM) and its faults."""

from __future__ import annotations

import pytest

from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading, Snapshot
from tests.checks import h200x2
from tests.conftest import set_gpu


@pytest.fixture
def pair() -> Snapshot:
    return h200x2.snapshot()


def host(snapshot: Snapshot, **values: object) -> Snapshot:
    for name, value in values.items():
        setattr(snapshot.host, name, value if isinstance(value, Reading) else Reading.ok(value))
    snapshot.host.__post_init__()
    return snapshot


def test_a_completed_fabric_is_ok(pair, run_rule):
    results = run_rule("fabric.state", pair)
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert results[0].message == "GPU fabric completed (Success, clique 0)"


@pytest.mark.parametrize("state", ["not_started", "in_progress"])
def test_a_fabric_not_complete_is_critical_and_says_what_to_start(pair, run_rule, state):
    set_gpu(pair, 1, fabric_state=state, fabric_status=Reading.not_supported())
    ok, bad = run_rule("fabric.state", pair)
    assert ok.status is Status.OK and bad.status is Status.CRITICAL
    assert bad.message.startswith(f"GPU fabric {state.replace('_', ' ')}: CUDA cannot create "
                                  "a context")
    assert "systemctl start nvidia-fabricmanager" in bad.message


def test_a_failed_status_is_critical(pair, run_rule):
    set_gpu(pair, 0, fabric_status="NVML_ERROR_INSUFFICIENT_RESOURCES")
    [bad, _] = run_rule("fabric.state", pair)
    assert bad.status is Status.CRITICAL
    assert "'NVML_ERROR_INSUFFICIENT_RESOURCES'" in bad.message


def test_an_unread_status_of_a_completed_fabric_is_unknown(pair, run_rule):
    set_gpu(pair, 0, fabric_status=Reading.failed("nvmlDeviceGetGpuFabricInfoV: killed by "
                                                   "signal 11"))
    assert run_rule("fabric.state", pair)[0].status is Status.UNKNOWN


def test_no_fabric_is_skipped(h200, run_rule):
    set_gpu(h200, fabric_state=Reading.not_supported())
    assert run_rule("fabric.state", h200)[0].status is Status.SKIPPED
    [result] = run_rule("fabric.manager", h200)
    assert result.status is Status.SKIPPED and "no fabric manager needed" in result.message


def test_a_completed_fabric_proves_the_manager_ran_elsewhere(pair, run_rule):
    host(pair, fabricmanager_running=Reading.failed("procfs: timeout"))
    [result] = run_rule("fabric.manager", pair)
    assert result.status is Status.OK and "hypervisor" in result.message


def test_a_fabric_waiting_without_a_manager_is_critical(pair, run_rule):
    set_gpu(pair, 1, fabric_state="not_started")
    [result] = run_rule("fabric.manager", pair)
    assert result.status is Status.CRITICAL
    assert result.message.startswith("no nvidia-fabricmanager process and the GPU fabric is "
                                     "not complete (GPU 1 not started)")
    host(pair, fabricmanager_running=True)
    [result] = run_rule("fabric.manager", pair)
    assert result.status is Status.OK and "GPU 1 not started" in result.message
    host(pair, fabricmanager_running=Reading.failed("procfs: timeout"))
    assert run_rule("fabric.manager", pair)[0].status is Status.UNKNOWN
