#!/usr/bin/env python3
"""Write the generated samples of the docs: each ```text block preceded by a marker

    <!-- sample: gpuguard check --input tests/fixtures/h200-live/idle-snapshot.json -->

holds exactly what that command prints today (120 columns, no colour, on the recordings
of the repository, under the tests' host guard: a sample never shows the machine it was
made on). A new rule then changes the sample by running this, not by hand.

    python scripts/gen_samples.py           # rewrite the samples
    python scripts/gen_samples.py --check   # exit 1 if one is out of date (the tests do this)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- sample: (?P<command>gpuguard [^>]*?) -->\n```text\n"
                    r"(?P<body>.*?)^```$", re.M | re.S)


def output_of(command: str) -> str:
    """What the command prints: the checkout's gpuguard, on nothing of this host's."""
    with tempfile.TemporaryDirectory() as etc:
        env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1",
               "GPUGUARD_FORBID_HOST": f"1,etc={etc}"}
        args = shlex.split(command)
        done = subprocess.run([sys.executable, "-m", "gpuguard", *args[1:]], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    if done.returncode not in (0, 1, 2, 3):
        raise SystemExit(f"{command}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def render(text: str) -> str:
    return MARKER.sub(lambda m: f"<!-- sample: {m['command']} -->\n```text\n"
                                f"{output_of(m['command'])}```", text)


def main() -> int:
    stale = []
    for path in DOCS:
        text = path.read_text()
        if not MARKER.search(text):
            continue
        new = render(text)
        if new == text:
            continue
        if "--check" in sys.argv:
            stale.append(path)
        else:
            path.write_text(new)
    for path in stale:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"out of date: {shown}: run scripts/gen_samples.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
