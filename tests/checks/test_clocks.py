from gpuguard.model.results import Status
from gpuguard.model.samples import Samples
from gpuguard.model.snapshot import Reading
from tests.conftest import overridden, set_gpu


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


def busy(h200, **values):
    """The busy H200 fixture's readings: capped at its default 700 W limit under a matmul."""
    base = {"clock_event_reasons": 0x4, "power_draw_w": 692.0, "power_limit_enforced_w": 700.0,
            "power_limit_default_w": 700.0, "clock_sm_mhz": 1455, "clock_sm_max_mhz": 1980}
    return set_gpu(h200, **(base | values))


def test_capping_at_the_default_limit_under_load_is_normal(h200, run_rule):
    """Measured: 689-696 W of 700 W, SM 1200-1860 MHz under bf16 matmuls of three sizes."""
    for draw, sm in ((692.0, 1455), (696.0, 1200), (689.0, 1860), (588.8, 1470)):
        [result] = run_rule("clocks.power_cap", busy(h200, power_draw_w=draw, clock_sm_mhz=sm))
        assert result.status is Status.OK, (draw, sm, result.message)
        assert "as the board is built to" in result.message


def test_busy_fixture_is_ok(run_rule):
    from gpuguard.sources import replay
    from tests.conftest import FIXTURES

    snapshot = replay.load(FIXTURES / "h200-live" / "busy-snapshot.json")
    set_gpu(snapshot, power_draw_w=692.0)  # what nvidia-smi showed over a minute of that load
    [result] = run_rule("clocks.power_cap", snapshot)
    assert result.status is Status.OK, result.message


def test_capping_at_a_lowered_limit_is_power_limit_s_finding(h200, run_rule):
    busy(h200, power_limit_enforced_w=500.0, power_draw_w=495.0, clock_sm_mhz=900)
    [cap] = run_rule("clocks.power_cap", h200)
    assert cap.status is Status.OK and "power.limit" in cap.message
    [limit] = run_rule("power.limit", h200)
    assert limit.status is Status.WARNING and "capped at it now" in limit.message
    # within power.limit's tolerance (1 W) the limit counts as the default
    for enforced in (699.5, 699.0):
        busy(h200, power_limit_enforced_w=enforced, clock_sm_mhz=900)
        assert run_rule("clocks.power_cap", h200)[0].status is Status.WARNING, enforced


def test_clock_held_far_below_the_max_at_the_limit_warns(h200, run_rule):
    floor = 0.5 * 1980  # min_sm_clock_ratio of the 1980 MHz maximum
    [result] = run_rule("clocks.power_cap", busy(h200, clock_sm_mhz=int(floor) - 1))
    assert result.status is Status.WARNING
    assert "989 MHz" in result.message and "1980" in result.message
    assert run_rule("clocks.power_cap", busy(h200, clock_sm_mhz=990))[0].status is Status.OK


def test_one_low_draw_sample_is_a_load_step_not_a_fault(h200, run_rule):
    # At a load step the bit was set while the 1 s average read 179 W (measured).
    for draw in (179.0, 349.0, 350.0):
        [result] = run_rule("clocks.power_cap", busy(h200, power_draw_w=draw))
        assert result.status is Status.OK
        assert ("load step" in result.message) == (draw < 350.0), result.message
    # a low clock fails even with a low draw
    [result] = run_rule("clocks.power_cap", busy(h200, power_draw_w=179.0, clock_sm_mhz=600))
    assert result.status is Status.WARNING


def test_unread_readings_never_make_capping_ok(h200, run_rule):
    for name in ("power_draw_w", "clock_sm_mhz", "clock_sm_max_mhz", "power_limit_default_w"):
        busy(h200)
        set_gpu(h200, **{name: Reading.failed("GPU is lost")})
        [result] = run_rule("clocks.power_cap", h200)
        assert result.status is Status.UNKNOWN, (name, result.message)


