"""The README runs as printed (issue 18).

Every fenced shell block of README.md carries a marker, an HTML comment on the line right
above its fence, that says what this test does with it:

    <!-- readme-test: run, exit 0 -->               run it, under the host guard
    <!-- readme-test: run, exit 2 (why) -->         ... and expect exit 2
    <!-- readme-test: live, exit 0 (why) -->        run it with the host guard lifted: it
                                                    reads this machine (a live test)
    <!-- readme-test: live, needs no-nvml, exit 2 (why) -->
                                                    ... only where the need is met, else skip
                                                    saying why (NEEDS below)
    <!-- readme-test: skip: why -->                 never run: a daemon that runs until
                                                    stopped, a GPU, a registry, the test
                                                    command itself

A shell block without a marker fails, so the README cannot gain a command that nobody runs.
A block runs as printed, with `bash -e` (every command but the last must succeed; the
marker's code is the last one's), from a fresh copy of the checkout, with a HOME and a
TMPDIR of its own and the virtual environment's bin first on PATH, as after the README's
first command. It must leave that copy as it found it: a recipe writes into a folder it
made (`mktemp -d`), never into the reader's checkout. A ```text block right after a shell
block is a sample of its output: the output with parts cut, each cut marked `...` (on a
line of its own: any lines; at the end of a line: the rest of it). Its first line may start
anywhere in the output and its last end anywhere.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, live_env

README = REPO / "README.md"
SHELLS = {"sh", "bash", "shell", "console"}
# The venv the README's first command makes; else the one running the tests.
VENV_BIN = next((d for d in (REPO / ".venv" / "bin", Path(sys.executable).parent)
                 if (d / "gpuguard").exists()), REPO / ".venv" / "bin")
# What a copy of the checkout leaves out: history, the venv and what tools leave behind.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache",
                                    ".mypy_cache", ".ruff_cache", "dist", "build",
                                    "*.egg-info", ".device", ".whl", "node_modules")
# A fence may be indented (in a list item): a block there needs its marker too.
FENCE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w-]*)")
MARKER = re.compile(
    r"^<!-- readme-test: (?:skip: (?P<skip>.+?)"
    r"|(?P<mode>run|live)(?:, needs (?P<needs>[\w-]+(?: [\w-]+)*))?, exit (?P<code>\d+)"
    r"(?: \((?P<why>.*)\))?) -->$")


@functools.cache
def _nvml_loads() -> bool:
    # In a child: loading the library into the test process would outlive the question.
    probe = subprocess.run([sys.executable, "-c",
                            "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"],
                           capture_output=True, check=False)
    return probe.returncode == 0


def _need_no_nvml() -> str | None:
    if _nvml_loads():
        return ("this machine has libnvidia-ml.so.1: a live check judges its GPUs, so the "
                "README's exit code for a machine without a driver does not apply")
    return None


def _need_gcc() -> str | None:
    return None if shutil.which("gcc") else "gcc is missing (./scripts/test.sh installs it)"


# need -> a check that returns why it is not met here, or None
NEEDS = {"no-nvml": _need_no_nvml, "gcc": _need_gcc}


@dataclass(frozen=True)
class Marker:
    skip: str | None = None  # the reason, for a block never run
    live: bool = False
    needs: tuple[str, ...] = ()
    exit_code: int = 0
    why: str = ""            # of the exit code, for the reader


@dataclass
class Block:
    line: int                   # of the opening fence, 1-based
    code: str
    marker: Marker | None
    problem: str | None = None  # why the block cannot be checked (no marker, a bad one)
    sample: str | None = None   # the ```text block right after it


def parse_marker(text: str) -> Marker:
    match = MARKER.match(text.strip())
    if match is None:
        raise ValueError(f"marker not understood: {text.strip()!r} (see tests/test_readme.py)")
    if match["skip"]:
        return Marker(skip=match["skip"])
    needs = tuple(match["needs"].split()) if match["needs"] else ()
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"unknown need {unknown} (known: {sorted(NEEDS)})")
    return Marker(live=match["mode"] == "live", needs=needs, exit_code=int(match["code"]),
                  why=match["why"] or "")


def parse(markdown: str, name: str = "README.md") -> tuple[list[Block], list[str]]:
    """The shell blocks of a Markdown text, and the problems of the text as a whole (a
    fence without a language, a marker above no shell block, a fence never closed)."""
    lines = markdown.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used_markers: set[int] = set()
    last: Block | None = None  # the last shell block, while only blank lines follow it
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            if lines[i].strip():
                last = None
            i += 1
            continue
        fence, lang = opening["fence"], opening["lang"]
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].strip().startswith(fence) and not lines[j].strip(" " + fence[0])),
                   None)
        if end is None:
            problems.append(f"{name}:{i + 1}: a fence that is never closed")
            break
        body = "\n".join(lines[i + 1:end]) + "\n"
        if not lang:
            problems.append(f"{name}:{i + 1}: a fence without a language (```sh, ```text, ...)")
        if lang in SHELLS:
            above = lines[i - 1].strip() if i > 0 else ""
            block = Block(line=i + 1, code=body, marker=None)
            if above.startswith("<!-- readme-test"):
                used_markers.add(i - 1)
                try:
                    block.marker = parse_marker(above)
                except ValueError as exc:
                    block.problem = f"{name}:{i + 1}: {exc}"
            else:
                block.problem = (f"{name}:{i + 1}: a shell block without a marker on the line "
                                 "above it (<!-- readme-test: run, exit 0 -->, ...)")
            blocks.append(block)
            last = block
        elif lang == "text" and last is not None:
            last.sample = body
            last = None
        else:
            last = None
        i = end + 1
    for n, line in enumerate(lines):
        if line.strip().startswith("<!-- readme-test") and n not in used_markers:
            problems.append(f"{name}:{n + 1}: a marker that is not right above a shell block")
    return blocks, problems


def copy_checkout(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=NOT_COPIED, symlinks=True)
    return dest


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in root.rglob("*")}


def check_sample(sample: str, output: str) -> str | None:
    """None when the output shows the sample, else the lines between two cuts that it
    does not show, there and in that order."""
    out = [line.rstrip() for line in output.splitlines()]
    # the runs of lines between the cuts, each to be found whole, one after the other
    runs: list[list[str]] = [[]]
    for line in (line.rstrip() for line in sample.splitlines()):
        if line == "...":
            runs.append([])
        else:
            runs[-1].append(line)
    at = 0
    for run in filter(None, runs):
        start = next((n for n in range(at, len(out) - len(run) + 1)
                      if all(_shows(out[n + k], want) for k, want in enumerate(run))), None)
        if start is None:
            return "\n".join(run)
        at = start + len(run)
    return None


def _shows(line: str, want: str) -> bool:
    if want.endswith("..."):
        return line.startswith(want.removesuffix("...").rstrip())
    return line == want


def reader_env(tmp: Path, live: bool) -> dict[str, str]:
    """The environment of the README's reader after its first command, with a HOME and a
    TMPDIR of its own under `tmp`."""
    assert (VENV_BIN / "gpuguard").exists(), \
        f"no gpuguard in {VENV_BIN}: run the README's first command or ./scripts/test.sh"
    home, tmpdir = tmp / "home", tmp / "tmp"
    home.mkdir(parents=True)
    tmpdir.mkdir()
    # Under the host guard as the rest of the suite (conftest set it in os.environ), unless
    # the block reads this machine on purpose. COLUMNS: the table wraps at a known width.
    env = live_env() if live else dict(os.environ)
    env.update(HOME=str(home), TMPDIR=str(tmpdir), PATH=f"{VENV_BIN}{os.pathsep}{env['PATH']}",
               NO_COLOR="1", COLUMNS="120")
    return env


def check_block(block: Block, checkout: Path, tmp: Path, name: str = "README.md") -> None:
    """Run one block as the README's reader would, and fail (AssertionError) where it does
    not do what its marker and its sample say."""
    assert block.problem is None, block.problem
    assert block.marker is not None
    marker = block.marker
    if marker.skip:
        pytest.skip(f"{name}:{block.line}: {marker.skip}")
    for need in marker.needs:
        unmet = NEEDS[need]()
        if unmet:
            pytest.skip(f"{name}:{block.line}: {unmet}")
    env = reader_env(tmp, marker.live)
    before = _tree(checkout)
    proc = subprocess.run(["bash", "-e", "-c", block.code], cwd=checkout, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, check=False)
    shown = (f"\n--- the block ({name}:{block.line})\n{block.code}--- its output\n"
             f"{proc.stdout}{proc.stderr}")
    says = f"{marker.exit_code} ({marker.why})" if marker.why else str(marker.exit_code)
    assert proc.returncode == marker.exit_code, \
        f"{name}:{block.line}: exit {proc.returncode}, the marker says {says}{shown}"
    after = _tree(checkout)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"{name}:{block.line}: wrote into the checkout: {changed}{shown}"
    if block.sample is not None:
        missing = check_sample(block.sample, proc.stdout)
        assert missing is None, \
            f"{name}:{block.line}: the output does not show these lines of its sample:\n" \
            f"{missing}{shown}"


# --- the README ----------------------------------------------------------------------

BLOCKS, PROBLEMS = parse(README.read_text())


def _param(block: Block) -> object:
    marks = []
    if block.marker is not None and block.marker.live:
        needs = ", ".join(block.marker.needs) or "nothing but this machine"
        marks.append(pytest.mark.live(needs=needs))
    return pytest.param(block, marks=marks, id=f"line{block.line}")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    return copy_checkout(tmp_path / "checkout")


def test_the_readme_parses():
    assert BLOCKS, "no shell block found in README.md"
    assert not PROBLEMS, "\n".join(PROBLEMS)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_block(block: Block, checkout: Path, tmp_path: Path):
    check_block(block, checkout, tmp_path / "run")


# What a block must never leave in the reader's shell: their next `gpuguard check` on a
# machine without a GPU would judge the fake's GPUs, with no sign that they are fake
# (issue 28).
LEAKS = re.compile(r"^(?:FAKE_NVML_\w*|LD_LIBRARY_PATH)=", re.MULTILINE)


def one_shell(blocks: list[Block], checkout: Path, tmp: Path, name: str = "README.md"
              ) -> tuple[dict[int, int], str, str]:
    """Run the blocks one after the other in ONE bash, as a reader pasting them into one
    terminal would (no -e: an interactive shell goes on after a failure), skipping those
    marked skip and those whose needs are unmet, as test_readme_block does; then `env`.
    Returns each block's status (its last command's) by line, the environment left at
    the end, and the whole output."""
    runs = [b for b in blocks if b.marker is not None and not b.marker.skip
            and not any(NEEDS[need]() for need in b.marker.needs)]
    assert runs, f"{name}: no block to run"
    # A live block reads this machine: the one shell is then the live one, for all.
    env = reader_env(tmp, any(b.marker is not None and b.marker.live for b in runs))
    # Whatever is found at the end came from a block, not from the shell running the tests.
    for var in [v for v in env if v.startswith("FAKE_NVML_") or v == "LD_LIBRARY_PATH"]:
        del env[var]
    envfile = tmp / "env-at-the-end"
    script = "".join(f"{b.code}echo \"readme-block {b.line} status $?\"\n" for b in runs)
    script += f"env > {shlex.quote(str(envfile))}\n"
    (tmp / "pasted.sh").write_text(script)
    proc = subprocess.run(["bash", "--norc", "--noprofile", str(tmp / "pasted.sh")],
                          cwd=checkout, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    statuses = {int(m[1]): int(m[2])
                for m in re.finditer(r"^readme-block (\d+) status (\d+)$", proc.stdout,
                                     re.MULTILINE)}
    assert envfile.exists(), f"{name}: the shell did not reach the end:\n{output}"
    return statuses, envfile.read_text(), output


@pytest.mark.live(needs="the blocks' own: the events block reads this machine's boot id")
def test_every_block_in_one_shell_leaves_no_fake_behind(checkout: Path, tmp_path: Path):
    statuses, left, output = one_shell(BLOCKS, checkout, tmp_path / "run")
    leaked = LEAKS.findall(left)
    assert not leaked, (f"README.md leaves {sorted(set(leaked))} in the reader's shell: keep "
                        f"them inside the block (a subshell, or VAR=... on the command)")
    for block in BLOCKS:
        if block.line in statuses:
            assert block.marker is not None
            assert statuses[block.line] == block.marker.exit_code, \
                f"README.md:{block.line}: exit {statuses[block.line]} in one shell:\n{output}"


def test_a_block_that_exports_the_fake_is_caught(tmp_path: Path):
    blocks, _ = parse("<!-- readme-test: run, exit 0 -->\n```sh\n"
                      "export FAKE_NVML_GPUS=4\n```\n\n"
                      "<!-- readme-test: run, exit 0 -->\n```sh\n"
                      "(export LD_LIBRARY_PATH=/x; true)\nFAKE_NVML_TEMP=9 true\n```\n", "t.md")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    statuses, left, _ = one_shell(blocks, checkout, tmp_path / "run", "t.md")
    assert statuses == {2: 0, 7: 0}
    assert LEAKS.findall(left) == ["FAKE_NVML_GPUS="]  # the subshell and VAR=cmd leave none


def test_the_readme_links_resolve():
    """Every relative link of the README names a file of the checkout (and, for a
    Markdown file, a heading that exists when it names one)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    broken = [t for t in targets if not re.match(r"[a-z]+:", t) and not _resolves(t)]
    assert not broken, f"README.md links to what does not exist: {broken}"


