"""service.*: the supervised services themselves (daemon only).

The daemon (gpuguard/daemon/services.py) puts one entry per supervised service into the
`services` reading: its processes, their host RSS, the samples of the current run and
the last inference request. `gpuguard check` has no services: these rules are skipped.

One result per rule for the host, as for other host rules: its status is the worst
service's, every service is named in the message, and `observed.service_status` gives
each service's own status (the supervisor counts only its own service's: policy.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuguard.judge import engine_errors
from gpuguard.judge.actions import Action, worst
from gpuguard.judge.engine_state import Limits as EngineLimits
from gpuguard.judge.engine_state import Progress as EngineProgress
from gpuguard.judge.engine_state import judge as judge_engine
from gpuguard.judge.engine_state import sustained_capacity, went_back, window_of
from gpuguard.judge.registry import CheckContext, Finding, host_check, ok, skipped, unknown
from gpuguard.judge.services import NO_SERVICE, combine, services_of
from gpuguard.judge.trend import Growth, Limits, Point, judge
from gpuguard.model.derived import held_by
from gpuguard.model.results import NAMES, Status
from gpuguard.model.snapshot import Process

MIB = 1024 * 1024


def _each_service(ctx: CheckContext,
                  judge_one: Callable[[dict[str, Any]], Finding]) -> Finding:
    """A memory rule's finding per service, combined: a service whose processes are not
    known is unknown (never "holds nothing")."""
    services = services_of(ctx)
    if services is None:
        return skipped(NO_SERVICE)
    findings: dict[str, Finding] = {}
    for name, entry in sorted(services.items()):
        if entry.get("error"):
            findings[name] = unknown(f"its processes are not known: {entry['error']}")
        else:
            findings[name] = judge_one(entry)
    return combine(findings)


@host_check("service.gpu_memory", thresholds=("headroom_percent",))
def gpu_memory(ctx: CheckContext) -> Finding:
    headroom = float(ctx.threshold("headroom_percent"))
    return _each_service(ctx, lambda entry: _gpu_memory_of(
        ctx, set(entry.get("pids") or []), headroom))


def _gpu_memory_of(ctx: CheckContext, pids: set[int], headroom: float) -> Finding:
    over: list[str] = []
    held_text: list[str] = []
    observed: dict[str, Any] = {}
    for gpu in ctx.snapshot.gpus:
        held = held_by(gpu, pids)
        if not held:
            continue
        total = gpu.memory_total_bytes.get()
        if not total:
            return unknown(f"GPU {gpu.index} reports no memory")
        sized = [(p, p.used_memory_bytes) for p in held if p.used_memory_bytes is not None]
        if len(sized) < len(held):
            # NVML may not account a process (no permission): its share cannot be told
            return unknown(f"NVML does not account the GPU {gpu.index} memory of "
                           f"{', '.join(str(p.pid) for p in held if p.used_memory_bytes is None)}")
        usage = _usage(held, sized, total)
        observed[str(gpu.index)] = usage
        text = f"GPU {gpu.index} {usage['percent']:.1f}% ({_names(sized)})"
        held_text.append(text)
        if usage["percent"] > 100.0 - headroom:
            over.append(text)
    if over:
        return ctx.fail(f"holds more than {100 - headroom:g}% of the GPU's memory: "
                        + "; ".join(over), **observed)
    if not held_text:
        return ok("holds no GPU memory")
    return ok("holds " + "; ".join(held_text), **observed)


def _usage(held: list[Process], sized: list[tuple[Process, int]], total: int
           ) -> dict[str, Any]:
    """One GPU's entry in `observed`: what the service's processes hold of the GPU's
    memory (every one of them accounted by NVML), in bytes and percent, and each process."""
    used = sum(size for _, size in sized)
    return {"used_bytes": used, "total_bytes": total, "percent": 100.0 * used / total,
            "processes": [{"pid": p.pid, "name": p.name, "used_bytes": p.used_memory_bytes}
                          for p in held]}


def _names(sized: list[tuple[Process, int]]) -> str:
    """Each process with its name ("?" once it exited) and its share in MiB."""
    return ", ".join(f"{p.pid} {p.name or '?'} {size / MIB:.0f} MiB" for p, size in sized)


@host_check("service.memory_growth", thresholds=(
    "window_s", "warmup_s", "min_samples", "min_r2", "recent_ratio", "horizon_s"))
def memory_growth(ctx: CheckContext) -> Finding:
    window = float(ctx.threshold("window_s"))
    limits = Limits(warmup_s=float(ctx.threshold("warmup_s")),
                    min_samples=int(ctx.threshold("min_samples")),
                    min_r2=float(ctx.threshold("min_r2")),
                    recent_ratio=float(ctx.threshold("recent_ratio")),
                    horizon_s=float(ctx.threshold("horizon_s")))
    return _each_service(ctx, lambda entry: _growth_of(ctx, entry, window, limits))


def _growth_of(ctx: CheckContext, entry: dict[str, Any], window: float,
               limits: Limits) -> Finding:
    samples = entry.get("samples") or []
    if not samples:
        return ok("no samples yet")
    answered = entry.get("answered_at")
    if answered is None:
        # a model still loading grows its memory: its warm-up has not even begun
        return ok("has not answered its probe yet: its memory is not judged before the "
                  "warm-up after its first answer")
    leaks: list[str] = []
    calm: list[str] = []
    observed: dict[str, Any] = {}
    for label, (points, headroom) in _series(entry, samples, window).items():
        if headroom is None or not points:
            continue
        growth = judge(points, float(headroom), float(answered), limits)
        observed[label] = {"samples": growth.samples, "slope_bytes_per_s": growth.slope,
                           "r2": growth.r2, "recent_slope_bytes_per_s": growth.recent_slope,
                           "projected_s": growth.projected_s, "headroom_bytes": headroom}
        if growth.leak:
            leaks.append(_leak_text(label, growth))
        else:
            calm.append(f"{label}: {growth.reason}")
    if leaks:
        return ctx.fail("; ".join(leaks), **observed)
    return ok("; ".join(calm) or "nothing to judge", **observed)


def _series(entry: dict[str, Any], samples: list[Any], window: float
            ) -> dict[str, tuple[list[Point], Any]]:
    """The two series judged, each with its headroom: host RSS and GPU memory of the
    samples (time, rss, gpu) in the window that ends at the newest one; a sample that did
    not read a value is left out of that series."""
    now = samples[-1][0]
    recent = [s for s in samples if now - s[0] <= window]
    return {
        "host RSS": ([(s[0], float(s[1])) for s in recent if s[1] is not None],
                     entry.get("host_headroom_bytes")),
        "GPU memory": ([(s[0], float(s[2])) for s in recent if s[2] is not None],
                       entry.get("gpu_headroom_bytes")),
    }


def _leak_text(label: str, growth: Growth) -> str:
    """A leak as judge() found it: the slope, how well it fits and when the limit is hit."""
    # judge() sets both whenever it finds a leak: the asserts only tell mypy so
    assert growth.slope is not None
    assert growth.projected_s is not None
    return (f"{label} grows {growth.slope * 60 / MIB:.1f} MiB/min over "
            f"{growth.samples} samples (r² {growth.r2:.2f}): its limit in "
            f"{growth.projected_s / 60:.0f} min")


@host_check("service.inference")
def inference(ctx: CheckContext) -> Finding:
    findings: dict[str, Finding] = {}
    services = services_of(ctx)
    if services is None:
        return skipped(NO_SERVICE)
    for name, entry in sorted(services.items()):
        answer = entry.get("inference")
        if answer is None:
            findings[name] = skipped("its probe is not an inference request")
        elif answer.get("ok") is None:
            findings[name] = unknown(f"not probed: {answer.get('error')}")
        elif answer.get("ok"):
            findings[name] = ok(f"answered in {answer['latency_s']:.3f} s", **answer)
        elif answer.get("timed_out") and (made := progressing(entry, _stuck_window(ctx))):
            # the engine's own progress counter made at least its floor over the stuck
            # window (issue 23, review 4): busy serving, not hung; never a failover at
            # its peak
            findings[name] = ok(f"saturated: no answer in {answer['latency_s']:.1f} s, but "
                                f"{made}", saturated=True, **answer)
        elif answer.get("timed_out"):
            # connected or not, no answer within request_timeout: a healthy server
            # saturated at peak load looks just like a hung one from here, and moving a
            # saturated service to CPU at its peak is the worst moment. Not known: it
            # neither counts towards failover nor resets (a hung GPU is the GPU rules'
            # finding: xid.recent, driver.responsive; a hung engine service.engine's).
            # An answer that came, a 500 or a refused connection, stays a failure.
            findings[name] = unknown(f"no answer in time (saturated or hung): "
                                     f"{answer.get('error')}", **answer)
        else:
            findings[name] = ctx.fail(f"inference failed: {answer.get('error')}", **answer)
    return combine(findings)


def progressing(entry: dict[str, Any], window_s: float = 120.0) -> str | None:
    """What the service's engine made when its progress counter made at least its
    profile's floor over the stuck window (the engine is serving, judge/engine_state), else
    None (no engine, not read, flat, creeping, gone back)."""
    eng = entry.get("engine") or {}
    reads = [r for r in (eng.get("reads") or []) if r[1] is None]
    if len(reads) < 2 or reads[-1][4] is None or (not reads[-1][2] and not reads[-1][3]) \
            or went_back(reads, window_s) is not None:
        return None
    window = window_of(reads, window_s, EngineProgress.of(eng))
    if not window.enough:
        return None
    unit = eng.get("unit") or "progress"
    return f"the engine made {window.made:,.0f} {unit} in its last {window.span_s:.0f} s"


def _stuck_window(ctx: CheckContext) -> float:
    """service.engine's stuck window, over which service.inference asks for progress."""
    rule = ctx.ruleset.rules.get("service.engine")
    return float((rule.thresholds if rule else {}).get("stuck_after_s", 120.0))


