import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.model.results import Status
from tests.conftest import set_gpu


def test_link_width_full_is_ok(h200, run_rule):
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.OK
    assert result.observed["current"] == result.observed["max"] == 16


def test_link_width_narrow_under_load_is_critical(h200, run_rule):
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=95)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.CRITICAL
    assert "x8" in result.message and "x16" in result.message
    assert result.remediation and "lspci" in result.remediation


def test_link_width_narrow_while_idle_is_not_judged(h200, run_rule):
    # False positive that users complain about: links narrow to save power at idle.
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=0)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.OK
    assert "idle" in result.message


def test_link_gen_idle_downshift_is_normal(h200, run_rule):
    set_gpu(h200, pcie_link_gen_current=1, utilization_gpu_percent=0)
    [result] = run_rule("pcie.link_gen", h200)
    assert result.status is Status.OK
    assert "power saving" in result.message


def test_link_gen_low_under_load_warns(h200, run_rule):
    set_gpu(h200, pcie_link_gen_current=3, utilization_gpu_percent=80)
    [result] = run_rule("pcie.link_gen", h200)
    assert result.status is Status.WARNING
    assert "Gen3" in result.message and "Gen5" in result.message


def test_busy_threshold_comes_from_the_rule(h200, run_rule, default_rules, tmp_path):
    # 15% is below the default busy threshold (20): not judged.
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=15)
    for rule_id in ("pcie.link_width", "pcie.link_gen"):
        assert run_rule(rule_id, h200)[0].status is Status.OK
    # The same 15% is busy once the rule's threshold says 10: the number is the rule's.
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "busy.yaml").write_text(
        "overrides:\n  pcie.link_width: {thresholds: {busy_utilization_percent: 10}}\n")
    lowered = load_ruleset([rules])
    assert run_rule("pcie.link_width", h200, rules=lowered)[0].status is Status.CRITICAL
    set_gpu(h200, utilization_gpu_percent=10)  # at the threshold is busy
    assert run_rule("pcie.link_width", h200, rules=lowered)[0].status is Status.CRITICAL
    set_gpu(h200, utilization_gpu_percent=9)
    assert run_rule("pcie.link_width", h200, rules=lowered)[0].status is Status.OK


def test_replays(h200, run_rule):
    [result] = run_rule("pcie.replays", h200)
    assert result.status is Status.OK
    set_gpu(h200, pcie_replay_counter=5000)
    [result] = run_rule("pcie.replays", h200)
    assert result.status is Status.WARNING
    assert "5000" in result.message


def aer_host(h200):
    from gpuguard.sources import sysfs
    from tests.conftest import FIXTURES, with_gpus

    snap = with_gpus(h200, ["00000000:3B:00.0", "00000000:86:00.0", "00000000:5E:00.0"])
    for gpu in snap.gpus:
        gpu.pcie_aer = sysfs.aer_chain(FIXTURES / "sysfs-aer", gpu.pci_bus_id.get())
        gpu.__post_init__()
    return snap


def test_aer_error_on_the_bridge_is_critical_and_named(h200, run_rule):
    riser, clean, vm = run_rule("pcie.aer", aer_host(h200))
    assert riser.status is Status.CRITICAL
    assert "bridge 0000:3a:00.0: 3 nonfatal (CmpltTO 3)" in riser.message
    assert "252 correctable (> 100; RxErr 240, BadTLP 12)" in riser.message
    assert clean.status is Status.OK
    assert "root port 0000:80:03.0" in clean.message
    assert vm.status is Status.SKIPPED  # no AER files: not available, not healthy


def test_correctable_only_is_a_warning(h200, run_rule, default_rules):
    snap = aer_host(h200)
    for device in snap.gpus[0].pcie_aer.get():
        device["nonfatal"] = {"TOTAL": 0}
    assert run_rule("pcie.aer", snap)[0].status is Status.WARNING


# -- boundaries and the daemon's replay rate (scripts/mutate_rules.py survivors) ---------

