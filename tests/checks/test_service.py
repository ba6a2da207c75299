"""service.*: on the real H200 recording with a services reading as the daemon writes it
(gpuguard/daemon/services.py); the daemon itself with real processes is in
tests/daemon/test_services.py."""

from __future__ import annotations

from typing import Any

from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import Process, Reading, Snapshot
from gpuguard.supervisor import policy
from tests.conftest import overridden, set_gpu

MIB = 1024 * 1024


def with_services(snap: Snapshot, **entries: dict[str, Any]) -> Snapshot:
    snap.host.services = Reading.ok(entries)
    snap.host.__post_init__()
    return snap


def entry(pids: list[int], samples: list[list[Any]] | None = None, **extra: Any
          ) -> dict[str, Any]:
    return {"variant": "gpu", "identity": "pid 1", "started_at": 0.0, "answered_at": 0.0,
            "pids": pids,
            "processes": [], "rss_bytes": 0, "host_headroom_bytes": 10**12,
            "gpu_headroom_bytes": None, "samples": samples or [], "inference": None, **extra}


GIB = 1024 * MIB


def hold(snap: Snapshot, percent: float, pid: int = 4242) -> Snapshot:
    """The service's process holds `percent` of a 100 GiB GPU (exact: 1% is 1 GiB)."""
    used = int(GIB * percent)
    return set_gpu(snap, memory_total_bytes=100 * GIB,
                   compute_processes=[Process(pid, used, "vllm"), Process(7, MIB, "other")])


def severity(tmp_path, rule_id: str, level: str) -> Any:
    from gpuguard.config.ruleset import load_ruleset

    rules = tmp_path / "sev.d"
    rules.mkdir(exist_ok=True)
    (rules / "sev.yaml").write_text(f"overrides:\n  {rule_id}: {{severity: {level}}}\n")
    return load_ruleset([rules])


# --- no service -----------------------------------------------------------------------

def test_no_service_configured_is_skipped_even_without_nvml(h200, run_rule):
    for rule in ("service.gpu_memory", "service.memory_growth", "service.inference"):
        [result] = run_rule(rule, h200)
        assert result.status is Status.SKIPPED, rule
        h200.nvml.init_error = "NVML Shared Library Not Found"
        assert run_rule(rule, h200)[0].status is Status.SKIPPED
        h200.nvml.init_error = None


def test_an_error_reading_is_unknown(h200, run_rule):
    h200.host.services = Reading.failed("boom")
    assert run_rule("service.gpu_memory", h200)[0].status is Status.UNKNOWN


def test_processes_not_known_is_unknown_for_that_service(h200, run_rule):
    with_services(h200, llm={"variant": "gpu", "error": "no pid file", "inference": None},
                  ok=entry([1]))
    for rule in ("service.gpu_memory", "service.memory_growth"):
        [result] = run_rule(rule, h200)
        assert result.status is Status.UNKNOWN
        assert result.observed["service_status"] == {"llm": "unknown", "ok": "ok"}
        assert "llm: its processes are not known: no pid file" in result.message


def test_an_empty_services_reading_is_skipped(h200, run_rule):
    with_services(h200)
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.SKIPPED and result.message == "no service is supervised"


def test_services_of_one_status_are_listed_by_name(h200, run_rule):
    with_services(h200, b=entry([1]), a=entry([2]))
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.OK
    assert result.message == "a: holds no GPU memory; b: holds no GPU memory"


# --- service.gpu_memory ---------------------------------------------------------------

def test_gpu_memory_boundaries_and_named_processes(h200, run_rule):
    with_services(h200, llm=entry([4242]))
    hold(h200, 95.5)  # vLLM at --gpu-memory-utilization 0.95 with its context: healthy
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.OK and "GPU 0 95.5%" in result.message
    hold(h200, 98.0)  # at the line: not over it
    assert run_rule("service.gpu_memory", h200)[0].status is Status.OK
    hold(h200, 98.1)
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.WARNING
    assert "4242 vllm 100454 MiB" in result.message and "more than 98%" in result.message
    assert "7 other" not in result.message  # not the service's
    seen = result.observed["services"]["llm"]["0"]
    assert seen["processes"][0]["pid"] == 4242
    assert seen["used_bytes"] == int(GIB * 98.1) and seen["total_bytes"] == 100 * GIB


