"""qualify.*: each rule on hand-made `qualify` readings of the real H200 recording (a
healthy standard run with the numbers the lent H200 gave: 622 TFLOPS, 688 of 700 W),
changed one fact at a time: each status, its action, and the numbers in its message."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.model.results import Status
from gpuguard.model.snapshot import GpuSnapshot, Reading
from tests.conftest import FIXTURES, gpuguard, overridden, set_gpu

GIB = 1024**3
RULES = ("qualify.run", "qualify.sdc", "qualify.power", "qualify.clocks", "qualify.throttle",
         "qualify.hbm_temperature", "qualify.ecc", "qualify.xid", "qualify.memtest",
         "qualify.bandwidth", "qualify.peer_bandwidth")
# rule -> the section it judges
SECTIONS = {"qualify.sdc": "compute", "qualify.power": "load", "qualify.clocks": "load",
            "qualify.throttle": "load", "qualify.hbm_temperature": "load", "qualify.ecc": "load",
            "qualify.xid": "load", "qualify.memtest": "memtest", "qualify.bandwidth": "bandwidth"}
TARGETS = {
    "model": "h200-sxm",
    "power_share": {"value": 0.9, "source": "gpuguard issue 29"},
    "hbm_gbps": {"value": 2333, "source": "DCGM diag-skus 2335"},
    "h2d_gbps": {"value": 48, "source": "Azure check_gpu_bw 48 335"},
    "d2h_gbps": {"value": 48, "source": "Azure check_gpu_bw 48 335"},
    "p2p_gbps": {"value": 335, "source": "Azure check_gpu_bw 48 335"},
    "correctable_ecc_per_hour": {"value": 1000, "source": "a site's limit", "note": "n"},
    "sm_clock_mhz": {"value": 1200, "source": "a cited floor"},
}


def healthy() -> dict[str, Any]:
    """A clean standard run on one H200 of a pair (GPU 1 its peer)."""
    return {
        "level": "standard", "refused": None, "drill": None, "error": None,
        "targets": copy.deepcopy(TARGETS),
        "compute": {"seconds": 35.0, "tflops": 622.0, "sms": 132, "launches": 800,
                    "tiles_computed": 422400, "tiles_compared": 422400, "moved_blocks": 3,
                    "mismatches": 0, "examples": [], "located": None},
        "memtest": {"bytes_tested": 130 * GIB, "free_bytes": 139 * GIB,
                    "patterns": ["address", "random"], "passes": 6, "mismatches": 0,
                    "seconds": 40.0, "gbps": 1800.0, "first": []},
        "bandwidth": {"h2d_gbps": 54.8, "d2h_gbps": 55.1, "d2d_gbps": 4150.0,
                      "bytes": 256 << 20},
        "peers": [{"peer": 1, "access": True, "gbps": 392.0, "reverse_gbps": 390.0}],
        "load": {
            "samples": 320, "interval_ms": 100.0, "power_w_median": 688.0,
            "power_w_max": 699.0, "power_limit_w": 700.0, "power_share": 0.983,
            "sm_clock_mhz": {"min": 1410, "median": 1470, "max": 1980},
            "mem_clock_mhz": {"min": 3201, "median": 3201, "max": 3201},
            "gpu_temp_c_max": 71, "hbm_temp_c_max": 62, "hbm_temp_limit_c": 95,
            "reasons": {"hw_slowdown": 0, "hw_thermal": 0, "hw_power_brake": 0,
                        "sw_power_cap": 290, "sw_thermal": 0},
            "ecc": {"uncorrectable_new": 0, "correctable_new": 3, "remap_pending": False,
                    "remap_pending_before": False, "remap_failed": False,
                    "remap_failed_before": False},
            "xids": [], "hours": 0.025},
    }


@pytest.fixture
def judge(h200, run_rule):
    """judge(rule, reading) -> the rule's one result on GPU 0 with that `qualify` reading."""
    def run(rule_id: str, reading: Any, rules: Any = None):
        set_gpu(h200, qualify=reading)
        [result] = run_rule(rule_id, h200, rules=rules)
        return result

    return run


def expect(result: Any, status: Status, *words: str, action: str | None = None) -> None:
    assert result.status is status, result.message
    for word in words:
        assert word in result.message, (word, result.message)
    if action is not None:
        assert result.action == action, result.action_reason


# --- what every qualify rule does: no run, a refusal, a bad reading, a clean run ------

@pytest.mark.parametrize("rule_id", RULES)
def test_without_a_run_every_rule_is_skipped(judge, rule_id):
    expect(judge(rule_id, Reading()), Status.SKIPPED, "gpuguard qualify did not run")