def test_full_width_and_generation_under_load_are_ok(h200, run_rule):
    # current == max is full speed, whether or not the GPU is busy.
    set_gpu(h200, utilization_gpu_percent=95)
    [width] = run_rule("pcie.link_width", h200)
    assert width.status is Status.OK and width.message == "x16 of x16"
    [gen] = run_rule("pcie.link_gen", h200)
    assert gen.status is Status.OK and gen.message == "Gen5 of Gen5"


def test_dcgm_replay_limit_per_generation():
    import pytest

    from gpuguard.checks.pcie import expected_replays_per_minute

    # 1e-12 x lane rate x 60 s per lane: 2.5, 5, 8, 16, 32, 64 GT/s for Gen1..6
    for gen, per_lane in ((1, 0.15), (2, 0.3), (3, 0.48), (4, 0.96), (5, 1.92), (6, 3.84)):
        assert expected_replays_per_minute(gen, 1) == pytest.approx(per_lane, rel=1e-12), gen
        assert expected_replays_per_minute(gen, 16) == pytest.approx(16 * per_lane, rel=1e-12)
    # a generation the table does not know is judged as Gen5
    assert expected_replays_per_minute(7, 1) == pytest.approx(1.92, rel=1e-12)


def replay_history(h200, counts):
    from gpuguard.model.samples import Samples

    history = Samples()
    for t, count in counts:
        history.add(set_gpu(h200, pcie_replay_counter=count), t)
    return history


def run_replays(h200, default_rules, counts, **gpu):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    set_gpu(h200, **gpu) if gpu else None
    history = replay_history(h200, counts)
    [result] = evaluate(h200, default_rules, Profile(), only=["pcie.replays"], samples=history)
    return result


def test_daemon_judges_the_replay_rate_not_the_count(h200, default_rules):
    # 5000 replays since the driver loaded but none in the last minute: the link is quiet.
    result = run_replays(h200, default_rules, [(0, 5000), (60, 5000)])
    assert result.status is Status.OK
    assert result.message == "PCIe replays at 0.00/min (limit 30.72/min)"
    assert result.observed == {"replays": 5000, "per_minute": 0.0, "limit_per_minute": 30.72,
                               "over_s": 60}
    # 100 new replays in 70 s on a Gen5 x16 link: above DCGM's 30.72/min
    result = run_replays(h200, default_rules, [(0, 0), (70, 100)])
    assert result.status is Status.WARNING
    assert result.message.startswith("PCIe replays at 85.71/min over 70 s, above DCGM's "
                                     "30.72/min")
    assert result.observed["per_minute"] == 85.714


def test_replay_rate_at_the_limit_is_ok(h200, default_rules):
    # Gen1 x4: 0.6/min. One replay in 100 s is exactly that, two are over.
    link = {"pcie_link_gen_current": 1, "pcie_link_width_current": 4}
    assert run_replays(h200, default_rules, [(0, 0), (100, 1)], **link).status is Status.OK
    assert run_replays(h200, default_rules, [(0, 0), (100, 2)], **link).status is Status.WARNING


def test_under_a_minute_of_history_the_count_is_judged(h200, default_rules):
    result = run_replays(h200, default_rules, [(0, 5000), (59, 5000)])
    assert result.status is Status.WARNING
    assert result.message == "5000 PCIe replays since the driver loaded (> 1000)"
    # one sample only: no rate either
    assert run_replays(h200, default_rules, [(0, 10)]).message == "10 PCIe replays"


def test_replay_rate_counts_from_the_last_counter_reset(h200, default_rules):
    # The driver reloaded at t=60 (the counter dropped): the rate is 100 over the 60 s since.
    result = run_replays(h200, default_rules, [(0, 100_000), (60, 0), (120, 100)])
    assert result.status is Status.WARNING
    assert result.observed["over_s"] == 60 and result.observed["per_minute"] == 100.0
    # an unchanged counter is not a reset: the rate runs over the whole 120 s
    result = run_replays(h200, default_rules, [(0, 0), (60, 0), (120, 100)])
    assert result.observed["over_s"] == 120 and result.observed["per_minute"] == 50.0
    # no reset: the rate runs from the first sample
    result = run_replays(h200, default_rules, [(0, 0), (30, 50), (90, 110)])
    assert result.observed["over_s"] == 90 and result.observed["per_minute"] == 73.333


