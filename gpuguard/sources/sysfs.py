"""sysfs source: PCIe AER counters of each GPU and of the bridges above it.

A bad riser or retimer shows its errors on the bridge, not on the GPU, so the chain is
walked from the GPU up to the root port through the device's real sysfs path
(/sys/devices/pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3b:00.0).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuguard.model.pci import normalise_pci
from gpuguard.model.snapshot import Reading

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
AER_KINDS = ("correctable", "fatal", "nonfatal")
EFI_SECURE_BOOT = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


class AerFormatError(ValueError):
    pass


def parse_aer(text: str, origin: str) -> dict[str, int]:
    """`NAME count` lines, the last a TOTAL_ERR_* line; only non-zero names are kept."""
    counts: dict[str, int] = {}
    total: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise AerFormatError(f"{origin}:{number}: expected `NAME count`, got {line!r}")
        name, value = parts[0], int(parts[1])
        if name.startswith("TOTAL_ERR"):
            total = value
        elif value:
            counts[name] = value
    if total is None:
        raise AerFormatError(f"{origin}: no TOTAL_ERR_* line (truncated?)")
    counts["TOTAL"] = total
    return counts


def aer_chain(sysfs: Path, pci_bus_id: str) -> Reading[list[dict[str, Any]]]:
    address = normalise_pci(pci_bus_id)
    device = sysfs / "bus" / "pci" / "devices" / address
    if not device.exists():
        return Reading.failed(f"{device} does not exist")
    real = device.resolve()
    chain = [p for p in (real, *real.parents) if PCI_ADDRESS.match(p.name)]
    entries: list[dict[str, Any]] = []
    for position, node in enumerate(chain):
        role = "gpu" if position == 0 else "root_port" if position == len(chain) - 1 else "bridge"
        entry: dict[str, Any] = {"address": node.name, "role": role}
        for kind in AER_KINDS:
            path = node / f"aer_dev_{kind}"
            try:
                entry[kind] = parse_aer(path.read_text(), str(path))
            except FileNotFoundError:
                continue
            except AerFormatError as exc:
                return Reading.failed(str(exc))
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                return Reading.failed(f"cannot read {path}: {reason}")
        if len(entry) > 2:
            entries.append(entry)
    if not entries:
        return Reading.not_supported(f"no AER counters in sysfs for {address} or the bridges "
                                     "above it (VMs and some kernels hide them)")
    return Reading.ok(entries)


def secure_boot(sysfs: Path) -> Reading[bool]:
    path = sysfs / EFI_SECURE_BOOT
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Reading.not_supported("no EFI SecureBoot variable (legacy boot or efivars hidden)")
    except OSError as exc:
        return Reading.failed(f"cannot read {path}: {exc.strerror or exc}")
    # 4 bytes of attributes, then the value.
    return Reading.ok(len(raw) >= 5 and raw[4] == 1)