def history_of(h200, t_and_values):
    history = Samples()
    for t, values in t_and_values:
        history.add(busy(h200, **values), t)
    return history


def run_with_history(h200, default_rules, history):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    [result] = evaluate(h200, default_rules, Profile(), only=["clocks.power_cap"],
                        samples=history)
    return result


def test_daemon_fails_only_when_held_back_through_most_of_the_window(h200, default_rules):
    low = {"power_draw_w": 200.0}
    # 7 whole minutes at a low draw (every 5 s sample): persistent
    history = history_of(h200, [(t, low) for t in range(0, 7 * 60, 5)])
    result = run_with_history(h200, default_rules, history)
    assert result.status is Status.WARNING and "below 350 W throughout 7" in result.message
    assert result.observed["minutes_low_draw"] == 7
    # exactly 6 whole minutes (60% of 10) is enough
    history = history_of(h200, [(t, low) for t in range(0, 6 * 60, 5)])
    assert run_with_history(h200, default_rules, history).status is Status.WARNING
    # 5 minutes: not yet (fails at 6)
    history = history_of(h200, [(t, low) for t in range(0, 5 * 60, 5)])
    result = run_with_history(h200, default_rules, history)
    assert result.status is Status.OK and "not yet persistent" in result.message
    # a bursty server: one load step (low draw) in every minute, normal capping between
    steps = [(t, low if t % 60 == 0 else {}) for t in range(0, 10 * 60 + 5, 5)]
    result = run_with_history(h200, default_rules, history_of(h200, steps))
    assert result.status is Status.OK and result.observed["minutes_low_draw"] == 0
    # low clock held for 7 minutes
    history = history_of(h200, [(t, {"clock_sm_mhz": 700}) for t in range(0, 7 * 60, 5)])
    result = run_with_history(h200, default_rules, history)
    assert result.status is Status.WARNING and "SM 700" not in result.message
    assert "SM clock 700 of 1980 MHz" in result.message
    assert result.observed["minutes_low_clock"] == 7


def test_daemon_window_forgets_old_minutes(h200, default_rules):
    low = {"clock_sm_mhz": 700}
    # 7 low minutes, then 5 normal ones: minutes older than the 600 s window do not count
    samples = [(t, low) for t in range(0, 7 * 60, 5)] + \
        [(t, {}) for t in range(7 * 60, 12 * 60, 5)]
    result = run_with_history(h200, default_rules, history_of(h200, samples))
    assert result.status is Status.OK, result.message
    assert result.observed["minutes_low_clock"] == 5
    # one more low minute inside the window fails, and says what the GPU does now
    samples = [(t, low) for t in range(0, 7 * 60, 5)] + \
        [(t, {}) for t in range(7 * 60, 11 * 60, 5)]
    result = run_with_history(h200, default_rules, history_of(h200, samples))
    assert result.status is Status.WARNING
    assert "below 990 MHz throughout 6 of the last 10 minutes (now" in result.message


def test_daemon_counts_only_capped_samples(h200, default_rules):
    # seven idle minutes (no cap bit, 345 MHz, 80 W), then one capped sample at TDP
    idle = {"clock_event_reasons": 0x1, "clock_sm_mhz": 345, "power_draw_w": 80.0}
    samples = [(t, idle) for t in range(0, 7 * 60, 5)] + [(7 * 60, {})]
    result = run_with_history(h200, default_rules, history_of(h200, samples))
    assert result.status is Status.OK, result.message
    assert result.observed["minutes_low_clock"] == 0
    assert result.observed["minutes_low_draw"] == 0


# -- the daemon's HW slowdown window, boundaries and thresholds from the rule
# (scripts/mutate_rules.py survivors) ---------------------------------------------------


def slowdown_result(h200, rules, t_and_reasons, keep_s=660.0, rule="clocks.hw_slowdown"):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    history = Samples(keep_s=keep_s)
    for t, reasons in t_and_reasons:
        history.add(set_gpu(h200, clock_event_reasons=reasons), t)
    [result] = evaluate(h200, rules, Profile(), only=[rule], samples=history)
    return result


