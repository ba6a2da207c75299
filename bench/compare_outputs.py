#!/usr/bin/env python3
"""Issue 27: a refactor that changes no output. Runs `check --input` (table, json,
prometheus) on every recorded snapshot and XML under tests/fixtures, `rules list`, `rules
explain` of every rule and every --help, with an older gpuguard tree and with this one,
and names each case whose exit code, stdout or stderr differs (durations, and the path of
each tree and of this checkout, masked).

    git archive e7ee59f | tar -x -C /tmp/before
    .venv/bin/python bench/compare_outputs.py /tmp/before
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python")
COMMANDS = ("", "check", "snapshot", "xid", "events", "ack", "daemon", "failover", "rules",
            "status", "slurm", "slurm health", "slurm prolog", "slurm epilog", "rules list",
            "rules explain", "failover status")


def masked(text: str, root: Path) -> str:
    text = re.sub(r'"duration_s": [0-9.e-]+', '"duration_s": X', text)
    text = re.sub(r"(duration_seconds(?:\{[^}]*\})?) [0-9.e+-]+", r"\1 X", text)
    text = re.sub(r"in [0-9.]+ ?m?s", "in X", text)
    return text.replace(str(root), "ROOT").replace(str(REPO), "ROOT")


def run(root: Path, args: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), NO_COLOR="1", COLUMNS="120")
    proc = subprocess.run([PYTHON, "-m", "gpuguard", *args], capture_output=True, text=True,
                          env=env, cwd="/tmp", check=False)
    return proc.returncode, masked(proc.stdout, root), masked(proc.stderr, root)


def cases() -> list[list[str]]:
    inputs = sorted(str(p) for p in (REPO / "tests" / "fixtures").rglob("*")
                    if p.suffix in (".json", ".xml") and p.is_file())
    out = [["check", "--input", f, "--format", fmt] for f in inputs
           for fmt in ("table", "json", "prometheus")]
    listed = run(REPO, ["rules", "list"])[1]
    ids = [line.split()[0] for line in listed.splitlines()[1:]
           if line.strip() and "." in line.split()[0]]
    out += [["rules", "explain", rule] for rule in ids]
    out.append(["rules", "list"])
    out += [[*command.split(), "--help"] for command in COMMANDS]
    return out


def main() -> int:
    before = Path(sys.argv[1]).resolve()
    every = cases()
    differ = 0
    for case in every:
        old, new = run(before, case), run(REPO, case)
        if old != new:
            differ += 1
            print("DIFF", " ".join(case).replace(str(REPO) + "/", ""), old[0], new[0])
            print("".join(difflib.unified_diff(old[1].splitlines(True),
                                               new[1].splitlines(True)))[:2000])
    print(f"{len(every)} cases, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
