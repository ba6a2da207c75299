"""The daemon's NVML worker: `python -m gpuguard.sources.nvml_worker PROGRESS_FILE PROCFS
[--no-xid-events] [--inforom-every=S]` (S: the daemon's slow interval, 60 s by default).
Reads commands on stdin (`sweep`, `forget`, `quit`), answers each sweep with the JSON lines of
sources/nvml_read.py ended by {"t": "end"}, and writes NVML Xid events as they happen.
`forget` (no answer: the next command's answer is the next line) drops what the worker
keeps between sweeps (InfoROM validity, P2P status), for the daemon to send when it sees a
GPU reset.
The daemon side of this protocol is gpuguard/daemon/sampler.py."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuguard.sources.nvml_inforom import InforomValidity
from gpuguard.sources.nvml_p2p_kept import P2PKept
from gpuguard.sources.nvml_progress import Progress
from gpuguard.sources.nvml_read import line_writer, sweep, text
from gpuguard.sources.pynvml_import import import_pynvml


def serve(commands: Any, out: Any, progress_path: str, procfs: str,
          xid_events: bool = True, inforom_every_s: float = 60.0,
          sysfs: str | None = None) -> None:
    """Answer `sweep` lines with the same JSON lines as the forked worker, ended by
    {"t": "end"}; keep NVML initialised between sweeps; retry nvmlInit while it fails
    (the driver may be loaded later). With xid_events, a thread waits for NVML Xid
    events and writes them as {"t": "xid_event", ...} lines as they happen."""
    progress = Progress(progress_path)
    progress.set(0, "import pynvml")
    pynvml = import_pynvml()  # without ctypes.util (pynvml_import.py)

    emit = line_writer(out)
    # each board's InfoROM validated at most once per slow interval (nvml_inforom.py)
    inforom = InforomValidity(inforom_every_s)
    # each pair's P2P status while its wiring holds, a slow interval at most (nvml_p2p_kept.py)
    p2p = P2PKept(inforom_every_s)
    initialised = False
    for command in commands:
        command = command.strip()
        if command == "quit":
            break
        if command == "forget":
            inforom, p2p = InforomValidity(inforom_every_s), P2PKept(inforom_every_s)
            continue
        if command != "sweep":
            emit({"t": "fatal", "kind": "BadCommand", "error": command[:80]})
            emit({"t": "end"})
            continue
        if not initialised:
            progress.set(0, "nvmlInit")
            try:
                pynvml.nvmlInit()
                initialised = True
                p2p.forget()  # handles and pairs of an earlier NVML are not this one's
            except pynvml.NVMLError as exc:
                emit({"t": "init_error", "kind": type(exc).__name__, "error": str(exc)})
            progress.set(0, "")
            if initialised and xid_events:
                threading.Thread(target=_xid_events, args=(pynvml, emit), daemon=True).start()
        if initialised:
            try:
                sweep(pynvml, emit, progress, procfs, inforom=inforom, p2p_kept=p2p,
                      sysfs=sysfs)
                emit({"t": "done"})
            except Exception as exc:
                emit({"t": "fatal", "kind": type(exc).__name__, "error": str(exc)})
        emit({"t": "end"})
    if initialised:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _xid_events(nv: Any, emit: Callable[[dict[str, Any]], None]) -> None:
    """Xids as the driver raises them (nvmlEventSetWait), beside the kernel log."""
    try:
        event_set = nv.nvmlEventSetCreate()
        for index in range(nv.nvmlDeviceGetCount()):
            # a GPU whose handle NVML cannot give (gpu.lost says so) takes no other GPU's
            # events with it
            with contextlib.suppress(nv.NVMLError):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
    except (nv.NVMLError, AttributeError) as exc:
        emit({"t": "xid_events_unavailable", "error": f"{type(exc).__name__}: {exc}"})
        return
    while True:
        try:
            data = nv.nvmlEventSetWait(event_set, 5000)
        except nv.NVMLError_Timeout:
            continue
        except nv.NVMLError as exc:
            emit({"t": "xid_events_unavailable", "error": f"{type(exc).__name__}: {exc}"})
            return
        try:
            pci = text(nv.nvmlDeviceGetPciInfo(data.device).busId)
        except nv.NVMLError:
            pci = None
        emit({"t": "xid_event", "xid": int(data.eventData), "pci": pci, "time": time.time()})


def main() -> None:
    progress, procfs = sys.argv[1], sys.argv[2]
    every = next((float(a.split("=", 1)[1]) for a in sys.argv[3:]
                  if a.startswith("--inforom-every=")), 60.0)
    # where it reads the PCI bus for the by-PCI lookups (nvml_bus.py); none: no lookups
    sysfs = next((a.split("=", 1)[1] for a in sys.argv[3:] if a.startswith("--sysfs=")), None)
    serve(sys.stdin, sys.stdout, progress, procfs, xid_events="--no-xid-events" not in sys.argv,
          inforom_every_s=every, sysfs=sysfs)


if __name__ == "__main__":
    main()