def test_daemon_fails_hw_slowdown_seen_in_most_minutes(h200, default_rules):
    # one sample a minute, six minutes with HW slowdown (60% of 10), none now
    samples = [(t, 0x8) for t in range(0, 360, 60)] + [(360, 0x1)]
    result = slowdown_result(h200, default_rules, samples)
    assert result.status is Status.CRITICAL
    assert result.message == "HW slowdown in 6 of the last 10 minutes"
    assert result.observed == {"reasons": "0x1", "minutes_with_slowdown": 6,
                               "minutes_needed": 6.0}
    # still slowed down now: the message says by what
    result = slowdown_result(h200, default_rules, [(t, 0x8) for t in range(0, 360, 60)])
    assert result.status is Status.CRITICAL
    assert result.message == "HW slowdown in 6 of the last 10 minutes, now HW slowdown"


def test_daemon_hw_slowdown_in_fewer_minutes_is_not_yet_a_fault(h200, default_rules):
    samples = [(t, 0x8) for t in range(0, 300, 60)]
    result = slowdown_result(h200, default_rules, samples)
    assert result.status is Status.OK
    assert result.message == ("HW slowdown now, seen in 5 minute(s) of the window: not yet "
                              "persistent (fails at 6)")
    result = slowdown_result(h200, default_rules, [*samples, (300, 0x1)])
    assert result.status is Status.OK
    assert result.message == "no hardware slowdown (reasons 0x1)"
    assert result.observed["minutes_with_slowdown"] == 5


def test_daemon_window_edge_and_first_cycle(h200, default_rules):
    # a slowdown exactly window_s (600 s) ago is outside the window; one second later it is in
    result = slowdown_result(h200, default_rules, [(0, 0x8), (590, 0x1), (600, 0x1)])
    assert result.observed["minutes_with_slowdown"] == 0
    result = slowdown_result(h200, default_rules, [(1, 0x8), (590, 0x1), (600, 0x1)])
    assert result.observed["minutes_with_slowdown"] == 1
    # only idle samples: no minute counted
    result = slowdown_result(h200, default_rules, [(t, 0x1) for t in range(0, 600, 10)])
    assert result.status is Status.OK and result.observed["minutes_with_slowdown"] == 0
    # the daemon's first cycle, before any sample: nothing counted yet
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    set_gpu(h200, clock_event_reasons=0x8)
    [result] = evaluate(h200, default_rules, Profile(), only=["clocks.hw_slowdown"],
                        samples=Samples())
    assert result.status is Status.OK and result.observed["minutes_with_slowdown"] == 0


def test_hw_slowdown_window_comes_from_the_rule(h200, tmp_path):
    rules = overridden(tmp_path, "clocks.hw_slowdown", window_s=3000, min_fraction=0.1)
    # 5 minutes of slowdown, all older than the default 600 s window, are 10% of 50 minutes
    samples = [(t, 0x8) for t in range(0, 300, 60)] + [(2000, 0x1)]
    result = slowdown_result(h200, rules, samples, keep_s=4000)
    assert result.status is Status.CRITICAL
    assert result.message == "HW slowdown in 5 of the last 50 minutes"
    assert result.observed["minutes_needed"] == 5.0


