"""nvmlDeviceValidateInforom at most once a slow interval in the daemon's worker, every run
in `check` (issue 32): the kept answer expires on the monotonic clock, a failed
validation is never kept, and gpu.inforom's verdict is the same either way."""

from __future__ import annotations

from gpuguard.sources.nvml_inforom import InforomValidity


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_board_is_validated_once_per_interval_by_its_uuid() -> None:
    clock = Clock()
    kept = InforomValidity(60.0, clock)
    answers = iter([True, False, True])
    assert kept.read("GPU-a", lambda: next(answers)) is True
    clock.now += 59.0
    assert kept.read("GPU-a", lambda: 1 / 0) is True  # kept: NVML not asked
    assert kept.read("GPU-b", lambda: next(answers)) is False  # another board: asked
    clock.now += 1.0
    assert kept.read("GPU-a", lambda: next(answers)) is True  # 60 s old: asked again
    assert kept.validations == 3


def test_a_failed_validation_or_an_unknown_board_is_asked_every_time() -> None:
    clock = Clock()
    kept = InforomValidity(60.0, clock)
    error = {"state": "error", "error": "nvmlDeviceValidateInforom: Unknown Error"}
    assert kept.read("GPU-a", lambda: error) == error
    assert kept.read("GPU-a", lambda: True) is True
    no_uuid = {"state": "error", "error": "nvmlDeviceGetUUID: GPU is lost"}
    for _ in range(3):
        kept.read(no_uuid, lambda: True)
    assert kept.validations == 5
    clock.now -= 1000.0  # a clock that went back (never the monotonic one): asked again
    assert kept.read("GPU-a", lambda: False) is False