def test_gpu_memory_severity_comes_from_the_rule(h200, run_rule, tmp_path):
    with_services(h200, llm=entry([4242]))
    hold(h200, 99)
    rules = severity(tmp_path, "service.gpu_memory", "critical")
    assert run_rule("service.gpu_memory", h200, rules=rules)[0].status is Status.CRITICAL


def test_gpu_memory_not_accounted_by_nvml_is_unknown(h200, run_rule):
    with_services(h200, llm=entry([4242, 5]))
    set_gpu(h200, compute_processes=[Process(4242, GIB, "vllm"), Process(5, None, "w")])
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.UNKNOWN
    assert "NVML does not account the GPU 0 memory of 5" in result.message


def test_gpu_memory_of_a_gpu_without_memory_is_unknown(h200, run_rule):
    with_services(h200, llm=entry([4242]))
    hold(h200, 1)
    set_gpu(h200, memory_total_bytes=0)
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.UNKNOWN and "reports no memory" in result.message


def test_gpu_memory_threshold_comes_from_the_rule(h200, run_rule, tmp_path):
    with_services(h200, llm=entry([4242]))
    hold(h200, 90.5)
    rules = overridden(tmp_path, "service.gpu_memory", headroom_percent=10)
    assert run_rule("service.gpu_memory", h200, rules=rules)[0].status is Status.WARNING
    assert run_rule("service.gpu_memory", h200)[0].status is Status.OK


def test_gpu_memory_of_a_service_without_gpu_processes(h200, run_rule):
    with_services(h200, llm=entry([99999]))
    hold(h200, 99.0)
    [result] = run_rule("service.gpu_memory", h200)
    assert result.status is Status.OK and "holds no GPU memory" in result.message


def test_gpu_memory_unreadable_processes_are_unknown(h200, run_rule):
    with_services(h200, llm=entry([4242]))
    set_gpu(h200, compute_processes=Reading.failed("NVML timeout"))
    assert run_rule("service.gpu_memory", h200)[0].status is Status.UNKNOWN


# --- service.memory_growth --------------------------------------------------------------

def leak_samples(n: int = 200, step: float = 5.0, rate: float = MIB) -> list[list[Any]]:
    """n samples `step` s apart from t=1000 (long after start): RSS growing `rate` B/s."""
    return [[1000 + i * step, int(100 * MIB + i * step * rate), None] for i in range(n)]


def test_memory_growth_flags_a_steady_leak_with_its_projection(h200, run_rule):
    # 1 MiB/s with 3,000 MiB left: 50 min, inside the 2 h horizon; the GPU has room but
    # no samples (not judged, not named)
    with_services(h200, llm=entry([1], leak_samples(), host_headroom_bytes=3000 * MIB,
                                  gpu_headroom_bytes=MIB))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.WARNING
    assert result.message == ("llm: host RSS grows 60.0 MiB/min over 200 samples (r² 1.00): "
                              "its limit in 50 min")
    seen = result.observed["services"]["llm"]["host RSS"]
    assert abs(seen["projected_s"] - 3000) < 1


def test_memory_growth_severity_comes_from_the_rule(h200, run_rule, tmp_path):
    with_services(h200, llm=entry([1], leak_samples(), host_headroom_bytes=MIB))
    rules = severity(tmp_path, "service.memory_growth", "critical")
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.CRITICAL


def test_memory_growth_window_edge(h200, run_rule, tmp_path):
    # 12 samples 5 s apart (t 1000..1055): a 55 s window holds all 12, a 50 s one 11
    with_services(h200, llm=entry([1], leak_samples(12), host_headroom_bytes=MIB))
    rules = overridden(tmp_path, "service.memory_growth", window_s=55)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.WARNING
    rules = overridden(tmp_path, "service.memory_growth", window_s=50)
    [result] = run_rule("service.memory_growth", h200, rules=rules)
    assert result.status is Status.OK and "11 samples after warm-up" in result.message


def test_memory_growth_horizon_comes_from_the_rule(h200, run_rule, tmp_path):
    with_services(h200, llm=entry([1], leak_samples(), host_headroom_bytes=1024 * MIB))
    rules = overridden(tmp_path, "service.memory_growth", horizon_s=1000)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.OK
    rules = overridden(tmp_path, "service.memory_growth", horizon_s=1030)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.WARNING


def test_memory_growth_judges_only_the_window(h200, run_rule, tmp_path):
    # grew long ago, flat in the last 30 minutes: not a leak
    old = leak_samples(100)
    flat = [[old[-1][0] + 5 * (i + 1), old[-1][1], None] for i in range(400)]
    with_services(h200, llm=entry([1], old + flat, host_headroom_bytes=MIB))
    assert run_rule("service.memory_growth", h200)[0].status is Status.OK
    rules = overridden(tmp_path, "service.memory_growth", window_s=100000)
    # the whole history judged: growth stopped in the newest third, still not a leak
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.OK


