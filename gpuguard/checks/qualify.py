"""qualify.*: what `gpuguard qualify` (issue 29) measured on a GPU under full load, a rule per
section of its `qualify` reading (gpuguard/model/qualify_reading.py). No run: skipped (as the
probe's rules without --active); refused: unknown with the reason; a section not measured:
unknown naming the error that stopped the run. Targets come only from the reading (the run
copies in the model's): no check reads a file; without one a measurement is "not judged"."""

from __future__ import annotations

from typing import Any

from gpuguard.judge.actions import CATALOG_WORDS
from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, skipped, unknown, warning
from gpuguard.judge.xids import grade
from gpuguard.model.snapshot import GpuSnapshot
from gpuguard.sources import cuda_api

GIB = 1024**3
# CUresults that say the run could not have the GPU, not that the GPU failed: out of
# memory (another process holds it), devices unavailable (exclusive compute mode), MPS.
NOT_THE_GPU = (2, 46, 805)
STOPPED = {"hung": "hung", "died": "died", "stopped": "was stopped",
           "deadline": "ran past its deadline", "fatal": "failed in gpuguard's worker"}
HW_REASONS = {"hw_slowdown": "HW slowdown", "hw_thermal": "HW thermal slowdown",
              "hw_power_brake": "HW power brake"}
COPIES = (("host to device", "h2d_gbps", "h2d_gbps"), ("device to host", "d2h_gbps", "d2h_gbps"),
          ("device to device", "d2d_gbps", "hbm_gbps"))

Run = dict[str, Any]


def _section(gpu: GpuSnapshot, name: str, *keys: str) -> tuple[Run, Any] | Finding:
    """The GPU's qualify reading and its section `name` with each of `keys` read in it, or
    the finding instead: skipped when qualify did not run, unknown when it refused the GPU,
    when the reading is bad (.get()) or when the section or a key was not measured."""
    if gpu.qualify.state == "absent":
        return skipped("gpuguard qualify did not run")
    run = gpu.qualify.get()
    if run.get("refused"):
        return unknown(f"qualify refused this GPU: {run['refused']}", refused=run["refused"])
    missing = [name] if run.get(name) is None else \
        [f"{name} {key}" for key in keys if run[name].get(key) is None]
    if missing:
        return unknown(f"not measured: {', '.join(missing)}{_stopped(run)}",
                       error=run.get("error"))
    return run, run[name]


def _stopped(run: Run) -> str:
    error = run.get("error")
    return "" if error is None else (f": the run stopped in its {error['phase']} phase "
                                     f"({error['kind']}: {error['text']})")


def _target(run: Run, key: str) -> Any:
    """The model's target `key` ({value, source}) as the run copied it in, or None."""
    return (run.get("targets") or {}).get(key)


def _model(run: Run, gpu: GpuSnapshot) -> str:
    return str((run.get("targets") or {}).get("model") or gpu.name.get_or("this GPU model"))


