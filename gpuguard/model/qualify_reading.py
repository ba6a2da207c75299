"""What a valid `qualify` reading is (GpuSnapshot.qualify: what `gpuguard qualify`
measured on one GPU). A value that is not this shape, from a run or a replayed file,
becomes an error reading, so every qualify.* rule is unknown: never a traceback, never a
wrong value judged.

The shape, every section optional but `level`; a section that is there carries the keys
its rule judges:

    level      quick | standard | long
    refused    null | why the run would not touch the GPU (text)
    drill      null | {sm}: a bit of every result computed on that SM flipped on purpose
    error      null | {phase, text, code: CUresult | null, kind: cuda | hung | died |
               stopped | deadline | fatal}
    targets    null | {model, power_share | hbm_gbps | h2d_gbps | d2h_gbps | p2p_gbps |
               correctable_ecc_per_hour | sm_clock_mhz: {value, source, note?}}
    compute    {seconds, tflops, sms, launches, tiles_computed, tiles_compared,
               moved_blocks, mismatches, examples: [{kind, sm, tile, word, expected, got}],
               located: null | {outcome: sm | every_sm | not_reproduced, sms: [sm], tile,
               kind, expected, got, count, checked_sms}}
    memtest    {bytes_tested, free_bytes, passes, mismatches, seconds, gbps, patterns: [text],
               first: [{address, expected, got}]}
    bandwidth  {h2d_gbps, d2h_gbps, d2d_gbps, bytes}
    peers      [{peer, access, gbps, reverse_gbps, error?}]
    load       {samples, interval_ms, power_w_median, power_w_max, power_limit_w,
               power_share, sm_clock_mhz / mem_clock_mhz: {min, median, max},
               gpu_temp_c_max, hbm_temp_c_max, hbm_temp_limit_c, reasons: {hw_slowdown,
               hw_thermal, hw_power_brake, sw_power_cap, sw_thermal: samples},
               ecc: {uncorrectable_new, correctable_new, remap_pending(_before),
               remap_failed(_before)}, xids: [{code, text}], hours}

Lists hold at most 64 entries (the SMs of a location and the Xids 1024); numbers are finite,
and not negative where they are counts, rates or times; text is bounded. Keys not named
here are left alone (the run may add notes)."""

from __future__ import annotations

import math

from gpuguard.model.readings import MAX_COUNTER, text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LEVELS = ("quick", "standard", "long")
ERROR_KINDS = ("cuda", "hung", "died", "stopped", "deadline", "fatal")
OUTCOMES = ("sm", "every_sm", "not_reproduced")
WORK = ("exact", "random")
TARGETS = ("power_share", "hbm_gbps", "h2d_gbps", "d2h_gbps", "p2p_gbps",
           "correctable_ecc_per_hour", "sm_clock_mhz")
MAX_ENTRIES = 64
MAX_SMS = 1024
# The Xids of a run: the sampler keeps the first 1000 and one more (it notes the rest); a
# flood of Xids must be judged, not refused as an invalid reading.
MAX_XIDS = 1024
# Larger than any rate, time or wattage a GPU gives: a corrupt input.
MAX_NUMBER = 1e15

# A key's kind: "count" (a whole number 0 <= n < 2**64), "number" (finite, >= 0),
# "celsius" (a whole number -100..250), "text", "flag", or a tuple of the words allowed;
# a trailing "?" lets it be null or left out.
Spec = dict[str, "str | tuple[str, ...]"]
ERROR: Spec = {"phase": "text", "text": "text", "code": "count?", "kind": ERROR_KINDS}
TARGET: Spec = {"value": "number", "source": "text", "note": "text?"}
COMPUTE: Spec = {"seconds": "number", "tflops": "number", "sms": "count", "launches": "count",
                 "tiles_computed": "count", "tiles_compared": "count",
                 "moved_blocks": "count", "mismatches": "count"}
EXAMPLE: Spec = {"kind": WORK, "sm": "count", "tile": "count", "word": "count?",
                 "expected": "text", "got": "text"}
LOCATED: Spec = {"outcome": OUTCOMES, "tile": "count", "kind": WORK, "expected": "text",
                 "got": "text", "count": "count", "checked_sms": "count"}
MEMTEST: Spec = {"bytes_tested": "count", "free_bytes": "count", "passes": "count",
                 "mismatches": "count", "seconds": "number", "gbps": "number"}
WRONG_WORD: Spec = {"address": "text", "expected": "text", "got": "text"}
BANDWIDTH: Spec = {"h2d_gbps": "number", "d2h_gbps": "number", "d2d_gbps": "number",
                   "bytes": "count?"}
PEER: Spec = {"peer": "count", "access": "flag", "gbps": "number?", "reverse_gbps": "number?",
              "error": "text?"}
LOAD: Spec = {"samples": "count", "interval_ms": "number?", "power_w_median": "number?",
              "power_w_max": "number?", "power_limit_w": "number?", "power_share": "number?",
              "gpu_temp_c_max": "celsius?", "hbm_temp_c_max": "celsius?",
              "hbm_temp_limit_c": "celsius?", "hours": "number?"}