@pytest.mark.parametrize("rule_id", RULES)
def test_a_refused_gpu_is_unknown_with_the_reason(judge, rule_id):
    why = "held by 2 compute process(es): pid 1234 (python3), pid 99 (vllm)"
    refused = {"level": "standard", "refused": why, "drill": None, "error": None,
               "targets": None}
    result = judge(rule_id, refused)
    expect(result, Status.UNKNOWN, why, action="none")
    assert result.observed["refused"] == why


@pytest.mark.parametrize("rule_id", RULES)
def test_a_bad_reading_is_unknown(judge, rule_id):
    bad = healthy()
    bad["compute"]["mismatches"] = -1
    expect(judge(rule_id, bad), Status.UNKNOWN, "invalid qualify", "compute mismatches")


@pytest.mark.parametrize("rule_id", RULES)
def test_a_clean_run_is_ok_everywhere(judge, rule_id):
    expect(judge(rule_id, healthy()), Status.OK, action="none")


@pytest.mark.parametrize("rule_id", sorted(SECTIONS))
def test_a_section_not_measured_is_unknown_naming_the_error(judge, rule_id):
    reading = healthy()
    del reading[SECTIONS[rule_id]]
    expect(judge(rule_id, reading), Status.UNKNOWN, f"not measured: {SECTIONS[rule_id]}")
    reading["error"] = {"kind": "hung", "phase": "burn", "text": "no line for 10 s",
                        "code": None}
    result = judge(rule_id, reading)
    expect(result, Status.UNKNOWN, "the run stopped in its burn phase (hung: no line for 10 s)")
    assert result.observed["error"]["phase"] == "burn"


# --- qualify.run ------------------------------------------------------------------

def failed(kind: str, code: int | None = None, text: str = "boom", phase: str = "burn"
           ) -> dict[str, Any]:
    reading = healthy()
    reading["error"] = {"kind": kind, "phase": phase, "text": text, "code": code}
    return reading


def test_run_ok_names_the_level(judge):
    expect(judge("qualify.run", healthy()), Status.OK, "the standard run finished")


def test_run_a_cuda_error_under_load_is_critical_and_reset(judge):
    text = "cuCtxSynchronize returned 999 CUDA_ERROR_UNKNOWN (unknown error)"
    result = judge("qualify.run", failed("cuda", 999, text))
    expect(result, Status.CRITICAL, "in the burn phase", text, action="reset_gpu")
    assert result.message.count("999") == 1
    assert result.observed["error"]["code"] == 999


def test_run_a_cuda_error_is_named_when_its_text_does_not(judge):
    result = judge("qualify.run", failed("cuda", 719, "the launch failed", "memtest"))
    expect(result, Status.CRITICAL, "in the memtest phase: the launch failed (719 "
           "CUDA_ERROR_LAUNCH_FAILED", action="reset_gpu")
    expect(judge("qualify.run", failed("cuda", None, "no code")), Status.CRITICAL, "no code")


@pytest.mark.parametrize("code", [2, 46, 805])
def test_run_a_gpu_the_run_could_not_have_is_unknown(judge, code):
    result = judge("qualify.run", failed("cuda", code, f"cuMemAlloc returned {code} X"))
    expect(result, Status.UNKNOWN, "could not have the GPU in its burn phase",
           f"returned {code} X", "run qualify again")


@pytest.mark.parametrize(("kind", "words"), [
    ("hung", "hung"), ("died", "died"), ("stopped", "was stopped"),
    ("deadline", "ran past its deadline"), ("fatal", "failed in gpuguard's worker")])
def test_run_a_run_that_did_not_finish_is_unknown_naming_the_phase(judge, kind, words):
    result = judge("qualify.run", failed(kind, None, "no line for 10 s", "memtest"))
    expect(result, Status.UNKNOWN, f"the standard run {words} in its memtest phase: "
           "no line for 10 s")


# --- qualify.sdc ------------------------------------------------------------------

def located(outcome: str, sms: list[int], drill: int | None = None, mismatches: int = 4,
            count: int = 16) -> dict[str, Any]:
    reading = healthy()
    reading["drill"] = None if drill is None else {"sm": drill}
    reading["compute"]["mismatches"] = mismatches
    reading["compute"]["examples"] = [{"kind": "exact", "sm": 17, "tile": 9, "word": 3,
                                       "expected": "0x3f800000", "got": "0x3f800001"}]
    reading["compute"]["located"] = {
        "outcome": outcome, "sms": sms, "tile": 9, "kind": "exact", "expected": "0x3f800000",
        "got": "0x3f800001", "count": count, "checked_sms": 132}
    return reading


def test_sdc_ok_says_every_result_was_compared(judge):
    result = judge("qualify.sdc", healthy())
    expect(result, Status.OK, "422400 tiles computed on 132 SMs in 35 s at 622 TFLOPS",
           "422400 compared, 0 wrong", "3 blocks moved SM")


