"""Turn a snapshot into results: every enabled rule, for the host or for each GPU."""

from __future__ import annotations

from collections.abc import Iterable
from string import Template
from typing import Any

from gpuguard.judge import registry
from gpuguard.judge.actions import suggest
from gpuguard.judge.registry import CheckContext, Finding, PerGpu
from gpuguard.model.identity import GpuId
from gpuguard.model.profile import Profile
from gpuguard.model.results import Result, Status
from gpuguard.model.rule import Rule, RuleSet
from gpuguard.model.rule_filter import selected
from gpuguard.model.samples import Samples
from gpuguard.model.snapshot import (
    GPU_READING_FIELDS,
    HOST_READING_FIELDS,
    GpuSnapshot,
    Reading,
    Snapshot,
    Unavailable,
)


def evaluate(
    snapshot: Snapshot,
    ruleset: RuleSet,
    profile: Profile,
    only: Iterable[str] = (),
    skip: Iterable[str] = (),
    cadence: str | None = None,
    samples: Samples | None = None,
) -> list[Result]:
    """Every selected rule (of one cadence, for the daemon) for the host or each GPU."""
    only, skip = list(only), list(skip)
    results: list[Result] = []
    for rule in ruleset.ordered():
        if not selected(rule.id, only, skip) or (cadence and rule.cadence != cadence):
            continue
        ctx = CheckContext(rule=rule, snapshot=snapshot, profile=profile, ruleset=ruleset,
                           samples=samples)
        if rule.scope == "host":
            results.extend(_run(rule, ctx, None))
        else:
            for gpu in snapshot.gpus:
                results.extend(_run(rule, ctx, gpu))
            results.extend(_host_part(rule, ctx))
    return results


def _host_part(rule: Rule, ctx: CheckContext) -> list[Result]:
    """A GPU-scope rule's host result, where its check has a host part that says something
    (registry.HOST_PARTS); a disabled or `when:` rule has none."""
    part = registry.HOST_PARTS.get(rule.id)
    if part is None or not rule.enabled or rule.when is not None:
        return []
    try:
        finding = part(ctx)
    except Unavailable:
        return []  # what it reads was not read: the GPUs' results say what is known
    except Exception as exc:  # a broken check is a result, never a crash of the run
        finding = Finding(Status.UNKNOWN, f"check failed: {type(exc).__name__}: {exc}")
    return [] if finding is None else [_result(rule, ctx, None, finding)]


def _run(rule: Rule, ctx: CheckContext, gpu: GpuSnapshot | None) -> list[Result]:
    ref = gpu.identity() if gpu is not None else None
    if not rule.enabled:
        # off in its own file (an opt-in rule of the pack): the file's name, not its
        # path, which differs per install and would make the message unstable
        where = rule.overrides[-1] if rule.overrides else rule.origin.rsplit("/", 1)[-1]
        return [Result(rule.id, Status.SKIPPED, rule.severity, f"disabled ({where})", ref)]
    try:
        finding = _finding(rule, ctx, gpu)
    except Unavailable as exc:
        finding = _unavailable(exc, ctx.snapshot)
    except Exception as exc:  # a broken check is a result, never a crash of the run
        finding = Finding(Status.UNKNOWN, f"check failed: {type(exc).__name__}: {exc}")
    if not isinstance(finding, PerGpu):
        return [_result(rule, ctx, ref, finding)]
    ids = {g.index: g.identity() for g in ctx.snapshot.gpus}
    out = [_result(rule, ctx, ids[index], found)
           for index, found in sorted(finding.gpus.items()) if index in ids]
    if finding.host is not None or not out:  # a rule never vanishes from the results
        out.append(_result(rule, ctx, None, finding.host or Finding(
            Status.UNKNOWN, "check failed: it named neither a GPU nor the host")))
    return out


def _result(rule: Rule, ctx: CheckContext, ref: GpuId | None, finding: Finding) -> Result:
    status = finding.status
    # A lowered severity caps every level a check can give (see docs/rules.md).
    if status in (Status.WARNING, Status.CRITICAL) and status.rank > rule.severity.rank:
        status = rule.severity
    remediation = rule.remediation if status in (Status.WARNING, Status.CRITICAL,
                                                 Status.UNKNOWN) else None
    action, why = suggest(rule, status, finding.observed, ctx.ruleset)
    return Result(rule.id, status, rule.severity, finding.message, ref, remediation or None,
                  finding.observed, action.value, why)


def _finding(rule: Rule, ctx: CheckContext, gpu: GpuSnapshot | None) -> Finding | PerGpu:
    if rule.when is not None:
        return _condition(rule, ctx, gpu)
    if gpu is None:
        return registry.HOST_CHECKS[rule.id](ctx)
    return registry.GPU_CHECKS[rule.id](gpu, ctx)


def _unavailable(exc: Unavailable, snapshot: Snapshot) -> Finding:
    reading = exc.reading
    if reading.state == "not_supported":
        return Finding(Status.SKIPPED, f"{exc.field_name} is not supported here",
                       {exc.field_name: reading.to_json()})
    if reading.state == "absent" and not (snapshot.nvml.init_error or snapshot.nvml.hung_call):
        return Finding(Status.SKIPPED, f"{exc.field_name} is not in this input")
    if reading.error:
        detail = reading.error
    elif snapshot.nvml.init_error:
        detail = "NVML is not available (see driver.loaded)"
    else:
        detail = "NVML did not answer in time (see driver.responsive)"
    return Finding(Status.UNKNOWN, f"cannot read {exc.field_name}: {detail}",
                   {exc.field_name: reading.to_json()})


def condition_names(snapshot: Snapshot, gpu: GpuSnapshot | None) -> dict[str, Reading[Any]]:
    names: dict[str, Reading[Any]] = {
        name: getattr(snapshot.host, name) for name in HOST_READING_FIELDS
    }
    if gpu is not None:
        names.update({name: getattr(gpu, name) for name in GPU_READING_FIELDS})
        names["index"] = Reading.ok(gpu.index)
    return names


def _condition(rule: Rule, ctx: CheckContext, gpu: GpuSnapshot | None) -> Finding:
    from gpuguard.model.expr import ConditionError

    assert rule.when is not None
    readings = condition_names(ctx.snapshot, gpu)
    for name in sorted(rule.when.names):
        readings[name].get()  # raises Unavailable: skipped or unknown, never a false "ok"
    values = {name: readings[name].value for name in rule.when.names}
    try:
        fired = bool(rule.when.evaluate(values))
    except ConditionError as exc:
        return Finding(Status.UNKNOWN, f"condition failed: {exc}", values)
    if not fired:
        return Finding(Status.OK, f"condition is false: {rule.when.source}", values)
    text = Template(rule.message or rule.summary).safe_substitute(
        {k: v.value for k, v in readings.items() if v.is_ok}
    )
    return ctx.fail(text, **values)
