from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from tests.conftest import set_gpu


def test_recovery_action(h200, run_rule):
    [result] = run_rule("recovery.action", h200)
    assert result.status is Status.OK
    set_gpu(h200, recovery_action="gpu_reset")
    [result] = run_rule("recovery.action", h200)
    assert result.status is Status.CRITICAL
    assert "gpu_reset" in result.message
    set_gpu(h200, recovery_action="drain_p2p")
    assert run_rule("recovery.action", h200)[0].status is Status.WARNING


def test_recovery_action_not_supported_on_old_driver(h200, run_rule):
    set_gpu(h200, recovery_action=Reading.not_supported("not in this driver's NVML"))
    assert run_rule("recovery.action", h200)[0].status is Status.SKIPPED