def test_sdc_located_on_one_sm_is_critical_and_goes_to_a_person(judge):
    result = judge("qualify.sdc", located("sm", [17]))
    expect(result, Status.CRITICAL, "silent data corruption", "tile 9 (exact)",
           "on SM 17:", "expected 0x3f800000, got 0x3f800001", "16 word(s) wrong",
           "right on the other 131 of 132 SMs", action="inspect_hardware")
    assert "wrong data" in result.action_reason
    assert result.observed["sms"] == [17] and result.observed["mismatches"] == 16
    assert result.observed["located"]["tile"] == 9
    assert judge("qualify.sdc", healthy()).observed["located"] is None


def test_sdc_located_on_two_sms_names_both(judge):
    result = judge("qualify.sdc", located("sm", [17, 40]))
    expect(result, Status.CRITICAL, "on SM 17, 40:", "other 130 of 132")


def test_sdc_a_drill_found_on_its_sm_is_critical_and_says_drill(judge):
    result = judge("qualify.sdc", located("sm", [17], drill=17))
    expect(result, Status.CRITICAL, "drill: the bit flipped on purpose on SM 17",
           "found and located", "on SM 17:", "a drill run records no pass",
           action="inspect_hardware")
    assert "silent data corruption" not in result.message


def test_sdc_a_drill_beside_a_real_corruption_names_the_real_one(judge):
    result = judge("qualify.sdc", located("sm", [5, 17], drill=17))
    expect(result, Status.CRITICAL, "silent data corruption", "on SM 5:")
    assert result.observed["sms"] == [5]


def test_sdc_a_drill_whose_bit_was_not_found_is_unknown(judge):
    reading = healthy()
    reading["drill"] = {"sm": 17}
    expect(judge("qualify.sdc", reading), Status.UNKNOWN,
           "the drill's flipped bit was not found: the verification path is broken",
           "--inject-bit-flip on SM 17", "0 wrong")
    expect(judge("qualify.sdc", located("every_sm", [], drill=17)), Status.UNKNOWN,
           "the drill's flipped bit was not found", "4 wrong")


def test_sdc_wrong_on_every_sm_is_our_bug_never_critical(judge):
    result = judge("qualify.sdc", located("every_sm", list(range(132))))
    expect(result, Status.UNKNOWN, "gpuguard's kernel disagrees with its reference",
           "tile 9 (exact)", "wrong on all 132 SMs", "expected 0x3f800000, got "
           "0x3f800001", "a gpuguard bug", action="none")


def test_sdc_not_reproduced_is_a_warning_to_run_again(judge):
    result = judge("qualify.sdc", located("not_reproduced", [], count=0))
    expect(result, Status.WARNING, "wrong once but not when tile 9 (exact) was computed "
           "again on 132 SMs", "run qualify again", "4 wrong", action="none")


def test_sdc_results_not_all_compared_are_unknown(judge):
    reading = healthy()
    reading["compute"]["tiles_compared"] = 422399
    expect(judge("qualify.sdc", reading), Status.UNKNOWN, "not every result was verified",
           "422400 tiles computed", "422399 compared")


def test_sdc_wrong_results_not_located_are_unknown_naming_the_stop(judge):
    reading = located("sm", [17])
    reading["compute"]["located"] = None
    reading["error"] = {"kind": "deadline", "phase": "locate", "text": "past 120 s",
                        "code": None}
    expect(judge("qualify.sdc", reading), Status.UNKNOWN, "wrong results not located",
           "stopped in its locate phase (deadline: past 120 s)", "4 wrong")


# --- qualify.power ------------------------------------------------------------------

def loaded(**values: Any) -> dict[str, Any]:
    reading = healthy()
    reading["load"].update(values)
    return reading


def test_power_at_the_target_is_ok(judge):
    expect(judge("qualify.power", healthy()), Status.OK, "power 688 W median under load, "
           "98 % of the 700 W limit (the h200-sxm target: 90 %)")
    expect(judge("qualify.power", loaded(power_share=0.9)), Status.OK, "90 % of the 700 W")


def test_power_below_the_target_warns_with_the_numbers_and_the_source(judge):
    result = judge("qualify.power", loaded(power_w_median=612.0, power_share=0.874))
    expect(result, Status.WARNING, "power 612 W median under load, 87 % of the 700 W limit, "
           "below the h200-sxm target of 90 % (source: gpuguard issue 29)", action="none")
    assert result.observed["target"] == 0.9


def test_power_without_a_target_is_reported_not_judged(judge):
    reading = loaded(power_w_median=300.0, power_share=0.43)
    reading["targets"] = None
    expect(judge("qualify.power", reading), Status.OK, "power 300 W median", "43 % of the "
           "700 W limit; no power target for NVIDIA H200: not judged")
    reading["targets"] = {"model": "l40s"}
    expect(judge("qualify.power", reading), Status.OK, "no power target for l40s")