# an entry that says not why its engine was not read (the daemon's always says:
# daemon/service_engine.EngineWatch.why_not, issue 28)
NOT_READ = "its engine was not read (judged by its probe alone)"


def _each_engine(ctx: CheckContext, judge_one: Any) -> Finding:
    services = services_of(ctx)
    if services is None:
        return skipped(NO_SERVICE)
    findings = {name: (judge_one(entry["engine"], entry) if entry.get("engine")
                       else skipped(str(entry.get("engine_note") or NOT_READ)))
                for name, entry in sorted(services.items())}
    return combine(findings)


@host_check("service.engine", thresholds=("stuck_after_s", "kv_full_percent"))
def engine(ctx: CheckContext) -> Finding:
    limits = EngineLimits(float(ctx.threshold("stuck_after_s")),
                          float(ctx.threshold("kv_full_percent")) / 100.0)
    return _each_engine(ctx, lambda eng, entry: _engine_of(ctx, eng, entry, limits))


def _engine_of(ctx: CheckContext, eng: dict[str, Any], entry: dict[str, Any],
               limits: EngineLimits) -> Finding:
    answer = entry.get("inference") or {}
    state = judge_engine(eng.get("reads") or [], limits, answer.get("timed_out") is True,
                         str(eng.get("unit") or "progress"),
                         answered=answer.get("ok") is True, progress=EngineProgress.of(eng))
    observed = {"state": state.state, "engine": eng.get("engine"), "url": eng.get("url"),
                "metrics": eng.get("metrics"), "flat_s": state.flat_s,
                "rising": state.rising, "at_capacity": state.at_capacity,
                "read": _newest(eng)}
    message = f"{eng.get('title') or eng.get('engine')}: {state.message}"
    if eng.get("no_run_identity"):
        # read all the same (issue 28); its reads start over only with another variant
        message += (f"; no run identity ({eng['no_run_identity']}): a restart is seen from "
                    "its probe and its counter alone")
        observed["no_run_identity"] = eng["no_run_identity"]
    if state.state == "stuck":
        return ctx.fail(message, **observed)
    if state.state == "unknown":
        return unknown(message, **observed)
    return ok(message, **observed)


