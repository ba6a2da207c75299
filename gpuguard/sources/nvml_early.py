"""The InfoROM validated from the first moment of a one-shot NVML worker (issue 32).

Why: on an H200 one nvmlDeviceValidateInforom takes 70 ms, most of `gpuguard check`'s
sweep, and `nvidia-smi -q` does not validate at all. gpu.inforom must still judge every
`check`, so the worker starts the validation before anything else, in a process of its
own forked first thing (forked.fork: it dies with the worker): it loads libnvidia-ml
through ctypes alone (no pynvml: its import is the next 10-30 ms), calls nvmlInit_v2
and validates each GPU's InfoROM in a thread of its own, writing "index code" lines to
a pipe, while the worker imports pynvml and sweeps the other readings. When the sweep
comes to the validation it takes the early return code, waiting for it if it is not in
yet, and raises the same pynvml error the direct call would: the readings are the same.

A process and not a thread: a validation that crashes (a driver bug) takes only the
early process with it; the sweep then validates directly, so the worker dies at the
same call, named, after the GPUs that answered, as it did before. Each early
validation names itself on the progress board (a slot after the sweep's), so one that
hangs is named too. If the early path cannot run (no library, an init error, no
handle), the sweep validates directly as well.

With `keep` (`gpuguard check`'s --state-dir, kernel log and boot id file), a validation
that passed is kept per boot and reused while nothing says it may have changed
(sources/nvml_inforom_kept.py): then the early process asks NVML only the GPU's UUID
and InfoROM image version, and the device is not held for 68 ms.
"""

from __future__ import annotations

import ctypes
import os
import threading

from gpuguard.io import forked
from gpuguard.sources.nvml_progress import GPU_SLOTS, Progress

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuguard.sources.nvml_inforom_kept import KeptInforom

EARLY_SLOT = 1 + GPU_SLOTS  # GPU i's early validation writes slot EARLY_SLOT + i


class EarlyInforom:
    """Starts validating every GPU's InfoROM on creation (call it while the worker has
    one thread: it forks); `code(index)` is GPU index's NVML return code (0: valid), or
    None when the early path has none for it."""

    def __init__(self, progress: Progress, library: str = "libnvidia-ml.so.1",
                 keep: tuple[str, str, str] | None = None) -> None:
        read_fd, write_fd = os.pipe()

        def body() -> None:
            os.close(read_fd)
            validate_all(progress, library, write_fd, keep)

        self.pid = forked.fork(body)
        os.close(write_fd)
        self._codes: dict[int, int] = {}
        self._changed = threading.Condition()
        self._ended = False
        threading.Thread(target=self._collect, args=(read_fd,), daemon=True).start()

    def _collect(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as lines:
            for line in lines:
                try:
                    index, code = (int(word) for word in line.split())
                except ValueError:
                    continue
                with self._changed:
                    self._codes[index] = code
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()
        forked.reaped(self.pid)

    def code(self, index: int | None) -> int | None:
        if index is None:
            return None
        with self._changed:  # the parent's deadline bounds the worker, not this wait
            self._changed.wait_for(lambda: index in self._codes or self._ended)
            return self._codes.get(index)


def validate_all(progress: Progress, library: str, out: int,
                 keep: tuple[str, str, str] | None = None) -> None:
    """In the early process: every GPU's validation, one thread each, one line each."""
    kept = None
    if keep is not None:
        from gpuguard.sources.nvml_inforom_kept import KeptInforom

        kept = KeptInforom(*keep)
        kept.start()  # the file and the kernel log are read beside nvmlInit
    try:
        lib = ctypes.CDLL(library)
        count = ctypes.c_uint()
        if lib.nvmlInit_v2() != 0 or lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return  # the sweep's own calls report it
    except (OSError, AttributeError):
        return  # no such library, or one without these symbols: validate directly
    if kept is not None and keep is not None and is_fake_in_host_state(lib, keep[0]):
        kept = None
    driver = ""
    if kept is not None:
        progress.set(EARLY_SLOT, "nvmlSystemGetDriverVersion (InfoROM kept)")
        driver = text_of(lambda buf, size: lib.nvmlSystemGetDriverVersion(buf, size))
        progress.set(EARLY_SLOT, "")
    threads = [threading.Thread(target=validate_one,
                                args=(lib, progress, index, out, kept, driver))
               for index in range(count.value)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def validate_one(lib: Any, progress: Progress, index: int, out: int,
                 kept: KeptInforom | None = None, driver: str = "") -> None:
    slot, where = EARLY_SLOT + index, f" (GPU {index})"
    handle = ctypes.c_void_p()
    progress.set(slot, "nvmlDeviceGetHandleByIndex" + where)
    if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0:
        uuid = image = ""
        if kept is not None:
            progress.set(slot, "nvmlDeviceGetUUID" + where)
            uuid = text_of(lambda buf, size: lib.nvmlDeviceGetUUID(handle, buf, size))
            progress.set(slot, "nvmlDeviceGetInforomImageVersion" + where)
            image = text_of(
                lambda buf, size: lib.nvmlDeviceGetInforomImageVersion(handle, buf, size))
        if kept is not None and kept.valid(uuid, image, driver):
            code = 0
        else:
            progress.set(slot, "nvmlDeviceValidateInforom" + where)
            code = int(lib.nvmlDeviceValidateInforom(handle))
            if kept is not None:  # saved before the code goes out: the worker may exit
                kept.learnt(uuid, image, driver, code)  # at once, and this process with it
                kept.save()
        os.write(out, f"{index} {code}\n".encode())  # one write: lines never interleave
    progress.set(slot, "")


def is_fake_in_host_state(lib: Any, state_dir: str) -> bool:
    """The tests' fake NVML (nvml_fake.py's marker) with the host's own state dir: a
    README reader's fake run keeps nothing in /var/lib/gpuguard (its GPUs are not this
    host's); with a --state-dir of their own the tests keep as a host would."""
    from gpuguard.io.guard import HOST_DEFAULTS
    from gpuguard.sources.nvml_fake import marker_of

    return (os.path.normpath(state_dir) == HOST_DEFAULTS["state"][0]
            and marker_of(lib) is not None)


def text_of(call: Any, size: int = 96) -> str:
    """An NVML string out-parameter's text, or "" when the call fails."""
    buf = ctypes.create_string_buffer(size)
    if call(buf, ctypes.c_uint(size)) != 0:
        return ""
    return buf.value.decode("ascii", errors="replace")


class WithEarlyInforom:
    """pynvml as the sweep sees it, except that nvmlDeviceValidateInforom answers from
    the early validation (the handle's GPU index is learnt from the sweep's own
    nvmlDeviceGetHandleByIndex: handles of two processes cannot be compared)."""

    def __init__(self, nv: Any, early: EarlyInforom) -> None:
        self._nv = nv
        self._early = early
        self._index_of: dict[int | None, int] = {}  # a handle's address -> its index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nv, name)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        self._index_of[address(handle)] = index
        return handle

    def nvmlDeviceValidateInforom(self, handle: Any) -> None:
        code = self._early.code(self._index_of.get(address(handle)))
        if code is None:
            self._nv.nvmlDeviceValidateInforom(handle)
        elif code != 0:
            raise self._nv.NVMLError(code)


def address(handle: Any) -> int | None:
    """The device handle's pointer value (the key of its GPU index)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