CLOCK: Spec = {"min": "count", "median": "count", "max": "count"}
REASONS: Spec = {name: "count" for name in ("hw_slowdown", "hw_thermal", "hw_power_brake",
                                            "sw_power_cap", "sw_thermal")}
ECC: Spec = {"uncorrectable_new": "count?", "correctable_new": "count?",
             **{f"{name}{when}": "flag?" for name in ("remap_pending", "remap_failed")
                for when in ("", "_before")}}
XID: Spec = {"code": "count", "text": "text?"}


def qualify(value: Any) -> str | None:
    """None when `value` is a qualify reading of the shape above, else what is wrong."""
    if not isinstance(value, dict):
        return f"must be a qualify result mapping, not {type(value).__name__}"
    if value.get("level") not in LEVELS:
        return f"qualify level must be one of {', '.join(LEVELS)}"
    if value.get("refused") is not None and text(value["refused"]):
        return "qualify refused must be text"
    drill = value.get("drill")
    if drill is not None and (not isinstance(drill, dict) or not _kind(drill.get("sm"), "count")):
        return "qualify drill must be {sm: a number}"
    for problem in (_one("error", value.get("error"), ERROR), _targets(value.get("targets")),
                    _compute(value.get("compute")), _memtest(value.get("memtest")),
                    _one("bandwidth", value.get("bandwidth"), BANDWIDTH),
                    _entries("peers", value.get("peers"), PEER), _load(value.get("load"))):
        if problem is not None:
            return problem
    return None


def _targets(targets: Any) -> str | None:
    if targets is None:
        return None
    if not isinstance(targets, dict) or (targets.get("model") is not None
                                         and text(targets["model"])):
        return "qualify targets must be a mapping with a model name"
    for key in TARGETS:
        if (problem := _one(f"target {key}", targets.get(key), TARGET)) is not None:
            return problem
    return None


def _compute(compute: Any) -> str | None:
    if compute is None:
        return None
    problem = _fields("compute", compute, COMPUTE) or \
        _entries("compute examples", compute.get("examples"), EXAMPLE)
    located = compute.get("located") if problem is None else None
    if located is None:
        return problem
    problem = _fields("compute located", located, LOCATED)
    sms = located.get("sms") if problem is None else []
    if not isinstance(sms, list) or len(sms) > MAX_SMS or \
            not all(_kind(sm, "count") for sm in sms):
        return f"qualify compute located sms must be a list of at most {MAX_SMS} SMs"
    return problem


def _memtest(memtest: Any) -> str | None:
    if memtest is None:
        return None
    problem = _fields("memtest", memtest, MEMTEST) or \
        _entries("memtest first", memtest.get("first"), WRONG_WORD)
    patterns = memtest.get("patterns") if problem is None else []
    if patterns is not None and (not isinstance(patterns, list) or len(patterns) > MAX_ENTRIES
                                 or not all(text(p) is None for p in patterns)):
        problem = "qualify memtest patterns must be a short list of text"
    return problem


def _load(load: Any) -> str | None:
    if load is None:
        return None
    problem = _fields("load", load, LOAD)
    for name, spec in (("sm_clock_mhz", CLOCK), ("mem_clock_mhz", CLOCK),
                       ("reasons", REASONS), ("ecc", ECC)):
        problem = problem or _one(f"load {name}", load.get(name), spec)
    return problem or _entries("load xids", load.get("xids"), XID, MAX_XIDS)


def _one(where: str, value: Any, spec: Spec) -> str | None:
    """An optional mapping of `spec`: null or left out is fine."""
    return None if value is None else _fields(where, value, spec)


def _entries(where: str, value: Any, spec: Spec, most: int = MAX_ENTRIES) -> str | None:
    """An optional list of at most `most` mappings of `spec`."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > most:
        return f"qualify {where} must be a list of at most {most} entries"
    return next((p for p in (_fields(where, entry, spec) for entry in value) if p), None)


def _fields(where: str, value: Any, spec: Spec) -> str | None:
    if not isinstance(value, dict):
        return f"qualify {where} must be a mapping"
    for key, kind in spec.items():
        if not _kind(value.get(key), kind):
            allowed = "|".join(kind) if isinstance(kind, tuple) else kind.rstrip("?")
            return f"qualify {where} {key} must be {allowed}"
    return None


def _kind(value: Any, kind: str | tuple[str, ...]) -> bool:
    if isinstance(kind, tuple):
        return value in kind
    if kind.endswith("?"):
        return value is None or _kind(value, kind[:-1])
    if kind == "text":
        return text(value) is None
    if kind == "flag":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind == "number":
        return math.isfinite(value) and 0 <= value <= MAX_NUMBER
    if not isinstance(value, int):
        return False
    return -100 <= value <= 250 if kind == "celsius" else 0 <= value < MAX_COUNTER
