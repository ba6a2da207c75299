"""Reading NVML, the multi-GPU part (issue 11): NVLink links, the GPU fabric, peer-to-peer
status. Runs only inside the NVML worker, through the same `read` wrapper as the rest of
sources/nvml_read.py: the progress board names every call (with its GPU, link or peer), an
NVML error becomes an error reading and NotSupported a not_supported one.

Each call here is passed exactly as the C function takes it: nvidia-ml-py hands its
arguments to ctypes unconverted, so a struct must go by reference with its version set
(nvmlDeviceGetGpuFabricInfoV crashed a process given an unversioned one) and an enum must
be a plain number (NVML_P2P_CAPS_INDEX_READ is the tuple `(0,)` in nvidia-ml-py 12 and
13: a stray comma, which ctypes refuses with an ArgumentError).
"""

from __future__ import annotations

import ctypes

from gpuguard.sources.nvml_p2p_kept import SweepPairs

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Read = Callable[..., Any]

NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
                   ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                   ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
                   ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3))

FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # 0: not supported

P2P_CAPS = (("read", "NVML_P2P_CAPS_INDEX_READ", 0),
            ("write", "NVML_P2P_CAPS_INDEX_WRITE", 1),
            ("nvlink", "NVML_P2P_CAPS_INDEX_NVLINK", 2),
            ("atomics", "NVML_P2P_CAPS_INDEX_ATOMICS", 3))

P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported",
              3: "topology_not_supported", 4: "disabled_by_regkey", 5: "not_supported",
              6: "unknown"}

# Links nvidia-ml-py 11 knew of; newer ones say 36 (NVML_NVLINK_MAX_LINKS).
_DEFAULT_MAX_LINKS = 18


def constant(nv: Any, name: str, fallback: int) -> int:
    """An NVML enum value as a plain int (see the module's note on stray tuples)."""
    value = getattr(nv, name, fallback)
    if isinstance(value, tuple):
        value = value[0]
    return int(value)


def _failed(value: Any) -> bool:
    return isinstance(value, dict) and value.get("state") == "error"


def _not_supported(value: Any) -> bool:
    return isinstance(value, dict) and value.get("state") == "not_supported"


def nvlink_links(nv: Any, h: Any, read: Read, where: str, counters: bool = True) -> Any:
    """One entry per NVLink: {"link", "up", "version", "remote_pci", and the four DL error
    counters}. Not supported when the first link answers NotSupported (a GPU without
    NVLink, e.g. PCIe); the scan stops at the first link that answers NotSupported or
    InvalidArgument (past the GPU's last link). An error on a link that is up makes the
    whole reading an error naming the call (never a silent None); on a link that is down
    its details may be missing (None): the link is reported down either way."""
    class PastLastLink(Exception):
        pass

    links: list[dict[str, Any]] = []
    for link in range(constant(nv, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS)):
        at = f"{where[:-1]}, link {link})" if where.endswith(")") else f"{where} link {link}"

        def state(link: int = link) -> Any:
            try:
                return nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError_InvalidArgument:
                return PastLastLink

        active = read("nvmlDeviceGetNvLinkState", state, at)
        if active is PastLastLink or _not_supported(active):
            if link == 0:
                return {"state": "not_supported",
                        "error": "nvmlDeviceGetNvLinkState: this GPU has no NVLink"}
            break
        if _failed(active):
            return active
        up = int(active) == constant(nv, "NVML_FEATURE_ENABLED", 1)
        try:
            links.append(_link(nv, h, read, link, up, at, counters))
        except _LinkError as exc:
            return exc.reading
    return links


def _link(nv: Any, h: Any, read: Read, link: int, up: bool, at: str,
          counters: bool) -> dict[str, Any]:
    def detail(call: str, fn: Callable[[], Any]) -> Any:
        value = read(call, fn, at)
        if _failed(value):
            if up:
                raise _LinkError(value)
            return None
        return None if _not_supported(value) else value

    def version() -> int:
        return int(nv.nvmlDeviceGetNvLinkVersion(h, link))

    def remote_pci() -> str:
        return _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)

    def counter(which: int) -> Callable[[], int]:
        return lambda: int(nv.nvmlDeviceGetNvLinkErrorCounter(h, link, which))

    entry: dict[str, Any] = {"link": link, "up": up}
    entry["version"] = detail("nvmlDeviceGetNvLinkVersion", version)
    entry["remote_pci"] = detail("nvmlDeviceGetNvLinkRemotePciInfo", remote_pci)
    for name, const, fallback in NVLINK_COUNTERS:
        entry[name] = detail("nvmlDeviceGetNvLinkErrorCounter",
                             counter(constant(nv, const, fallback))) if counters else None
    return entry


