import pytest

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Process, Reading
from tests.conftest import overridden, set_gpu

GIB = 1024**3


def test_retired_pages_not_supported_on_hopper_is_skipped(h200, run_rule):
    [result] = run_rule("memory.retired_pages", h200)
    assert result.status is Status.SKIPPED
    assert "not supported" in result.message


def test_retired_pages_levels(h200, run_rule):
    set_gpu(h200, retired_pages_sbe=2, retired_pages_dbe=0, retired_pages_pending=False)
    assert run_rule("memory.retired_pages", h200)[0].status is Status.OK
    set_gpu(h200, retired_pages_pending=True)
    assert run_rule("memory.retired_pages", h200)[0].status is Status.WARNING
    set_gpu(h200, retired_pages_sbe=60, retired_pages_dbe=3)
    [result] = run_rule("memory.retired_pages", h200)
    assert result.status is Status.CRITICAL
    assert "63" in result.message


def test_row_remap(h200, run_rule):
    assert run_rule("memory.row_remap", h200)[0].status is Status.OK
    set_gpu(h200, remapped_rows_pending=True)
    [result] = run_rule("memory.row_remap", h200)
    assert result.status is Status.WARNING and "reset" in result.message
    set_gpu(h200, remapped_rows_failure=True)
    [result] = run_rule("memory.row_remap", h200)
    assert result.status is Status.CRITICAL
    assert "spare rows" in result.message


def test_a_remapping_failure_goes_to_a_person_not_to_a_reset(h200, run_rule):
    """Issue 21: the bank has no spare row left; a reset activates pending remaps but adds
    no rows, so the action is inspect_hardware (it was the memory family's reset_gpu)."""
    [healthy] = run_rule("memory.row_remap", h200)
    assert (healthy.status, healthy.action) == (Status.OK, "none")
    set_gpu(h200, remapped_rows_failure=True)
    [result] = run_rule("memory.row_remap", h200)
    assert (result.status, result.action) == (Status.CRITICAL, "inspect_hardware")
    assert result.action_reason == ("row remapping failed: no spare row is left, and a "
                                    "reset does not add any")
    set_gpu(h200, remapped_rows_failure=False, remapped_rows_pending=True)
    [pending] = run_rule("memory.row_remap", h200)
    assert pending.action != "inspect_hardware"


def test_row_remap_many_uncorrectable_rows_warn(h200, run_rule):
    set_gpu(h200, remapped_rows_uncorrectable=512)
    assert run_rule("memory.row_remap", h200)[0].status is Status.WARNING


def test_orphaned_memory(h200, run_rule):
    set_gpu(h200, memory_used_bytes=20 * GIB, compute_processes=[])
    [result] = run_rule("memory.orphaned", h200)
    assert result.status is Status.WARNING
    assert "20.0 GiB" in result.message


def test_memory_held_by_a_process_is_fine(h200, run_rule):
    set_gpu(h200, memory_used_bytes=20 * GIB,
            compute_processes=[Process(pid=4242, used_memory_bytes=20 * GIB, name="vllm")])
    [result] = run_rule("memory.orphaned", h200)
    assert result.status is Status.OK
    assert "vllm[4242]" in result.message


def test_process_that_vanished_while_listed_is_not_a_fault(h200, run_rule):
    # NVML listed it, /proc no longer had it: the source leaves name None.
    set_gpu(h200, memory_used_bytes=20 * GIB,
            compute_processes=[Process(pid=999999, used_memory_bytes=None, name=None)])
    [result] = run_rule("memory.orphaned", h200)
    assert result.status is Status.OK
    assert "(exited)[999999]" in result.message


def test_process_list_error_is_unknown(h200, run_rule):
    set_gpu(h200, compute_processes=Reading.failed("GPU is lost"))
    [result] = run_rule("memory.orphaned", h200)
    assert result.status is Status.UNKNOWN
    assert "GPU is lost" in result.message



def test_memory_thresholds_come_from_the_rules(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "memory.retired_pages", max_retired=10)
    set_gpu(h200, retired_pages_sbe=9, retired_pages_dbe=1, retired_pages_pending=False)
    [result] = run_rule("memory.retired_pages", h200, rules=rules)
    assert result.status is Status.CRITICAL and result.message == "10 pages retired (limit 10)"
    rules = overridden(tmp_path, "memory.row_remap", warn_uncorrectable_rows=3)
    set_gpu(h200, remapped_rows_uncorrectable=3)
    [result] = run_rule("memory.row_remap", h200, rules=rules)
    assert result.status is Status.WARNING
    assert result.message == "3 rows remapped for uncorrectable errors (>= 3)"
    rules = overridden(tmp_path, "memory.orphaned", max_unowned_gib=30)
    set_gpu(h200, memory_used_bytes=20 * GIB, compute_processes=[])
    assert run_rule("memory.orphaned", h200, rules=rules)[0].status is Status.OK


