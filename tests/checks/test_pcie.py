from gpuguard.results import Status
from gpuguard.ruleset import load_ruleset
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
