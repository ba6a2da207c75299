"""No traceback from any input on the command line (issue 28, item 2).

The matrix is generated from click's own list of every command and option
(gpuguard.cli.main:main, walked recursively): a new option is covered with no new row here,
and an option whose click type has no hostile-value class fails the test until one is
given. Each value of each class is run as a user runs it, `python -m gpuguard ...` in a
child process, under `LANG=C` and `LANG=C.UTF-8` (LC_ALL likewise), with a deadline: the
command exits 0-3 (3 where the value is refused, click's usage error included) or 4 where it
reached for a host default under the tests' guard (tests/conftest.py), and never prints a
`Traceback`. The long-running daemon is started with each hostile value on a replay and
stopped once it has exited or serves /healthz: a bad value is exit 3 at start, with no
traceback in its log.

Runs go through a pool of threads (one child process each), so the whole matrix takes
minutes on two cores."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from gpuguard.cli.main import main as cli_main
from tests.conftest import REPO, own_host
from tests.daemon.conftest import LIVE, free_port

cli_main.load_all()  # the group imports its commands lazily (cli/main.py)

FAKE_SLURM = REPO / "tests" / "slurm" / "fake_slurm"
LOCALES = ("C", "C.UTF-8")
WORKERS = 4
DEADLINE_S = 90.0  # a command's own deadlines are seconds; this only catches a hang
DAEMON_UP_S = 20.0
XID_LINE = "[  100.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.\n"

Arg = str | bytes

# The hostile values of each class, by name (a run's name says which it was).
NUMBER_CLASSES = ("inf", "nan", "huge", "negative")
PATH_CLASSES = ("dev-null", "dev-zero", "fifo", "directory", "missing", "long")
TEXT_CLASSES = ("empty", "long", "not-utf8")


def hostile_classes(param: click.Parameter) -> tuple[str, ...] | None:
    """The classes of hostile value `param` takes (by its click type; () for a flag),
    or None where no class fits: the test then fails, naming the option."""
    if isinstance(param, click.Option) and (param.is_flag or param.count):
        return ()
    kind = param.type
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBER_CLASSES
    if isinstance(kind, click.Path):
        return PATH_CLASSES
    if isinstance(kind, click.Choice) or kind is click.STRING:
        return TEXT_CLASSES
    return None


def commands(group: click.Group = cli_main, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def is_integer(param: click.Parameter) -> bool:
    return isinstance(param.type, click.IntRange) or param.type is click.INT


@dataclass
class Host:
    """What the runs share: a host of the tests' own, a replayed snapshot, a fake Slurm,
    a daemon answering `status`, and the hostile paths."""

    root: Path
    socket: Path
    fake_env: dict[str, str]

    def hostile(self, name: str, param: click.Parameter, case: Path) -> Arg:
        if name in NUMBER_CLASSES:
            huge = "1" + "0" * 5000 if is_integer(param) else "1e308"
            return {"inf": "inf", "nan": "nan", "huge": huge, "negative": "-1"}[name]
        if name in PATH_CLASSES:
            return str(self.path(name, case))
        return {"empty": "", "long": "x" * 100_000, "not-utf8": b"\xff\xfe\x80gpu"}[name]

    def path(self, name: str, case: Path) -> Path:
        if name in ("dev-null", "dev-zero"):
            return self.root / name
        if name == "fifo":
            return self.root / "fifo"
        if name == "directory":
            case.mkdir(parents=True, exist_ok=True)
            return case
        if name == "missing":
            return case / "missing" / "file"
        return Path("/" + "/".join(["d" * 200] * 30))  # 6,000 characters, past PATH_MAX


def _device(path: Path, minor: int, fallback: str) -> None:
    """A character device of the test's own (as /dev/null or /dev/zero): a command that
    unlinked or chmodded it would harm nothing of the host's."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except OSError:
        os.symlink(fallback, path)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, fake_nvml: Path) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("no-traceback")
    own_host(root / "own", kmsg=XID_LINE)
    (root / "slurm").mkdir()
    (root / "slurm" / "nodes").write_text("n1|IDLE|Unknown|gpu|none\n")
    _device(root / "dev-null", 3, "/dev/null")
    _device(root / "dev-zero", 5, "/dev/zero")
    os.mkfifo(root / "fifo")
    sock = root / "status.sock"
    log = root / "status-daemon.log"
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("NOTIFY_SOCKET", None)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuguard", "daemon", "--listen", f"127.0.0.1:{free_port()}",
         "--no-udev", "--log-format", "json", "--input", str(LIVE), "--status-socket",
         str(sock), "--state-dir", str(root / "status-state")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    end = time.monotonic() + DAEMON_UP_S
    while not sock.exists() and time.monotonic() < end and daemon.poll() is None:
        time.sleep(0.05)
    assert sock.exists(), log.read_text()
    try:
        yield Host(root, sock, {"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_GPUS": "1"})
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=15)
    assert "Traceback" not in log.read_text()


