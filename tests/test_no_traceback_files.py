"""No traceback from any file gpuguard reads (issue 28, item 2), the Slurm records aside
(tests/slurm/test_no_state.py): snapshots and XML dumps, profiles, rule files, service
configs, the GPUs-seen memory, the kernel-log ack, the supervisor's failover state and
requests, the event store and its rows, the daemon's events file. Each hostile content
(nested 100,000 deep, nested just under a small file's bound, over each file's bound,
binary, the wrong shape) is read by the command that reads it, as a user runs it: exit 3
with `PATH: what is wrong`, or, where a bad file must not stop the command (the GPUs seen,
the kernel-log ack, the event store under `check`), the command goes on, says so where the
code documents it, and never prints a `Traceback`. Hypothesis drives the readers with
JSON of many shapes in-process: only their documented errors ever leave them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.assess.gpus_seen import SeenGpus
from gpuguard.io.paths import Paths
from gpuguard.sources import boot_state, replay
from gpuguard.supervisor import state
from tests.conftest import REPO, TEST_BOOT_ID, gpuguard, own_host
from tests.daemon.conftest import LIVE, free_port

XID = "[  100.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.\n"
MIB = 1 << 20

# name -> content: deep (100,000 `[`), small-deep (2,000, under the 4 KiB of the
# kernel-log ack), closed-deep (a valid object holding 100,000 levels), binary, and shapes
# that are JSON or YAML but not the file's. "huge" is made per file, past its own bound.
HOSTILE: dict[str, bytes] = {
    "deep": b"[" * 100_000,
    "small-deep": b'{"a":' + b"[" * 2000,
    "closed-deep": b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "binary": bytes(range(256)) * 16,
    "list": b"[]",
    "number": b"1e999",
    "nan": b'{"gpus": NaN, "seq": NaN, "boot_id": NaN, "active": NaN}',
    "yaml-deep": b"a: " + b"[" * 100_000,
    "xml-deep": b"<a>" * 100_000 + b"</a>" * 100_000,
}
BOUNDS = {"input": 32 * MIB, "profile": 4 * MIB, "rules": 4 * MIB, "config": 4 * MIB,
          "gpus-seen": MIB, "xid-ack": 4096, "failover": 64 * 1024, "events.db": 8 * MIB}


def contents(kind: str) -> list[tuple[str, bytes]]:
    huge = b'{"x": "' + b"a" * (BOUNDS[kind] + 1) + b'"}'
    return [*HOSTILE.items(), ("huge", huge)]


def no_traceback(out: subprocess.CompletedProcess[str]) -> str:
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text[-3000:]
    return text


def cases(kind: str) -> Any:
    return pytest.mark.parametrize("name", [n for n, _ in contents(kind)])


def write(path: Path, kind: str, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dict(contents(kind))[name])
    return path


@cases("input")
def test_a_bad_snapshot_or_dump_is_exit_3_naming_it(tmp_path: Path, name: str) -> None:
    bad = write(tmp_path / "snapshot.json", "input", name)
    out = gpuguard("check", "--input", str(bad))
    assert out.returncode == 3 and f"{bad}" in no_traceback(out), out.stderr


@cases("profile")
def test_a_bad_profile_is_exit_3_naming_it(tmp_path: Path, name: str) -> None:
    bad = write(tmp_path / "profile.yaml", "profile", name)
    out = gpuguard("check", "--input", str(LIVE), "--profile", str(bad))
    assert out.returncode == 3 and f"{bad}" in no_traceback(out), out.stderr


@cases("rules")
def test_a_bad_rule_file_is_exit_3_naming_it(tmp_path: Path, name: str) -> None:
    bad = write(tmp_path / "rules.d" / "site.yaml", "rules", name)
    out = gpuguard("rules", "list", "--rules", str(bad.parent))
    assert out.returncode == 3 and f"{bad}" in no_traceback(out), out.stderr


@cases("config")
def test_a_bad_service_config_stops_the_daemon_at_start_naming_it(tmp_path: Path,
                                                                   name: str) -> None:
    bad = write(tmp_path / "gpuguard.yaml", "config", name)
    out = gpuguard("daemon", "--no-udev", "--input", str(LIVE), "--config", str(bad),
                   "--listen", f"127.0.0.1:{free_port()}", "--log-format", "json",
                   "--state-dir", str(tmp_path / "state"), timeout=60)
    assert out.returncode == 3 and f"{bad}" in no_traceback(out), out.stderr


def live_check(root: Path, fake_env: Any, *extra: str, kmsg: str = ""
               ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = gpuguard("check", *own_host(root, kmsg=kmsg), "--format", "json", *extra,
                   env=fake_env(gpus=1))
    no_traceback(out)
    assert out.returncode in (0, 1, 2, 3), out.stderr
    return out, {(r["rule"], (r["gpu"] or {}).get("index")): r
                 for r in json.loads(out.stdout)["results"]}


@cases("gpus-seen")
def test_a_bad_gpus_seen_file_is_doubt_never_a_traceback(tmp_path: Path, fake_env: Any,
                                                         name: str) -> None:
    """gpus_seen.py: an unreadable file is doubt, gpu.count unknown naming the file."""
    bad = write(tmp_path / "state" / "gpus-seen.json", "gpus-seen", name)
    _, results = live_check(tmp_path, fake_env)
    count = results[("gpu.count", None)]
    assert count["status"] == "unknown" and str(bad) in count["message"], count


@cases("xid-ack")
def test_a_bad_kernel_log_ack_hides_no_xid(tmp_path: Path, fake_env: Any, name: str) -> None:
    """boot_state.py: a bad ack counts everything (it never hides an Xid)."""
    write(tmp_path / "state" / "xid-ack.json", "xid-ack", name)
    _, results = live_check(tmp_path, fake_env, kmsg=XID)
    assert results[("xid.recent", 0)]["status"] == "critical", results[("xid.recent", 0)]


@cases("failover")
def test_a_bad_failover_state_is_named_by_failover_status(tmp_path: Path, name: str) -> None:
    bad = write(tmp_path / "state" / "failover-llm.json", "failover", name)
    out = gpuguard("failover", "status", "--state-dir", str(bad.parent))
    assert out.returncode == 3 and f"{bad}: unreadable" in no_traceback(out), out.stdout


@cases("events.db")
def test_a_bad_event_store_is_named_and_never_stops_check(tmp_path: Path, fake_env: Any,
                                                          name: str) -> None:
    bad = write(tmp_path / "state" / "events.db", "events.db", name)
    for args in (["events"], ["ack", "gpu.count", "--reason", "r", "--path.procfs",
                              str(tmp_path / "proc")]):
        out = gpuguard(*args, "--state-dir", str(bad.parent))
        assert out.returncode == 3 and f"{bad}" in no_traceback(out), out.stderr
    live_check(tmp_path, fake_env)


def test_event_store_rows_with_hostile_data_are_skipped(tmp_path: Path, fake_env: Any) -> None:
    """Rows of a real store whose JSON extras are nested 100,000 deep, binary or a list:
    `events` and `check` go on (events/rows.py), no traceback."""
    live_check(tmp_path, fake_env, "--record", kmsg=XID)
    store = tmp_path / "state" / "events.db"
    with sqlite3.connect(store) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM events")]
        assert ids
        for index, row_id in enumerate(ids):
            data = ["[" * 100_000, "\udcff\x00", "[]", '{"a": NaN}'][index % 4]
            db.execute("UPDATE events SET data = ? WHERE id = ?",
                       (data.encode("utf-8", "surrogateescape"), row_id))
    db.close()
    out = gpuguard("events", "--state-dir", str(store.parent), "--format", "json")
    assert out.returncode in (0, 3), out.stderr
    no_traceback(out)
    live_check(tmp_path, fake_env, kmsg=XID)


def test_the_daemon_logs_bad_lines_of_its_files_and_serves_on(tmp_path: Path) -> None:
    """The daemon on a GPUs-seen file nested 100,000 deep and an events file whose lines
    are nested 4,000 deep or binary: it serves, and its log holds no traceback."""
    write(tmp_path / "state" / "gpus-seen.json", "gpus-seen", "deep")
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"[" * 4000 + b"\n" + bytes(range(1, 256)) + b"\n" + b"[]\n")
    port = free_port()
    log = tmp_path / "daemon.log"
    env = {**os.environ}
    env.pop("NOTIFY_SOCKET", None)
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuguard", "daemon", "--no-udev", "--input", str(LIVE),
             "--listen", f"127.0.0.1:{port}", "--log-format", "json", "--events-file",
             str(events), "--state-dir", str(tmp_path / "state")],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=handle)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and "bad_event_line" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        status = json.loads(subprocess.run(
            ["curl", "-s", f"http://127.0.0.1:{port}/status"], capture_output=True,
            text=True, timeout=10, check=False).stdout or "{}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    text = log.read_text()
    assert "Traceback" not in text and "bad_event_line" in text, text[-3000:]
    count = [r for r in status.get("results", []) if r["rule"] == "gpu.count"]
    assert count and count[0]["status"] == "unknown", count


# --- the readers in-process, on JSON of many shapes ----------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["gpus", "boot_id", "seq", "doubt", "forgotten", "uuid",
                         "pci_bus_id", "kind", "schema", "host", "active", "to",
                         "reason", "since", "transition", "x"]), inner, max_size=6),
    max_leaves=30)


def _json_bytes(value: Any, depth: int) -> bytes:
    return ("[" * depth + json.dumps(value) + "]" * depth).encode()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON, depth=st.sampled_from([0, 0, 5, 2000]))
def test_every_reader_takes_any_json_shape(tmp_path: Path, value: Any, depth: int) -> None:
    data = _json_bytes(value, depth)
    paths = Paths(procfs=tmp_path / "proc")
    (tmp_path / "proc" / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text(TEST_BOOT_ID)
    for name in ("gpus-seen.json", boot_state.XID_ACK_FILE, "snap.json"):
        (tmp_path / name).write_bytes(data)
    seen = SeenGpus(tmp_path, TEST_BOOT_ID, keep=False)
    assert isinstance(seen.gpus, list)
    assert boot_state.read_xid_ack(tmp_path, paths) is None or isinstance(
        boot_state.read_xid_ack(tmp_path, paths), int)
    try:
        replay.load(tmp_path / "snap.json")
    except replay.InputError as exc:
        assert str(tmp_path / "snap.json") in str(exc)
    (tmp_path / "failover-llm.json").write_bytes(data)
    try:
        read: object = state.read(tmp_path / "failover-llm.json")
    except state.Unreadable as exc:
        read = exc
    assert isinstance(read, state.ServiceState | state.Unreadable), read
    request = state.request_path(tmp_path, "llm")
    request.write_bytes(data)
    os.chmod(request, 0o600)
    try:
        taken: object = state.take_request(tmp_path, "llm")
    except state.BadRequest as exc:
        taken = exc
    assert isinstance(taken, state.MoveRequest | state.BadRequest), taken
