"""`gpuguard rules`: the rules in force, what each checks and what to do when it fails."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuguard.assess.inputs import load_configuration
from gpuguard.cli.options import ConfigProblem, emit_json, rule_options, text_or_json_option
from gpuguard.cli.rule_ids import complete_rule_id

if TYPE_CHECKING:
    from gpuguard.model.rule import Rule, RuleSet

SCHEMA = 1  # of the JSON documents below (gpuguard/outputs/schemas/rules-*.schema.json)


@click.group()
def rules() -> None:
    """Inspect the rules in force."""


@rules.command("list")
@text_or_json_option()
@rule_options
def rules_list(fmt: str, profile_path: Path | None, rules_dirs: tuple[Path, ...]) -> None:
    """List every rule with its scope, severity and whether it is enabled."""
    _, ruleset = load_configuration(profile_path, rules_dirs)
    rows = ruleset.ordered()
    if fmt == "json":
        emit_json({"schema": SCHEMA, "rules": [
            {"id": r.id, "scope": r.scope, "severity": r.severity.value, "enabled": r.enabled,
             "summary": r.summary, "tags": list(r.tags)} for r in rows]})
        return
    width = max(len(r.id) for r in rows)
    click.echo(f"{'RULE':<{width}}  SCOPE  SEVERITY  ENABLED  SUMMARY")
    for r in rows:
        click.echo(f"{r.id:<{width}}  {r.scope:<5}  {r.severity.value:<8}  "
                   f"{'yes' if r.enabled else 'no':<7}  {r.summary}")


@rules.command("explain")
@click.argument("rule_id", shell_complete=complete_rule_id)
@text_or_json_option()
@rule_options
def rules_explain(rule_id: str, fmt: str, profile_path: Path | None,
                  rules_dirs: tuple[Path, ...]) -> None:
    """What RULE_ID checks, the thresholds in force, and what to do when it fails."""
    _, ruleset = load_configuration(profile_path, rules_dirs)
    rule = ruleset.rules.get(rule_id)
    if rule is None:
        raise ConfigProblem(f"no rule {rule_id!r}; see `gpuguard rules list`")
    if fmt == "json":
        emit_json({"schema": SCHEMA, "rule": explained(rule, ruleset)})
        return
    click.echo(f"{rule.id}  ({rule.scope} rule, severity {rule.severity.value}, "
               f"{'enabled' if rule.enabled else 'disabled'})")
    click.echo(f"  checks:      {rule.summary}")
    if rule.when is not None:
        click.echo(f"  when:        {rule.when.source}")
    if rule.thresholds:
        click.echo("  thresholds:  " + ", ".join(f"{k}={v}" for k, v in rule.thresholds.items()))
    if rule.tags:
        click.echo(f"  tags:        {', '.join(rule.tags)}")
    click.echo(f"  defined at:  {rule.origin}")
    for where in rule.overrides:
        click.echo(f"  changed at:  {where}")
    click.echo(f"  remediation: {rule.remediation or '-'}")
    click.echo(f"  action:      {action_text(rule, ruleset)}")


def explained(rule: Rule, ruleset: RuleSet) -> dict[str, Any]:
    """`rules explain`'s lines as one object (the JSON document's `rule`)."""
    return {"id": rule.id, "scope": rule.scope, "severity": rule.severity.value,
            "enabled": rule.enabled, "summary": rule.summary,
            "when": None if rule.when is None else rule.when.source,
            "thresholds": dict(rule.thresholds), "tags": list(rule.tags),
            "defined_at": rule.origin, "changed_at": list(rule.overrides),
            "remediation": rule.remediation or None, "action": action_text(rule, ruleset)}


def action_text(rule: Rule, ruleset: RuleSet) -> str:
    """What the rule's failure suggests doing, and where a finding's own data decides."""
    from gpuguard.judge.actions import NO_RESET_HELPS, WRONG_DATA, suggest
    from gpuguard.model.results import Status

    prefix = "inspect_hardware when the GPU read back wrong data, else " \
        if rule.id in WRONG_DATA else ""
    if rule.id in NO_RESET_HELPS:
        prefix = f"inspect_hardware when {NO_RESET_HELPS[rule.id][1].split(':')[0]}, else "
    source = {"xid.recent": "the Xid catalog (or the line) per event, else ",
              "sxid.recent": "the SXid catalog (or the line) per event, else ",
              "gsp.firmware": "what each GSP line means, else ",
              "recovery.action": "the driver's recovery action field, else "}
    whats = [f"{status.value} {action.value} ({why})" for status in
             (Status.CRITICAL, Status.WARNING)
             for action, why in [suggest(rule, status, {}, ruleset)]]
    return (f"{prefix}{source.get(rule.id, '') if rule.action is None else ''}"
            + "; ".join(whats))


@rules.command("fields")
@text_or_json_option()
def rules_fields(fmt: str) -> None:
    """Names that a rule's `when:` condition can use."""
    from gpuguard.config.rule_files import GPU_CONDITION_NAMES, HOST_CONDITION_NAMES

    if fmt == "json":
        emit_json({"schema": SCHEMA, "gpu": list(GPU_CONDITION_NAMES),
                   "host": list(HOST_CONDITION_NAMES)})
        return
    click.echo("gpu scope:  " + ", ".join(GPU_CONDITION_NAMES))
    click.echo("host scope: " + ", ".join(HOST_CONDITION_NAMES))