QUALIFY_TARGETS = REPO / "tests" / "qualify" / "targets-fake"


def base(path: tuple[str, ...], host: Host, case: Path) -> list[tuple[str, Arg | None]]:
    """The command's options and arguments without the hostile one: a valid run on the
    test's own host (an argument is `("", value)`; a flag `(name, None)`)."""
    own = own_host(host.root / "own")
    state = ("--state-dir", str(case / "state"))
    pairs = [(own[i], own[i + 1]) for i in range(0, len(own), 2) if own[i] != "--state-dir"]
    pairs.append(state)
    slurm = [("--node", "n1"), ("--slurm-bin", str(FAKE_SLURM)),
             ("--slurm-conf", str(host.root / "slurm" / "slurm.conf"))]
    procfs = [p for p in pairs if p[0] == "--path.procfs"]
    kmsg = [p for p in pairs if p[0] == "--kmsg-file"]
    table: dict[tuple[str, ...], list[tuple[str, Arg | None]]] = {
        ("check",): [*pairs, ("--format", "json")],
        ("snapshot",): pairs,
        ("daemon",): [*pairs, ("--log-format", "json"), ("--no-udev", None)],
        ("events",): [state],
        ("ack",): [("", "gpu.count"), ("--reason", "maintenance"), state, *procfs, *kmsg],
        ("xid", "ack"): [state, *procfs, *kmsg],
        ("failover", "status"): [state],
        ("failover", "to"): [("", "cpu"), ("", "llm"), ("--reason", "maintenance"), state,
                             ("--wait", "0")],
        ("rules", "list"): [],
        ("rules", "explain"): [("", "xid.recent")],
        ("rules", "fields"): [],
        ("status",): [("--socket", str(host.socket))],
        ("slurm", "health"): [*pairs, ("--input", str(LIVE)), ("--no-daemon", None),
                              ("--brake-jitter", "0"), *slurm],
        ("slurm", "prolog"): [*pairs, ("--input", str(LIVE)), *slurm],
        ("slurm", "epilog"): [*pairs, ("--input", str(LIVE)), *slurm],
        # the fake NVML without its memory: every GPU refused before a worker starts
        ("qualify",): [*pairs, ("--level", "quick"), ("--seconds", "0.5"),
                       ("--format", "json"), ("--targets", str(QUALIFY_TARGETS))],
    }
    return list(table[path])


def argv(path: tuple[str, ...], pairs: list[tuple[str, Arg | None]]) -> list[Arg]:
    args: list[Arg] = [*path]
    options = [p for p in pairs if p[0]]
    for name, value in options:
        args += [name] if value is None else [name, value]
    args += [value for name, value in pairs if not name and value is not None]
    return args


@dataclass
class Case:
    path: tuple[str, ...]
    param: click.Parameter
    value_class: str
    locale: str

    @property
    def name(self) -> str:
        return f"{' '.join(self.path)} {self.param.name}={self.value_class} LANG={self.locale}"


def with_hostile(case: Case, host: Host, folder: Path) -> list[Arg]:
    pairs = base(case.path, host, folder)
    value = host.hostile(case.value_class, case.param, folder / "value")
    if isinstance(case.param, click.Argument):
        arguments = [i for i, p in enumerate(pairs) if not p[0]]
        position = [p for p in cli_command(case.path).params
                    if isinstance(p, click.Argument)].index(case.param)
        pairs[arguments[position]] = ("", value)
        return argv(case.path, pairs)
    assert isinstance(case.param, click.Option)
    names = set(case.param.opts) | set(case.param.secondary_opts)
    if not case.param.multiple:
        pairs = [p for p in pairs if p[0] not in names]
    long = max(case.param.opts, key=len)
    return argv(case.path, [*pairs, (long, value)])