def test_power_cap_window_and_floors_come_from_the_rule(h200, tmp_path):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    rules = overridden(tmp_path, "clocks.power_cap", window_s=3000, min_fraction=0.1,
                       low_draw_ratio=0.9, min_sm_clock_ratio=0.8)

    def judged(t_and_values, keep_s=4000.0):
        history = Samples(keep_s=keep_s)
        for t, values in t_and_values:
            history.add(busy(h200, **values), t)
        [result] = evaluate(h200, rules, Profile(), only=["clocks.power_cap"], samples=history)
        return result

    # 1455 MHz is below 80% of 1980 (1584), and 5 of 50 minutes is 10%
    result = judged([(t, {}) for t in range(0, 300, 60)])
    assert result.status is Status.WARNING
    assert result.message.startswith("power capped with the SM clock below 1584 MHz "
                                     "throughout 5 of the last 50 minutes (now")
    assert result.observed["minutes_needed"] == 5.0
    # 600 W is below 90% of 700 W (630 W) with a clock above the floor
    result = judged([(t, {"power_draw_w": 600.0, "clock_sm_mhz": 1900})
                     for t in range(0, 300, 60)])
    assert result.status is Status.WARNING
    assert "drawing below 630 W throughout 5 of the last 50 minutes" in result.message
    # without history the clock floor is judged at once, and named with its ratio
    busy(h200)
    [result] = evaluate(h200, rules, Profile(), only=["clocks.power_cap"])
    assert result.status is Status.WARNING
    assert "below 1584 MHz (80% of its 1980 MHz maximum)" in result.message


def test_power_cap_counts_whole_minutes_and_not_the_floor_itself(h200, default_rules):
    # one sample a minute, each held back: six minutes, and the sixth fails
    held = [(t, {"clock_sm_mhz": 700}) for t in range(0, 360, 60)]
    result = run_with_history(h200, default_rules, history_of(h200, held))
    assert result.status is Status.WARNING and result.observed["minutes_low_clock"] == 6
    # at the floors (990 MHz, 350 W) is not below them
    at_floor = [(t, {"clock_sm_mhz": 990, "power_draw_w": 350.0}) for t in range(0, 420, 5)]
    result = run_with_history(h200, default_rules, history_of(h200, at_floor))
    assert result.observed["minutes_low_clock"] == 0
    assert result.observed["minutes_low_draw"] == 0
    # the first cycle: no minute yet
    busy(h200, clock_sm_mhz=700)
    result = run_with_history(h200, default_rules, Samples())
    assert result.status is Status.OK and result.observed["minutes_low_clock"] == 0


def test_lowered_limit_tolerance_is_power_limit_s(h200, tmp_path, run_rule):
    # With power.limit's tolerance raised to 250 W, 500 W of 700 counts as the default
    # limit here too: the low clock is then this rule's finding.
    rules = overridden(tmp_path, "power.limit", tolerance_w=250)
    busy(h200, power_limit_enforced_w=500.0, power_draw_w=495.0, clock_sm_mhz=900)
    assert run_rule("clocks.power_cap", h200, rules=rules)[0].status is Status.WARNING


def test_application_clocks_at_their_defaults_are_ok(run_rule):
    from tests.checks import h200x2

    results = run_rule("clocks.applications", h200x2.snapshot())
    assert {r.status for r in results} == {Status.OK}
    assert results[0].message == ("application clocks SM 1980 / memory 3201 MHz, at or above "
                                  "their defaults")


def test_application_clocks_below_the_defaults_warn_naming_both(h200, run_rule):
    set_gpu(h200, clock_sm_app_mhz=1980, clock_sm_app_default_mhz=1980,
            clock_mem_app_mhz=3201, clock_mem_app_default_mhz=3201)
    assert run_rule("clocks.applications", h200)[0].status is Status.OK
    set_gpu(h200, clock_sm_app_mhz=1979)
    [result] = run_rule("clocks.applications", h200)
    assert result.status is Status.WARNING
    assert result.message == ("application clocks below their defaults: SM 1979 MHz "
                              "(default 1980 MHz)")
    set_gpu(h200, clock_mem_app_mhz=1593)
    [result] = run_rule("clocks.applications", h200)
    assert result.message.endswith("SM 1979 MHz (default 1980 MHz), memory 1593 MHz "
                                   "(default 3201 MHz)")
    set_gpu(h200, clock_sm_app_mhz=Reading.not_supported())
    assert run_rule("clocks.applications", h200)[0].status is Status.SKIPPED
