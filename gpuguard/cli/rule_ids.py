"""Shell completion of rule ids (`gpuguard rules explain pcie.<TAB>`, `ack`, `events --rule`).

A completion runs on every TAB, so it reads only the ids and summaries: each rule file
through yamlfile.load, which takes the shipped pack's documents from rules/compiled.json
while their hashes match (no YAML parse, no schema, no checks), plus the rule files of the
--rules directories named so far on the line (else /etc/gpuguard/rules.d where present).
A file that cannot be read adds nothing: a completion never prints an error; the command
itself says what is wrong when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem


def complete_rule_id(ctx: click.Context, param: click.Parameter,
                     incomplete: str) -> list[CompletionItem]:
    """click's shell_complete: the rule ids that start with what was typed, each with its
    summary (zsh and fish show it beside the id)."""
    summaries = rule_summaries(_user_dirs(ctx.params.get("rules_dirs")))
    return [CompletionItem(rule_id, help=summary)
            for rule_id, summary in sorted(summaries.items()) if rule_id.startswith(incomplete)]


def rule_summaries(user_dirs: list[Path]) -> dict[str, str]:
    """Rule id -> summary, of the shipped pack and of `user_dirs`' rule files."""
    from gpuguard.config.ruleset import default_pack_dir

    found: dict[str, str] = {}
    for directory in [default_pack_dir(), *user_dirs]:
        for path in _rule_files(directory):
            found.update(_rules_of(path))
    return found


def _user_dirs(given: Any) -> list[Path]:
    from gpuguard.io.paths import HostPathForbidden, rules_dirs_or_default

    try:
        return rules_dirs_or_default(tuple(Path(p) for p in given or ()))
    except HostPathForbidden:  # a test's guard: the host's rules.d is not read
        return []


def _rule_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir()
                      if p.suffix in (".yaml", ".yml") and p.is_file())
    except OSError:
        return []


def _rules_of(path: Path) -> dict[str, str]:
    from gpuguard.config.yamlfile import ConfigError, load

    try:
        doc = load(path)
    except ConfigError:
        return {}
    rules = doc.get("rules") if isinstance(doc, dict) else None
    return {rule["id"]: str(rule.get("summary", ""))
            for rule in rules if isinstance(rule, dict) and isinstance(rule.get("id"), str)
            } if isinstance(rules, list) else {}