def test_power_not_read_is_unknown(judge):
    expect(judge("qualify.power", loaded(power_share=None)), Status.UNKNOWN,
           "not measured: load power_share")


# --- qualify.clocks -----------------------------------------------------------------

def test_clocks_are_reported_and_judged_against_the_floor(judge):
    expect(judge("qualify.clocks", healthy()), Status.OK, "SM clock 1410-1980 MHz under "
           "load, median 1470 MHz; memory clock median 3201 MHz (the h200-sxm floor: "
           "1200 MHz)")
    reading = healthy()
    reading["load"]["sm_clock_mhz"]["median"] = 1200
    expect(judge("qualify.clocks", reading), Status.OK, "median 1200 MHz")
    reading["load"]["sm_clock_mhz"]["median"] = 1100
    result = judge("qualify.clocks", reading)
    expect(result, Status.WARNING, "median 1100 MHz", "below the h200-sxm floor of 1200 MHz "
           "(source: a cited floor)", action="none")


def test_clocks_without_a_floor_are_not_judged(judge):
    reading = loaded(mem_clock_mhz=None)
    del reading["targets"]["sm_clock_mhz"]
    result = judge("qualify.clocks", reading)
    expect(result, Status.OK, "median 1470 MHz; no SM clock floor for h200-sxm: not judged")
    assert "memory clock" not in result.message


def test_clocks_not_read_are_unknown(judge):
    expect(judge("qualify.clocks", loaded(sm_clock_mhz=None)), Status.UNKNOWN,
           "not measured: load sm_clock_mhz")


# --- qualify.throttle ---------------------------------------------------------------

def reasons(**counts: int) -> dict[str, Any]:
    reading = healthy()
    reading["load"]["reasons"].update(counts)
    return reading


def test_throttle_the_sw_power_cap_is_expected(judge):
    expect(judge("qualify.throttle", reasons(sw_power_cap=320)), Status.OK,
           "no HW slowdown, HW thermal slowdown or HW power brake in 320 load samples; "
           "SW power cap in 320 (expected at full load)")


@pytest.mark.parametrize(("key", "name"), [("hw_slowdown", "HW slowdown"),
                                           ("hw_thermal", "HW thermal slowdown"),
                                           ("hw_power_brake", "HW power brake")])
def test_throttle_any_hw_reason_is_critical_hardware(judge, key, name):
    result = judge("qualify.throttle", reasons(**{key: 1}))
    expect(result, Status.CRITICAL, f"the board slowed itself down under load: {name} in 1 "
           "of 320 samples", "SW power cap in 290", action="inspect_hardware")


def test_throttle_names_every_hw_reason_seen(judge):
    result = judge("qualify.throttle", reasons(hw_slowdown=4, hw_power_brake=2))
    expect(result, Status.CRITICAL, "HW slowdown in 4, HW power brake in 2 of 320")
    assert "thermal" not in result.message


def test_throttle_sw_thermal_warns(judge):
    expect(judge("qualify.throttle", reasons(sw_thermal=7)), Status.WARNING,
           "SW thermal slowdown in 7 of 320 samples", "temperature target", action="none")


def test_throttle_allows_what_the_threshold_allows(judge, tmp_path):
    rules = overridden(tmp_path, "qualify.throttle", max_hw_samples=3)
    expect(judge("qualify.throttle", reasons(hw_slowdown=2, hw_thermal=1), rules), Status.OK,
           "HW slowdown in 2, HW thermal slowdown in 1 in 320 load samples")
    expect(judge("qualify.throttle", reasons(hw_slowdown=2, hw_thermal=2), rules),
           Status.CRITICAL, "HW slowdown in 2, HW thermal slowdown in 2 of 320")


def test_throttle_without_samples_is_unknown(judge):
    expect(judge("qualify.throttle", loaded(samples=0)), Status.UNKNOWN,
           "no sample in the load window")
    reading = loaded(samples=0)
    reading["error"] = {"kind": "died", "phase": "burn", "text": "signal 9", "code": None}
    expect(judge("qualify.throttle", reading), Status.UNKNOWN, "no sample in the load window: "
           "the run stopped in its burn phase (died: signal 9)")
    expect(judge("qualify.throttle", loaded(reasons=None)), Status.UNKNOWN,
           "not measured: load reasons")


# --- qualify.hbm_temperature ----------------------------------------------------------

def test_hbm_temperature_below_its_limit_is_ok(judge):
    expect(judge("qualify.hbm_temperature", healthy()), Status.OK,
           "HBM peaked at 62 C under load, 33 C below its 95 C limit")
    expect(judge("qualify.hbm_temperature", loaded(hbm_temp_c_max=94)), Status.OK,
           "1 C below its 95 C limit")


