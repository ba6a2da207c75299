"""Load rules: the default pack, user rule directories, and overrides; all validated.

Rule files are YAML with a top-level `rules:` list (new rules) and/or an
`overrides:` mapping (rule id -> severity/enabled/thresholds/remediation). The
default pack holds the rules whose logic is Python (`gpuguard/checks/`); user
files may add rules without code through a `when:` condition. Anything wrong
raises ConfigError naming the file and the line, before a single rule runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard import checks
from gpuguard.profile import Profile, load_profile
from gpuguard.results import SEVERITIES, Status
from gpuguard.rule import Rule, RuleSet, XidEntry
from gpuguard.snapshot import GPU_READING_FIELDS, HOST_READING_FIELDS
from gpuguard.yamlfile import ConfigError, Mapping, load, short

if TYPE_CHECKING:
    pass

RULE_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
RULE_KEYS = {"id", "scope", "severity", "summary", "message", "remediation", "thresholds",
             "enabled", "tags", "when", "cadence", "problem"}
OVERRIDE_KEYS = {"severity", "enabled", "thresholds", "remediation"}
TOP_LEVEL_KEYS = {"rules", "overrides", "xid_catalog"}
XID_SEVERITIES = ("critical", "warning", "ignore")
XID_ACTIONS = ("restart_app", "reset_gpu", "reboot", "contact_vendor", "ignore", "follow_text")

GPU_CONDITION_NAMES = (*GPU_READING_FIELDS, "index", *HOST_READING_FIELDS)
HOST_CONDITION_NAMES = HOST_READING_FIELDS


def default_pack_dir() -> Path:
    here = Path(__file__).resolve().parent
    shipped = here / "_rules"  # inside an installed wheel
    return shipped if shipped.is_dir() else here.parent / "rules"


def load_ruleset(
    user_dirs: list[Path] | None = None,
    profile_overrides: tuple[Path, Mapping] | None = None,
    pack_dir: Path | None = None,
) -> RuleSet:
    checks.load_all()
    ruleset = RuleSet()
    for path in _yaml_files(pack_dir or default_pack_dir()):
        _load_file(ruleset, path, default_pack=True)
    missing = (set(checks.HOST_CHECKS) | set(checks.GPU_CHECKS)) - set(ruleset.rules)
    if missing:
        raise ConfigError(pack_dir or default_pack_dir(), None,
                          f"checks without a rule in the pack: {', '.join(sorted(missing))}")
    for rule in ruleset.rules.values():
        _check_declared_thresholds(rule)
    for directory in user_dirs or []:
        for path in _yaml_files(directory):
            _load_file(ruleset, path, default_pack=False)
    if profile_overrides:
        path, overrides = profile_overrides
        _apply_overrides(ruleset, path, overrides)
    return ruleset


def _check_declared_thresholds(rule: Rule) -> None:
    """The pack's file declares exactly the thresholds its check reads: one it reads but the
    file lacks would fail at run time, one it declares but never reads misleads."""
    wanted = set(checks.THRESHOLDS.get(rule.id, ()))
    have = set(rule.thresholds)
    path, _, line = rule.origin.rpartition(":")
    if wanted - have:
        raise ConfigError(path, int(line), f"{rule.id}: its check reads threshold(s) "
                          f"{', '.join(sorted(wanted - have))}, which this file does not declare")
    if have - wanted:
        raise ConfigError(path, int(line), f"{rule.id}: threshold(s) "
                          f"{', '.join(sorted(have - wanted))} are declared but its check "
                          "never reads them")


def load_config(profile_path: Path | None,
                rules_dirs: list[Path]) -> tuple[Profile, RuleSet]:
    """The profile and the rules in force: the pack, the user's directories, then the
    profile's overrides. `check` and the daemon (also on SIGHUP) load through here."""
    profile = load_profile(profile_path) if profile_path is not None else Profile()
    overrides = (profile.path, profile.rule_overrides) \
        if profile.path is not None and profile.rule_overrides is not None else None
    return profile, load_ruleset(rules_dirs, overrides)


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise ConfigError(directory, None, "rules directory does not exist")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    for path in files:
        if not path.is_file():  # a FIFO or a folder named *.yaml is not skipped in silence
            raise ConfigError(path, None, "not a regular file")
    return files


