"""The status socket under abuse (issue 27, item 9): group members of other uids holding
and renewing idle connections leave root its slot, so `gpuguard status` and `slurm
health` get the daemon's verdict, not the cold path; malformed and deeply nested
requests get an error reply and a bounded number of log lines, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpuguard.daemon import socket_client, verdict_socket
from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.verdict_socket import VerdictSocket
from gpuguard.daemon.verdict_view import DaemonView
from gpuguard.model.results import Result, Status
from tests.conftest import gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

GROUP = 4242  # a gid no group on the host has: the kernel's check needs no name
FAKE_SLURM = Path(__file__).parent.parent / "slurm" / "fake_slurm"  # sinfo, scontrol
SYSTEM_PYTHON = "/usr/bin/python3"  # the checkout's venv may be closed to other uids
as_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                             reason="clients of other uids need root and /usr/bin/python3")

# A client of another uid: opens `count` connections to the socket, sends nothing, and
# renews each the moment the daemon closes it (10 ms later where it was refused at once,
# so that the refused ones do not spin a core). It prints "up" once `hold` of them have
# stayed open past the daemon's accept, and on stdin's end the number of connections
# that were held for a while (they had a slot) and the number renewed.
RENEWER = r"""
import selectors, socket, sys, time
path, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, None)
opened, due, held, renewed, told = {}, [], 0, 0, False
def connect():
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(path)
    except OSError:
        conn.close(); due.append(time.monotonic() + 0.01); return
    opened[conn] = time.monotonic()
    sel.register(conn, selectors.EVENT_READ, conn)
for _ in range(count):
    connect()
while True:
    for key, _ in sel.select(0.01):
        if key.data is None:
            print(held, renewed, flush=True); sys.exit(0)
        conn = key.data
        try:
            gone = conn.recv(4096) == b""
        except OSError:
            gone = True
        if gone:
            lived = time.monotonic() - opened.pop(conn)
            sel.unregister(conn); conn.close()
            renewed += 1
            if lived > 0.5:
                held += 1
                connect()
            else:
                due.append(time.monotonic() + 0.01)
    now = time.monotonic()
    for when in [d for d in due if d <= now]:
        due.remove(when); connect()
    if not told and sum(now - t > 0.3 for t in opened.values()) >= hold:
        told = True; print("up", flush=True)
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder that other uids can reach (pytest's tmp_path is 0700 under root's)."""
    path = Path(tempfile.mkdtemp(prefix="gpuguard-abuse-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def renewer(sock: Path, uid: int, count: int, hold: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", RENEWER, str(sock), str(count), str(hold)],
                            user=uid, group=uid, extra_groups=[GROUP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    wait_up(proc)
    return proc


def wait_up(proc: subprocess.Popen[str]) -> None:
    """The child's "up" line; where it never comes (its connections were never held),
    the test fails rather than waits for ever."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    if not ready:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError("the client never held its connections")
    assert proc.stdout.readline().strip() == "up"


def stop(proc: subprocess.Popen[str]) -> tuple[int, int]:
    """(connections that held a slot, connections renewed) of a renewer."""
    out, _ = proc.communicate("", timeout=30)
    held, renewed = out.split()[-2:]
    return int(held), int(renewed)


