"""What the event store's command-line tests share: a boot of the test's own (its procfs
with a boot id), a live `check --record` on the fake NVML, and reading `events` back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gpuguard, own_host

BOOT_A = "11111111-1111-1111-1111-111111111111"
BOOT_B = "22222222-2222-2222-2222-222222222222"
# The fake NVML's boards (tests/fake_nvml/fake_nvml.c): serials 1654000000000 + index,
# GPU 0 at bus 10, GPU 1 at bus 11. The driver's recovery action: 1 gpu_reset, 0 none.
GPU_RESET, NONE = 1, 0


def procfs(tmp: Path, boot: str) -> Path:
    root = tmp / f"proc-{boot[:4]}"
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
    return root


RunCheck = Callable[..., dict[str, Any]]


@pytest.fixture
def run(fake_env: Callable[..., dict[str, str]], tmp_path: Path) -> RunCheck:
    """A live `check --record` of the fake two-GPU host, GPU 0's recovery action given,
    in the boot whose procfs is given (history is this host's own: never a replay)."""
    host = own_host(tmp_path / "host")

    def check(state: Path, proc: Path, *extra: str, recovery: int = GPU_RESET,
              only: tuple[str, ...] = ("recovery.action", "xid.recent"),
              **switches: str | int) -> dict[str, Any]:
        out = gpuguard("check", *host, "--record", "--state-dir", str(state),
                       *(f"--only={rule}" for rule in only),
                       "--path.procfs", str(proc), "--format", "json", *extra,
                       env=fake_env(gpus=2, recovery=recovery, recovery_gpu=0, **switches))
        assert out.returncode in (0, 1, 2, 3), out.stderr
        return dict(json.loads(out.stdout), stderr=out.stderr)

    return check


def result(doc: dict[str, Any], rule: str, gpu: int | None) -> dict[str, Any]:
    return next(r for r in doc["results"] if r["rule"] == rule
                and (r["gpu"] or {}).get("index") == gpu)


def events(state: Path, *args: str) -> list[dict[str, Any]]:
    out = gpuguard("events", "--state-dir", str(state), "--format", "json", *args)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["events"])


def ack(state: Path, proc: Path, rule: str, *extra: str) -> Any:
    """`gpuguard ack RULE` in the boot of `proc` (the process, for its exit and output)."""
    return gpuguard("ack", rule, "--reason", "RMA case 123", "--state-dir", str(state),
                    "--path.procfs", str(proc), *extra)


def kmsg_lines(tmp: Path, name: str, xids: list[int], first_seq: int = 100) -> Path:
    """A kernel log of these fatal Xids on GPU 0 (bus 10), a minute apart, numbered from
    `first_seq` (the store keeps one event per line and boot)."""
    path = tmp / name
    lines = [f"4,{first_seq + i},{(1000 + i * 60) * 1_000_000},-;NVRM: Xid (PCI:0000:10:00): "
             f"{xid}, pid='<unknown>', name=<unknown>, something went wrong."
             for i, xid in enumerate(xids)]
    path.write_text("\n".join(lines) + "\n")
    return path