def _load_file(ruleset: RuleSet, path: Path, default_pack: bool) -> None:
    doc = load(path)
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise ConfigError(path, 1, "expected a mapping with `rules:` and/or `overrides:`")
    if (key := doc.first_unknown(TOP_LEVEL_KEYS)) is not None:
        raise ConfigError(path, doc.line_of(key),
                          f"unknown top-level key {key!r} (expected "
                          f"{', '.join(f'`{k}`' for k in sorted(TOP_LEVEL_KEYS))})")
    entries = doc.get("rules", [])
    if not isinstance(entries, list):
        raise ConfigError(path, doc.line_of("rules"), "`rules` must be a list")
    for entry in entries:
        rule = _parse_rule(path, entry, doc.line_of("rules"), default_pack)
        if rule.id in ruleset.rules:
            raise ConfigError(
                path, entry.line,
                f"rule {rule.id!r} is already defined at {ruleset.rules[rule.id].origin}; "
                "change it with `overrides:` instead",
            )
        ruleset.rules[rule.id] = rule
    if "overrides" in doc:
        overrides = doc["overrides"]
        if not isinstance(overrides, Mapping):
            raise ConfigError(path, doc.line_of("overrides"),
                              "`overrides` must map rule ids to changes")
        _apply_overrides(ruleset, path, overrides)
    if "xid_catalog" in doc:
        _load_xid_catalog(ruleset, path, doc["xid_catalog"], doc.line_of("xid_catalog"))
    ruleset.files.append(path)


def _load_xid_catalog(ruleset: RuleSet, path: Path, catalog: Any, line: int) -> None:
    if not isinstance(catalog, Mapping):
        raise ConfigError(path, line, "xid_catalog maps an Xid number to its grading")
    for key, entry in catalog.items():
        key_line = catalog.line_of(key)
        try:
            xid = int(key)
        except ValueError:
            raise ConfigError(path, key_line, f"xid_catalog key {key!r} is not a number") from None
        if not isinstance(entry, Mapping):
            raise ConfigError(path, key_line, f"xid_catalog[{xid}] must be a mapping")
        if (key := entry.first_unknown({"severity", "action", "meaning"})) is not None:
            raise ConfigError(path, entry.line_of(key),
                              f"xid_catalog[{xid}]: unknown key {key!r} "
                              "(allowed: severity, action, meaning)")
        old = ruleset.xid_catalog.get(xid)
        if old is None and not {"severity", "action", "meaning"} <= set(entry):
            raise ConfigError(path, key_line, f"xid_catalog[{xid}] is new here: it needs "
                              "severity, action and meaning")
        severity = entry.get("severity", old.severity if old else None)
        if severity not in XID_SEVERITIES:
            raise ConfigError(path, entry.line_of("severity"),
                              f"xid_catalog[{xid}]: severity must be one of "
                              f"{', '.join(XID_SEVERITIES)}, not {short(severity)}")
        raw_actions = entry.get("action", list(old.actions) if old else [])
        actions = tuple(raw_actions) if isinstance(raw_actions, list) else (raw_actions,)
        bad = [a for a in actions if a not in XID_ACTIONS]
        if bad or not actions:
            raise ConfigError(path, entry.line_of("action"),
                              f"xid_catalog[{xid}]: action must be one or a list of "
                              f"{', '.join(XID_ACTIONS)}, not {short(raw_actions)}")
        meaning = entry.get("meaning", old.meaning if old else "")
        if not isinstance(meaning, str):
            raise ConfigError(path, entry.line_of("meaning"), f"xid_catalog[{xid}]: meaning "
                              "must be text")
        ruleset.xid_catalog[xid] = XidEntry(severity, actions, meaning, f"{path}:{key_line}")


