"""One rule file read the full way: checked whole against config/shapes.py's RulesFile
(msgspec, through config/schema.py), then the checks that span keys, each error naming
its file and line. ruleset.py comes here for every user file and profile override, and
for the pack itself when its compiled form (config/pack_cache.py) does not match it."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.config import schema
from gpuguard.config.shapes import OverrideSpec, RulesFile, RuleSpec, XidSpec, given
from gpuguard.config.yamlfile import ConfigError, Mapping, load, short
from gpuguard.judge import registry
from gpuguard.model.results import Status
from gpuguard.model.rule import Rule, RuleSet, XidEntry
from gpuguard.model.snapshot import GPU_READING_FIELDS, HOST_READING_FIELDS

if TYPE_CHECKING:
    from gpuguard.model.expr import Condition

# makes the ConfigError for a key of the entry at hand: its line, and the problem given
Fail = Callable[[str, str], ConfigError]

GPU_CONDITION_NAMES = (*GPU_READING_FIELDS, "index", *HOST_READING_FIELDS)
HOST_CONDITION_NAMES = HOST_READING_FIELDS


def convert_overrides(overrides: Mapping, path: Path) -> dict[str, OverrideSpec]:
    """A profile's `rules:` overrides (load_profile has checked them) as parsed values."""
    return schema.convert(overrides, dict[str, OverrideSpec], path)


def load_file(ruleset: RuleSet, path: Path, default_pack: bool) -> None:
    """One rule file, checked whole against config_shapes.RulesFile before any of it
    changes `ruleset`; then the checks that span keys, each naming its line."""
    doc = load(path)
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise ConfigError(path, 1, "expected a mapping with `rules:`, `overrides:`, "
                          "`xid_catalog:` and/or `sxid_catalog:`")
    spec = schema.convert(doc, RulesFile, path)
    for rule_spec, entry in zip(spec.rules, doc.get("rules") or [], strict=True):
        rule = _rule(path, rule_spec, entry, default_pack)
        if rule.id in ruleset.rules:
            raise ConfigError(
                path, entry.line,
                f"rule {rule.id!r} is already defined at {ruleset.rules[rule.id].origin}; "
                "change it with `overrides:` instead",
            )
        ruleset.rules[rule.id] = rule
    if spec.overrides:
        apply_overrides(ruleset, path, spec.overrides, doc["overrides"])
    if spec.xid_catalog:
        _load_xid_catalog(ruleset.xid_catalog, path, spec.xid_catalog, doc["xid_catalog"],
                          "xid_catalog")
    if spec.sxid_catalog:
        _load_xid_catalog(ruleset.sxid_catalog, path, spec.sxid_catalog, doc["sxid_catalog"],
                          "sxid_catalog")
    ruleset.xid_catalog_source = given(spec.xid_catalog_source) or ruleset.xid_catalog_source
    ruleset.sxid_catalog_source = given(spec.sxid_catalog_source) or ruleset.sxid_catalog_source
    ruleset.files.append(path)


def _load_xid_catalog(target: dict[int, XidEntry], path: Path, catalog: dict[int, XidSpec],
                      raw: Mapping, key: str) -> None:
    """An Xid or SXid catalog (`key` names it in messages) merged into `target`."""
    for xid, entry in catalog.items():
        key_line = raw.line_of(xid)
        old = target.get(xid)
        severity, meaning = given(entry.severity), given(entry.meaning)
        action = entry.action
        if old is None:
            if severity is None or given(action) is None or meaning is None:
                raise ConfigError(path, key_line, f"{key}[{xid}] is new here: it "
                                  "needs severity, action and meaning")
            old = XidEntry(severity, (), meaning, "")
        actions: tuple[str, ...] = old.actions
        if isinstance(action, list):
            actions = tuple(action)
        elif isinstance(action, str):
            actions = (action,)
        nvidia = given(entry.nvidia)
        target[xid] = XidEntry(severity or old.severity, actions,
                               old.meaning if meaning is None else meaning,
                               f"{path}:{key_line}",
                               given(entry.mnemonic) or old.mnemonic,
                               old.nvidia if nvidia is None else tuple(nvidia),
                               # a re-grade without a reason keeps none: the pack's was
                               # about the pack's grade
                               given(entry.reason) or "")


def _rule(path: Path, spec: RuleSpec, entry: Mapping, default_pack: bool) -> Rule:
    """The checks that span a rule's keys, on a well-typed entry."""
    rule_id = spec.id

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(path, entry.line_of(key), problem)

    condition = _condition(spec, default_pack, fail)
    if condition is not None and given(spec.message) is None:
        raise ConfigError(path, entry.line, f"{rule_id}: a `when:` rule needs a `message`")

    for key, value in spec.thresholds.items():
        if (problem_text := _not_finite(rule_id, key, value)) is not None:
            raise fail("thresholds", problem_text)
    rule = Rule(
        id=rule_id,
        scope=spec.scope,
        severity=Status(spec.severity),
        summary=spec.summary.strip(),
        remediation=spec.remediation.strip(),
        origin=f"{path}:{entry.line}",
        thresholds=dict(spec.thresholds),
        enabled=spec.enabled,
        tags=tuple(spec.tags),
        message=given(spec.message),
        when=condition,
        cadence=spec.cadence,
        problem=problem.strip() if (problem := given(spec.problem)) is not None else None,
        kind=given(spec.kind),
    )
    if (action := given(spec.action)) is not None:
        rule.action, rule.action_origin = action, f"{path}:{entry.line_of('action')}"
    _read_spans(rule, spec, fail)
    return rule