def test_an_unread_replay_counter_is_left_out_of_the_rate(h200, default_rules):
    from gpuguard.model.snapshot import Reading

    history = replay_history(h200, [(0, 10), (30, Reading.failed("busy")), (90, 10)])
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile

    [result] = evaluate(h200, default_rules, Profile(), only=["pcie.replays"], samples=history)
    assert result.status is Status.OK and result.observed["over_s"] == 90


def test_replay_count_at_the_threshold_is_ok(h200, run_rule):
    set_gpu(h200, pcie_replay_counter=1000)
    assert run_rule("pcie.replays", h200)[0].status is Status.OK
    set_gpu(h200, pcie_replay_counter=1001)
    assert run_rule("pcie.replays", h200)[0].status is Status.WARNING


def aer_device(**counts):
    return {"address": "0000:86:00.0", "role": "gpu", **counts}


def test_one_fatal_error_is_critical_and_absent_counters_are_none(h200, run_rule):
    set_gpu(h200, pcie_aer=[aer_device(fatal={"TOTAL": 1, "SurpriseDown": 1})])
    [result] = run_rule("pcie.aer", h200)
    assert result.status is Status.CRITICAL
    assert result.message == "PCIe AER errors: gpu 0000:86:00.0: 1 fatal (SurpriseDown 1)"
    # files that list no TOTAL (or no file at all) count as no error
    set_gpu(h200, pcie_aer=[aer_device(fatal={}, nonfatal=None, correctable={})])
    [result] = run_rule("pcie.aer", h200)
    assert result.status is Status.OK
    assert result.message == "no uncorrectable AER errors on gpu 0000:86:00.0"


def test_correctable_limit_comes_from_the_rule(h200, run_rule, tmp_path):
    set_gpu(h200, pcie_aer=[aer_device(correctable={"TOTAL": 100})])
    assert run_rule("pcie.aer", h200)[0].status is Status.OK  # at the limit
    set_gpu(h200, pcie_aer=[aer_device(correctable={"TOTAL": 101, "RxErr": 101})])
    [result] = run_rule("pcie.aer", h200)
    assert result.status is Status.WARNING
    assert "101 correctable (> 100; RxErr 101)" in result.message
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "aer.yaml").write_text(
        "overrides:\n  pcie.aer: {thresholds: {max_correctable: 0}}\n")
    strict = load_ruleset([rules])
    set_gpu(h200, pcie_aer=[aer_device(correctable={"TOTAL": 1})])
    [result] = run_rule("pcie.aer", h200, rules=strict)
    assert result.status is Status.WARNING and "(> 0; )" in result.message
    set_gpu(h200, pcie_aer=[aer_device(correctable={})])  # no TOTAL: none counted
    assert run_rule("pcie.aer", h200, rules=strict)[0].status is Status.OK


def test_daemon_warns_when_correctable_errors_grow(h200, default_rules):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile
    from gpuguard.model.samples import Samples

    def judged(counts):
        history = Samples()
        for t, total in counts:
            history.add(set_gpu(h200, pcie_aer=[aer_device(correctable={"TOTAL": total})]), t)
        [result] = evaluate(h200, default_rules, Profile(), only=["pcie.aer"], samples=history)
        return result

    result = judged([(0, 3), (10, 8)])
    assert result.status is Status.WARNING
    assert result.message == "PCIe AER errors: correctable errors grew by 5 in the last 10 s"
    assert judged([(0, 8), (10, 8)]).status is Status.OK
    assert judged([(0, 8), (10, 9)]).status is Status.WARNING
    assert judged([(10, 8)]).status is Status.OK


# --- pcie.bandwidth (the active probe) ------------------------------------------------