class _LinkError(Exception):
    def __init__(self, reading: dict[str, Any]) -> None:
        super().__init__(reading.get("error"))
        self.reading = reading


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fabric(nv: Any, h: Any, read: Read, where: str) -> dict[str, Any]:
    """fabric_state, fabric_status and fabric_clique_id from nvmlDeviceGetGpuFabricInfoV
    (a v2 struct, by reference, version set), or nvmlDeviceGetGpuFabricInfo on drivers or
    bindings without it. Status and clique are valid only once the state is completed."""
    def versioned() -> Any:
        struct = getattr(nv, "c_nvmlGpuFabricInfo_v2_t", None)
        if struct is None or not hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
            return None
        info = struct()
        # Set here, not left to the binding: some nvidia-ml-py releases declare the struct
        # without setting it, and the driver then reads a wrong size.
        info.version = (2 << 24) | ctypes.sizeof(info)
        try:
            nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        except nv.NVMLError_FunctionNotFound:
            return None
        return info

    def unversioned() -> Any:
        info = nv.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        return info

    info = read("nvmlDeviceGetGpuFabricInfoV", versioned, where)
    if info is None:
        info = read("nvmlDeviceGetGpuFabricInfo", unversioned, where)
    if isinstance(info, dict):  # an error or not supported: the same for all three
        return {"fabric_state": info, "fabric_status": info, "fabric_clique_id": info}
    state = int(info.state)
    if state == 0:
        none = {"state": "not_supported", "error": "NVML: no GPU fabric on this GPU"}
        return {"fabric_state": none, "fabric_status": none, "fabric_clique_id": none}
    if state not in FABRIC_STATES:
        bad = {"state": "error", "error": f"nvmlDeviceGetGpuFabricInfo: unknown state {state}"}
        return {"fabric_state": bad, "fabric_status": bad, "fabric_clique_id": bad}
    out: dict[str, Any] = {"fabric_state": FABRIC_STATES[state]}
    if FABRIC_STATES[state] != "completed":
        pending = {"state": "not_supported",
                   "error": "valid only once the fabric state is completed"}
        out["fabric_status"] = pending
        out["fabric_clique_id"] = pending
        return out
    status = int(info.status)
    out["fabric_status"] = "Success" if status == 0 else _error_text(nv, status)
    out["fabric_clique_id"] = int(info.cliqueId)
    return out


def _error_text(nv: Any, code: int) -> str:
    try:
        return str(nv.NVMLError(code))
    except Exception:  # the binding's own lookup failed: the number still says it
        return f"NVML error {code}"


class PeerHandles:
    """The GPUs' handles for one sweep, each asked of NVML once and shared by the per-GPU
    threads' p2p_status (it asked every peer's handle again: N-1 calls a GPU, N(N-1) a
    sweep). Two threads may both ask for a handle not yet kept (the same answer twice);
    a failed ask is not kept, so each GPU that needs it asks and reads its own error, as
    before."""

    def __init__(self) -> None:
        self._kept: dict[int, Any] = {}

    def keep(self, index: int, handle: Any) -> None:
        """A handle its own GPU's thread got (it asks for it first thing)."""
        self._kept[index] = handle

    def get(self, nv: Any, read: Read, peer: int, at: str) -> Any:
        kept = self._kept.get(peer)
        if kept is not None:
            return kept
        handle = read("nvmlDeviceGetHandleByIndex",
                      lambda: nv.nvmlDeviceGetHandleByIndex(peer), at)
        if not _failed(handle) and not _not_supported(handle):
            self._kept[peer] = handle  # one dict store: atomic under the GIL
        return handle


def p2p_status(nv: Any, h: Any, read: Read, index: int, count: int,
               handles: PeerHandles | None = None, kept: SweepPairs | None = None) -> Any:
    """Read, write, NVLink and atomics peer status with every other GPU. An error on any
    call makes the whole reading an error naming the call and the pair. `handles`: the
    sweep's shared peer handles (else this call asks each peer's); `kept`: the daemon's
    worker's pairs kept between sweeps (sources/nvml_p2p_kept.py)."""
    handles = handles if handles is not None else PeerHandles()
    peers: list[dict[str, Any]] = []
    for peer in range(count):
        if peer == index:
            continue
        pair = kept.pair(index, peer) if kept is not None else None
        known = pair.entry() if pair is not None else None
        if known is not None:
            peers.append(known)
            continue
        other = handles.get(nv, read, peer, f" (GPU {index}, peer GPU {peer})")
        if _failed(other):
            return other
        if _not_supported(other):
            # no handle of the peer (NVML answered "not supported" for it): no status of
            # the pair, rather than the answer handed to NVML as a handle
            peers.append({"peer": peer, **{name: "not_supported" for name, _, _ in P2P_CAPS}})
            continue
        entry: dict[str, Any] = {"peer": peer}
        for name, const, fallback in P2P_CAPS:
            cap = ctypes.c_uint(constant(nv, const, fallback))
            value = read("nvmlDeviceGetP2PStatus",
                         lambda other=other, cap=cap: int(nv.nvmlDeviceGetP2PStatus(h, other, cap)),
                         f" (GPU {index}, peer GPU {peer}, {name})")
            if _failed(value):
                return value
            entry[name] = "not_supported" if _not_supported(value) \
                else P2P_STATUS.get(value, "unknown")
        if pair is not None:
            pair.keep(entry)
        peers.append(entry)
    return peers


def field_value(nv: Any, h: Any, name: str) -> int:
    """One integer NVML field (nvmlDeviceGetFieldValues), by the binding's constant name;
    NotSupported where the binding or the GPU lacks it."""
    field_id = getattr(nv, name, None)
    if field_id is None:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    value = nv.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if value.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(value.nvmlReturn)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
              6: "usVal"}.get(int(value.valueType), "uiVal")
    return int(getattr(value.value, member))
