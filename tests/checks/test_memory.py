from gpuguard.results import Status
from gpuguard.snapshot import Process, Reading
from tests.conftest import set_gpu

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
