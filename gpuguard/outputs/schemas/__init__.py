"""The JSON Schemas (draft 2020-12) of the documents the commands print with `--format json`
(docs/json-output.md). They ship in the package beside this module; the tests validate each
command's real output against its file (tests/schemas/test_documents.py).

A schema's `$id` is a name under one made-up base (the .invalid domain is never served):
a schema names another by a relative `$ref` ("verdict.schema.json#/$defs/result"), which a
validator resolves among these files, not over the network."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

ID_BASE = "https://gpuguard.invalid/schemas/"
SUFFIX = ".schema.json"

# Every command that prints results -> the schema of its `--format json` document. `status`
# prints what `check` prints (the daemon renders with check's renderer), and so does
# `qualify` (its verdict is judged by the qualify.* rules like any other).
DOCUMENTS: dict[tuple[str, ...], str] = {
    ("check",): "check",
    ("status",): "check",
    ("qualify",): "check",
    ("events",): "events",
    ("rules", "list"): "rules-list",
    ("rules", "explain"): "rules-explain",
    ("rules", "fields"): "rules-fields",
    ("failover", "status"): "failover-status",
    ("slurm", "health"): "slurm-health",
}

# The commands that print no results, and why: a new command must be in one of the two.
NO_RESULTS: dict[tuple[str, ...], str] = {
    ("snapshot",): "records readings, not a judgement: its JSON is the input format of "
                   "`check --input` (kind gpuguard-snapshot, its own schema number)",
    ("daemon",): "a service: its results are /metrics, /status and the status socket",
    ("ack",): "an action: prints one confirmation line; the ack is an event (`events`)",
    ("xid", "ack"): "an action: prints one confirmation line; the ack is an event",
    ("failover", "to"): "an action: prints its progress; the outcome is `failover status`",
    ("slurm", "prolog"): "slurmd's Prolog: its answer is the exit code, its lines slurmd's log",
    ("slurm", "epilog"): "slurmd's Epilog: its answer is the exit code, its lines slurmd's log",
}


def names() -> list[str]:
    """Every schema file's name (without .schema.json), the shared verdict's included."""
    return sorted(entry.name.removesuffix(SUFFIX) for entry in files(__package__).iterdir()
                  if entry.name.endswith(SUFFIX))


def load(name: str) -> dict[str, Any]:
    """The schema `name` (check, verdict, ...) as parsed JSON."""
    raw = json.loads(files(__package__).joinpath(name + SUFFIX).read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    return raw
