"""sources/pci_gpus.py on tests/fixtures/sysfs-pci-gpus (its README): the NVIDIA display
and 3D functions with their drivers; not the audio function, not the NVSwitch bridges."""

from __future__ import annotations

from gpuguard.sources import pci_gpus
from tests.conftest import FIXTURES


def test_the_gpus_on_the_bus_with_their_drivers():
    found = pci_gpus.read(FIXTURES / "sysfs-pci-gpus").get()
    assert [(g["address"], g["class"], g["driver"]) for g in found] == [
        ("0000:10:00.0", "0x030200", "nvidia"), ("0000:11:00.0", "0x030200", "nvidia"),
        ("0000:12:00.0", "0x030200", "vfio-pci"), ("0000:13:00.0", "0x030000", None)]


def test_a_sysfs_without_a_pci_bus_is_not_supported(tmp_path):
    assert pci_gpus.read(tmp_path).state == "not_supported"


def test_a_gpu_of_the_display_controller_class_0380_is_a_gpu():
    """Class 0x0380 ("Display controller"; tests/fixtures/sysfs-pci-display/README.md)."""
    found = pci_gpus.read(FIXTURES / "sysfs-pci-display").get()
    assert [(g["address"], g["class"], g["device"]) for g in found] == [
        ("0000:10:00.0", "0x030200", "0x2335"), ("0000:11:00.0", "0x038000", "0x2bb1")]
