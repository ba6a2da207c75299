"""The status page's tests can fail (issue 31): each mutation of the page that would make
it unsafe or unusable (its policy header removed, one host field left unescaped, its reload
removed, its dark scheme dropped) is applied to a private copy of the code, and the tests
that guard it, in the real browser and without it, must then fail. The working tree is
never written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BROWSER = "tests/browser/test_status_page_browser.py"
ESCAPING = "tests/browser/test_status_page_escaping.py"
RENDER = "tests/test_status_page_render.py"
DAEMON = "tests/daemon/test_status_page.py"

# name -> (file, the text replaced, its replacement, the tests that must fail)
MUTATIONS = {
    "the policy header removed": (
        "gpuguard/outputs/page_style.py", '    ("Content-Security-Policy", CSP),\n', "",
        [f"{BROWSER}::test_headers_and_the_style_hash",
         f"{DAEMON}::test_the_policy_admits_the_pages_own_style_and_nothing_else"]),
    "a field left unescaped": (
        "gpuguard/outputs/status_page.py", '<span class="message">{field(f.message)}</span>',
        '<span class="message">{shown(f.message)}</span>',
        [f"{ESCAPING}::test_host_text_is_text_in_the_browser",
         f"{RENDER}::test_host_text_stays_text"]),
    "the reload removed": (
        "gpuguard/outputs/status_page.py",
        """        *([f'<meta http-equiv="refresh" content="{refresh}">'] if refresh else []),\n""",
        "", [f"{BROWSER}::test_the_page_reloads_itself",
             f"{RENDER}::test_the_reader_can_stop_the_reload_before_it_comes"]),
    "the dark scheme dropped": (
        "gpuguard/outputs/page_style.py", "@media (prefers-color-scheme:dark)",
        "@media (prefers-color-scheme:no-such-scheme)",
        [f"{BROWSER}::test_the_dark_scheme_is_dark"]),
}


def private_copy(tmp: Path) -> Path:
    root = tmp / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gpuguard", "tests", "rules", "scripts"):
        shutil.copytree(REPO / name, root / name, ignore=ignore, symlinks=True)
    for name in ("pyproject.toml", "package.json", "package-lock.json", "Makefile"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, root / name)
    if (REPO / "node_modules").exists():  # axe-core, read only
        (root / "node_modules").symlink_to(REPO / "node_modules")
    return root


def run_tests(root: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-x", "--no-header", *tests], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_fails_its_tests(name: str, tmp_path: Path) -> None:
    path, old, new, tests = MUTATIONS[name]
    before = (REPO / path).read_bytes()
    root = private_copy(tmp_path)
    source = (root / path).read_text()
    assert source.count(old) == 1, f"{name}: the text to mutate is not once in {path}"
    # the copy passes as it is: a failure below is the mutation's
    clean = run_tests(root, tests)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-2000:]
    (root / path).write_text(source.replace(old, new))
    for test in tests:
        done = run_tests(root, [test])
        assert done.returncode == 1 and " failed" in done.stdout, \
            f"{name}: {test} did not fail\n{done.stdout[-3000:]}"
    assert (REPO / path).read_bytes() == before
