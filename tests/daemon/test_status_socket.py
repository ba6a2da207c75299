"""`gpuguard status` (issue 22, item 1): the real daemon's verdict over its Unix socket,
judged like `check`, fresh per cadence, readable by root and one group only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.daemon import socket_client
from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.verdict_view import DaemonView, Request, answer, fresh_results
from gpuguard.model.results import Result, Status
from tests.conftest import REPO, gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

GROUP = 4242  # a gid no group on the host has: chown and the kernel's check need no name
NOBODY = 65534


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder that uid 65534 can reach (pytest's tmp_path is 0700 under root's)."""
    path = Path(tempfile.mkdtemp(prefix="gpuguard-status-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hot(tmp_path: Path) -> Path:
    """A replayed host whose GPU 0 runs past T.Limit: thermal.margin critical."""
    path = tmp_path / "hot.json"
    write_snapshot(path, host_snapshot(2, {(0, "temperature_tlimit_margin_c"): -5}))
    return path


def status(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return gpuguard("status", "--socket", str(sock), *args, timeout=30)


def test_status_is_checks_verdict_with_its_filters_and_codes(start_daemon: Any,
                                                             tmp_path: Path) -> None:
    snap = hot(tmp_path)
    sock = tmp_path / "status.sock"
    start_daemon("--input", str(snap), "--status-socket", str(sock), "--status-group",
                 str(GROUP), "--fast-interval", "1")
    cold = gpuguard("check", "--input", str(snap), "--format", "json")
    warm = status(sock, "--format", "json")
    assert warm.returncode == cold.returncode == 2, warm.stderr
    got, want = json.loads(warm.stdout), json.loads(cold.stdout)
    assert {(r["rule"], (r["gpu"] or {}).get("index"), r["status"]) for r in got["results"]} \
        == {(r["rule"], (r["gpu"] or {}).get("index"), r["status"]) for r in want["results"]}
    assert "the daemon's verdict" in got["notes"][0]
    # the same filters and --fail-on as check
    assert status(sock, "--only", "thermal.*", "--fail-on", "critical").returncode == 2
    assert status(sock, "--skip", "thermal.margin", "--fail-on", "critical").returncode == 0
    table = status(sock, "--only", "thermal.margin")
    assert "CRITICAL  thermal.margin" in table.stdout and "(exit 2)" in table.stdout
    quiet = status(sock, "-q", "--skip", "thermal.margin", "--fail-on", "critical")
    assert quiet.returncode == 0
    typo = status(sock, "--only", "thermal.nope")
    assert typo.returncode == 3 and "matches no rule" in typo.stderr
    prom = status(sock, "--format", "prometheus", "--only", "thermal.margin")
    assert 'gpuguard_rule_status{gpu="0"' in prom.stdout and "gpuguard_check_exit_code 2" \
        in prom.stdout


def test_a_result_older_than_its_stale_after_is_unknown_naming_its_age(
        start_daemon: Any, tmp_path: Path) -> None:
    """A real daemon whose cycles stop ending (SIGSTOP: no cycle runs, and when it goes on
    the socket answers before the overdue cycle has ended): its fast results, older than
    the stale_after it logged at start (issue 28: 2 x (interval + its longest cycle)), are
    unknown with their age, never the old ok. Tried a few times: the overdue cycle may
    win the race with the answer."""
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = tmp_path / "status.sock"
    daemon = start_daemon("--input", str(snap), "--timeout", "0.5", "--fast-interval", "0.5",
                          "--slow-interval", "60", "--status-socket", str(sock))
    logged = daemon.wait_for(lambda: next((json.loads(line) for line in
                                           daemon.log.read_text().splitlines()
                                           if '"freshness"' in line), None),
                             what="the freshness line")
    stale_after = float(logged["fast_stale_after_s"])
    assert stale_after == 2 * (0.5 + 0.5 + 1.0), logged  # NVML's deadline, history's wait
    # the stale message from that value (the SIGSTOP race with the overdue cycle made an
    # end-to-end check flaky under load; fresh_results is judged in-process below)
    now = time.monotonic()
    fast = Result("thermal.margin", Status.OK, Status.CRITICAL, "47 C below T.Limit")
    rule = Freshness({"fast": 0.5}, {"fast": 1.5})
    [got], _ = fresh_results([(fast, "fast", now - stale_after - 1)], rule, now)
    assert got.status is Status.UNKNOWN and got.observed["stale_after_s"] == stale_after
    assert f"(stale after {stale_after:g} s: every 0.5 s, a cycle may take up to 1.5 s)" \
        in got.message, got.message


def test_a_daemon_slow_by_design_is_never_called_stale(start_daemon: Any,
                                                        tmp_path: Path) -> None:
    """Issue 28: cycles that take their whole configured deadline (a kernel log that
    never answers, read under its deadline every fast cycle, 0.5 s apart) are slow by
    design, not stale: `status` stays on the results, 20 times out of 20."""
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    sock = tmp_path / "status.sock"
    start_daemon("--input", str(snap), "--kmsg-file", str(fifo), "--timeout", "4",
                 "--fast-interval", "0.5", "--status-socket", str(sock), healthy=False)
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    codes = []
    while len(codes) < 20 and time.monotonic() < deadline:
        run = status(sock, "--format", "json", "--only", "thermal.margin")
        if run.returncode == 3 and "no results yet" in run.stderr:
            time.sleep(0.2)
            continue
        result = json.loads(run.stdout)["results"][0]
        codes.append((run.returncode, result["observed"].get("stale", False)))
        time.sleep(0.25)
    assert codes == [(0, False)] * 20, codes


def view(entries: list[tuple[Result, str, float]]) -> DaemonView:
    return DaemonView(lambda: entries, lambda: Freshness({"fast": 5.0, "slow": 60.0}),
                      lambda: ["thermal.margin", "driver.version"], list, lambda: None,
                      lambda: 0.1, 1)


def test_freshness_is_judged_per_cadence_on_the_monotonic_clock() -> None:
    """A fast result 11 s old (two 5 s cycles are 10) is unknown; a slow one 100 s old
    (two 60 s cycles are 120) is still itself; a wall-clock jump changes neither."""
    now = time.monotonic()
    fast = Result("thermal.margin", Status.OK, Status.CRITICAL, "47 C below T.Limit")
    slow = Result("driver.version", Status.OK, Status.WARNING, "driver 580")
    got, ages = fresh_results([(fast, "fast", now - 11), (slow, "slow", now - 100)],
                              Freshness({"fast": 5.0, "slow": 60.0}), now)
    assert got[0].status is Status.UNKNOWN and "11 s old" in got[0].message
    assert got[1] is slow and round(ages["slow"]) == 100
    fresh, _ = fresh_results([(fast, "fast", now - 9.9)], Freshness({"fast": 5.0}), now)
    assert fresh[0] is fast
    reply = answer(view([(fast, "fast", time.monotonic() - 11)]),
                   Request(want="results", fail_on="critical"))
    # unknown passes --fail-on critical, as in check: it is never an ok either
    assert reply["results"][0]["status"] == "unknown" and reply["code"] == 0


def test_no_daemon_is_exit_3_saying_so_and_cold_checks_only_when_asked(
        tmp_path: Path) -> None:
    missing = status(tmp_path / "none.sock")
    assert missing.returncode == 3 and "no daemon answers" in missing.stderr
    assert "nothing was checked" in missing.stderr and not missing.stdout
    # a socket left by a daemon that was killed: refused, still exit 3
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    refused = status(tmp_path / "dead.sock")
    assert refused.returncode == 3 and "connection refused" in refused.stderr
    # --cold runs check on this host: under the tests' guard it reaches for /proc (exit 4)
    cold = status(tmp_path / "none.sock", "--cold")
    assert cold.returncode == 4 and "checking this host now" in cold.stderr
    assert "refused to use the host's" in cold.stderr


def _ask_as(sock: Path, groups: list[int]) -> int:
    """What `gpuguard status`'s client gets as uid 65534 with these supplementary groups:
    0 an answer, 13 "permission denied" (its NoDaemon message), 1 anything else."""
    pid = os.fork()
    if pid == 0:  # the child drops to nobody and asks; nothing else runs here
        code = 1
        try:
            os.setgroups(groups)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = socket_client.ask(str(sock), {"want": "results"}, 5.0)
            code = 0 if "results" in reply else 1
        except socket_client.NoDaemon as exc:
            code = 13 if "permission denied" in str(exc) else 1
        except BaseException:
            code = 1
        os._exit(code)
    _, status_ = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status_)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid needs root")
def test_the_socket_is_for_root_and_its_group_only(start_daemon: Any, tmp_path: Path,
                                                   open_dir: Path) -> None:
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = open_dir / "status.sock"
    start_daemon("--input", str(snap), "--status-socket", str(sock), "--status-group",
                 str(GROUP))
    info = os.stat(sock)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
    assert (info.st_uid, info.st_gid) == (0, GROUP)
    assert _ask_as(sock, []) == 13  # EACCES, said as such: nobody else
    assert _ask_as(sock, [GROUP]) == 0  # the group may
    assert status(sock).returncode == 0  # and root


def test_without_its_group_the_socket_is_root_only(start_daemon: Any, tmp_path: Path,
                                                   open_dir: Path) -> None:
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = open_dir / "status.sock"
    daemon = start_daemon("--input", str(snap), "--status-socket", str(sock),
                          "--status-group", "gpuguard-no-such-group")
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert "status_group_missing" in daemon.log.read_text()


def test_hostile_clients_do_not_stop_the_answer(start_daemon: Any, tmp_path: Path) -> None:
    """Idle connections, garbage and a huge line: each costs at most 2 s of one of 8
    slots; an honest client is answered after them, and the daemon's cycles go on."""
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = tmp_path / "status.sock"
    daemon = start_daemon("--input", str(snap), "--status-socket", str(sock))
    idle = []
    for _ in range(20):
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(str(sock))
        idle.append(conn)
    for payload in (b"not json\n", b"x" * 100_000, b'{"want": "everything"}\n'):
        with socket.socket(socket.AF_UNIX) as bad:
            bad.settimeout(5)
            bad.connect(str(sock))
            try:
                bad.sendall(payload)
                reply = bad.recv(4096)
            except OSError:
                reply = b""
            assert b'"error"' in reply or reply == b""
    started = time.monotonic()
    end = started + 20
    while time.monotonic() < end:
        run = status(sock, "--timeout", "5")
        if run.returncode == 0:
            break
    assert run.returncode == 0, run.stderr
    for conn in idle:
        conn.close()
    assert daemon.proc.poll() is None


def test_a_second_daemon_on_a_live_socket_exits_1_and_leaves_it(start_daemon: Any,
                                                                 tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = tmp_path / "status.sock"
    start_daemon("--input", str(snap), "--status-socket", str(sock))
    second = start_daemon("--input", str(snap), "--status-socket", str(sock), healthy=False)
    assert second.proc.wait(timeout=30) == 1
    assert "another daemon answers" in second.log.read_text()
    assert status(sock).returncode == 0


def test_status_imports_no_nvml_click_or_rules(tmp_path: Path) -> None:
    """The client's whole import list: the standard library and three small modules."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuguard", "status",
                          "--socket", str(tmp_path / "none.sock")], capture_output=True,
                         text=True, cwd=REPO, timeout=30, check=False)
    assert run.returncode == 3
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    ours = {m for m in imported if m.startswith("gpuguard")}
    assert ours <= {"gpuguard", "gpuguard.cli", "gpuguard.cli.entry", "gpuguard.cli.timing",
                    "gpuguard.io", "gpuguard.io.guard", "gpuguard.cli.status_client",
                    "gpuguard.daemon", "gpuguard.daemon.socket_client",
                    "gpuguard.__main__"}, ours
    assert not {"click", "pynvml", "msgspec", "yaml", "prometheus_client"} & imported


def serve_once(path: Path, reply: bytes) -> None:
    """A stand-in for the daemon on `path` that answers one request with `reply`."""
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer_one() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(reply)
        server.close()

    threading.Thread(target=answer_one, daemon=True).start()


@pytest.mark.parametrize(("reply", "code", "said"), [
    (b"GGV1 1 14\nthe rendering\n", 1, "the rendering"),
    (b"GGV1 error 24\nno rule matches --only x", 3, "no rule matches --only x"),
    (b"GGV1 7 10\nnot a code", 3, "wrong shape"),
    (b"GGV1 0 100\nOK all fine", 3, "no complete answer"),  # cut: 11 bytes of 100
    (b"GGV1 0\nOK", 3, "no complete answer"),  # no length
    (b"HTTP/1.1 200 OK\n\nok", 3, "no complete answer"),  # another program on the socket
    (b"", 3, "no complete answer"),
])
def test_the_fast_client_reads_only_a_well_formed_frame(tmp_path: Path, reply: bytes,
                                                        code: int, said: str) -> None:
    """`gpuguard status` reads the daemon's framed rendering with no JSON parser; whatever
    else answers on the socket is exit 3, never an ok. Its imports stay the standard
    library's cheapest (no json, socket, typing: the 0.25 x nvidia-smi -q budget)."""
    sock = tmp_path / "s.sock"
    serve_once(sock, reply)
    # as the installed console script starts it (`-m` would add runpy's imports)
    script = "from gpuguard.cli.entry import main; main()"
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", script, "status",
                          "--socket", str(sock)], capture_output=True, text=True, cwd=REPO,
                         timeout=30, check=False)
    assert run.returncode == code, run.stdout + run.stderr
    assert said in run.stdout + run.stderr
    # beyond what this interpreter's start imports anyway (a .pth may bring contextlib)
    bare = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                          capture_output=True, text=True, timeout=30, check=True)
    added = imports(run.stderr) - imports(bare.stderr)
    assert not {"json", "socket", "typing", "contextlib", "click", "__future__",
                "gpuguard.cli.timing", "gpuguard.io.guard"} & added, added


