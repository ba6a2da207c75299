"""The burn: qgemm launches back to back for the level's time, two result buffers so the
GPU computes one launch while the host checks the last, every result compared bit for bit
(the exact kind against the CPU's reference, the random kind across SMs), and the first
mismatch located: the same tile re-run on every SM at once says which SMs get it wrong.

Why re-run on every SM and not only the suspect: a tile wrong on one SM and right on the
others is that SM (critical); a tile wrong everywhere is gpuguard's own kernel or
reference (unknown: a bug of ours must never send a good GPU to RMA); a tile right
everywhere on the re-run was a one-off (warning: run again)."""

from __future__ import annotations

import random
import struct
import time
from array import array
from dataclasses import dataclass

from gpuguard.sources.qualify import kernels as k

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from gpuguard.sources.qualify.plan import QualifyOptions

    class Worker(Protocol):
        """What the burn uses of its GPU's worker (child.Worker)."""

        @property
        def c(self) -> Any: ...
        @property
        def cu(self) -> Any: ...
        @property
        def opts(self) -> QualifyOptions: ...
        @property
        def sms(self) -> int: ...

        def alloc(self, size: int, allow_oom: bool = False) -> int: ...
        def free(self, ptr: int) -> None: ...
        def pinned(self, size: int) -> int: ...
        def event(self) -> Any: ...
        def launch(self, name: str, blocks: int, threads: int, *args: Any) -> None: ...
        def to_host(self, host: int, device: int, size: int, sync: bool = True) -> None: ...
        def to_device(self, device: int, data: bytes) -> None: ...
        def emit(self, msg: dict[str, Any]) -> None: ...

EXACT, RANDOM = "exact", "random"
MAX_EXAMPLES = 8
CALIBRATION_ITERS = 64
LOCATE_TRIES = 3


@dataclass
class Suspect:
    kind: str
    tile: int
    sm: int


