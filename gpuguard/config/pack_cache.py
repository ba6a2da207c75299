"""The shipped rule pack loaded from its compiled form, without the schema machinery.

scripts/gen_pack_cache.py loads the pack the full way (config/rule_files.py: msgspec,
every file:line check) and stores the resulting rules in rules/compiled-ruleset.json,
beside the SHA-256 of every YAML file they came from. `gpuguard check` then builds the same
RuleSet from that JSON, trusting it only while the hashes of the files read now match
(issue 32: msgspec and the schema were 24-33 ms of a check's start on the H200 host).
Any other file list or content, a missing or unreadable entry: None, and the caller
loads the pack the full way, errors and exit 3 as before.

Origins are stored as `file.yaml:line` and given the pack's folder when loaded, so an
installed pack names its own paths, as the full load does."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpuguard.model.results import Status
from gpuguard.model.rule import Rule, RuleSet, XidEntry

# Beside rules/compiled.json (the YAML documents, for the full load): a file of its own,
# so that the fast path parses 40 KiB of rules, not the documents' 140 KiB too.
COMPILED_RULESET = "compiled-ruleset.json"
FORMAT = 1


def pack_digest(files: dict[str, str]) -> str:
    """One hash for the pack: every file's name and SHA-256, in name order."""
    text = "".join(f"{name}\0{digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def load_cached(pack_dir: Path, paths: list[Path]) -> RuleSet | None:
    """The pack's RuleSet from `pack_dir`'s compiled file, or None where it does not hold
    exactly these files as they are now, or its body is not the one its head hashed (a
    hand-edited or cut file)."""
    try:
        head_line, _, body = (pack_dir / COMPILED_RULESET).read_bytes().partition(b"\n")
        head = json.loads(head_line)
        if head["format"] != FORMAT or head["body_sha256"] != hashlib.sha256(body).hexdigest():
            return None
        digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
        if head["pack_sha256"] != pack_digest(digests):
            return None
        return _decode(json.loads(body), pack_dir)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def render(ruleset: RuleSet, pack_dir: Path, digests: dict[str, str]) -> str:
    """The compiled file's text: a head line (the hashes) and the body (encode's)."""
    body = json.dumps(encode(ruleset, pack_dir), separators=(",", ":")) + "\n"
    head = {"generated_by": "scripts/gen_pack_cache.py", "format": FORMAT,
            "pack_sha256": pack_digest(digests),
            "body_sha256": hashlib.sha256(body.encode()).hexdigest()}
    return json.dumps(head, separators=(",", ":")) + "\n" + body


def _origin(pack_dir: Path, stored: str | None) -> str | None:
    return None if stored is None else str(pack_dir / stored)


def _decode(stored: dict[str, Any], pack_dir: Path) -> RuleSet:
    ruleset = RuleSet()
    for raw in stored["rules"]:
        rule = Rule(id=raw["id"], scope=raw["scope"], severity=Status(raw["severity"]),
                    summary=raw["summary"], remediation=raw["remediation"],
                    origin=str(pack_dir / raw["origin"]), thresholds=raw["thresholds"],
                    enabled=raw["enabled"], tags=tuple(raw["tags"]), message=raw["message"],
                    overrides=[str(pack_dir / o) for o in raw["overrides"]],
                    cadence=raw["cadence"], problem=raw["problem"], action=raw["action"],
                    action_origin=_origin(pack_dir, raw["action_origin"]),
                    auto_clear_s=raw["auto_clear_s"], escalate_count=raw["escalate_count"],
                    escalate_window_s=raw["escalate_window_s"], kind=raw["kind"])
        ruleset.rules[rule.id] = rule
    for name in ("xid_catalog", "sxid_catalog"):
        catalog: dict[int, XidEntry] = getattr(ruleset, name)
        for code, severity, actions, meaning, origin, mnemonic, nvidia, reason in stored[name]:
            catalog[code] = XidEntry(severity, tuple(actions), meaning,
                                     str(pack_dir / origin), mnemonic, tuple(nvidia), reason)
    ruleset.xid_catalog_source = stored["xid_catalog_source"]
    ruleset.sxid_catalog_source = stored["sxid_catalog_source"]
    ruleset.files = [pack_dir / name for name in stored["files"]]
    return ruleset


def encode(ruleset: RuleSet, pack_dir: Path) -> dict[str, Any]:
    """The pack as loaded the full way, as JSON for _decode.
    A pack rule with a `when:` has no JSON form: the pack has none (its rules are the
    registered checks), and a new one fails here, at generation."""
    prefix = f"{pack_dir}/"

    def local(origin: str | None) -> str | None:
        if origin is None:
            return None
        if not origin.startswith(prefix):
            raise ValueError(f"origin {origin!r} is outside the pack {pack_dir}")
        return origin[len(prefix):]

    rules = []
    for rule in ruleset.rules.values():
        if rule.when is not None:
            raise ValueError(f"{rule.id}: a `when:` rule cannot be compiled")
        rules.append({"id": rule.id, "scope": rule.scope, "severity": rule.severity.value,
                      "summary": rule.summary, "remediation": rule.remediation,
                      "origin": local(rule.origin), "thresholds": rule.thresholds,
                      "enabled": rule.enabled, "tags": list(rule.tags),
                      "message": rule.message,
                      "overrides": [local(o) for o in rule.overrides],
                      "cadence": rule.cadence, "problem": rule.problem, "action": rule.action,
                      "action_origin": local(rule.action_origin),
                      "auto_clear_s": rule.auto_clear_s,
                      "escalate_count": rule.escalate_count,
                      "escalate_window_s": rule.escalate_window_s, "kind": rule.kind})
    catalogs = {name: [[code, e.severity, list(e.actions), e.meaning, local(e.origin),
                        e.mnemonic, list(e.nvidia), e.reason]
                       for code, e in getattr(ruleset, name).items()]
                for name in ("xid_catalog", "sxid_catalog")}
    return {"rules": rules,
            **catalogs, "xid_catalog_source": ruleset.xid_catalog_source,
            "sxid_catalog_source": ruleset.sxid_catalog_source,
            "files": [p.name for p in ruleset.files]}