def test_memory_growth_warmup_and_min_samples_come_from_the_rule(h200, run_rule, tmp_path):
    samples = leak_samples(20)  # t 1000..1095, started at 0
    with_services(h200, llm=entry([1], samples, host_headroom_bytes=MIB))
    assert run_rule("service.memory_growth", h200)[0].status is Status.WARNING
    rules = overridden(tmp_path, "service.memory_growth", warmup_s=1050)
    [result] = run_rule("service.memory_growth", h200, rules=rules)
    assert result.status is Status.OK and "10 samples after warm-up, 12 needed" in result.message
    rules = overridden(tmp_path, "service.memory_growth", min_samples=21)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.OK


def test_memory_growth_warmup_starts_at_the_first_answer(h200, run_rule, tmp_path):
    """A model loading from network storage for longer than warmup_s grows all the while:
    the warm-up counts from the service's first answer, not from its process start."""
    samples = leak_samples(20)  # t 1000..1095, the process started at 0
    with_services(h200, llm=entry([1], samples, host_headroom_bytes=MIB, answered_at=None))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.OK and "has not answered its probe yet" in result.message
    # first answered at 400: with a 600 s warm-up the samples from 1000 on are judged ...
    with_services(h200, llm=entry([1], samples, host_headroom_bytes=MIB, answered_at=400.0))
    assert run_rule("service.memory_growth", h200)[0].status is Status.WARNING
    # ... first answered at 450: only those from 1050 on, 10 of the 12 needed
    with_services(h200, llm=entry([1], samples, host_headroom_bytes=MIB, answered_at=450.0))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.OK and "10 samples after warm-up" in result.message


def test_memory_growth_of_gpu_memory(h200, run_rule):
    samples = [[t, 100 * MIB, g] for t, _, g in
               ([s[0], 0, int(s[1])] for s in leak_samples())]
    with_services(h200, llm=entry([1], samples, gpu_headroom_bytes=512 * MIB))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.WARNING and "GPU memory grows" in result.message
    assert "host RSS" not in result.message.split("GPU memory")[0].split("llm:")[1]


def test_memory_growth_ratio_and_fit_come_from_the_rule(h200, run_rule, tmp_path):
    # grows, then grows at a quarter of the pace in its newest third
    samples = [[1000 + i * 5, int(i * 5 * MIB if i < 134 else 134 * 5 * MIB
                                  + (i - 134) * 5 * MIB / 4), None] for i in range(200)]
    with_services(h200, llm=entry([1], samples, host_headroom_bytes=MIB))
    assert run_rule("service.memory_growth", h200)[0].status is Status.OK  # 0.25 < 0.5
    rules = overridden(tmp_path, "service.memory_growth", recent_ratio=0.2)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.WARNING
    rules = overridden(tmp_path, "service.memory_growth", recent_ratio=0.2, min_r2=0.999)
    assert run_rule("service.memory_growth", h200, rules=rules)[0].status is Status.OK


def test_memory_growth_judges_only_series_with_samples_and_room(h200, run_rule):
    flat = [[1000 + i * 5, 100 * MIB, None] for i in range(20)]
    with_services(h200, llm=entry([1], flat, gpu_headroom_bytes=MIB))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.OK and result.message == "llm: host RSS: not growing"
    with_services(h200, llm=entry([1], leak_samples(), host_headroom_bytes=None))
    [result] = run_rule("service.memory_growth", h200)
    assert result.status is Status.OK and result.message == "llm: nothing to judge"


def test_memory_growth_without_samples_is_ok(h200, run_rule):
    with_services(h200, llm=entry([1], []))
    assert run_rule("service.memory_growth", h200)[0].status is Status.OK


# --- service.inference ------------------------------------------------------------------