def cli_command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli_main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def environment(case: Case, host: Host) -> dict[str, str]:
    env = {**os.environ, **host.fake_env, "NO_COLOR": "1", "LANG": case.locale,
           "LC_ALL": case.locale, "SLURM_JOB_ID": "77"}
    env.pop("NOTIFY_SOCKET", None)
    return env


def run_command(case: Case, host: Host, folder: Path) -> str | None:
    """None when the run held (exit 0-4, no traceback, in time), else what went wrong."""
    args = with_hostile(case, host, folder)
    try:
        out = subprocess.run([sys.executable, "-m", "gpuguard", *args], capture_output=True,
                             env=environment(case, host), cwd=REPO, timeout=DEADLINE_S,
                             check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no exit within {DEADLINE_S:g} s"
    text = (out.stdout + out.stderr).decode("utf-8", "replace")
    if "Traceback" in text or out.returncode not in (0, 1, 2, 3, 4):
        return f"exit {out.returncode}: {tail(text)}"
    return None


def tail(text: str) -> str:
    """The end of a failed run's output, its long hostile values shortened."""
    for long in ("d" * 200, "x" * 1000):
        text = text.replace(long, "…")
    return text[-1200:]


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # 503: serving, and saying its results are stale or failed
    except OSError:
        return False


def run_daemon(case: Case, host: Host, folder: Path) -> str | None:
    """The daemon on a replay with the hostile value: it exits 0-4 at once (3 for a bad
    value) or serves; either way no traceback in its log."""
    args = with_hostile(case, host, folder)
    port = free_port()
    if case.param.name != "listen":
        args += ["--listen", f"127.0.0.1:{port}"]
    if case.param.name != "input_path":
        args += ["--input", str(LIVE)]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "daemon.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "gpuguard", *args], cwd=REPO,
                                env=environment(case, host), stdout=handle, stderr=handle,
                                stdin=subprocess.DEVNULL)
    end = time.monotonic() + DAEMON_UP_S
    served = False
    try:
        while proc.poll() is None and time.monotonic() < end:
            if case.param.name != "listen" and _serves(port):
                served = True
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return "SIGTERM did not stop it within 15 s"
    text = log.read_bytes().decode("utf-8", "replace")
    if "Traceback" in text:
        return f"traceback in its log: {tail(text)}"
    if not served and proc.returncode not in (0, 1, 2, 3, 4, -signal.SIGTERM) \
            and case.param.name != "listen":
        return f"exit {proc.returncode}: {tail(text)}"
    return None


def matrix() -> tuple[list[Case], list[str]]:
    """Every (command, option, hostile value, locale); GPUGUARD_MATRIX_ONLY=TEXT keeps the
    runs whose name holds TEXT (to rerun part of it while fixing)."""
    only = os.environ.get("GPUGUARD_MATRIX_ONLY", "")
    cases: list[Case] = []
    uncovered: list[str] = []
    for path, command in commands():
        for param in command.params:
            classes = hostile_classes(param)
            if classes is None:
                uncovered.append(f"{' '.join(path)} {param.name} ({param.type!r})")
                continue
            cases += [case for value_class in classes for locale in LOCALES
                      if only in (case := Case(path, param, value_class, locale)).name]
    return cases, uncovered


def test_every_option_has_a_hostile_value_class() -> None:
    """A new option whose click type is none of the classes' fails here until it has one."""
    cases, uncovered = matrix()
    assert not uncovered, f"options with no hostile-value class: {uncovered}"
    assert len({c.path for c in cases}) >= 14  # the walk found the whole tree