def _newest(eng: dict[str, Any]) -> dict[str, Any]:
    reads = eng.get("reads") or []
    if not reads:
        return {}
    newest = reads[-1]
    return {"error": newest[1], "running": newest[2], "waiting": newest[3],
            "progress": newest[4], "kv_cache": newest[5], "preemptions": newest[6]}


@host_check("service.engine_full", thresholds=("kv_full_percent", "window_s"))
def engine_full(ctx: CheckContext) -> Finding:
    kv_full = float(ctx.threshold("kv_full_percent")) / 100.0
    window = float(ctx.threshold("window_s"))

    def one(eng: dict[str, Any], _entry: dict[str, Any]) -> Finding:
        held = sustained_capacity(eng.get("reads") or [], kv_full, window)
        if held is None:
            return ok(f"not at capacity for {window:g} s")
        return ctx.fail(f"at capacity for {held:.0f} s: KV cache at or above {kv_full:.0%}"
                        " with preemptions rising (a healthy peak; more replicas or a "
                        "smaller batch if it lasts)", held_s=held)

    return _each_engine(ctx, one)


@host_check("service.gpu_errors", thresholds=("window_s", "xid_within_s"))
def gpu_errors(ctx: CheckContext) -> Finding:
    services = services_of(ctx)
    if services is None:
        return skipped(NO_SERVICE)
    window = float(ctx.threshold("window_s"))
    within = float(ctx.threshold("xid_within_s"))
    findings: dict[str, Finding] = {}
    for name, entry in sorted(services.items()):
        if entry.get("log") is None:
            findings[name] = skipped("its backend names no log to read (exec: "
                                     "log_file_gpu, docs/supervisor.md)")
            continue
        verdict = engine_errors.judge(name, entry, ctx.snapshot, ctx.ruleset.xid_catalog,
                                      window, within)
        findings[name] = (ctx.fail(verdict.message, **verdict.observed)
                          if verdict.status == "failed" else
                          Finding(Status(verdict.status), verdict.message, verdict.observed))
    result = combine(findings)
    failing = [f for f in findings.values() if f.observed.get("suggested")]
    if failing:
        # the finding decides the action (judge/actions.FINDING_DECIDES): the worst of
        # the failing services'
        chosen = worst(Action(f.observed["suggested"]) for f in failing)
        result.observed["suggested"] = chosen.value
        result.observed["why"] = next(f.observed["why"] for f in failing
                                      if f.observed["suggested"] == chosen.value)
        result.observed[NAMES] = sorted(n for f in failing for n in f.observed[NAMES])
    return result
