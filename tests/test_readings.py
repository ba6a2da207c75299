"""Each reading is declared once: its field names its validator (gpuguard/model/snapshot.py),
and any reading set on a snapshot is checked there, with no call to remember."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.model.snapshot import GpuSnapshot, HostInfo, Reading


@pytest.mark.parametrize("cls", [GpuSnapshot, HostInfo])
def test_every_reading_field_declares_what_is_valid(cls):
    fields = [f for f in dataclasses.fields(cls) if f.name not in
              ("index", "hostname", "collected_at", "source")]
    assert fields
    undeclared = [f.name for f in fields if not callable(f.metadata.get("valid"))]
    assert undeclared == []


def test_a_wrong_value_set_anywhere_becomes_an_error_reading():
    gpu = GpuSnapshot(index=0)
    gpu.temperature_c = Reading.ok("hot")  # no __post_init__() to remember
    assert gpu.temperature_c.state == "error"
    assert "invalid temperature_c" in (gpu.temperature_c.error or "")
    gpu.temperature_c = Reading.ok(41)
    assert gpu.temperature_c.get() == 41 and gpu.temperature_c.name == "temperature_c"
    host = HostInfo()
    host.gpu_count = Reading.ok(-1)
    assert host.gpu_count.state == "error" and "outside" in (host.gpu_count.error or "")
    # built with a bad value: the same
    assert GpuSnapshot(index=1, pcie_link_width_current=Reading.ok(True)) \
        .pcie_link_width_current.state == "error"


def test_a_reading_moved_to_another_field_is_checked_for_it_and_keeps_its_owner():
    shared = Reading.ok(200)
    gpu = GpuSnapshot(index=0, temperature_c=shared)
    gpu.utilization_gpu_percent = shared  # 200 is a temperature, not a percentage
    assert gpu.temperature_c.get() == 200 and gpu.temperature_c.name == "temperature_c"
    assert gpu.utilization_gpu_percent.state == "error"