def test_hbm_temperature_at_its_limit_is_critical(judge):
    result = judge("qualify.hbm_temperature", loaded(hbm_temp_c_max=95))
    expect(result, Status.CRITICAL, "HBM reached 95 C under load, at its 95 C limit",
           action="inspect_hardware")
    expect(judge("qualify.hbm_temperature", loaded(hbm_temp_limit_c=1)), Status.CRITICAL,
           "at its 1 C limit")


def test_hbm_temperature_without_a_limit_or_a_sensor(judge):
    for limit in (None, 0):
        expect(judge("qualify.hbm_temperature", loaded(hbm_temp_limit_c=limit)), Status.OK,
               "HBM peaked at 62 C under load; no HBM temperature limit given: not judged")
    expect(judge("qualify.hbm_temperature", loaded(hbm_temp_c_max=None)), Status.SKIPPED,
           "the GPU reports no HBM temperature")


# --- qualify.ecc --------------------------------------------------------------------

def ecc(**values: Any) -> dict[str, Any]:
    reading = healthy()
    reading["load"]["ecc"].update(values)
    return reading


def test_ecc_clean_reports_the_correctable_rate(judge):
    expect(judge("qualify.ecc", healthy()), Status.OK, "no new uncorrectable ECC error, no "
           "new pending or failed row remap; 3 new correctable error(s) in 1.5 min, 120/h "
           "against the h200-sxm limit of 1000/h (source: a site's limit)")


def test_ecc_a_new_uncorrectable_error_is_critical_and_reset(judge):
    result = judge("qualify.ecc", ecc(uncorrectable_new=2))
    expect(result, Status.CRITICAL, "under load: 2 new uncorrectable ECC error(s); 3 new "
           "correctable", action="reset_gpu")
    assert result.action_reason == "a reset applies the row remap"


def test_ecc_a_remap_that_became_pending_is_critical_one_pending_before_is_not(judge):
    expect(judge("qualify.ecc", ecc(remap_pending=True)), Status.CRITICAL,
           "a row remap became pending", action="reset_gpu")
    expect(judge("qualify.ecc", ecc(remap_pending=True, remap_pending_before=True)),
           Status.OK, "no new pending")


def test_ecc_a_remapping_that_failed_goes_to_a_person(judge):
    result = judge("qualify.ecc", ecc(remap_failed=True, uncorrectable_new=1))
    expect(result, Status.CRITICAL, "1 new uncorrectable ECC error(s); row remapping failed",
           action="inspect_hardware")
    assert "no reset adds a spare row" in result.action_reason
    expect(judge("qualify.ecc", ecc(remap_failed=True, remap_failed_before=True)), Status.OK,
           "no new pending or failed")


def test_ecc_a_correctable_rate_above_the_model_warns(judge):
    result = judge("qualify.ecc", ecc(correctable_new=26))
    expect(result, Status.WARNING, "26 new correctable error(s) in 1.5 min, 1040/h against "
           "the h200-sxm limit of 1000/h", action="none")
    expect(judge("qualify.ecc", ecc(correctable_new=25)), Status.OK, "1000/h")
    reading = ecc(correctable_new=30)
    reading["load"]["hours"] = 0.5
    expect(judge("qualify.ecc", reading), Status.OK, "30 new correctable error(s) in 30.0 min, "
           "60/h")


def test_ecc_correctable_not_judged_without_a_target_or_a_length(judge):
    reading = ecc(correctable_new=5000)
    del reading["targets"]["correctable_ecc_per_hour"]
    expect(judge("qualify.ecc", reading), Status.OK, "5000 new correctable error(s); no "
           "correctable rate for h200-sxm: not judged")
    reading = ecc(correctable_new=5000)
    reading["load"]["hours"] = 0.0
    expect(judge("qualify.ecc", reading), Status.OK, "5000 new correctable error(s); the "
           "run's length unknown: not judged")
    expect(judge("qualify.ecc", ecc(correctable_new=None)), Status.OK,
           "correctable errors not read")


@pytest.mark.parametrize("key", ["uncorrectable_new", "remap_pending", "remap_failed"])
def test_ecc_not_read_is_unknown(judge, key):
    expect(judge("qualify.ecc", ecc(**{key: None})), Status.UNKNOWN,
           f"ECC not read under load: {key}")
    expect(judge("qualify.ecc", loaded(ecc=None)), Status.UNKNOWN, "not measured: load ecc")


# --- qualify.xid --------------------------------------------------------------------

def xids(*codes: int) -> dict[str, Any]:
    return loaded(xids=[{"code": code, "text": None} for code in codes])


def test_xid_none_during_the_run_is_ok(judge):
    expect(judge("qualify.xid", healthy()), Status.OK, "no Xid during the run")


