import copy

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from tests.conftest import set_gpu


def eight(h200):
    base = h200.gpus[0]
    h200.gpus = []
    for i in range(8):
        gpu = copy.deepcopy(base)
        gpu.index = i
        h200.gpus.append(gpu)
    return h200


def test_consistent(h200, run_rule):
    [result] = run_rule("vbios.consistent", eight(h200))
    assert result.status is Status.OK


def test_mixed_versions_warn_and_name_the_gpus(h200, run_rule):
    snap = eight(h200)
    set_gpu(snap, 5, vbios_version="96.00.99.00.01")
    [result] = run_rule("vbios.consistent", snap)
    assert result.status is Status.WARNING
    assert "96.00.99.00.01 on GPU 5" in result.message
    assert "96.00.A5.00.1A on GPU 0, 1, 2, 3, 4, 6, 7" in result.message


def test_allowlist(h200, run_rule):
    [result] = run_rule("vbios.allowed", h200)
    assert result.status is Status.SKIPPED
    allowed = Profile(vbios_allowed={"NVIDIA H200": ["96.00.A5.00.1A"]})
    assert run_rule("vbios.allowed", h200, allowed)[0].status is Status.OK
    other = Profile(vbios_allowed={"NVIDIA H200": ["96.00.B0.00.01"]})
    [result] = run_rule("vbios.allowed", h200, other)
    assert result.status is Status.WARNING
    assert "96.00.A5.00.1A" in result.message


def test_gpus_without_a_readable_vbios_are_left_out_or_skipped(h200, run_rule):
    from gpuguard.model.snapshot import Reading

    eight(h200)
    set_gpu(h200, 3, vbios_version=Reading.failed("GPU is lost"))
    [result] = run_rule("vbios.consistent", h200)
    assert result.status is Status.OK and result.message.startswith("one VBIOS per model")
    for i in range(8):
        set_gpu(h200, i, vbios_version=Reading.not_supported())
    [result] = run_rule("vbios.consistent", h200)
    assert result.status is Status.SKIPPED
    assert result.message == "no GPU reported both its model and VBIOS version"
