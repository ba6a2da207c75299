from gpuguard.model.results import Status
from tests.conftest import overridden, set_gpu


def test_power_limit(h200, run_rule):
    assert run_rule("power.limit", h200)[0].status is Status.OK
    set_gpu(h200, power_limit_enforced_w=500.0)
    [result] = run_rule("power.limit", h200)
    assert result.status is Status.WARNING
    assert "500 W" in result.message and "700 W" in result.message


def test_power_limit_within_tolerance_is_the_default(h200, run_rule):
    set_gpu(h200, power_limit_enforced_w=699.0, power_limit_default_w=700.0)
    assert run_rule("power.limit", h200)[0].status is Status.OK
    set_gpu(h200, power_limit_enforced_w=698.9)
    assert run_rule("power.limit", h200)[0].status is Status.WARNING


def test_lowered_limit_says_when_the_gpu_is_capped_at_it(h200, run_rule):
    set_gpu(h200, power_limit_enforced_w=500.0, clock_event_reasons=0x1)
    assert "capped" not in run_rule("power.limit", h200)[0].message
    set_gpu(h200, clock_event_reasons=0x4)
    assert "capped at it now" in run_rule("power.limit", h200)[0].message



def test_power_tolerance_comes_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "power.limit", tolerance_w=250)
    set_gpu(h200, power_limit_enforced_w=500.0, power_limit_default_w=700.0)
    assert run_rule("power.limit", h200, rules=rules)[0].status is Status.OK
    set_gpu(h200, power_limit_enforced_w=449.0)
    assert run_rule("power.limit", h200, rules=rules)[0].status is Status.WARNING
