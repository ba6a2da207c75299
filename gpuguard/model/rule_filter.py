"""`--only` and `--skip`: which rules a command's patterns select, and a pattern that names
no rule refused (a typo would otherwise pass on nothing checked). `check` filters the
rules it runs with it and the daemon the results it serves to `gpuguard status`."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable


def selected(rule_id: str, only: Iterable[str], skip: Iterable[str]) -> bool:
    only = list(only)
    if only and not any(fnmatch.fnmatchcase(rule_id, pattern) for pattern in only):
        return False
    return not any(fnmatch.fnmatchcase(rule_id, pattern) for pattern in skip)


def filter_problem(only: Iterable[str], skip: Iterable[str],
                   rule_ids: Iterable[str]) -> str | None:
    """What is wrong with the patterns (a usage error, exit 3), or None."""
    ids = list(rule_ids)
    for option, patterns in (("--only", only), ("--skip", skip)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(rule_id, pattern) for rule_id in ids):
                return f"{option} {pattern!r} matches no rule; see `gpuguard rules list`"
    return None