def test_no_input_on_the_command_line_gives_a_traceback(host: Host, tmp_path: Path) -> None:
    cases, _ = matrix()

    def one(indexed: tuple[int, Case]) -> str | None:
        index, case = indexed
        folder = tmp_path / f"case-{index}"
        runner = run_daemon if case.path == ("daemon",) else run_command
        problem = runner(case, host, folder)
        return None if problem is None else f"{case.name}: {problem}"

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        problems = [p for p in pool.map(one, enumerate(cases)) if p is not None]
    options = sum(len(c.params) for _, c in commands())
    print(f"hostile CLI matrix: {len({c.path for c in cases})} commands, {options} options "
          f"({len({(c.path, c.param.name) for c in cases})} with values), "
          f"{len(cases) // len(LOCALES)} values x {len(LOCALES)} locales = {len(cases)} runs")
    assert not problems, f"{len(problems)} of {len(cases)} runs:\n" + "\n\n".join(problems)


# --- the findings the matrix found, one by one (each failed on 9057d6c) ---------------


def refused(*args: Arg, option: str) -> None:
    out = subprocess.run([sys.executable, "-m", "gpuguard", *args], capture_output=True,
                         cwd=REPO, timeout=60, check=False, stdin=subprocess.DEVNULL,
                         env={**os.environ, "NO_COLOR": "1"})
    text = (out.stdout + out.stderr).decode("utf-8", "replace")
    assert out.returncode == 3 and "Traceback" not in text, tail(text)
    assert option in text, tail(text)


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "-1"])
def test_status_refuses_a_timeout_that_is_no_finite_number(host: Host, value: str) -> None:
    """`status --timeout inf` raised OverflowError in settimeout (the fast path let it
    through), `nan` ValueError in click's command: exit 1, a traceback."""
    refused("status", "--socket", str(host.socket), "--timeout", value, option="--timeout")
    refused("status", "--socket", str(host.socket), "--timeout", value, "--cold",
            option="--timeout")


@pytest.mark.parametrize("option", ["--only", "--skip"])
def test_status_sends_filter_bytes_that_are_not_utf8(host: Host, option: str) -> None:
    """Bytes of an argument that are not UTF-8 (a lone surrogate in Python) made the fast
    path's encoder raise UnicodeEncodeError: now they are escaped as JSON escapes them and
    the daemon says the filter matches no rule, exit 3."""
    refused("status", "--socket", str(host.socket), option, b"\xff\xfe", option=option)


@pytest.mark.parametrize(("args", "option"), [
    (("check", "--input", str(LIVE), "--timeout", "1e308"), "--timeout"),
    (("snapshot", "--input", str(LIVE), "--timeout", "inf"), "--timeout"),
    (("slurm", "health", "--no-daemon", "--input", str(LIVE), "--slurm-timeout", "nan"),
     "--slurm-timeout"),
    (("slurm", "prolog", "--input", str(LIVE), "--timeout", "1e308"), "--timeout"),
    (("daemon", "--no-udev", "--input", str(LIVE), "--fast-interval", "nan"),
     "--fast-interval"),
    (("daemon", "--no-udev", "--input", str(LIVE), "--slow-interval", "nan"),
     "--slow-interval"),
    (("failover", "to", "cpu", "llm", "--reason", "r", "--wait", "inf"), "--wait"),
])
def test_a_deadline_or_interval_that_is_no_finite_number_is_refused(
        args: tuple[str, ...], option: str) -> None:
    """NaN passed every FloatRange (each comparison with it is false) and inf or 1e308
    those with no maximum: OverflowError (time_t), "cannot convert float NaN to integer",
    a daemon whose scheduling thread died."""
    refused(*args, option=option)


@pytest.mark.parametrize("args", [
    ("rules", "list", "--rules"), ("events", "--state-dir"),
    ("check", "--input", str(LIVE), "--path.sysfs"), ("daemon", "--no-udev", "--state-dir"),
])
def test_a_path_longer_than_the_kernel_takes_is_refused_naming_the_option(
        args: tuple[str, ...]) -> None:
    """ENAMETOOLONG escaped pathlib's exists() and is_dir() (they swallow only "not
    there"): exit 1 and a traceback, the daemon's in its log."""
    long = "/" + "/".join(["d" * 200] * 30)
    refused(*args, long, option=args[-1])
    refused(*args, "/tmp/" + "n" * 300, option=args[-1])
