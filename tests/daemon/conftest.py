"""Run the real daemon as a subprocess on replayed or fake-NVML sources, talk HTTP to it."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.io.atomic import write_text
from tests.conftest import FIXTURES, REPO, own_host

LIVE = FIXTURES / "h200-live" / "idle-snapshot.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_snapshot(gpus: int = 8, changes: dict[tuple[int, str], Any] | None = None
                  ) -> dict[str, Any]:
    """An n-GPU host made from the real H200 recording (JSON form)."""
    base = json.loads(LIVE.read_text())
    one = base["gpus"][0]
    base["gpus"] = []
    for i in range(gpus):
        gpu = copy.deepcopy(one)
        gpu.update(index=i, uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
                   pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0")
        base["gpus"].append(gpu)
    base["host"]["gpu_count"] = gpus
    for (index, name), value in (changes or {}).items():
        base["gpus"][index][name] = value
    return base


def write_snapshot(path: Path, snapshot: dict[str, Any]) -> None:
    write_text(path, json.dumps(snapshot))  # atomic: the daemon never reads half a file


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{") or
            line.startswith(name + " ")]


class DaemonProcess:
    def __init__(self, args: list[str], env: dict[str, str], tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "daemon.log"
        self.events = tmp / "events.jsonl"
        full_env = {**os.environ, **env}
        full_env.pop("NOTIFY_SOCKET", None)
        full_env.update({k: v for k, v in env.items()})
        # a live daemon (the fake NVML) reads a host of the test's own; a replay only what
        # its arguments name
        host = [] if "--input" in args else own_host(tmp / "own-host")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuguard", "daemon", "--listen", f"127.0.0.1:{self.port}",
             "--no-udev", "--log-format", "json", "--events-file", str(self.events), *host,
             "--state-dir", str(tmp / "state"), *args],
            cwd=REPO, env=full_env, stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"))

    def wait_healthy(self, timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if get(self.url + "/healthz", 1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("daemon not healthy: " + self.log.read_text()[-2000:])

    def metrics(self) -> str:
        return get(self.url + "/metrics")[1]

    def status(self) -> dict[str, Any]:
        return json.loads(get(self.url + "/status")[1])

    def result(self, rule: str, gpu: int | None = None) -> dict[str, Any] | None:
        for r in self.status()["results"]:
            if r["rule"] == rule and (r["gpu"] or {}).get("index") == gpu:
                return r
        return None

    def wait_for(self, predicate: Any, timeout: float = 10.0, what: str = "") -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; log:\n"
                             + self.log.read_text()[-3000:])

    def send_event(self, action: str, properties: dict[str, str]) -> None:
        with self.events.open("a") as handle:
            handle.write(json.dumps({"action": action, "properties": properties}) + "\n")

    def stop(self) -> float:
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("SIGTERM did not stop the daemon within 10 s") from None
        return time.monotonic() - started


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, healthy: bool = True
              ) -> DaemonProcess:
        daemon = DaemonProcess(list(args), env or {}, tmp_path)
        started.append(daemon)
        if healthy:
            daemon.wait_healthy()
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


class WallClock:
    """The wall clock of the processes started with `env` (tests/fake_clock/fake_clock.c,
    preloaded): `set(s)` puts it `s` seconds off the real one, at once, as NTP stepping
    the host's clock would; their monotonic and boot clocks are left alone, and so is
    every other process's clock (this test's included)."""

    def __init__(self, library: Path, offset_file: Path) -> None:
        self.offset_file = offset_file
        self.env = {"LD_PRELOAD": str(library), "FAKE_CLOCK_OFFSET_FILE": str(offset_file)}
        self.set(0)

    def set(self, seconds: float) -> None:
        write_text(self.offset_file, f"{seconds}\n")
        time.sleep(0.1)  # the shim reads the file again at most every 20 ms


@pytest.fixture(scope="session")
def fake_clock_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fake_clock/fake_clock.c built into libfakeclock.so."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the wall-clock shim (see README)"
    out = tmp_path_factory.mktemp("fake_clock") / "libfakeclock.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out),
                    str(REPO / "tests/fake_clock/fake_clock.c"), "-ldl"], check=True)
    return out


@pytest.fixture
def wall_clock(fake_clock_library: Path, tmp_path: Path) -> WallClock:
    return WallClock(fake_clock_library, tmp_path / "wall-clock-offset")
