"""Bad rule and config files (issue 9): every one is `file:line: what is wrong`, exit 3,
in bounded time and memory; a running daemon keeps its last good rules."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO

LIVE = FIXTURES / "h200-live" / "idle-snapshot.json"
GIB = 1024**3


def check_with(rules_dir: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`gpuguard check` limited to 1 GiB of address space: a file that costs gigabytes
    fails the test by MemoryError instead of passing by luck."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

    return subprocess.run([sys.executable, "-m", "gpuguard", "check", "--input", str(LIVE),
                           "--rules", str(rules_dir), *extra], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, preexec_fn=limit, check=False)


def user_rule(when: str) -> str:
    return ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: x\n"
            f"    message: x\n    when: {when}\n")


def alias_bomb(levels: int = 9) -> str:
    parts = ['&l0 ["xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx", '
             '"xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx"]']
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return ("overrides:\n  thermal.margin:\n    thresholds:\n      warn_margin_c: ["
            + ", ".join(parts) + "]\n")


@pytest.mark.parametrize("text, words", [
    (user_rule('""'), "a.yaml:7: site.x: the condition is empty"),
    (user_rule('"' + "(" * 200_000 + "1" + ")" * 200_000 + '"'), "a.yaml:7: site.x: the "
     "condition is 400001 characters long"),
    (user_rule('"' + "not " * 200 + 'True"'), "a.yaml:7: site.x: the condition has"),
    (alias_bomb(), "a.yaml:4: the document expands to more than 100000 values"),
])
def test_bad_rule_files_are_file_line_exit_3_in_bounded_memory(tmp_path, text, words):
    (tmp_path / "a.yaml").write_text(text)
    started = time.monotonic()
    proc = check_with(tmp_path)
    assert proc.returncode == 3, proc.stderr[-500:]
    assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-500:]
    assert time.monotonic() - started < 10


def test_a_rule_file_that_is_a_fifo_is_refused_in_time(tmp_path):
    os.mkfifo(tmp_path / "a.yaml")
    proc = check_with(tmp_path, timeout=30)
    assert proc.returncode == 3 and "a.yaml" in proc.stderr and "Traceback" not in proc.stderr