def _parse_rule(path: Path, entry: Any, list_line: int, default_pack: bool) -> Rule:
    if not isinstance(entry, Mapping):
        raise ConfigError(path, list_line, "each rule must be a mapping")

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(path, entry.line_of(key), problem)

    if (key := entry.first_unknown(RULE_KEYS)) is not None:
        raise fail(key, f"unknown rule key {key!r} (allowed: {', '.join(sorted(RULE_KEYS))})")
    for required in ("id", "scope", "severity", "summary"):
        if required not in entry:
            raise ConfigError(path, entry.line, f"rule is missing {required!r}")
    rule_id = entry["id"]
    if not isinstance(rule_id, str) or not RULE_ID.match(rule_id):
        raise fail("id", f"rule id {short(rule_id)} must look like `family.name` (lowercase)")
    scope = entry["scope"]
    if scope not in ("host", "gpu"):
        raise fail("scope", f"{rule_id}: scope must be `host` or `gpu`, not {short(scope)}")
    severity = _severity(path, entry, rule_id)
    for key in ("summary", "remediation", "message", "problem"):
        if key in entry and not isinstance(entry[key], str):
            raise fail(key, f"{rule_id}: {key} must be text")
    thresholds = entry.get("thresholds", Mapping())
    if not isinstance(thresholds, Mapping):
        raise fail("thresholds", f"{rule_id}: thresholds must be a mapping")
    for key, value in thresholds.items():
        if not isinstance(value, int | float | bool | str | list):
            raise ConfigError(path, thresholds.line_of(key),
                              f"{rule_id}: threshold {key!r} must be a number, text or list")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise fail("enabled", f"{rule_id}: enabled must be true or false")
    cadence = entry.get("cadence", "fast")
    if cadence not in ("fast", "slow"):
        raise fail("cadence", f"{rule_id}: cadence must be `fast` or `slow`, not {short(cadence)}")
    tags = entry.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise fail("tags", f"{rule_id}: tags must be a list of words")

    registered = checks.GPU_CHECKS if scope == "gpu" else checks.HOST_CHECKS
    other = checks.HOST_CHECKS if scope == "gpu" else checks.GPU_CHECKS
    condition = None
    if "when" in entry:
        if rule_id in registered or rule_id in other:
            raise fail("when", f"{rule_id}: has Python logic already; it takes no `when:`")
        if not isinstance(entry["when"], str):
            raise fail("when", f"{rule_id}: `when` must be an expression in quotes")
        # simpleeval is imported only when some rule has a condition (none in the pack).
        from gpuguard.expr import Condition, ConditionError

        names = GPU_CONDITION_NAMES if scope == "gpu" else HOST_CONDITION_NAMES
        try:
            condition = Condition(entry["when"], names)
        except ConditionError as exc:
            raise fail("when", f"{rule_id}: {exc}") from exc
    elif rule_id not in registered:
        if rule_id in other:
            raise fail("scope", f"{rule_id}: its check is registered for the other scope")
        hint = "" if default_pack else " (a user rule needs a `when:` condition)"
        raise fail("id", f"{rule_id}: no check is registered under this id{hint}")
    if not default_pack and condition is None:
        raise fail("id", f"{rule_id}: a user rule needs a `when:` condition")
    if condition is not None and "message" not in entry:
        raise ConfigError(path, entry.line, f"{rule_id}: a `when:` rule needs a `message`")

    return Rule(
        id=rule_id,
        scope=scope,
        severity=severity,
        summary=entry["summary"].strip(),
        remediation=str(entry.get("remediation", "")).strip(),
        origin=f"{path}:{entry.line}",
        thresholds=dict(thresholds),
        enabled=enabled,
        tags=tuple(tags),
        message=entry.get("message"),
        when=condition,
        cadence=cadence,
        problem=entry["problem"].strip() if "problem" in entry else None,
    )


def _severity(path: Path, entry: Mapping, rule_id: str) -> Status:
    raw = entry["severity"]
    allowed = [s.value for s in SEVERITIES]
    if raw not in allowed:
        raise ConfigError(path, entry.line_of("severity"),
                          f"{rule_id}: severity must be one of {', '.join(allowed)}, "
                          f"not {short(raw)}")
    return Status(raw)


def _apply_overrides(ruleset: RuleSet, path: Path, overrides: Mapping) -> None:
    for rule_id, change in overrides.items():
        line = overrides.line_of(rule_id)
        rule = ruleset.rules.get(rule_id)
        if rule is None:
            raise ConfigError(path, line, f"override for unknown rule {rule_id!r}")
        if not isinstance(change, Mapping):
            raise ConfigError(path, line, f"override for {rule_id} must be a mapping")
        if (key := change.first_unknown(OVERRIDE_KEYS)) is not None:
            raise ConfigError(path, change.line_of(key),
                              f"{rule_id}: cannot override {key!r} "
                              f"(allowed: {', '.join(sorted(OVERRIDE_KEYS))})")
        if "severity" in change:
            rule.severity = _severity(path, change, rule_id)
        if "enabled" in change:
            if not isinstance(change["enabled"], bool):
                raise ConfigError(path, change.line_of("enabled"),
                                  f"{rule_id}: enabled must be true or false")
            rule.enabled = change["enabled"]
        if "remediation" in change:
            if not isinstance(change["remediation"], str):
                raise ConfigError(path, change.line_of("remediation"),
                                  f"{rule_id}: remediation must be text")
            rule.remediation = change["remediation"].strip()
        if "thresholds" in change:
            _override_thresholds(rule, path, change)
        rule.overrides.append(f"{path}:{line}")


def _override_thresholds(rule: Rule, path: Path, change: Mapping) -> None:
    new = change["thresholds"]
    if not isinstance(new, Mapping):
        raise ConfigError(path, change.line_of("thresholds"),
                          f"{rule.id}: thresholds must be a mapping")
    for key, value in new.items():
        line = new.line_of(key)
        if key not in rule.thresholds:
            known = ", ".join(sorted(rule.thresholds)) or "none"
            raise ConfigError(path, line,
                              f"{rule.id}: unknown threshold {key!r} (this rule has: {known})")
        old = rule.thresholds[key]
        if not _same_kind(old, value):
            raise ConfigError(path, line,
                              f"{rule.id}: threshold {key!r} must be {_kind(old)}, "
                              f"not {short(value)}")
        rule.thresholds[key] = value


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
