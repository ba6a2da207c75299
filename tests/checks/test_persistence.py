from gpuguard.results import Status
from tests.conftest import set_gpu


def test_persistence_mode(h200, run_rule):
    assert run_rule("persistence.mode", h200)[0].status is Status.OK
    set_gpu(h200, persistence_mode=False)
    [result] = run_rule("persistence.mode", h200)
    assert result.status is Status.WARNING
    assert "nvidia-persistenced" in (result.remediation or "")