def _resolves(target: str) -> bool:
    path, _, anchor = target.partition("#")
    file = REPO / path if path else README
    if not file.exists():
        return False
    return not anchor or file.suffix != ".md" or anchor in _anchors(file)


def _anchors(md: Path) -> set[str]:
    """GitHub's ids for the headings of a Markdown file."""
    ids = set()
    for line in md.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            ids.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return ids


def test_the_docs_index_lists_every_doc():
    index = (REPO / "docs" / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    docs = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert docs - listed == set(), f"docs/README.md does not list {sorted(docs - listed)}"
    assert listed - docs == set(), f"docs/README.md lists what is not there: {listed - docs}"


# --- the test itself: it must be able to fail -----------------------------------------


def _one(markdown: str) -> Block:
    blocks, problems = parse(markdown, "t.md")
    assert not problems, problems
    assert len(blocks) == 1
    return blocks[0]


def _check(markdown: str, tmp_path: Path) -> None:
    """check_block on the one block of a small Markdown text, from an empty checkout."""
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    check_block(_one(markdown), checkout, Path(tempfile.mkdtemp(dir=tmp_path)), "t.md")


def test_a_block_without_a_marker_fails(tmp_path):
    assert _one("Text.\n\n```sh\necho hello\n```\n").marker is None
    with pytest.raises(AssertionError, match=r"t\.md:3: a shell block without a marker"):
        _check("Text.\n\n```sh\necho hello\n```\n", tmp_path)


def test_a_marker_separated_from_its_block_does_not_count():
    blocks, problems = parse("<!-- readme-test: run, exit 0 -->\n\n```sh\ntrue\n```\n", "t.md")
    assert blocks[0].problem and "without a marker" in blocks[0].problem
    assert problems == ["t.md:1: a marker that is not right above a shell block"]


def test_a_marker_it_cannot_read_fails(tmp_path):
    with pytest.raises(AssertionError, match="marker not understood"):
        _check("<!-- readme-test: run, exit zero -->\n```sh\ntrue\n```\n", tmp_path)
    with pytest.raises(AssertionError, match="unknown need"):
        _check("<!-- readme-test: live, needs a-gpu, exit 0 -->\n```sh\ntrue\n```\n", tmp_path)


def test_every_kind_of_shell_fence_needs_a_marker_and_every_fence_a_language():
    blocks, problems = parse("```bash\ntrue\n```\n\n```\nplain\n```\n", "t.md")
    assert blocks[0].problem and "without a marker" in blocks[0].problem
    assert problems == ["t.md:5: a fence without a language (```sh, ```text, ...)"]


def test_an_exit_code_other_than_the_marker_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"t\.md:2: exit 3, the marker says 0"):
        _check("<!-- readme-test: run, exit 0 -->\n```sh\necho one\nexit 3\n```\n", tmp_path)
    _check("<!-- readme-test: run, exit 3 (on purpose) -->\n```sh\nexit 3\n```\n", tmp_path)