def imports(importtime: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in importtime.splitlines()
            if line.startswith("import time:")}


def test_sigterm_removes_the_socket(start_daemon: Any, tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = tmp_path / "status.sock"
    daemon = start_daemon("--input", str(snap), "--status-socket", str(sock))
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=15) == 0
    assert not sock.exists()


def test_one_deadline_for_the_whole_answer(tmp_path: Path) -> None:
    """A server that trickles a byte a second (a wedged daemon thread, another program)
    held `status --timeout 1` for as long as it kept sending: a deadline per recv."""
    import threading

    sock = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock))
    server.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"GGV1 0 1000\nok")
            while not stop.wait(0.3):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    try:
        run = status(sock, "--timeout", "1")
    finally:
        stop.set()
        server.close()
    assert run.returncode == 3 and "did not answer within 1 s" in run.stderr, run
    assert time.monotonic() - started < 20  # bounded; it waited until killed before


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="starts a server as nobody: needs root and /usr/bin/python3")
def test_an_answer_from_another_users_program_is_not_a_verdict(tmp_path: Path) -> None:
    """Another user's program listening where `--socket` points answers "all ok": the
    client asks the kernel who it is (SO_PEERCRED) and takes no verdict from it."""
    folder = Path(tempfile.mkdtemp(prefix="gg-peer-"))
    folder.chmod(0o777)
    sock = folder / "s.sock"
    code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\n"
            "s.listen(1)\nprint('up',flush=True)\nc,_=s.accept()\nc.recv(4096)\n"
            "c.sendall(b'GGV1 0 7\\nall ok\\n')\nc.close()\n")
    python = "/usr/bin/python3"  # the system one: the checkout and pyenv may be closed to nobody
    server = subprocess.Popen([python, "-c", code, str(sock)], user=65534,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        run = status(sock)
    finally:
        server.kill()
        server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    assert run.returncode == 3 and "runs as uid 65534" in run.stderr, run
