from gpuguard.profile import Profile
from gpuguard.results import Status
from gpuguard.snapshot import Reading


def test_count_against_profile(h200, run_rule):
    assert run_rule("gpu.count", h200, Profile(gpu_count=1))[0].status is Status.OK
    [result] = run_rule("gpu.count", h200, Profile(gpu_count=8))
    assert result.status is Status.CRITICAL
    assert "1 GPU(s) visible, the profile expects 8" in result.message


def test_no_profile_no_gpu_is_critical(h200, run_rule):
    assert run_rule("gpu.count", h200)[0].status is Status.OK
    h200.host.gpu_count = Reading.ok(0)
    h200.gpus = []
    assert run_rule("gpu.count", h200)[0].status is Status.CRITICAL
