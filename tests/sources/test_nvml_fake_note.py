"""`check` says when its NVML is the tests' fake (issue 28): a reader who kept the README's
LD_LIBRARY_PATH got four GPUs and a critical with no sign that they were not real."""

from __future__ import annotations

import json

from tests.conftest import FIXTURES, gpuguard

H200_RECORDING = FIXTURES / "h200-live" / "idle-snapshot.json"


def test_a_check_on_the_fake_says_so_in_the_table_and_in_json(fake_env, host_args, fake_nvml,
                                                              tmp_path):
    env = fake_env(gpus=4, recovery=1, recovery_gpu=3)
    table = gpuguard("check", *host_args, "--only", "recovery.action", env=env)
    assert table.returncode == 2, table.stdout + table.stderr
    header = table.stdout.splitlines()
    library = (fake_nvml / "libnvidia-ml.so.1").resolve()
    note = (f"note: NVML is tests/fake_nvml (FAKE_NVML_GPUS=4 FAKE_NVML_RECOVERY=1 "
            f"FAKE_NVML_RECOVERY_GPU=3), loaded from {library}: these GPUs are not real")
    assert header[1] == note, table.stdout  # right under the header line
    doc = json.loads(gpuguard("check", *host_args, "--format", "json", env=env).stdout)
    assert doc["notes"] == [note.removeprefix("note: ")]
    # the snapshot carries it, and a replay of that snapshot still says so
    snap = gpuguard("snapshot", *host_args, env=env)
    assert json.loads(snap.stdout)["nvml"]["fake_library"] == str(library)
    (tmp_path / "snap.json").write_text(snap.stdout)
    replay = gpuguard("check", "--input", str(tmp_path / "snap.json"))
    assert note in replay.stdout.splitlines(), replay.stdout


def test_a_replay_of_the_real_h200_has_no_such_note():
    table = gpuguard("check", "--input", str(H200_RECORDING))
    assert table.returncode == 0, table.stdout + table.stderr
    assert "fake" not in table.stdout and "note:" not in table.stdout
    doc = json.loads(gpuguard("check", "--input", str(H200_RECORDING), "--format", "json").stdout)
    assert "notes" not in doc and doc["results"]
