from gpuguard.results import Status
from tests.conftest import set_gpu


def test_idle_bit_is_not_throttling(h200, run_rule):
    # The real H200 at idle reports 0x1 (GPU idle).
    assert h200.gpus[0].clock_event_reasons.get() == 0x1
    for rule in ("clocks.hw_slowdown", "clocks.sw_thermal", "clocks.power_cap"):
        [result] = run_rule(rule, h200)
        assert result.status is Status.OK, rule


def test_application_clocks_and_sync_boost_bits_are_normal(h200, run_rule):
    set_gpu(h200, clock_event_reasons=0x1 | 0x2 | 0x10 | 0x100)
    for rule in ("clocks.hw_slowdown", "clocks.sw_thermal", "clocks.power_cap"):
        [result] = run_rule(rule, h200)
        assert result.status is Status.OK, rule


def test_each_hw_bit_is_critical(h200, run_rule):
    for bit, word in ((0x8, "HW slowdown"), (0x40, "HW thermal"), (0x80, "power brake")):
        set_gpu(h200, clock_event_reasons=bit)
        [result] = run_rule("clocks.hw_slowdown", h200)
        assert result.status is Status.CRITICAL
        assert word in result.message


def test_sw_thermal_warns(h200, run_rule):
    set_gpu(h200, clock_event_reasons=0x20)
    [result] = run_rule("clocks.sw_thermal", h200)
    assert result.status is Status.WARNING


def test_power_cap_only_counts_at_the_limit(h200, run_rule):
    set_gpu(h200, clock_event_reasons=0x4, power_draw_w=690.0, power_limit_enforced_w=700.0)
    [result] = run_rule("clocks.power_cap", h200)
    assert result.status is Status.WARNING
    assert "690" in result.message
    set_gpu(h200, power_draw_w=300.0)
    [result] = run_rule("clocks.power_cap", h200)
    assert result.status is Status.OK
    assert "transient" in result.message