def test_xid_of_the_critical_set_takes_the_catalog_action(judge):
    result = judge("qualify.xid", xids(48))
    expect(result, Status.CRITICAL, "1 Xid(s) of the critical set under load: 1 x Xid 48 "
           "(double-bit ECC error)", action="reset_gpu")
    assert result.action_reason == "Xid 48 in the catalog"
    result = judge("qualify.xid", xids(43, 48, 79, 79))
    expect(result, Status.CRITICAL, "3 Xid(s) of the critical set", "1 x Xid 48 (double-bit "
           "ECC error); 2 x Xid 79", action="reboot")
    assert "Xid 43" not in result.message and result.observed["xids"] == [43, 48, 79, 79]


def test_xid_outside_the_critical_set_is_reported(judge):
    expect(judge("qualify.xid", xids(43, 13, 43)), Status.OK, "no Xid of the critical set "
           "during the run; seen: 2 x Xid 43 (GPU stopped processing", "ignore); 1 x Xid 13 "
           "(graphics engine exception (usually an application bug); warning)")


def test_xid_a_flood_is_judged_not_refused(judge):
    result = judge("qualify.xid", xids(*[79] * 1001))
    expect(result, Status.CRITICAL, "1001 Xid(s) of the critical set under load: 1001 x Xid 79 "
           "(GPU has fallen off the bus)", action="reboot")
    assert judge("qualify.xid", xids(*[79] * 1025)).status is Status.UNKNOWN


def test_xid_not_read_is_unknown(judge):
    expect(judge("qualify.xid", loaded(xids=None)), Status.UNKNOWN, "not measured: load xids")


# --- qualify.memtest ------------------------------------------------------------------

def memtested(**values: Any) -> dict[str, Any]:
    reading = healthy()
    reading["memtest"].update(values)
    return reading


def test_memtest_clean_names_size_coverage_and_speed(judge):
    expect(judge("qualify.memtest", healthy()), Status.OK, "every word read back right: "
           "130.0 GiB tested, 94 % of 139.0 GiB free, 6 passes (address, random) at 1800 GB/s")
    expect(judge("qualify.memtest", memtested(patterns=None)), Status.OK, "6 passes (?)")
    assert judge("qualify.memtest", healthy()).observed["coverage"] == 0.935


def test_memtest_wrong_words_are_critical_naming_the_first(judge):
    first = [{"address": f"0x7f00{n:04x}", "expected": "0x00007f0000000000",
              "got": "0x00007f0000000010"} for n in range(4)]
    result = judge("qualify.memtest", memtested(mismatches=12, first=first, bytes_tested=GIB))
    expect(result, Status.CRITICAL, "12 word(s) read back wrong (1.0 GiB tested, 1 % of "
           "139.0 GiB free); first: 0x7f000000 expected 0x00007f0000000000 got "
           "0x00007f0000000010; 0x7f000001", action="inspect_hardware")
    assert "0x7f000003" not in result.message
    expect(judge("qualify.memtest", memtested(mismatches=1, first=[])), Status.CRITICAL,
           "first: not recorded")


def test_memtest_that_covered_too_little_is_unknown(judge, tmp_path):
    expect(judge("qualify.memtest", memtested(bytes_tested=125 * GIB)), Status.UNKNOWN,
           "covered too little", "125.0 GiB tested, 90 % of 139.0 GiB free, below 90 %")
    expect(judge("qualify.memtest", memtested(bytes_tested=90 * GIB, free_bytes=100 * GIB)),
           Status.OK, "90 % of 100.0 GiB free")
    expect(judge("qualify.memtest", memtested(free_bytes=0, bytes_tested=0)), Status.UNKNOWN,
           "0 % of 0.0 GiB free")
    rules = overridden(tmp_path, "qualify.memtest", min_coverage=0.95)
    expect(judge("qualify.memtest", healthy(), rules), Status.UNKNOWN, "below 95 %")


def test_memtest_at_the_quick_level_is_a_sample(judge):
    reading = memtested(bytes_tested=GIB)
    reading["level"] = "quick"
    expect(judge("qualify.memtest", reading), Status.OK, "1.0 GiB tested, 1 % of 139.0 GiB")


# --- qualify.bandwidth ----------------------------------------------------------------

def copies(**values: Any) -> dict[str, Any]:
    reading = healthy()
    reading["bandwidth"].update(values)
    return reading


def test_bandwidth_above_the_floors_is_ok(judge):
    expect(judge("qualify.bandwidth", healthy()), Status.OK, "host to device 54.8 GB/s "
           "(floor 48), device to host 55.1 GB/s (floor 48), device to device 4150.0 GB/s "
           "(floor 2333)")
    expect(judge("qualify.bandwidth", copies(h2d_gbps=48.0, d2d_gbps=2333.0)), Status.OK)


@pytest.mark.parametrize(("key", "label", "floor", "source"), [
    ("h2d_gbps", "host to device", 48, "Azure"), ("d2h_gbps", "device to host", 48, "Azure"),
    ("d2d_gbps", "device to device", 2333, "DCGM diag-skus 2335")])