class Burn:
    def __init__(self, worker: Worker) -> None:
        self.w = worker
        c = worker.c
        self.c = c
        rng = random.Random(worker.opts.seed)
        self.exact = k.ExactInputs(rng)
        inputs = {EXACT: self.exact.buffer, RANDOM: k.random_inputs(rng)}
        self.inputs = {kind: worker.alloc(len(data)) for kind, data in inputs.items()}
        for kind, data in inputs.items():
            worker.to_device(self.inputs[kind], data)
        self.blocks = worker.sms * worker.opts.blocks_per_sm
        out_bytes = self.blocks * k.BLOCK_OUT_BYTES
        self.out = [worker.alloc(out_bytes) for _ in range(2)]
        self.sm = [worker.alloc(self.blocks * 8) for _ in range(2)]
        self.host_out = [worker.pinned(out_bytes) for _ in range(2)]
        self.host_sm = [worker.pinned(self.blocks * 8) for _ in range(2)]
        self.done = [worker.event() for _ in range(2)]
        self.start, self.stop = worker.event(), worker.event()
        self.flip = k.NO_VALUE if worker.opts.flip_sm is None else worker.opts.flip_sm
        self.iters = 1
        self.expected: list[bytes] = []
        self.whole: tuple[tuple[int, int], bytes] = ((0, 0), b"")
        self.suspect: Suspect | None = None
        self.reference: dict[int, bytes] = {}   # random kind: the majority result per tile
        self.stats = {"tiles_computed": 0, "tiles_compared": 0, "moved_blocks": 0,
                      "mismatches": 0, "launches": 0}
        self.examples: list[dict[str, Any]] = []

    def close(self) -> None:
        for ptr in self.out + self.sm + list(self.inputs.values()):
            self.w.free(ptr)

    def enqueue(self, slot: int, kind: str, blocks: int, tile: int = k.NO_VALUE) -> None:
        c = self.c
        self.w.launch("qgemm", blocks, k.THREADS, c.c_uint64(self.inputs[kind]),
                      c.c_uint64(self.out[slot]), c.c_uint64(self.sm[slot]),
                      c.c_uint32(k.SETS), c.c_uint32(self.iters), c.c_uint32(tile),
                      c.c_uint32(self.flip))
        self.w.to_host(self.host_out[slot], self.out[slot], blocks * k.BLOCK_OUT_BYTES,
                       sync=False)
        self.w.to_host(self.host_sm[slot], self.sm[slot], blocks * 8, sync=False)
        self.w.cu.call("cuEventRecord", self.done[slot], None)

    def wait(self, slot: int, blocks: int) -> tuple[memoryview, array[int]]:
        self.w.cu.call("cuEventSynchronize", self.done[slot])
        # the pinned buffer itself, not a copy: the next launch copies into the other one
        data = memoryview((self.c.c_char * (blocks * k.BLOCK_OUT_BYTES)).from_address(
            self.host_out[slot])).cast("B")
        sms = array("I")
        sms.frombytes(self.c.string_at(self.host_sm[slot], blocks * 8))
        return data, sms

    def calibrate(self) -> None:
        """Steps per launch for a slice of `slice_s`: a short launch timed by events, then
        one of the steps it suggests, whose time sets the steps (the first includes the
        launch's fixed cost). Their results are checked too."""
        self.iters = CALIBRATION_ITERS
        for _ in range(2):
            seconds = self.timed_launch()
            self.iters = k.iters_for(seconds / self.iters, self.w.opts.slice_s)
        self.expected = self.exact.expected(self.iters)

    def timed_launch(self) -> float:
        cu = self.w.cu
        self.expected = self.exact.expected(self.iters)
        cu.call("cuEventRecord", self.start, None)
        self.enqueue(0, EXACT, self.blocks)
        cu.call("cuEventRecord", self.stop, None)
        self.check(EXACT, *self.wait(0, self.blocks))
        cu.call("cuEventSynchronize", self.stop)
        ms = self.c.c_float()
        cu.call("cuEventElapsedTime", self.c.byref(ms), self.start, self.stop)
        return max(float(ms.value), 1e-3) / 1e3

    def run(self) -> dict[str, Any]:
        self.calibrate()
        began = time.monotonic()
        self.w.emit({"t": "load", "mono": began})
        end = began + self.w.opts.burn_s
        pending: tuple[int, str] | None = None
        launch = 0
        while True:
            queued = None
            if time.monotonic() < end:
                kind = EXACT if launch % 2 == 0 else RANDOM
                self.enqueue(launch % 2, kind, self.blocks)
                queued = (launch % 2, kind)
                launch += 1
            if pending is not None:
                self.check(pending[1], *self.wait(pending[0], self.blocks))
            if queued is None:
                break
            pending = queued
        seconds = time.monotonic() - began
        self.w.emit({"t": "unload", "mono": time.monotonic()})
        self.stats["launches"] = launch
        return {**self.stats, "seconds": round(seconds, 3), "sms": self.w.sms,
                "iters": self.iters, "blocks": self.blocks,
                "tflops": round(k.tflops(self.blocks * launch, self.iters, seconds), 1),
                "examples": self.examples}

    def check(self, kind: str, data: memoryview, sms: array[int]) -> None:
        """Every block's results compared: the exact kind with the CPU's reference, the
        random kind with the same tile from another SM; a tile computed on one SM only
        is not counted as compared. Compared as bytes (memcmp): comparing memoryviews
        goes element by element and kept an H200 idle 95 % of the time."""
        n = k.BLOCK_OUT_BYTES
        blocks = len(sms) // 2
        self.stats["tiles_computed"] += blocks
        self.stats["moved_blocks"] += sum(1 for b in range(blocks) if sms[2 * b] != sms[2 * b + 1])
        got = bytes(data)
        if kind == EXACT:
            self.stats["tiles_compared"] += blocks
            if got == self.expected_launch(blocks):
                return
            for block in range(blocks):
                want = self.expected[block % k.SETS]
                if got[block * n:(block + 1) * n] != want:
                    self.wrong(kind, block % k.SETS, sms[2 * block], want,
                               memoryview(got[block * n:(block + 1) * n]))
            return
        for tile in range(min(k.SETS, blocks)):
            first = tile
            other = next((b for b in range(tile, blocks, k.SETS) if sms[2 * b] != sms[2 * first]),
                         None)
            if other is None:
                continue
            refs = {True: got[other * n:(other + 1) * n], False: got[first * n:(first + 1) * n]}
            differs = False
            for block in range(tile, blocks, k.SETS):
                self.stats["tiles_compared"] += 1
                if got[block * n:(block + 1) * n] != refs[sms[2 * block] == sms[2 * first]]:
                    differs = True
            if differs:
                self.random_mismatch(tile, memoryview(got), sms)

    def expected_launch(self, blocks: int) -> bytes:
        """A whole launch's exact results (block b holds tile b % SETS), built once per
        step count: one comparison for the launch when all is well."""
        key = (self.iters, blocks)
        if self.whole[0] != key:
            self.whole = (key, b"".join(self.expected[b % k.SETS] for b in range(blocks)))
        return self.whole[1]

    def random_mismatch(self, tile: int, data: memoryview, sms: array[int]) -> None:
        """Which blocks of this tile are wrong: those outside the majority result."""
        n = k.BLOCK_OUT_BYTES
        groups: dict[bytes, list[int]] = {}
        for block in range(tile, len(sms) // 2, k.SETS):
            groups.setdefault(bytes(data[block * n:(block + 1) * n]), []).append(block)
        majority = max(groups, key=lambda key: len(groups[key]))
        self.reference.setdefault(tile, majority)
        for result, blocks in groups.items():
            if result != majority:
                for block in blocks:
                    self.wrong(RANDOM, tile, sms[2 * block], majority,
                               memoryview(result), count_only=block != blocks[0])

    def wrong(self, kind: str, tile: int, sm: int, expected: bytes | memoryview,
              got: memoryview, count_only: bool = False) -> None:
        self.stats["mismatches"] += 1
        if self.suspect is None:
            self.suspect = Suspect(kind, tile, int(sm))
        if count_only or len(self.examples) >= MAX_EXAMPLES:
            return
        word, want, have = first_difference(expected, got)
        self.examples.append({"kind": kind, "sm": int(sm), "tile": tile, "word": word,
                              "expected": f"{want:#010x}", "got": f"{have:#010x}"})

    def locate(self) -> dict[str, Any]:
        """The suspect's tile on every SM at once (every block computes it)."""
        assert self.suspect is not None
        kind, tile = self.suspect.kind, self.suspect.tile
        for _ in range(LOCATE_TRIES):
            self.enqueue(0, kind, self.blocks, tile=tile)
            data, sms = self.wait(0, self.blocks)
            verdict = self.judge_rerun(kind, tile, data, sms)
            if verdict is not None:
                return verdict
        return {"outcome": "not_reproduced", "sms": [], "tile": tile, "kind": kind,
                "checked_sms": 0, "count": 0, "expected": "", "got": "",
                "note": f"no block of the re-run ran on SM {self.suspect.sm}"}

    def judge_rerun(self, kind: str, tile: int, data: memoryview,
                    sms: array[int]) -> dict[str, Any] | None:
        """Which SMs got the tile wrong in the re-run; None when no block that stayed on
        one SM ran on the suspect's (the re-run is tried again)."""
        n = k.BLOCK_OUT_BYTES
        placed = [(int(sms[2 * b]), bytes(data[b * n:(b + 1) * n]))
                  for b in range(len(sms) // 2) if sms[2 * b] == sms[2 * b + 1]]
        if self.suspect is not None and all(sm != self.suspect.sm for sm, _ in placed):
            return None
        want = self.expected[tile] if kind == EXACT else majority(placed)
        return rerun_verdict(kind, tile, placed, want)


def rerun_verdict(kind: str, tile: int, placed: list[tuple[int, bytes]],
                  want: bytes) -> dict[str, Any]:
    """sm: wrong on some SMs, right on others; every_sm: wrong everywhere (ours);
    not_reproduced: right everywhere (a one-off)."""
    wrong_sms = sorted({sm for sm, result in placed if result != want})
    right_sms = {sm for sm, result in placed if result == want}
    outcome = "not_reproduced" if not wrong_sms else "every_sm" if not right_sms else "sm"
    verdict: dict[str, Any] = {"outcome": outcome, "sms": wrong_sms, "tile": tile,
                               "kind": kind, "checked_sms": len(right_sms | set(wrong_sms)),
                               "count": 0, "expected": "", "got": ""}
    if wrong_sms:
        bad = next(result for sm, result in placed if sm == wrong_sms[0] and result != want)
        _, expected, got = first_difference(want, memoryview(bad))
        verdict.update(expected=f"{expected:#010x}", got=f"{got:#010x}",
                       count=sum(words_differing(want, result)
                                 for sm, result in placed if sm in wrong_sms))
    return verdict


def majority(placed: list[tuple[int, bytes]]) -> bytes:
    """The result most blocks computed (the random kind's reference in a re-run)."""
    counts: dict[bytes, int] = {}
    for _, result in placed:
        counts[result] = counts.get(result, 0) + 1
    return max(counts, key=lambda key: counts[key])


def first_difference(expected: bytes | memoryview, got: bytes | memoryview
                     ) -> tuple[int, int, int]:
    """(word index, expected word, got word) of the first 32-bit word that differs."""
    for offset in range(0, min(len(expected), len(got)), 4):
        want = bytes(expected[offset:offset + 4])
        have = bytes(got[offset:offset + 4])
        if want != have:
            return (offset // 4, struct.unpack("<I", want)[0], struct.unpack("<I", have)[0])
    return (-1, 0, 0)


def words_differing(expected: bytes | memoryview, got: bytes | memoryview) -> int:
    a, b = array("I"), array("I")
    a.frombytes(bytes(expected))
    b.frombytes(bytes(got))
    return sum(1 for x, y in zip(a, b, strict=False) if x != y)
