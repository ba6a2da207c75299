"""Man pages (issue 34): one per command, packaging/man/, written from the click tree by
scripts/gen_manpages.py. The committed pages are what it writes today (a stale, missing or
left-over page fails), each reads without a warning from man and groff, man-db can index
it (lexgrog: its NAME line), an option added to a command shows in that command's page,
and the packages install every page."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
import yaml

from tests.conftest import REPO

MAN_DIR = REPO / "packaging" / "man"
PAGES = sorted(MAN_DIR.glob("*.1"))


def _generator() -> ModuleType:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_manpages
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gen_manpages


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (scripts/test.sh installs man-db)")
    return found


def test_the_committed_pages_are_what_the_cli_gives_today():
    done = subprocess.run([sys.executable, "scripts/gen_manpages.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_every_command_has_a_page():
    from gpuguard.cli.main import COMMANDS

    names = {page.name for page in PAGES}
    assert "gpuguard.1" in names and "gpuguard-rules-explain.1" in names
    assert {f"gpuguard-{command}.1" for command in COMMANDS} <= names


def test_a_stale_a_missing_and_a_left_over_page_are_caught(tmp_path, monkeypatch, capsys):
    gen = _generator()
    for page in PAGES:
        shutil.copy(page, tmp_path / page.name)
    monkeypatch.setattr(gen, "OUT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gen_manpages.py", "--check"])
    assert gen.main() == 0
    edited = tmp_path / "gpuguard-check.1"
    edited.write_text(edited.read_text().replace(r"\-\-format", r"\-\-formats"))
    (tmp_path / "gpuguard-rules-list.1").unlink()
    (tmp_path / "gpuguard-gone.1").write_text(".TH GONE 1\n")
    assert gen.main() == 1
    err = capsys.readouterr().err
    assert "gpuguard-check.1" in err and "gpuguard-rules-list.1" in err
    assert "gpuguard-gone.1" in err
    monkeypatch.setattr(sys, "argv", ["gen_manpages.py"])
    assert gen.main() == 0
    assert sorted(p.name for p in tmp_path.glob("*.1")) == [p.name for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_page_reads_without_a_warning(page: Path):
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    shown = subprocess.run([_tool("man"), "--warnings", "-l", str(page)], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert shown.stdout.startswith(page.stem.upper() + "(1)")
    checked = subprocess.run([_tool("groff"), "-ww", "-z", "-man", str(page)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    # man-db's indexer reads the NAME line (whatis, apropos)
    indexed = subprocess.run([_tool("lexgrog"), str(page)], capture_output=True, text=True,
                             timeout=60, check=False)
    assert indexed.returncode == 0 and f'"{page.stem} - ' in indexed.stdout, indexed.stdout


def test_an_option_added_to_a_command_shows_in_its_page(tmp_path: Path):
    from gpuguard.cli.check import check

    gen = _generator()
    changed = copy.copy(check)
    changed.params = [*check.params,
                      click.Option(["--brand-new"], metavar="N",
                                   help="A new option's help, with a \\ and a 'quote'.")]
    page = gen.render(changed, ["gpuguard", "check"])
    committed = (MAN_DIR / "gpuguard-check.1").read_text()
    assert page != committed and "brand" not in committed
    assert r"\fB\-\-brand\-new N\fR" in page
    (tmp_path / "gpuguard-check.1").write_text(page)
    shown = subprocess.run([_tool("man"), "-l", str(tmp_path / "gpuguard-check.1")],
                           env=dict(os.environ, MANWIDTH="200", LC_ALL="C.UTF-8"),
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--brand-new N" in shown
    assert "A new option's help, with a \\ and a 'quote'." in shown


def test_the_packages_install_every_page():
    contents = yaml.safe_load((REPO / "packaging" / "nfpm.yaml").read_text())["contents"]
    assert {"src": "../packaging/man/*.1", "dst": "/usr/share/man/man1/"} in contents
    assert len(PAGES) > 10
