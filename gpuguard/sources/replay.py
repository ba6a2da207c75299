"""Replay a recorded host: a gpuguard snapshot (JSON) or an `nvidia-smi -q -x` dump."""

from __future__ import annotations

import json
from pathlib import Path

from gpuguard.snapshot import Snapshot
from gpuguard.sources import nvidia_smi_xml


class InputError(ValueError):
    pass


def load(path: Path) -> Snapshot:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    head = text.lstrip()[:1]
    if head == "<":
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
    try:
        return Snapshot.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: {exc}") from exc