@as_root
@pytest.mark.parametrize("connections", [12, 300], ids=["idle", "flood"])
def test_root_is_answered_by_the_daemon_while_other_uids_renew_idle_connections(
        start_daemon: Any, tmp_path: Path, open_dir: Path, connections: int) -> None:
    """Two group members (uids 65534 and 65533) keep 12 idle connections each and renew
    every one the daemon closes: before, they held all 8 slots and root's `status` and
    `slurm health` (the real commands; health on the fake Slurm) went to their cold path.
    Now one uid holds at most 6 and one slot is root's: 20 of 20 answered by the daemon,
    for each. With 300 each, the connections
    refused at once and renewed fill the daemon's listen queue: the client's connect
    met EAGAIN (2 to 4 in 20 failed so) and now tries again within its deadline."""
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = open_dir / "status.sock"
    start_daemon("--input", str(snap), "--status-socket", str(sock), "--status-group",
                 str(GROUP))
    first = renewer(sock, 65534, connections, 6)
    second = renewer(sock, 65533, connections, 1)
    (tmp_path / "nodes").write_text("n1|IDLE|Unknown|gpu|none\n")  # the fake Slurm's
    health = ["slurm", "health", "--socket", str(sock), "--brake-jitter", "0", "--node", "n1",
              "--slurm-bin", str(FAKE_SLURM), "--slurm-conf", str(tmp_path / "slurm.conf"),
              "--state-dir", str(tmp_path / "health-state")]
    statuses, healths, asked = [], [], []
    try:
        for _ in range(20):  # paced over about 3 of the daemon's 2 s deadlines
            statuses.append(gpuguard("status", "--socket", str(sock), "--format", "json",
                                     timeout=30))
            healths.append(gpuguard(*health, timeout=60))
            try:  # what `slurm health` asks (integrations/slurm/verdict.py from_daemon)
                asked.append(socket_client.ask(str(sock), {"want": "results"}, 5.0))
            except socket_client.NoDaemon as exc:
                asked.append({"error": str(exc)})
            time.sleep(0.1)
    finally:
        held = [stop(first), stop(second)]
    from_daemon = [run for run in statuses if run.returncode == 0
                   and "the daemon's verdict" in json.loads(run.stdout)["notes"][0]]
    assert len(from_daemon) == 20, [run.stderr for run in statuses if run.returncode]
    # its one-line plan names the verdict it acted on; the cold path says "a cold check"
    warm = [run for run in healths if run.returncode == 0
            and "verdict: the daemon's verdict" in run.stdout]
    assert len(warm) == 20, [run.stdout + run.stderr for run in healths if run not in warm]
    answered = [reply for reply in asked if "the daemon's verdict" in reply.get("note", "")]
    assert len(answered) == 20, [reply for reply in asked if "note" not in reply]
    # they did hold slots to the deadline and renew them meanwhile
    assert all(kept > 0 and renewed > kept for kept, renewed in held), held


def one_result() -> list[tuple[Result, str, float]]:
    return [(Result("thermal.margin", Status.OK, Status.CRITICAL, "47 C below T.Limit"),
             "fast", time.monotonic())]


def view(entries: Any = one_result) -> DaemonView:
    return DaemonView(entries, lambda: Freshness({"fast": 5.0}), lambda: ["thermal.margin"], list,
                      lambda: None, lambda: 0.1, 1)