def _condition(spec: RuleSpec, default_pack: bool, fail: Fail) -> Condition | None:
    """The rule's `when:` compiled; None for the pack's rule of a registered check."""
    rule_id = spec.id
    registered = registry.GPU_CHECKS if spec.scope == "gpu" else registry.HOST_CHECKS
    other = registry.HOST_CHECKS if spec.scope == "gpu" else registry.GPU_CHECKS
    if (when := given(spec.when)) is None:
        _require_registered_check(rule_id, registered, other, default_pack, fail)
        return None
    if rule_id in registered or rule_id in other:
        raise fail("when", f"{rule_id}: has Python logic already; it takes no `when:`")
    # simpleeval is imported only when some rule has a condition (none in the pack).
    from gpuguard.model.expr import Condition, ConditionError

    names = GPU_CONDITION_NAMES if spec.scope == "gpu" else HOST_CONDITION_NAMES
    try:
        return Condition(when, names)
    except ConditionError as exc:
        raise fail("when", f"{rule_id}: {exc}") from exc


def _require_registered_check(rule_id: str, registered: Collection[str],
                              other: Collection[str], default_pack: bool, fail: Fail) -> None:
    """A rule without `when:` is the pack's rule of a check registered for its scope."""
    if rule_id not in registered:
        if rule_id in other:
            raise fail("scope", f"{rule_id}: its check is registered for the other scope")
        hint = "" if default_pack else " (a user rule needs a `when:` condition)"
        raise fail("id", f"{rule_id}: no check is registered under this id{hint}")
    if not default_pack:
        raise fail("id", f"{rule_id}: a user rule needs a `when:` condition")


def _read_spans(rule: Rule, spec: RuleSpec, fail: Fail) -> None:
    """`auto_clear:` and `escalate:`, in seconds."""
    if (auto_clear := given(spec.auto_clear)) is not None:
        rule.auto_clear_s = _span(auto_clear, fail("auto_clear", f"{rule.id}: auto_clear "
                                                   "must be longer than 0"))
    if (escalate := given(spec.escalate)) is not None:
        rule.escalate_count = escalate.count
        rule.escalate_window_s = _span(escalate.window, fail(
            "escalate", f"{rule.id}: escalate.window must be longer than 0"))


def _span(text: str, error: ConfigError) -> float:
    from gpuguard.config.profile import parse_span

    seconds = parse_span(text)
    if seconds is None:
        raise error
    return seconds


def apply_overrides(ruleset: RuleSet, path: Path, overrides: dict[str, OverrideSpec],
                     raw: Mapping) -> None:
    """`overrides` as parsed; `raw`, the same as written, for the line of each key."""
    for rule_id, change in overrides.items():
        line = raw.line_of(rule_id)
        rule = ruleset.rules.get(rule_id)
        if rule is None:
            raise ConfigError(path, line, f"override for unknown rule {rule_id!r}")
        if (severity := given(change.severity)) is not None:
            rule.severity = Status(severity)
        if (enabled := given(change.enabled)) is not None:
            rule.enabled = enabled
        if (remediation := given(change.remediation)) is not None:
            rule.remediation = remediation.strip()
        if (action := given(change.action)) is not None:
            rule.action, rule.action_origin = action, f"{path}:{raw[rule_id].line_of('action')}"
        if (thresholds := given(change.thresholds)) is not None:
            _override_thresholds(rule, path, thresholds, raw[rule_id]["thresholds"])
        rule.overrides.append(f"{path}:{line}")


def _override_thresholds(rule: Rule, path: Path, new: dict[str, Any], raw: Mapping) -> None:
    for key, value in new.items():
        line = raw.line_of(key)
        if key not in rule.thresholds:
            known = ", ".join(sorted(rule.thresholds)) or "none"
            raise ConfigError(path, line,
                              f"{rule.id}: unknown threshold {key!r} (this rule has: {known})")
        old = rule.thresholds[key]
        if (problem := _not_finite(rule.id, key, value)) is not None:
            raise ConfigError(path, line, problem)
        if not _same_kind(old, value):
            raise ConfigError(path, line,
                              f"{rule.id}: threshold {key!r} must be {_kind(old)}, "
                              f"not {short(value)}")
        rule.thresholds[key] = value


def _not_finite(rule_id: str, key: str, value: Any) -> str | None:
    """A threshold of .nan or .inf passes a type check and then no comparison ever fires:
    a warning silently disabled. Refused, as any bad value is (`file:line`)."""
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, float) and not math.isfinite(item):
            return f"{rule_id}: threshold {key!r} must be a finite number, not {item}"
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return "text"


def _same_kind(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, int | float):
        return isinstance(new, int | float)
    return type(old) is type(new)