def test_inference(h200, run_rule):
    good = {"ok": True, "latency_s": 0.25, "status": 200, "error": None, "url": "u"}
    bad = {"ok": False, "latency_s": 0.01, "status": 500, "error": "answered 500, expected 200",
           "url": "u"}
    with_services(h200, a=entry([1], inference=good), b=entry([2]))
    [result] = run_rule("service.inference", h200)
    assert result.status is Status.OK and "a: answered in 0.250 s" in result.message
    with_services(h200, a=entry([1], inference=bad), b=entry([2], inference=good))
    [result] = run_rule("service.inference", h200)
    assert result.status is Status.CRITICAL
    assert result.message.startswith("a: inference failed: answered 500")
    assert result.observed["service_status"] == {"a": "critical", "b": "ok"}
    with_services(h200, b=entry([2]))
    assert run_rule("service.inference", h200)[0].status is Status.SKIPPED
    with_services(h200, a=entry([1], inference={"ok": None, "error": "starting"}))
    [result] = run_rule("service.inference", h200)
    assert result.status is Status.UNKNOWN and result.message == "a: not probed: starting"


def test_inference_that_times_out_is_unknown_and_a_500_stays_failed(h200, run_rule):
    """A saturated healthy server whose answer takes longer than request_timeout is not
    failed (it would be moved to CPU at peak load): unknown, which neither counts nor
    resets. An answer that came, even a 500, is a failure."""
    late = {"ok": False, "latency_s": 2.0, "status": None, "timed_out": True,
            "error": "TimeoutError: the request timed out after 2 s", "url": "u"}
    with_services(h200, a=entry([1], inference=late))
    [result] = run_rule("service.inference", h200)
    assert result.status is Status.UNKNOWN
    assert result.message == ("a: no answer in time (saturated or hung): "
                              "TimeoutError: the request timed out after 2 s")
    assert policy.outcome([result], None, {"service.inference"}, None, "a")[0] == "unknown"
    failed = {"ok": False, "latency_s": 0.01, "status": 500, "timed_out": False,
              "error": "answered 500, expected 200", "url": "u"}
    with_services(h200, a=entry([1], inference=failed))
    [result] = run_rule("service.inference", h200)
    assert result.status is Status.CRITICAL
    assert policy.outcome([result], None, {"service.inference"}, None, "a")[0] == "failed"


# --- the supervisor counts its own service's status --------------------------------------

def test_policy_counts_only_its_own_service():
    result = Result("service.inference", Status.CRITICAL, Status.CRITICAL, "a failed",
                    observed={"service_status": {"a": "critical", "b": "ok"}})
    gpu_ok = Result("ecc.uncorrected", Status.OK, Status.CRITICAL, "ok", GpuId(0, "u", "p"))
    tagged = {"service.inference", "ecc.uncorrected"}
    assert policy.outcome([result, gpu_ok], None, tagged, None, "a")[0] == "failed"
    assert policy.outcome([result, gpu_ok], None, tagged, None, "b") == ("passed", [])
    assert policy.outcome([result, gpu_ok], None, tagged, None, "c") == ("passed", [])


# --- the engine's own metrics (issue 23) -----------------------------------------------

def engine(reads: list[list[Any]], name: str = "vllm") -> dict[str, Any]:
    """The `engine` of a service entry as gpuguard/daemon/service_engine.py writes it."""
    return {"engine": name, "title": "vLLM", "unit": "tokens", "url": "u",
            "metrics": {"progress": "vllm:generation_tokens_total"}, "reads": reads}


def flat_reads(seconds: int, progress: float = 500.0, **kv: Any) -> list[list[Any]]:
    return [[float(t), None, 2, 9, progress, kv.get("kv", 0.3), kv.get("pre", 0)]
            for t in range(0, seconds + 1, 5)]


def test_engine_stuck_is_critical_and_counts_for_failover(h200, run_rule, default_rules):
    from gpuguard.judge import actions

    with_services(h200, a=entry([1], engine=engine(flat_reads(125))),
                  b=entry([2], engine=engine(flat_reads(60))), c=entry([3]))
    [result] = run_rule("service.engine", h200)
    assert result.status is Status.CRITICAL
    assert result.message.startswith("a: vLLM: stuck: 2 running and 9 waiting and no tokens "
                                     "made for 125 s (stuck_after 120 s)")
    assert result.observed["service_status"] == {"a": "critical", "b": "ok", "c": "skipped"}
    assert result.observed["services"]["a"]["state"] == "stuck"
    tagged = {"service.engine"}
    assert policy.outcome([result], None, tagged, None, "a")[0] == "failed"
    assert policy.outcome([result], None, tagged, None, "b") == ("passed", [])
    rule = default_rules.rules["service.engine"]
    assert actions.suggest(rule, Status.CRITICAL, result.observed, default_rules)[0] \
        is actions.Action.RESTART_APP


