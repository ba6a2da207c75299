"""Issue 36 through the command line: every form of a lost GPU on a live `check` (the fake
NVML, a host of the test's own: tests/conftest.py own_host)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES, gpuguard, own_host

K = FIXTURES / "kmsg"


def by_gpu(proc: Any, rule: str) -> dict[Any, dict[str, Any]]:
    """A rule's results by GPU index, `host` for the host's."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return {"host" if r["gpu"] is None else r["gpu"]["index"]: r
            for r in json.loads(proc.stdout)["results"] if r["rule"] == rule}


def check(root: Path, env: dict[str, str], kmsg: str = "", *extra: str) -> Any:
    return gpuguard("check", "--format", "json", *own_host(root, kmsg=kmsg), *extra, env=env)


def test_a_log_whose_last_line_has_no_newline_is_read_and_the_result_says_it_may_be_cut(
        tmp_path, fake_env):
    """A pasted excerpt without its last newline: its Xid 79 on GPU 0 (the fake's GPU 0 is
    at 0000:10:00.0) is read, not every kernel-log rule unknown; the messages say the last
    line may be cut."""
    line = "[ 200.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=x, GPU has fallen off the bus"
    proc = check(tmp_path, fake_env(), line)
    xids = by_gpu(proc, "xid.recent")
    assert xids[0]["status"] == "critical", xids[0]["message"]
    assert "may be cut" in xids[0]["message"]
    gsp = by_gpu(proc, "gsp.firmware")
    assert gsp[0]["status"] == "ok" and "may be cut" in gsp[0]["message"]