@gpu_check("qualify.run")
def finished(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The run reached its end on this GPU. A CUDA error under load is the GPU's (as
    gpu.compute's); a run that hung, died, was stopped or hit its deadline vouches for
    nothing after its last phase, and is no fault of the GPU's that can be told."""
    got = _section(gpu, "level")
    if isinstance(got, Finding):
        return got
    run, error = got[0], got[0].get("error")
    if error is None:
        return ok(f"the {run['level']} run finished without an error", level=run["level"])
    code, phase, text = error.get("code"), error["phase"], error["text"]
    observed = {"level": run["level"], "error": error}
    if error["kind"] != "cuda":
        return unknown(f"the {run['level']} run {STOPPED[error['kind']]} in its {phase} "
                       f"phase: {text}", **observed)
    if isinstance(code, int) and f"{code} " not in f"{text} ":
        text = f"{text} ({cuda_api.describe(code)})"
    if code in NOT_THE_GPU:
        return unknown(f"the run could not have the GPU in its {phase} phase: {text}; free "
                       "it and run qualify again", **observed)
    return ctx.fail(f"a CUDA call failed under load in the {phase} phase: {text}", **observed)


@gpu_check("qualify.sdc")
def sdc(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Every result compared bit-exact; a mismatch computed again on its SM and the others.
    Wrong on one SM only is the GPU's; wrong on every SM is gpuguard's kernel disagreeing
    with its reference: unknown, never critical (a bug of ours must never send a good GPU
    to RMA). A drill flipped a bit of every result on its SM: found there, critical and
    said to be a drill; not found, the verification path is broken."""
    got = _section(gpu, "compute")
    if isinstance(got, Finding):
        return got
    run, compute = got
    drill = (run.get("drill") or {}).get("sm")
    located = compute.get("located") or {}
    computed, compared = compute["tiles_computed"], compute["tiles_compared"]
    observed = {"tiles_computed": computed, "tiles_compared": compared,
                "first_pass_mismatches": compute["mismatches"], "tflops": compute["tflops"],
                "moved_blocks": compute["moved_blocks"], "located": located or None,
                "drill": drill}
    if located.get("outcome") == "sm":
        return _located(ctx, located, drill, observed)
    done = (f"{computed} tiles computed on {compute['sms']} SMs in {compute['seconds']:.0f} s at "
            f"{compute['tflops']:.0f} TFLOPS, {compared} compared, {compute['mismatches']} wrong")
    if drill is not None:
        return unknown(f"the drill's flipped bit was not found: the verification path is "
                       f"broken (--inject-bit-flip on SM {drill}; {done})", **observed)
    if compared < computed:
        return unknown(f"not every result was verified: {done}", **observed)
    if located.get("outcome") == "every_sm":
        return unknown(f"gpuguard's kernel disagrees with its reference: tile {located['tile']} "
                       f"({located['kind']}) wrong on all {located['checked_sms']} SMs that "
                       f"ran it again (expected {located['expected']}, got {located['got']}): "
                       f"a gpuguard bug, not the GPU's ({done})", **observed)
    if located.get("outcome") == "not_reproduced":
        return warning(f"a result was wrong once but not when tile {located['tile']} "
                       f"({located['kind']}) was computed again on {located['checked_sms']} "
                       f"SMs: intermittent, run qualify again ({done})", **observed)
    if compute["mismatches"]:
        return unknown(f"wrong results not located{_stopped(run)} ({done})", **observed)
    return ok(f"every result compared bit-exact and right: {done} "
              f"({compute['moved_blocks']} blocks moved SM)", **observed)


def _located(ctx: CheckContext, located: dict[str, Any], drill: int | None,
             observed: dict[str, Any]) -> Finding:
    """Wrong on the SMs named only: the GPU's (or, on the drill's SM alone, the drill's)."""
    sms = located["sms"]
    others = [sm for sm in sms if sm != drill]
    text = (f"tile {located['tile']} ({located['kind']}) computed wrong on SM "
            f"{', '.join(map(str, others or sms))}: expected {located['expected']}, got "
            f"{located['got']}, {located['count']} word(s) wrong when computed again, right "
            f"on the other {located['checked_sms'] - len(sms)} of {located['checked_sms']} SMs")
    observed = {**observed, "mismatches": located["count"], "sms": others or sms}
    if drill is None or others:
        return ctx.fail(f"silent data corruption: {text}", **observed)
    return ctx.fail(f"drill: the bit flipped on purpose on SM {drill} (--inject-bit-flip) was "
                    f"found and located: {text}; a drill run records no pass", **observed)


@gpu_check("qualify.power")
def power(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The load window's median power as a share of the enforced limit, against the model's
    target (the SW power cap holding a healthy board at its limit under full load is normal)."""
    got = _section(gpu, "load", "power_w_median", "power_limit_w", "power_share")
    if isinstance(got, Finding):
        return got
    run, load = got
    share = load["power_share"]
    observed: dict[str, Any] = {"power_w_median": load["power_w_median"],
                                "power_limit_w": load["power_limit_w"], "power_share": share}
    text = (f"power {load['power_w_median']:.0f} W median under load, {share * 100:.0f} % of "
            f"the {load['power_limit_w']:.0f} W limit")
    target = _target(run, "power_share")
    if target is None:
        return ok(f"{text}; no power target for {_model(run, gpu)}: not judged", **observed)
    observed["target"] = target["value"]
    if share < target["value"]:
        return ctx.fail(f"{text}, below the {_model(run, gpu)} target of "
                        f"{target['value'] * 100:.0f} % (source: {target['source']})", **observed)
    return ok(f"{text} (the {_model(run, gpu)} target: {target['value'] * 100:.0f} %)", **observed)


@gpu_check("qualify.clocks")
def clocks(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The SM clock under load, reported; judged only against the model's floor, where a
    source gives one (a power-capped GPU runs below its maximum clock, which is normal)."""
    got = _section(gpu, "load", "sm_clock_mhz")
    if isinstance(got, Finding):
        return got
    run, load = got
    sm, mem = load["sm_clock_mhz"], load.get("mem_clock_mhz")
    observed: dict[str, Any] = {"sm_clock_mhz": sm, "mem_clock_mhz": mem}
    text = f"SM clock {sm['min']}-{sm['max']} MHz under load, median {sm['median']} MHz"
    if mem is not None:
        text += f"; memory clock median {mem['median']} MHz"
    target = _target(run, "sm_clock_mhz")
    if target is None:
        return ok(f"{text}; no SM clock floor for {_model(run, gpu)}: not judged", **observed)
    observed["floor_mhz"] = target["value"]
    if sm["median"] < target["value"]:
        return ctx.fail(f"{text}, below the {_model(run, gpu)} floor of {target['value']:.0f} "
                        f"MHz (source: {target['source']})", **observed)
    return ok(f"{text} (the {_model(run, gpu)} floor: {target['value']:.0f} MHz)", **observed)


@gpu_check("qualify.throttle", thresholds=("max_hw_samples",))
def throttle(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The load samples' clock event reasons: HW slowdown, HW thermal, HW power brake are the
    board protecting itself; SW thermal (a warning) its temperature target; SW power cap normal."""
    got = _section(gpu, "load", "reasons")
    if isinstance(got, Finding):
        return got
    reasons, samples = got[1]["reasons"], got[1]["samples"]
    observed = {"samples": samples, "reasons": reasons}
    if samples == 0:
        return unknown(f"no sample in the load window{_stopped(got[0])}", **observed)
    hw = {name: reasons[key] for key, name in HW_REASONS.items() if reasons[key]}
    seen = ", ".join(f"{name} in {n}" for name, n in hw.items())
    capped = f"SW power cap in {reasons['sw_power_cap']} (expected at full load)"
    if sum(hw.values()) > ctx.threshold("max_hw_samples"):
        return ctx.fail(f"the board slowed itself down under load: {seen} of {samples} "
                        f"samples; {capped}", **observed)
    if reasons["sw_thermal"]:
        return warning(f"SW thermal slowdown in {reasons['sw_thermal']} of {samples} samples: "
                       f"the GPU ran at its temperature target; {capped}", **observed)
    quiet = seen or "no HW slowdown, HW thermal slowdown or HW power brake"
    return ok(f"{quiet} in {samples} load samples; {capped}", **observed)


@gpu_check("qualify.hbm_temperature")
def hbm_temperature(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    got = _section(gpu, "load")
    if isinstance(got, Finding):
        return got
    temp, limit = got[1].get("hbm_temp_c_max"), got[1].get("hbm_temp_limit_c")
    observed = {"hbm_temp_c_max": temp, "hbm_temp_limit_c": limit,
                "gpu_temp_c_max": got[1].get("gpu_temp_c_max")}
    if temp is None:
        return skipped("the GPU reports no HBM temperature", **observed)
    if limit is None or limit <= 0:
        return ok(f"HBM peaked at {temp} C under load; no HBM temperature limit given: not "
                  "judged", **observed)
    if temp >= limit:
        return ctx.fail(f"HBM reached {temp} C under load, at its {limit} C limit", **observed)
    return ok(f"HBM peaked at {temp} C under load, {limit - temp} C below its {limit} C limit",
              **observed)


@gpu_check("qualify.ecc")
def ecc(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """New uncorrectable errors and new pending or failed remaps under load; the check names
    the action (a reset applies a remap, a failed remapping goes to a person)."""
    got = _section(gpu, "load", "ecc")
    if isinstance(got, Finding):
        return got
    run, load = got
    counts = load["ecc"]
    unread = [k for k in ("uncorrectable_new", "remap_pending", "remap_failed")
              if counts.get(k) is None]
    if unread:
        return unknown(f"ECC not read under load: {', '.join(unread)}", ecc=counts)
    problems = [f"{counts['uncorrectable_new']} new uncorrectable ECC error(s)"] \
        if counts["uncorrectable_new"] else []
    if counts["remap_pending"] and not counts.get("remap_pending_before"):
        problems.append("a row remap became pending")
    failed = counts["remap_failed"] and not counts.get("remap_failed_before")
    if failed:
        problems.append("row remapping failed (no spare row left)")
    corrected, over = _correctable(run, gpu, load)
    observed = {"ecc": counts, "hours": load.get("hours")}
    if problems:
        action = "inspect_hardware" if failed else "reset_gpu"
        return ctx.fail(f"under load: {'; '.join(problems)}; {corrected}", suggested=action,
                        why="a failed remapping: no reset adds a spare row" if failed
                        else "a reset applies the row remap", **observed)
    if over:
        return warning(f"no new uncorrectable error or remap; {corrected}", suggested="none",
                       why="a correctable rate above the model's is to watch", **observed)
    return ok(f"no new uncorrectable ECC error, no new pending or failed row remap; "
              f"{corrected}", **observed)


def _correctable(run: Run, gpu: GpuSnapshot, load: dict[str, Any]) -> tuple[str, bool]:
    """The correctable count said as text, and whether its rate is above the target's."""
    count, hours = load["ecc"].get("correctable_new"), load.get("hours")
    target = _target(run, "correctable_ecc_per_hour")
    if count is None:
        return "correctable errors not read", False
    if target is None:
        return (f"{count} new correctable error(s); no correctable rate for "
                f"{_model(run, gpu)}: not judged"), False
    if not hours:
        return f"{count} new correctable error(s); the run's length unknown: not judged", False
    rate = count / hours
    return (f"{count} new correctable error(s) in {hours * 60:.1f} min, {rate:.0f}/h against "
            f"the {_model(run, gpu)} limit of {target['value']:g}/h (source: "
            f"{target['source']})"), rate > target["value"]


@gpu_check("qualify.xid")
def xid(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The Xids NVML reported for the GPU during the run, graded by the Xid catalog as
    xid.recent grades them: one of the critical set fails, with its catalog action."""
    got = _section(gpu, "load", "xids")
    if isinstance(got, Finding):
        return got
    catalog, source = ctx.ruleset.xid_catalog, ctx.ruleset.xid_catalog_source
    codes, graded = [x["code"] for x in got[1]["xids"]], dict[int, Any]()
    for x in got[1]["xids"]:  # each code once (a flood is one code a thousand times)
        graded.setdefault(x["code"], grade(x["code"], x.get("text"), catalog, source))
    fatal = {code: g for code, g in graded.items() if g.severity == "critical"}
    observed: dict[str, Any] = {"xids": codes}
    if fatal:
        worst = max(fatal.values(), key=lambda g: CATALOG_WORDS[g.first].rank)
        named = "; ".join(f"{codes.count(c)} x Xid {c} ({g.meaning})" for c, g in fatal.items())
        return ctx.fail(f"{sum(map(codes.count, fatal))} Xid(s) of the critical set under load: "
                        f"{named}", suggested=CATALOG_WORDS[worst.first].value, why=worst.why,
                        **observed)
    if graded:
        seen = "; ".join(f"{codes.count(c)} x Xid {c} ({g.meaning}; {g.severity})"
                         for c, g in graded.items())
        return ok(f"no Xid of the critical set during the run; seen: {seen}", **observed)
    return ok("no Xid during the run", **observed)


@gpu_check("qualify.memtest", thresholds=("min_coverage",))
def memtest(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Address and seeded random patterns over most of the free memory: wrong data is wrong
    whatever the coverage; a clean test of too little vouches for too little (quick: a sample)."""
    got = _section(gpu, "memtest")
    if isinstance(got, Finding):
        return got
    run, test = got
    tested, free, wrong = test["bytes_tested"], test["free_bytes"], test["mismatches"]
    coverage = tested / free if free else 0.0
    observed = {"bytes_tested": tested, "free_bytes": free, "coverage": round(coverage, 3),
                "mismatches": wrong, "first": test.get("first") or []}
    size = f"{tested / GIB:.1f} GiB tested, {coverage * 100:.0f} % of {free / GIB:.1f} GiB free"
    if wrong:
        first = "; ".join(f"{w['address']} expected {w['expected']} got {w['got']}"
                          for w in observed["first"][:3]) or "not recorded"
        return ctx.fail(f"{wrong} word(s) read back wrong ({size}); first: {first}", **observed)
    if coverage < ctx.threshold("min_coverage") and run["level"] != "quick":
        return unknown(f"the memory test covered too little to vouch for the memory: {size}, "
                       f"below {ctx.threshold('min_coverage') * 100:.0f} %", **observed)
    patterns = ", ".join(test.get("patterns") or []) or "?"
    return ok(f"every word read back right: {size}, {test['passes']} passes ({patterns}) at "
              f"{test['gbps']:.0f} GB/s", **observed)


@gpu_check("qualify.bandwidth")
def bandwidth(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Pinned host<->device copies and a device copy (read + written) against the model's floors."""
    got = _section(gpu, "bandwidth")
    if isinstance(got, Finding):
        return got
    run, measured = got
    observed = {key: measured[key] for _, key, _ in COPIES}
    parts, slow = [], []
    for label, key, target_key in COPIES:
        target = _target(run, target_key)
        if target is None:
            parts.append(f"{label} {measured[key]:.1f} GB/s (no floor: not judged)")
            continue
        parts.append(f"{label} {measured[key]:.1f} GB/s (floor {target['value']:g})")
        if measured[key] < target["value"]:
            slow.append(f"{label} {measured[key]:.1f} GB/s, below the {_model(run, gpu)} "
                        f"floor of {target['value']:g} GB/s (source: {target['source']})")
    if slow:
        return ctx.fail("; ".join(slow), **observed)
    return ok(", ".join(parts), **observed)


@gpu_check("qualify.peer_bandwidth")
def peer_bandwidth(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Peer copies with every other GPU of the run, the slower direction of each against
    the model's peer-to-peer floor. A run on one GPU has no peer; a pair without peer
    access is p2p.status's to judge."""
    got = _section(gpu, "level")
    if isinstance(got, Finding):
        return got
    run, peers = got[0], got[0].get("peers")
    if peers is None and run.get("error") is not None:
        return unknown(f"peer copies not measured{_stopped(run)}", error=run["error"])
    target = _target(run, "p2p_gbps") or {}
    floor, model = target.get("value"), _model(run, gpu)
    slow, unmeasured, measured = _copies(peers or [], floor)
    observed = {"peers": peers or [], "floor_gbps": floor}
    if slow:
        return ctx.fail(f"peer copies below the {model} floor of {floor:g} GB/s (source: "
                        f"{target['source']}): {', '.join(slow)}", **observed)
    if unmeasured:
        return unknown(f"peer copies not measured with {'; '.join(unmeasured)}", **observed)
    if not measured:
        return ok("no peer: no other GPU in the run to copy with", **observed)
    judged = f"not judged: no peer floor for {model}" if floor is None else f"floor {floor:g} GB/s"
    return ok(f"peer copies with {', '.join(measured)} ({judged})", **observed)


def _copies(peers: list[dict[str, Any]], floor: float | None
            ) -> tuple[list[str], list[str], list[str]]:
    """As text: the copies below the floor, those not measured, every pair's slower one."""
    slow, unmeasured, measured = [], [], []
    for peer in peers:
        rates: tuple[Any, Any] = (peer.get("gbps"), peer.get("reverse_gbps"))
        if not peer["access"]:
            measured.append(f"GPU {peer['peer']}: no peer access (p2p.status judges it)")
        elif peer.get("error") or None in rates:
            unmeasured.append(f"GPU {peer['peer']}: {peer.get('error') or 'not measured'}")
        else:
            measured.append(f"GPU {peer['peer']} {min(rates):.0f} GB/s")
            if floor is not None and min(rates) < floor:
                slow.append(f"GPU {peer['peer']} at {min(rates):.0f} GB/s")
    return slow, unmeasured, measured