def test_pcie_bandwidth_floor_is_70_percent_of_the_gen5_x16_link(h200, run_rule):
    from tests.checks.probed import probed

    assert run_rule("pcie.bandwidth", h200)[0].status is Status.SKIPPED  # no --active
    [result] = run_rule("pcie.bandwidth", probed(h200))  # the real 55.4 / 55.2 GB/s
    assert result.status is Status.OK
    assert result.observed["floor_gbps"] == 44.1 and result.observed["link"] == "Gen5 x16"
    # the slower direction is judged: at the floor ok, just below it a warning
    probed(h200, probe_pcie={"h2d_gbps": 55.4, "d2h_gbps": 44.11})
    assert run_rule("pcie.bandwidth", h200)[0].status is Status.OK
    probed(h200, probe_pcie={"h2d_gbps": 44.09, "d2h_gbps": 55.2})
    [result] = run_rule("pcie.bandwidth", h200)
    assert result.status is Status.WARNING and "44.1" in result.message


def test_pcie_bandwidth_floor_follows_the_link_the_rule_and_the_profile(h200, run_rule,
                                                                        tmp_path):
    from gpuguard.model.profile import Profile
    from tests.checks.probed import probed
    from tests.checks.test_memory import overridden

    probed(h200, probe_pcie={"h2d_gbps": 30.0, "d2h_gbps": 30.0})
    assert run_rule("pcie.bandwidth", h200)[0].status is Status.WARNING
    set_gpu(h200, pcie_link_gen_current=4)  # Gen4 x16: 31.5 GB/s, floor 22.1
    assert run_rule("pcie.bandwidth", h200)[0].status is Status.OK
    set_gpu(h200, pcie_link_gen_current=5)
    rules = overridden(tmp_path, "pcie.bandwidth", floor_fraction=0.4)
    assert run_rule("pcie.bandwidth", h200, rules=rules)[0].status is Status.OK
    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"pcie": 25.0}})
    assert run_rule("pcie.bandwidth", h200, profile)[0].status is Status.OK


def test_pcie_bandwidth_at_the_floor_is_ok_and_an_unknown_generation_not_judged(h200,
                                                                              run_rule):
    from gpuguard.model.profile import Profile
    from tests.checks.probed import probed

    probed(h200, probe_pcie={"h2d_gbps": 40.0, "d2h_gbps": 41.0})
    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"pcie": 40.0}})
    assert run_rule("pcie.bandwidth", h200, profile)[0].status is Status.OK
    assert run_rule("pcie.bandwidth", h200)[0].observed["link_gbps"] == 63.0  # 63.008
    set_gpu(h200, pcie_link_gen_current=7)
    [result] = run_rule("pcie.bandwidth", h200)
    assert result.status is Status.OK and "not judged" in result.message


@pytest.mark.parametrize(("gen", "floor"), [
    (1, 2.8), (2, 5.6), (3, 11.0), (4, 22.1), (5, 44.1), (6, 84.7)])
def test_pcie_bandwidth_floor_of_each_generation(h200, run_rule, gen, floor):
    """70 % of the per-lane rate (per direction) x 16 lanes: 0.25, 0.5, 0.985, 1.969,
    3.938, 7.563 GB/s per lane from Gen1 to Gen6."""
    from tests.checks.probed import probed

    probed(h200, probe_pcie={"h2d_gbps": 100.0, "d2h_gbps": 100.0})
    set_gpu(h200, pcie_link_gen_current=gen)
    [result] = run_rule("pcie.bandwidth", h200)
    assert result.observed["floor_gbps"] == floor, result.observed


def test_a_width_of_zero_is_unknown_not_idle(h200, run_rule):
    """x0 is no lane at all (issue 20): not a link narrowed to save power, never ok."""
    set_gpu(h200, pcie_link_width_current=0, utilization_gpu_percent=0)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.UNKNOWN and "x0 of x16" in result.message
    set_gpu(h200, utilization_gpu_percent=100)
    assert run_rule("pcie.link_width", h200)[0].status is Status.UNKNOWN
    set_gpu(h200, pcie_link_width_current=1, utilization_gpu_percent=0)
    assert run_rule("pcie.link_width", h200)[0].status is Status.OK  # idle x1: not judged
