"""PCI addresses as gpuguard compares them: one spelling for NVML's, the kernel log's and
sysfs's forms of the same address."""

from __future__ import annotations


def normalise_pci(address: str) -> str:
    """`0000:3b:00`, `00000000:3B:00.0` and `0000:3b:00.0` all become `0000:3b:00.0`."""
    parts = address.lower().split(":")
    domain, bus, rest = parts[-3], parts[-2], parts[-1]
    device, _, function = rest.partition(".")
    return f"{int(domain, 16):04x}:{bus}:{device}.{function or '0'}"



def nvml_pci(address: str) -> str:
    """The address as NVML spells it (`00000000:3B:00.0`): the label of a GPU NVML does not
    list any more matches the series it had while it did."""
    short = normalise_pci(address)
    domain, bus, rest = short.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"
