import json

import pytest

from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources import replay
from tests.conftest import FIXTURES, H200_XML


def test_round_trip_keeps_every_reading_state(h200):
    h200.gpus[0].temperature_c = Reading.failed("GPU is lost")
    h200.gpus[0].__post_init__()
    again = Snapshot.from_json(json.loads(json.dumps(h200.to_json())))
    assert again == h200
    gpu = again.gpus[0]
    assert gpu.retired_pages_pending.state == "not_supported"
    assert gpu.temperature_c.error == "GPU is lost"
    assert gpu.temperature_c.name == "temperature_c"


def test_detects_format(tmp_path, h200):
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(h200.to_json()))
    assert replay.load(path).gpus[0].uuid == h200.gpus[0].uuid
    assert replay.load(H200_XML).host.source == "nvidia-smi-xml"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"kind": "gpuguard-snapshot", "schema": 1,\n "gpus": [}', "snap.json:2:11: invalid JSON"),
        ('{"kind": "other"}', "not a gpuguard snapshot"),
        ('{"kind": "gpuguard-snapshot", "schema": 99}', "schema 99 is not supported"),
        ('{"kind": "gpuguard-snapshot", "schema": 1, "gpus": [{"index": 0, "temp": 3}]}',
         "unknown GpuSnapshot fields: temp"),
        ("Timestamp : Mon Nov 30", "neither a gpuguard snapshot"),
    ],
)
def test_bad_input_names_the_file(tmp_path, content, words):
    path = tmp_path / "snap.json"
    path.write_text(content)
    with pytest.raises(replay.InputError, match=words):
        replay.load(path)


def test_binary_input(tmp_path):
    path = tmp_path / "core"
    path.write_bytes(b"\x7fELF\xff\xfe")
    with pytest.raises(replay.InputError, match="not a text file"):
        replay.load(path)


def test_text_nvidia_smi_q_is_refused_with_a_hint(tmp_path):
    with pytest.raises(replay.InputError, match="nvidia-smi -q -x"):
        replay.load(FIXTURES / "h200" / "nvidia-smi-q.txt")
