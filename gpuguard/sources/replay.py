"""Replay a recorded host: a gpuguard snapshot (JSON) or an `nvidia-smi -q -x` dump."""

from __future__ import annotations

import json
from pathlib import Path

from gpuguard.io.bounded import MIB, BoundedReadError, read_text
from gpuguard.model.snapshot import Snapshot

# An 8-GPU snapshot is ~200 KiB and an 8-GPU `nvidia-smi -q -x` ~400 KiB.
MAX_INPUT_BYTES = 32 * MIB


class InputError(ValueError):
    pass


def load(path: Path, deadline_s: float = 10.0) -> Snapshot:
    """The snapshot in `path`, read within `deadline_s` (a FIFO with no writer, a device
    such as /dev/zero or an oversized file is an InputError, never a hang)."""
    try:
        text = read_text(path, MAX_INPUT_BYTES, deadline_s)
    except BoundedReadError as exc:
        raise InputError(str(exc)) from exc
    head = text.lstrip()[:1]
    if head == "<":
        # XML's parser only for an XML dump: a live check imports none of it
        from gpuguard.sources import nvidia_smi_xml

        try:
            return nvidia_smi_xml.parse(text, str(path))
        except nvidia_smi_xml.XmlDumpError as exc:
            raise InputError(str(exc)) from exc
    if head != "{":
        raise InputError(f"{path}: neither a gpuguard snapshot (JSON) nor nvidia-smi -q -x XML")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    except RecursionError:  # not a ValueError: `{"a": [[[...` escaped as a traceback
        raise InputError(f"{path}: invalid JSON: nested deeper than a snapshot is "
                         "(Python's parser stops at 1,000 levels)") from None
    try:
        return Snapshot.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: {exc}") from exc
    except RecursionError:
        raise InputError(f"{path}: not a gpuguard snapshot (nested too deep)") from None