def test_engine_threshold_comes_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "service.engine", stuck_after_s=30, kv_full_percent=95)
    with_services(h200, a=entry([1], engine=engine(flat_reads(35))))
    [result] = run_rule("service.engine", h200, rules=rules)
    assert result.status is Status.CRITICAL and "stuck_after 30 s" in result.message


def test_saturated_makes_inference_ok_and_the_engine_saturated(h200, run_rule):
    late = {"ok": False, "latency_s": 2.0, "status": None, "timed_out": True,
            "error": "TimeoutError: the request timed out after 2 s", "url": "u"}
    rising = [[0.0, None, 256, 900, 1000.0, 0.9, 0], [5.0, None, 256, 900, 26000.0, 0.9, 0]]
    with_services(h200, a=entry([1], inference=late, engine=engine(rising)))
    [inference] = run_rule("service.inference", h200)
    assert inference.status is Status.OK
    assert inference.message == ("a: saturated: no answer in 2.0 s, but the engine made "
                                 "25,000 tokens in its last 5 s")
    assert policy.outcome([inference], None, {"service.inference"}, None, "a") \
        == ("passed", [])
    [judged] = run_rule("service.engine", h200)
    assert judged.status is Status.OK and judged.observed["services"]["a"]["state"] \
        == "saturated"
    # flat while timing out: still unknown, as before (no engine says it works)
    with_services(h200, a=entry([1], inference=late, engine=engine(flat_reads(10))))
    assert run_rule("service.inference", h200)[0].status is Status.UNKNOWN


def test_engine_unreachable_is_unknown_and_no_engine_skipped(h200, run_rule):
    reads = [*flat_reads(10), [15.0, "answered 503", None, None, None, None, None]]
    with_services(h200, a=entry([1], engine=engine(reads)))
    [result] = run_rule("service.engine", h200)
    assert result.status is Status.UNKNOWN and "answered 503" in result.message
    with_services(h200, a=entry([1]))
    [result] = run_rule("service.engine", h200)
    assert result.status is Status.SKIPPED and "its engine was not read" in result.message


def test_engine_at_capacity_is_ok_and_the_opt_in_rule_warns(h200, run_rule, tmp_path):
    from gpuguard.config.ruleset import load_ruleset

    full = [[float(t), None, 200, 40, 1000.0 + 200 * t, 0.97, t] for t in range(0, 905, 5)]
    with_services(h200, a=entry([1], engine=engine(full)))
    [judged] = run_rule("service.engine", h200)
    assert judged.status is Status.OK
    assert judged.observed["services"]["a"]["state"] == "capacity"
    assert run_rule("service.engine_full", h200)[0].status is Status.SKIPPED  # opt in
    on = tmp_path / "on.d"
    on.mkdir()
    (on / "on.yaml").write_text("overrides:\n  service.engine_full: {enabled: true}\n")
    [result] = run_rule("service.engine_full", h200, rules=load_ruleset([on]))
    assert result.status is Status.WARNING
    assert result.message.startswith("a: at capacity for 900 s")
    with_services(h200, a=entry([1], engine=engine(full[:-1])))
    [result] = run_rule("service.engine_full", h200, rules=load_ruleset([on]))
    assert result.status is Status.OK


# --- CUDA errors in the service's log, tied to its GPUs' Xids (issue 23) ----------------

KNOW = 7200 * 10**6  # the kernel log's clock at its read (usec)
BUSES = ["00000000:00:06.0", "00000000:3B:00.0"]


def with_xids(snap: Snapshot, *xids: tuple[int, str, float]) -> Snapshot:
    """Xids (code, bus id, seconds before the kernel log's read) on a 2-GPU host."""
    from tests.conftest import with_gpus

    snap = with_gpus(snap, BUSES)
    snap.host.kernel_log = Reading.ok({
        "xids": [{"xid": x, "pci": pci, "pid": None, "process": None, "text": "",
                  "seq": 1000 + i, "usec": KNOW - int(ago * 10**6)}
                 for i, (x, pci, ago) in enumerate(xids)],
        "now_usec": KNOW, "acked_seq": None})
    snap.host.__post_init__()
    return snap


def logged(seen_ago: float, kind: str = "illegal_memory_access", run: str = "pid 1",
           now: float = 1000.0) -> dict[str, Any]:
    """The `log` of a service entry (gpuguard/daemon/service_logs.py): one error read
    `seen_ago` seconds before this cycle."""
    return {"source": "file /var/log/llm.log", "now": now, "lines_read": 10,
            "errors": [{"kind": kind, "seen": now - seen_ago, "run": run,
                        "line": "RuntimeError: CUDA error: an illegal memory access was "
                                "encountered"}]}