def test_an_unread_uncorrectable_count_is_never_taken_as_zero(h200, run_rule):
    set_gpu(h200, remapped_rows_uncorrectable=Reading.failed("nvmlDeviceGetRemappedRows: x"))
    assert run_rule("memory.row_remap", h200)[0].status is Status.UNKNOWN
    set_gpu(h200, remapped_rows_uncorrectable=Reading.not_supported(),
            remapped_rows_correctable=Reading.not_supported())
    assert run_rule("memory.row_remap", h200)[0].status is Status.SKIPPED
    set_gpu(h200, remapped_rows_uncorrectable=0)  # the correctable count is only described
    [result] = run_rule("memory.row_remap", h200)
    assert result.message == "rows remapped: ? correctable, 0 uncorrectable; none pending"
    # a failure or a pending remap is judged even when the counts cannot be read
    set_gpu(h200, remapped_rows_uncorrectable=Reading.failed("x"), remapped_rows_pending=True)
    assert run_rule("memory.row_remap", h200)[0].status is Status.WARNING


def test_unread_reserved_memory_counts_as_zero(h200, run_rule):
    set_gpu(h200, memory_reserved_bytes=Reading.not_supported(), compute_processes=[])
    assert run_rule("memory.orphaned", h200)[0].observed["reserved_bytes"] == 0


def test_unowned_memory_up_to_the_limit_is_ok(h200, run_rule):
    set_gpu(h200, memory_used_bytes=GIB, compute_processes=[])
    [result] = run_rule("memory.orphaned", h200)
    assert result.status is Status.OK
    assert result.message == "1.00 GiB in use, no compute process"


def test_at_most_five_processes_are_named(h200, run_rule):
    procs = [Process(pid=100 + i, used_memory_bytes=GIB, name=f"w{i}") for i in range(6)]
    set_gpu(h200, memory_used_bytes=6 * GIB, compute_processes=procs)
    [result] = run_rule("memory.orphaned", h200)
    assert result.message == ("6 compute process(es) hold the memory: w0[100], w1[101], "
                              "w2[102], w3[103], w4[104]")


def test_memory_temperature_of_the_real_nvlink_host_is_ok(run_rule):
    from tests.checks import h200x2

    results = run_rule("memory.temperature", h200x2.snapshot())
    assert [r.message for r in results] == ["HBM at 35 C, 60 C below its 95 C maximum",
                                            "HBM at 36 C, 59 C below its 95 C maximum"]


def test_memory_temperature_margins(h200, run_rule, tmp_path):
    def status(temp, rules=None):
        set_gpu(h200, memory_temperature_c=temp, memory_temperature_max_c=95)
        return run_rule("memory.temperature", h200, rules=rules)[0].status

    assert [status(t) for t in (84, 85, 86, 89, 90, 91, 120)] == [
        Status.OK, Status.WARNING, Status.WARNING, Status.WARNING, Status.CRITICAL,
        Status.CRITICAL, Status.CRITICAL]
    rules = overridden(tmp_path, "memory.temperature", warn_margin_c=20, critical_margin_c=15)
    assert [status(t, rules) for t in (74, 75, 80)] == [Status.OK, Status.WARNING,
                                                        Status.CRITICAL]


def test_memory_temperature_without_a_maximum_is_not_judged(h200, run_rule):
    set_gpu(h200, memory_temperature_c=36, memory_temperature_max_c=0)
    [result] = run_rule("memory.temperature", h200)
    assert result.status is Status.SKIPPED and "reads 0 C" in result.message
    set_gpu(h200, memory_temperature_max_c=Reading.not_supported())
    assert run_rule("memory.temperature", h200)[0].status is Status.SKIPPED
    set_gpu(h200, memory_temperature_max_c=95, memory_temperature_c=Reading.failed("x"))
    assert run_rule("memory.temperature", h200)[0].status is Status.UNKNOWN


# --- memory.pattern and memory.bandwidth (the active probe) ---------------------------


