"""P2P status kept between the daemon's NVML sweeps (issue 32, sources/nvml_p2p_kept.py):
the worker asks nvmlDeviceGetP2PStatus again only when a pair's wiring may have changed
(NVLink state or counters, fabric, the GPU set, a forget, the slow interval), never keeps
a failed answer; `check` reads P2P every run.

The worker runs for real on the fake NVML; the fake's P2P answer lives in a file the test
rewrites (FAKE_NVML_P2P_FILE), so an answer kept shows as the old one, and every
nvmlDeviceGetP2PStatus call is a line of FAKE_NVML_P2P_CALLS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuguard.sources.nvml_p2p_kept import P2PKept
from tests.conftest import REPO

CALLS_A_SWEEP_2GPU = 2 * 4  # two ordered pairs, four kinds each


class Worker:
    """The daemon's NVML worker (python -m gpuguard.sources.nvml_worker) on the fake."""

    def __init__(self, tmp: Path, fake_nvml: Path, every_s: float = 3600.0,
                 **files: str) -> None:
        self.tmp = tmp
        self.calls = tmp / "p2p_calls"
        self.switches = {name: tmp / name for name in ("gpus", "nvlink_down", "fabric", "p2p")}
        for name, path in self.switches.items():
            path.write_text(files.get(name, {"gpus": "2", "p2p": "ok",
                                             "fabric": "completed"}.get(name, "")) + "\n")
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_NVLINKS": "2",
               "FAKE_NVML_P2P_CALLS": str(self.calls),
               **{f"FAKE_NVML_{n.upper()}_FILE": str(p) for n, p in self.switches.items()}}
        env = {k: v for k, v in env.items() if k not in ("FAKE_NVML_GPUS", "FAKE_NVML_P2P")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuguard.sources.nvml_worker", str(tmp / "progress"),
             str(tmp), "--no-xid-events", f"--inforom-every={every_s:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)

    def set(self, name: str, value: str) -> None:
        self.switches[name].write_text(value + "\n")

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def sweep(self) -> dict[int, Any]:
        """Each GPU's p2p_status reading of one sweep."""
        self.command("sweep")
        assert self.proc.stdout is not None
        out: dict[int, Any] = {}
        for line in self.proc.stdout:
            msg = json.loads(line)
            if msg["t"] == "end":
                return out
            if msg["t"] == "gpu":
                out[msg["index"]] = msg["p2p_status"]
        raise AssertionError("the worker ended without an answer")

    def p2p_calls(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

    def close(self) -> None:
        self.command("quit")
        self.proc.wait(timeout=10)


@pytest.fixture
def worker(tmp_path: Path, fake_nvml: Path) -> Any:
    started: list[Worker] = []

    def start(**kwargs: Any) -> Worker:
        started.append(Worker(tmp_path, fake_nvml, **kwargs))
        return started[-1]

    yield start
    for w in started:
        w.close()


def nvlink_kind(p2p: dict[int, Any], gpu: int = 0) -> str:
    return str(p2p[gpu][0]["nvlink"])


def test_kept_between_sweeps_while_nothing_changes(worker: Any) -> None:
    w = worker()
    assert nvlink_kind(w.sweep()) == "ok"
    assert w.p2p_calls() == CALLS_A_SWEEP_2GPU
    w.set("p2p", "not_supported")  # NVML would say otherwise now: the kept answer is used
    for _ in range(3):
        assert nvlink_kind(w.sweep()) == "ok"
    assert w.p2p_calls() == CALLS_A_SWEEP_2GPU


def test_read_again_when_a_link_goes_down(worker: Any) -> None:
    w = worker()
    w.sweep()
    w.set("p2p", "not_supported")
    w.set("nvlink_down", "1:0")  # GPU 1's link 0: both of GPU 1's pairs may have changed
    p2p = w.sweep()
    assert nvlink_kind(p2p, 0) == "not_supported" and nvlink_kind(p2p, 1) == "not_supported"
    assert w.p2p_calls() == 2 * CALLS_A_SWEEP_2GPU


def test_read_again_when_the_fabric_changes(worker: Any) -> None:
    w = worker()
    w.sweep()
    w.set("p2p", "not_supported")
    w.set("fabric", "in_progress")
    assert nvlink_kind(w.sweep()) == "not_supported"


def test_read_again_when_the_gpu_set_changes(worker: Any) -> None:
    w = worker()
    w.sweep()
    w.set("p2p", "not_supported")
    w.set("gpus", "3")
    p2p = w.sweep()
    assert [entry["nvlink"] for entry in p2p[0]] == ["not_supported", "not_supported"]
    w.set("gpus", "2")  # back to the first set: GPU 0's pair with GPU 1 still as last read
    assert nvlink_kind(w.sweep()) == "not_supported"


def test_read_again_after_the_slow_interval(worker: Any) -> None:
    every_sweep = worker(every_s=0)  # a slow interval of 0: no answer is young enough
    every_sweep.sweep()
    every_sweep.set("p2p", "not_supported")
    assert nvlink_kind(every_sweep.sweep()) == "not_supported"


def test_forget_drops_what_was_kept(worker: Any) -> None:
    w = worker()
    w.sweep()
    w.set("p2p", "not_supported")
    w.command("forget")  # as the daemon would on a GPU reset in the kernel log
    assert nvlink_kind(w.sweep()) == "not_supported"


def test_a_failed_read_is_never_kept(worker: Any) -> None:
    w = worker(p2p="error")
    first = w.sweep()
    assert first[0]["state"] == "error" and "nvmlDeviceGetP2PStatus" in first[0]["error"]
    w.set("p2p", "ok")
    assert nvlink_kind(w.sweep()) == "ok"


def test_a_pair_expires_after_the_slow_interval_on_the_monotonic_clock() -> None:
    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    kept = P2PKept(60.0, clock)
    readings = {"nvlink_links": [{"link": 0, "up": True}], "fabric_state": "completed"}
    entry = {"peer": 1, "read": "ok", "write": "ok", "nvlink": "ok", "atomics": "ok"}

    def pair() -> Any:
        sweep = kept.sweep(2)
        sweep.publish(0, "GPU-a", readings)
        sweep.publish(1, "GPU-b", readings)
        return sweep.pair(0, 1)

    pair().keep(entry)
    clock.now += 59.0
    assert pair().entry() == entry
    clock.now += 1.0
    assert pair().entry() is None  # 60 s old: read again
    assert kept.pairs_read == 1


def test_a_gpu_without_a_uuid_is_read_every_sweep() -> None:
    kept = P2PKept(60.0)
    entry = {"peer": 1, "read": "ok", "write": "ok", "nvlink": "ok", "atomics": "ok"}
    for _ in range(2):
        sweep = kept.sweep(2)
        sweep.publish(0, "GPU-a", {})
        sweep.publish(1, {"state": "error", "error": "nvmlDeviceGetUUID: GPU is lost"}, {})
        pair = sweep.pair(0, 1)
        assert pair.entry() is None
        pair.keep(entry)
    assert kept.pairs_read == 2
