"""Issue 36 through the command line: an upgrade with a stale initramfs (the old release
reports the GPU unsupported and its load fails, the new release loads seconds later) is
cleared by that load: NVML lists and reads the GPU, xid.recent is ok on it
(tests/fixtures/kmsg/README.md: lost-unsupported-upgrade*.log)."""

from __future__ import annotations

import pytest

from tests.test_lost_gpu_cli import K, by_gpu, check


@pytest.mark.parametrize("name", ["lost-unsupported-upgrade.log",
                                  "lost-unsupported-upgrade-notime.log"])
def test_the_new_release_loaded_after_a_failed_old_one_clears_the_unsupported_gpu(
        tmp_path, fake_env, name):
    proc = check(tmp_path, fake_env(gpus=3), (K / name).read_text())
    xids = by_gpu(proc, "xid.recent")
    assert xids[1]["status"] == "ok", xids[1]["message"]


def test_the_unsupported_gpu_without_a_later_load_stays_critical(tmp_path, fake_env):
    """The control: the same failed load with no load after it is still update_software."""
    log = (K / "lost-unsupported-upgrade.log").read_text().splitlines(keepends=True)[:-2]
    proc = check(tmp_path, fake_env(gpus=3), "".join(log))
    xids = by_gpu(proc, "xid.recent")
    assert (xids[1]["status"], xids[1]["action"]) == ("critical", "update_software")