@pytest.fixture
def server(open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[VerdictSocket]:
    """The real VerdictSocket in this process, its deadline long enough that an idle
    connection keeps its slot for the whole test."""
    monkeypatch.setattr(verdict_socket, "DEADLINE_S", 60.0)
    served = VerdictSocket(open_dir / "status.sock", str(GROUP), view())
    served.start()
    yield served
    served.stop()


def wait_until(predicate: Any, what: str) -> None:
    end = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def idle_as(uid: int, sock: Path, count: int) -> subprocess.Popen[str]:
    """`count` idle connections of `uid` (held until stdin ends)."""
    code = ("import socket,sys\nc=[socket.socket(socket.AF_UNIX) for _ in range(int("
            "sys.argv[2]))]\n[s.connect(sys.argv[1]) for s in c]\nprint('up',flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", code, str(sock), str(count)], user=uid,
                            group=uid, extra_groups=[GROUP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    wait_up(proc)
    return proc


@as_root
def test_slots_are_counted_per_uid_and_one_is_roots(server: VerdictSocket) -> None:
    """10 idle connections of uid 65534: 6 held, 4 closed at once; 10 of uid 65533: 1
    held (the 8th slot is kept for root); root is answered, 20 times of 20."""
    sock = str(server.path)
    first = idle_as(65534, server.path, 10)
    try:
        # before: 8 held (every slot), 2 refused
        wait_until(lambda: server.refused >= 4, "uid 65534 was not held to 6 slots")
        assert server.slots.held() == {65534: 6} and server.refused == 4
        second = idle_as(65533, server.path, 10)
        try:
            wait_until(lambda: server.refused >= 13, "uid 65533's were not refused")
            assert server.slots.held() == {65534: 6, 65533: 1} and server.refused == 13
            replies = [socket_client.ask(sock, {"want": "results"}, 5.0) for _ in range(20)]
            assert all("the daemon's verdict" in r["note"] for r in replies), replies
        finally:
            second.communicate("", timeout=30)
    finally:
        first.communicate("", timeout=30)


@as_root
def test_root_finding_every_slot_taken_waits_for_its_own(server: VerdictSocket) -> None:
    """7 slots held by two other uids, the 8th by an idle connection of root's: root's
    next request waits (it is not closed at once) and is answered when root's idle one
    goes."""
    first, second = idle_as(65534, server.path, 6), idle_as(65533, server.path, 1)
    try:
        wait_until(lambda: server.slots.held() == {65534: 6, 65533: 1}, "7 slots held")
        mine = socket.socket(socket.AF_UNIX)
        mine.connect(str(server.path))
        wait_until(lambda: server.slots.held().get(0) == 1, "root's idle connection held")
        replies: list[dict[str, Any]] = []
        asking = threading.Thread(target=lambda: replies.append(
            socket_client.ask(str(server.path), {"want": "results"}, 30.0)))
        asking.start()
        wait_until(lambda: server.slots.root_waiting == 1, "root's request waiting")
        assert not replies and server.refused == 0
        mine.close()
        asking.join(timeout=30)
        assert replies and "the daemon's verdict" in replies[0]["note"], replies
    finally:
        first.communicate("", timeout=30)
        second.communicate("", timeout=30)


# Each refused with an error reply (JSON {"error"}), none a traceback.
HOSTILE = [
    b"[" * 3000 + b"]" * 1000 + b"\n",  # 3,000 deep: json.loads raises RecursionError
    b'{"":' * 1010 + b"\n",  # 1,010 objects deep: RecursionError too
    b'{"want": "results", "fmt": "\xc3\x28"}\n',  # not UTF-8
    b"\xff\xfe{\x00}\x00\n",  # a UTF-16 byte order mark
    b"not json\n",
    b"[1]\n",
    b"\n",
    b'{"want": "everything"}\n',
    b'{"only": ' + b'["x",' * 600 + b"\n",
    b"x" * 5000 + b"\n",  # over 4 KiB
]


def send(sock: Path, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10)
        conn.connect(str(sock))
        # the daemon may close a line over 4 KiB before it is all sent
        with contextlib.suppress(OSError):
            conn.sendall(payload)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:  # after the reply: it closed with our bytes unread
            pass
        return b"".join(chunks)


def test_malformed_and_deeply_nested_requests_get_an_error_and_few_log_lines(
        start_daemon: Any, tmp_path: Path) -> None:
    """Each hostile request 20 times: every one answered {"error": ...}, the daemon's log
    says so once per minute (here: at most one line per minute the test took, plus one),
    and holds no traceback; an honest request is still answered."""
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(1))
    sock = tmp_path / "status.sock"
    daemon = start_daemon("--input", str(snap), "--status-socket", str(sock))
    started = time.monotonic()
    for payload in HOSTILE:
        for _ in range(20):
            reply = send(sock, payload)
            assert "error" in json.loads(reply), (payload[:40], reply)
    assert "results" in socket_client.ask(str(sock), {"want": "results"}, 5.0)
    minutes = (time.monotonic() - started) / 60
    daemon.wait_for(lambda: "status_request_refused" in daemon.log.read_text(), 10,
                    "the refusal's log line")
    log = daemon.log.read_text()
    lines = [line for line in log.splitlines() if "status_request" in line]
    assert 1 <= len(lines) <= 1 + int(minutes) + 1, lines
    assert "Traceback" not in log and "RecursionError" not in log
    assert daemon.proc.poll() is None


def test_a_failing_answer_is_an_error_reply_and_one_traceback_per_interval(
        open_dir: Path) -> None:
    """A bug in an answer (the view raises) used to log one traceback per request and
    close the connection unanswered: now an error reply each time, one log line."""
    def broken() -> list[tuple[Result, str, float]]:
        raise KeyError("a bug")

    served = VerdictSocket(open_dir / "status.sock", None, view(broken))
    served.start()
    try:
        with capture_logs() as logs:
            replies = [send(served.path, b'{"want": "results"}\n') for _ in range(30)]
    finally:
        served.stop()
    assert all("error" in json.loads(reply) for reply in replies), replies[:2]
    assert "KeyError" in json.loads(replies[0])["error"]
    failed = [entry for entry in logs if entry["event"] == "status_request_failed"]
    assert len(failed) == 1, logs


def test_a_rendering_holding_a_lone_surrogate_is_still_sent(open_dir: Path) -> None:
    """A result's message holding a lone surrogate (as a replayed string may): the frame's
    encoding raised, the connection closed unanswered and the log took a traceback per
    request; now the frame goes (the character replaced) and nothing is logged."""
    def odd() -> list[tuple[Result, str, float]]:
        return [(Result("thermal.margin", Status.OK, Status.CRITICAL, "GPU \ud800 ok"),
                 "fast", time.monotonic())]

    served = VerdictSocket(open_dir / "status.sock", None, view(odd))
    served.start()
    try:
        with capture_logs() as logs:
            replies = [socket_client.ask_text(str(served.path), {"fmt": "table"}, 5.0)
                       for _ in range(20)]
    finally:
        served.stop()
    assert all(reply.get("code") == 0 and "GPU ? ok" in reply["text"] for reply in replies)
    assert not logs, logs


def test_the_log_quota_is_one_line_per_interval_counting_the_rest() -> None:
    from gpuguard.daemon.verdict_socket import LogQuota  # new with this test

    now = [100.0]
    quota = LogQuota(60.0, clock=lambda: now[0])
    with capture_logs() as logs:
        for _ in range(50):
            quota.warning("status_request_refused", reason="not JSON")
        quota.warning("status_client_refused", uid=65534)
        now[0] += 61
        quota.warning("status_request_refused", reason="nested too deep")
    assert [entry["event"] for entry in logs] == ["status_request_refused"] * 2
    assert logs[0]["untold"] == {} and logs[0]["reason"] == "not JSON"
    assert logs[1]["untold"] == {"status_request_refused": 49, "status_client_refused": 1}


def test_a_live_daemon_whose_queue_is_full_keeps_its_socket(tmp_path: Path) -> None:
    """A second daemon's probe met a live one's full listen queue (EAGAIN, as under a
    flood of connections) and took it for dead: it unlinked the live daemon's socket."""
    path = tmp_path / "status.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen(0)  # never accepts: one waiting connection fills its queue
    inode = os.stat(path).st_ino
    waiting = []
    try:
        for _ in range(4):
            conn = socket.socket(socket.AF_UNIX)
            conn.setblocking(False)
            waiting.append(conn)
            try:
                conn.connect(str(path))
            except BlockingIOError:
                break
        else:
            pytest.fail("the listen queue never filled")
        second = VerdictSocket(path, None, view())
        with pytest.raises(OSError, match="another daemon listens"):
            second.start()
        assert os.stat(path).st_ino == inode  # the live one's, not unlinked
    finally:
        for conn in waiting:
            conn.close()
        live.close()