def test_gpu_error_with_an_xid_on_its_gpu_takes_the_xids_action(h200, run_rule,
                                                                default_rules):
    from gpuguard.judge import actions

    # Xid 48 (double-bit ECC: reset the GPU) on GPU 1, 30 s before the engine's error
    snap = with_xids(h200, (48, "0000:3B:00.0", 40.0))
    with_services(snap, llm=entry([1], gpus=[1], log=logged(10.0)))
    [result] = run_rule("service.gpu_errors", snap)
    assert result.status is Status.CRITICAL
    assert "Xid 48 on GPU 1 30 s before the engine's illegal_memory_access" in result.message
    assert result.observed["suggested"] == "reset_gpu"
    rule = default_rules.rules["service.gpu_errors"]
    action, why = actions.suggest(rule, Status.CRITICAL, result.observed, default_rules)
    assert action is actions.Action.RESET_GPU and "Xid 48" in why
    # the pair is in what the event store keeps of the result
    pair = result.observed["services"]["llm"]
    assert pair["xid"]["xid"] == 48 and pair["errors"][0]["kind"] == "illegal_memory_access"
    assert policy.outcome([result], None, {"service.gpu_errors"}, None, "llm")[0] == "failed"


def test_gpu_error_without_a_near_xid_on_its_gpus_is_the_apps(h200, run_rule,
                                                               default_rules):
    from gpuguard.judge import actions

    rule = default_rules.rules["service.gpu_errors"]
    # an Xid on another GPU, and one on its GPU but 200 s apart: neither is its
    for xids in ([(48, "0000:00:06.0", 15.0)], [(48, "0000:3B:00.0", 210.0)]):
        snap = with_xids(h200, *xids)
        with_services(snap, llm=entry([1], gpus=[1], log=logged(10.0)))
        [result] = run_rule("service.gpu_errors", snap)
        assert result.status is Status.CRITICAL
        assert "no Xid on its GPUs within 60 s: the application's fault" in result.message
        assert actions.suggest(rule, Status.CRITICAL, result.observed, default_rules)[0] \
            is actions.Action.RESTART_APP
    # an error of a run that has restarted since, not tied to the GPU: mended
    snap = with_xids(h200)
    with_services(snap, llm=entry([1], gpus=[1], log=logged(10.0, run="pid 0")))
    assert run_rule("service.gpu_errors", snap)[0].status is Status.OK


def test_gpu_errors_ages_out_and_an_unread_log_is_unknown(h200, run_rule):
    snap = with_xids(h200)
    with_services(snap, llm=entry([1], log=logged(400.0)))  # window_s 300
    assert run_rule("service.gpu_errors", snap)[0].status is Status.OK
    with_services(snap, llm=entry([1], log={"source": "file x", "now": 5.0, "errors": [],
                                            "error": "cannot open x: EACCES"}))
    [result] = run_rule("service.gpu_errors", snap)
    assert result.status is Status.UNKNOWN and "could not be read" in result.message
    with_services(snap, llm=entry([1]))
    [result] = run_rule("service.gpu_errors", snap)
    assert result.status is Status.SKIPPED and "names no log" in result.message


def test_gpu_errors_bytes_a_read_skipped_are_unknown_for_the_window(h200, run_rule):
    """Review 4, item 9: a flood past a read's bound (gpuguard/sources/service_logs.py
    MAX_SCAN) may have hidden an error: unknown for window_s, never a silent ok; an error
    read beside it is still the failure."""
    snap = with_xids(h200)
    skipped = {"what": "123 bytes of /var/log/llm.log not read", "seen": 900.0}
    log = {"source": "file /var/log/llm.log", "now": 1000.0, "errors": [],
           "skips": [skipped]}
    with_services(snap, llm=entry([1], log=log))
    [result] = run_rule("service.gpu_errors", snap)
    assert result.status is Status.UNKNOWN
    assert "was not read 100 s ago: 123 bytes of /var/log/llm.log not read" in result.message
    with_services(snap, llm=entry([1], log={**log, "now": 1201.0}))  # window_s 300
    assert run_rule("service.gpu_errors", snap)[0].status is Status.OK
    with_services(snap, llm=entry([1], gpus=[1], log={**logged(10.0), "skips": [skipped]}))
    assert run_rule("service.gpu_errors", snap)[0].status is Status.CRITICAL
