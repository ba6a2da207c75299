#!/usr/bin/env python3
"""Write the shell completion scripts of `gpuguard`, as click makes them for our command
tree (what `_GPUGUARD_COMPLETE=bash_source gpuguard` prints), into packaging/completion/:
the deb and the rpm install them where bash, zsh and fish look (packaging/nfpm.yaml,
docs/operations.md). Each script asks `gpuguard` itself what to offer on every TAB
(click's completion protocol), so commands, options and rule ids never go stale in it;
the file changes only when click's script does (after a click upgrade: run this again).

    python scripts/gen_completion.py [--check]

--check: exit 1 when a file is missing or out of date (tests/test_completion.py)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from click.shell_completion import get_completion_class  # noqa: E402

from gpuguard.cli.main import main as cli  # noqa: E402

OUT = REPO / "packaging" / "completion"
PROG = "gpuguard"
COMPLETE_VAR = "_GPUGUARD_COMPLETE"
# shell -> the file's name, as each shell's completion directory expects it
FILES = {"bash": "gpuguard.bash", "zsh": "_gpuguard", "fish": "gpuguard.fish"}


def render(shell: str) -> str:
    complete = get_completion_class(shell)
    assert complete is not None, shell
    source = complete(cli, {}, PROG, COMPLETE_VAR).source()
    return source if source.endswith("\n") else source + "\n"


def main() -> int:
    outputs = {OUT / name: render(shell) for shell, name in FILES.items()}
    if "--check" in sys.argv:
        stale = [out for out, text in outputs.items()
                 if not out.exists() or out.read_text() != text]
        for out in stale:
            print(f"out of date: {out}: run scripts/gen_completion.py", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for out, text in outputs.items():
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
