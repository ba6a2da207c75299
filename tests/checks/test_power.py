from gpuguard.results import Status
from tests.conftest import set_gpu


def test_power_limit(h200, run_rule):
    assert run_rule("power.limit", h200)[0].status is Status.OK
    set_gpu(h200, power_limit_enforced_w=500.0)
    [result] = run_rule("power.limit", h200)
    assert result.status is Status.WARNING
    assert "500 W" in result.message and "700 W" in result.message