def test_bandwidth_below_a_floor_warns_naming_it(judge, key, label, floor, source):
    result = judge("qualify.bandwidth", copies(**{key: 27.1}))
    expect(result, Status.WARNING, f"{label} 27.1 GB/s, below the h200-sxm floor of {floor} "
           f"GB/s (source: {source}", action="none")
    assert result.message.count("below") == 1


def test_bandwidth_without_targets_is_reported(judge):
    reading = copies(h2d_gbps=5.0)
    reading["targets"] = None
    expect(judge("qualify.bandwidth", reading), Status.OK, "host to device 5.0 GB/s (no "
           "floor: not judged)", "device to device 4150.0 GB/s (no floor: not judged)")


# --- qualify.peer_bandwidth -----------------------------------------------------------

def peers(*entries: dict[str, Any]) -> dict[str, Any]:
    reading = healthy()
    reading["peers"] = list(entries)
    return reading


def test_peer_bandwidth_above_the_floor_is_ok(judge):
    expect(judge("qualify.peer_bandwidth", healthy()), Status.OK,
           "peer copies with GPU 1 390 GB/s (floor 335 GB/s)")
    at = peers({"peer": 1, "access": True, "gbps": 335.0, "reverse_gbps": 400.0})
    expect(judge("qualify.peer_bandwidth", at), Status.OK, "GPU 1 335 GB/s")


def test_peer_bandwidth_below_the_floor_warns(judge):
    slow = peers({"peer": 1, "access": True, "gbps": 392.0, "reverse_gbps": 120.4},
                 {"peer": 2, "access": True, "gbps": 392.0, "reverse_gbps": 391.0})
    result = judge("qualify.peer_bandwidth", slow)
    expect(result, Status.WARNING, "peer copies below the h200-sxm floor of 335 GB/s "
           "(source: Azure check_gpu_bw 48 335): GPU 1 at 120 GB/s", action="none")
    assert "GPU 2" not in result.message
    assert [p["peer"] for p in result.observed["peers"]] == [1, 2]


def test_peer_bandwidth_with_no_peer(judge):
    reading = healthy()
    del reading["peers"]
    expect(judge("qualify.peer_bandwidth", reading), Status.OK, "no peer: no other GPU")
    expect(judge("qualify.peer_bandwidth", peers()), Status.OK, "no peer")
    reading["error"] = {"kind": "stopped", "phase": "bandwidth", "text": "SIGTERM",
                        "code": None}
    expect(judge("qualify.peer_bandwidth", reading), Status.UNKNOWN, "peer copies not "
           "measured: the run stopped in its bandwidth phase (stopped: SIGTERM)")


def test_peer_bandwidth_leaves_peer_access_to_p2p_status(judge):
    reading = peers({"peer": 1, "access": False, "gbps": None, "reverse_gbps": None})
    expect(judge("qualify.peer_bandwidth", reading), Status.OK,
           "GPU 1: no peer access (p2p.status judges it)")


@pytest.mark.parametrize(("entry", "words"), [
    ({"peer": 1, "access": True, "gbps": 392.0, "reverse_gbps": None}, "GPU 1: not measured"),
    ({"peer": 1, "access": True, "gbps": None, "reverse_gbps": 3.0}, "GPU 1: not measured"),
    ({"peer": 1, "access": True, "gbps": 392.0, "reverse_gbps": 390.0,
      "error": "cuMemcpyPeer returned 700"}, "GPU 1: cuMemcpyPeer returned 700")])
def test_peer_bandwidth_a_copy_not_measured_is_unknown(judge, entry, words):
    expect(judge("qualify.peer_bandwidth", peers(entry)), Status.UNKNOWN,
           f"peer copies not measured with {words}")


def test_peer_bandwidth_without_a_floor_is_not_judged(judge):
    reading = peers({"peer": 1, "access": True, "gbps": 20.0, "reverse_gbps": 20.0})
    reading["targets"] = None
    expect(judge("qualify.peer_bandwidth", reading), Status.OK, "GPU 1 20 GB/s (not judged: "
           "no peer floor for NVIDIA H200)")


# --- the reading: hostile values are unknown, never a traceback -------------------------