def test_an_earlier_command_that_fails_fails_the_block(tmp_path):
    with pytest.raises(AssertionError, match="exit 1, the marker says 0"):
        _check("<!-- readme-test: run, exit 0 -->\n```sh\nfalse\necho never\n```\n", tmp_path)


def test_a_block_that_writes_into_the_checkout_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"wrote into the checkout: \['host.json'\]"):
        _check("<!-- readme-test: run, exit 0 -->\n```sh\necho x > host.json\n```\n", tmp_path)
    (tmp_path / "checkout" / "host.json").unlink()
    _check("<!-- readme-test: run, exit 0 -->\n```sh\n"
           'out=$(mktemp -d)\necho x > "$out/host.json"\n```\n', tmp_path)


def test_a_sample_the_output_does_not_show_fails(tmp_path):
    text = ("<!-- readme-test: run, exit 0 -->\n```sh\nprintf 'a\\nb long line\\nc\\n'\n```\n\n"
            "```text\na\n...\n{}\n```\n")
    _check(text.format("b long..."), tmp_path)
    _check(text.format("c"), tmp_path)
    with pytest.raises(AssertionError, match=r"of its sample:\s+b short\s+---"):
        _check(text.format("b short"), tmp_path)
    with pytest.raises(AssertionError, match=r"of its sample:\s+c\s+a\s+---"):  # order counts
        _check(text.format("c\na"), tmp_path)
    with pytest.raises(AssertionError, match=r"of its sample:\s+a\s+c\s+---"):  # a cut is marked
        _check(text.replace("...\n", "").format("c"), tmp_path)


def test_only_a_text_block_right_after_a_shell_block_is_its_sample():
    shell = "<!-- readme-test: run, exit 0 -->\n```sh\ntrue\n```\n"
    assert _one(shell + "\n```text\nout\n```\n").sample == "out\n"
    assert _one(shell + "\nProse between.\n\n```text\nother\n```\n").sample is None


def test_run_is_under_the_host_guard_and_live_is_not(tmp_path):
    _check('<!-- readme-test: run, exit 0 -->\n```sh\ntest -n "$GPUGUARD_FORBID_HOST"\n```\n',
           tmp_path)
    _check('<!-- readme-test: live, exit 0 -->\n```sh\ntest -z "$GPUGUARD_FORBID_HOST"\n```\n',
           tmp_path)


def test_an_unmet_need_skips_saying_why(tmp_path, monkeypatch):
    monkeypatch.setitem(NEEDS, "gcc", lambda: "gcc is missing")
    with pytest.raises(pytest.skip.Exception, match=r"t\.md:2: gcc is missing"):
        _check("<!-- readme-test: live, needs gcc, exit 0 -->\n```sh\ntrue\n```\n", tmp_path)