def test_memory_pattern_levels(h200, run_rule):
    from tests.checks.probed import probed

    assert run_rule("memory.pattern", h200)[0].status is Status.SKIPPED  # no --active
    assert run_rule("memory.pattern", probed(h200))[0].status is Status.OK
    probed(h200, probe_pattern={"error": None, "mismatches": 32, "bytes": 128 << 20})
    [result] = run_rule("memory.pattern", h200)
    assert result.status is Status.CRITICAL and "32 words" in result.message


def test_memory_bandwidth_floor_is_half_the_h200s_hbm(h200, run_rule):
    from tests.checks.probed import probed

    assert run_rule("memory.bandwidth", h200)[0].status is Status.SKIPPED  # no --active
    probed(h200, probe_memory=2400.0)
    [result] = run_rule("memory.bandwidth", h200)
    assert result.status is Status.OK and result.observed["floor_gbps"] == 2400.0
    probed(h200, probe_memory=2399.0)
    [result] = run_rule("memory.bandwidth", h200)
    assert result.status is Status.WARNING and "2399" in result.message


def test_memory_bandwidth_floor_comes_from_the_rule_and_the_profile(h200, run_rule, tmp_path):
    from tests.checks.probed import probed

    probed(h200, probe_memory=3000.0)
    rules = overridden(tmp_path, "memory.bandwidth", floor_fraction=0.7)  # 3360
    assert run_rule("memory.bandwidth", h200, rules=rules)[0].status is Status.WARNING
    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"memory": 3500.0}})
    assert run_rule("memory.bandwidth", h200, profile)[0].status is Status.WARNING
    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"memory": 2900.0}})
    assert run_rule("memory.bandwidth", h200, profile, rules)[0].status is Status.OK


def test_memory_bandwidth_of_an_unknown_model_is_reported_not_judged(h200, run_rule):
    from tests.checks.probed import probed

    probed(h200, name="NVIDIA L40S", probe_memory=10.0)
    [result] = run_rule("memory.bandwidth", h200)
    assert result.status is Status.OK
    assert "not judged" in result.message and "NVIDIA L40S" in result.message


def test_memory_pattern_names_the_size_and_a_write_error_is_critical(h200, run_rule):
    from tests.checks.probed import probed

    # the probe's 64 MiB default, written twice (ones, then zeros): 128 MiB of words checked
    assert "(64 MiB, written and read twice: walking ones, then walking zeros)" in \
        run_rule("memory.pattern", probed(h200))[0].message
    probed(h200, probe_pattern={"error": None, "mismatches": 0, "bytes": None})
    assert run_rule("memory.pattern", h200)[0].message.endswith("read back right")
    probed(h200, probe_pattern={"error": "cuMemsetD32_v2 returned 700", "mismatches": None})
    [result] = run_rule("memory.pattern", h200)
    assert result.status is Status.CRITICAL and "cuMemsetD32_v2" in result.message


def test_memory_bandwidth_reports_its_floor_to_a_tenth(h200, run_rule, tmp_path):
    from tests.checks.probed import probed

    rules = overridden(tmp_path, "memory.bandwidth", floor_fraction=0.33333)
    [result] = run_rule("memory.bandwidth", probed(h200), rules=rules)
    assert result.observed["floor_gbps"] == 1600.0  # 1599.984


@pytest.mark.parametrize(("model", "floor"), [
    ("NVIDIA H200", 2400.0), ("NVIDIA H100 80GB HBM3", 1675.0),
    ("NVIDIA A100-SXM4-80GB", 1019.5), ("NVIDIA A100 80GB PCIe", 967.5)])
def test_memory_bandwidth_floor_is_half_of_each_models_hbm(h200, run_rule, model, floor):
    from tests.checks.probed import probed

    probed(h200, probe_memory=5000.0)
    h200.gpus[0].name = Reading.ok(model)
    h200.gpus[0].__post_init__()
    [result] = run_rule("memory.bandwidth", h200)
    assert result.observed["floor_gbps"] == floor, result.observed


def test_memory_temperature_max_of_1_c_is_a_maximum(h200, run_rule):
    """0 C is no maximum (skipped); 1 C is one, the lowest (`limit <= 0` is the line)."""
    for limit in (0, 1):
        h200.gpus[0].memory_temperature_c = Reading.ok(40)
        h200.gpus[0].memory_temperature_max_c = Reading.ok(limit)
        h200.gpus[0].__post_init__()
        [result] = run_rule("memory.temperature", h200)
        assert result.status is (Status.SKIPPED if limit == 0 else Status.CRITICAL), result