@pytest.mark.parametrize("value", [
    [], "standard", {"level": "fast"}, {"level": "quick", "refused": 3},
    {"level": "quick", "drill": {"sm": -1}}, {"level": "quick", "drill": 5},
    {"level": "quick", "error": {"kind": "oops", "phase": "burn", "text": "x"}},
    {"level": "quick", "targets": {"power_share": {"value": float("nan"), "source": "s"}}},
    {"level": "quick", "targets": {"model": 7}},
    {"level": "quick", "targets": {"hbm_gbps": {"value": 1.0}}},
    {"level": "quick", "compute": {"tiles_computed": 1}},
    {"level": "quick", "memtest": {**healthy()["memtest"], "first": [{}] * 65}},
    {"level": "quick", "memtest": {**healthy()["memtest"], "patterns": [1]}},
    {"level": "quick", "memtest": {**healthy()["memtest"], "free_bytes": 2**64}},
    {"level": "quick", "bandwidth": {"h2d_gbps": float("inf"), "d2h_gbps": 1, "d2d_gbps": 1}},
    {"level": "quick", "peers": [{"peer": 1, "access": "yes"}]},
    {"level": "quick", "peers": {"peer": 1}},
    {"level": "quick", "load": {"samples": True}},
    {"level": "quick", "load": {"samples": 1, "hbm_temp_c_max": 900}},
    {"level": "quick", "load": {"samples": 1, "power_share": -0.1}},
    {"level": "quick", "load": {"samples": 1, "reasons": {"hw_slowdown": 1}}},
    {"level": "quick", "load": {"samples": 1, "ecc": {"remap_failed": "no"}}},
    {"level": "quick", "load": {"samples": 1, "xids": [{"code": "79"}]}},
    {"level": "quick", "load": {"samples": 1, "sm_clock_mhz": {"min": 1.5}}},
    {"level": "quick", "load": {"samples": 1, "hours": 1e300}},
    {"level": "quick", "refused": "x" * 5000},
])
def test_a_hostile_reading_becomes_an_error_reading(value):
    gpu = GpuSnapshot(index=0, qualify=Reading.ok(value))
    assert gpu.qualify.state == "error" and "invalid qualify" in (gpu.qualify.error or "")


def test_the_located_sms_and_extra_keys_are_accepted():
    reading = located("every_sm", list(range(148)))
    reading["phases_ms"] = {"burn": 35000.0}
    reading["error"] = {"kind": "cuda", "phase": "peer", "text": "x", "code": 1,
                        "meaning": "1 CUDA_ERROR_INVALID_VALUE"}
    assert GpuSnapshot(index=0, qualify=Reading.ok(reading)).qualify.is_ok
    reading["compute"]["located"]["sms"] = list(range(1025))
    assert GpuSnapshot(index=0, qualify=Reading.ok(reading)).qualify.state == "error"


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the healthy reading a value sits (keys and list indexes)."""
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else []
    return [at] + [p for key, inner in items for p in _paths(inner, (*at, key))]


HOSTILE = st.none() | st.booleans() | st.integers(-2, 2**65) | st.floats() | \
    st.text(max_size=8) | st.lists(st.integers(), max_size=3) | \
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(_paths(located("sm", [17], drill=3))[1:]), value=HOSTILE)
def test_any_value_anywhere_is_judged_or_unknown_never_a_broken_check(h200, run_rule, where,
                                                                      value):
    """A valid reading is one every check can judge: whatever one value of a full reading
    becomes, each rule either judges it or is unknown for an invalid reading."""
    reading = located("sm", [17], drill=3)
    inner = reading
    for key in where[:-1]:
        inner = inner[key]
    inner[where[-1]] = value
    set_gpu(h200, qualify=reading)
    for result in run_rule("qualify.*", h200):
        assert not result.message.startswith("check failed"), (where, value, result.message)


def test_a_replayed_file_with_a_hostile_qualify_reading_is_unknown(tmp_path):
    raw = json.loads((FIXTURES / "h200-live" / "idle-snapshot.json").read_text())
    raw["gpus"][0]["qualify"] = {"level": "standard", "compute": {"mismatches": "many"}}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(raw))
    out = gpuguard("check", "--input", str(path), "--only", "qualify.*", "--format", "json")
    assert "Traceback" not in out.stdout + out.stderr
    results = json.loads(out.stdout)["results"]
    assert {r["rule"]: r["status"] for r in results} == dict.fromkeys(RULES, "unknown")
    assert all("invalid qualify" in r["message"] for r in results)


def test_without_a_run_the_qualify_rules_export_no_series(tmp_path):
    """Skipped, as the active probe's rules without --active: no gpuguard_rule_status
    series in `check` (nor in the daemon: the series budget of docs/metrics.md)."""
    snap = str(FIXTURES / "h200-live" / "idle-snapshot.json")
    text = gpuguard("check", "--input", snap, "--format", "prometheus").stdout
    assert 'rule="thermal.margin"' in text and 'rule="qualify.' not in text
    raw = json.loads((FIXTURES / "h200-live" / "idle-snapshot.json").read_text())
    raw["gpus"][0]["qualify"] = healthy()
    (tmp_path / "snap.json").write_text(json.dumps(raw))
    text = gpuguard("check", "--input", str(tmp_path / "snap.json"), "--format",
                    "prometheus").stdout
    assert sum(line.startswith("gpuguard_rule_status{") and 'rule="qualify.' in line
               for line in text.splitlines()) == len(RULES)
