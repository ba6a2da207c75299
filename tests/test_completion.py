"""Shell completion (issue 34): the scripts the packages install (packaging/completion/,
written by scripts/gen_completion.py) are what click makes today, and each shell, started
for real, completes a command, an option and a rule id with them. The scripts ask
`gpuguard` on every TAB (click's protocol: _GPUGUARD_COMPLETE=<shell>_complete), so the
`gpuguard` of this environment must be first on PATH.

bash: the script sourced, COMP_WORDS/COMP_CWORD set as readline would, its function
called (bash completes only at an interactive prompt). zsh: an interactive zsh on a
pseudo-terminal (zpty) with the completion system (compinit) and the folder of _gpuguard
first in fpath, as Debian's vendor-completions is: the line typed, then TAB. fish: the
folder of gpuguard.fish first in fish_complete_path (autoloaded by the command's name, as
from vendor_completions.d), then `complete -C LINE`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.shell_completion import ShellComplete

from tests.conftest import REPO

COMPLETION = REPO / "packaging" / "completion"
# (what is typed, what TAB must offer): a command, an option, a rule id
CASES = [(["gpuguard", "rul"], "rules"),
         (["gpuguard", "check", "--form"], "--format"),
         (["gpuguard", "rules", "explain", "pcie.link_w"], "pcie.link_width")]
CASE_IDS = ["command", "option", "rule-id"]

# zsh -f DRIVER FOLDER LINE: LINE typed at an interactive zsh with compinit and FOLDER
# first in fpath, then TAB, then ^U (the line cleared); prints what the terminal showed
# until the marker command after it answered (zle reads its input in order, so the
# completion is done by then: no sleep)
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PS1='> '; fpath=(${(q)1} \$fpath); LISTMAX=1000"
zpty -w z "autoload -U compinit; compinit -u -D; print -r -- START''MARK"
zpty -r -m z ignored '*STARTMARK*> *'
zpty -w -n z "$2"$'\t'$'\C-u'
zpty -w z "print -r -- END''MARK"
zpty -r -m z shown '*ENDMARK*'
print -r -- "$shown"
zpty -d z
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0e-\x1f]")


def _shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (scripts/test.sh installs it)")
    return found


def _env(tmp_path: Path) -> dict[str, str]:
    """This environment's `gpuguard` first on PATH; the shells' homes in tmp_path."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "gpuguard").exists(), f"no gpuguard beside {sys.executable}"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               HOME=str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    return env


def _run(args: list[str], env: dict[str, str]) -> str:
    """In an empty folder: a shell's file completion must not pass for ours (the
    checkout's rules/ completes `gpuguard rul` too)."""
    empty = Path(env["HOME"]) / "cwd"
    empty.mkdir(exist_ok=True)
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120,
                          cwd=empty, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_completion_scripts_are_what_click_makes_today():
    done = subprocess.run([sys.executable, "scripts/gen_completion.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_the_packages_install_each_script_where_its_shell_looks():
    contents = yaml.safe_load((REPO / "packaging" / "nfpm.yaml").read_text())["contents"]
    installed = {(c.get("src", ""), c["dst"], c.get("packager")) for c in contents}
    src = "../packaging/completion/"
    assert {(src + "gpuguard.bash", "/usr/share/bash-completion/completions/gpuguard", None),
            (src + "_gpuguard", "/usr/share/zsh/vendor-completions/_gpuguard", "deb"),
            (src + "_gpuguard", "/usr/share/zsh/site-functions/_gpuguard", "rpm"),
            (src + "gpuguard.fish", "/usr/share/fish/vendor_completions.d/gpuguard.fish",
             None)} <= installed
    for source, _, _ in installed:
        if source.startswith(src):
            assert (REPO / "packaging" / source.removeprefix("../packaging/")).is_file(), source


@pytest.mark.parametrize(("words", "wanted"), CASES, ids=CASE_IDS)
def test_bash_completes(words: list[str], wanted: str, tmp_path: Path):
    script = ('source "$1"; shift; complete -p gpuguard >/dev/null || exit 9; '
              'COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); '
              '_gpuguard_completion gpuguard; printf "%s\\n" "${COMPREPLY[@]}"')
    out = _run([_shell("bash"), "--norc", "--noprofile", "-c", script, "bash",
                str(COMPLETION / "gpuguard.bash"), *words], _env(tmp_path))
    assert wanted in out.splitlines(), out


@pytest.mark.parametrize(("words", "wanted"), CASES, ids=CASE_IDS)
def test_zsh_completes(words: list[str], wanted: str, tmp_path: Path):
    driver = tmp_path / "drive.zsh"
    driver.write_text(ZSH_DRIVER)
    shown = ANSI.sub("", _run([_shell("zsh"), "-f", str(driver), str(COMPLETION),
                               " ".join(words)], _env(tmp_path)))
    # a single match is written into the line, several are listed under it
    assert re.search(rf"(?<![\w.-]){re.escape(wanted)}(?![\w.-])", shown), shown


@pytest.mark.parametrize(("words", "wanted"), CASES, ids=CASE_IDS)
def test_fish_completes(words: list[str], wanted: str, tmp_path: Path):
    script = "set -p fish_complete_path $argv[1]; complete -C $argv[2]"
    out = _run([_shell("fish"), "--no-config", "--private", "-c", script, str(COMPLETION),
                " ".join(words)], _env(tmp_path))
    assert wanted in [line.split("\t")[0] for line in out.splitlines()], out


def _completions(args: list[str], incomplete: str) -> dict[str, str | None]:
    from gpuguard.cli.main import main

    complete = ShellComplete(main, {}, "gpuguard", "_GPUGUARD_COMPLETE")
    return {item.value: item.help for item in complete.get_completions(args, incomplete)}


def test_every_rule_id_argument_completes_the_packs_ids_with_their_summaries():
    from gpuguard.config.ruleset import load_ruleset

    pack = load_ruleset()
    for args in (["rules", "explain"], ["ack"], ["events", "--rule"]):
        offered = _completions(args, "")
        assert set(offered) == set(pack.rules), args
        assert offered["pcie.link_width"] == pack.rules["pcie.link_width"].summary
    assert set(_completions(["ack"], "xid.")) == {r for r in pack.rules if r.startswith("xid.")}


def test_the_rules_of_a_rules_directory_on_the_line_complete_too(tmp_path: Path):
    (tmp_path / "site.yaml").write_text(
        "rules:\n  - id: site.fan\n    scope: gpu\n    severity: warning\n"
        "    summary: the fans spin\n    when: fan_speed_percent < 100\n")
    (tmp_path / "broken.yaml").write_text("rules: [\n")  # adds nothing, says nothing
    offered = _completions(["rules", "explain", "--rules", str(tmp_path)], "site.")
    assert offered == {"site.fan": "the fans spin"}
    assert _completions(["rules", "explain"], "site.") == {}
