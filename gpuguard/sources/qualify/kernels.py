"""The kernels `gpuguard qualify` runs, as PTX, and what the host needs to check them.

PTX, not a prebuilt binary: the driver JIT-compiles it for whatever GPU it finds (sm_80
and later: `mma.sync` bf16 needs Ampere), so nothing is shipped per architecture, and no
PyTorch or CUDA toolkit is needed (the active probe loads its fill kernel the same way).

qgemm: each warp multiplies one 16x16 bf16 tile A by four 16x8 tiles B with
`mma.sync.m16n8k16` (bf16 in, f32 accumulated), `iters` times over the same registers:
tensor cores only, no memory traffic in the loop, four independent accumulators per
warp so the tensor pipes stay full. Every block writes every result and the SM it ran on
(`%smid` at its start and at its end). Two kinds of input feed it:

- exact: small integers (|a|, |b| <= 4). Every product and partial sum is an integer below
  2^24 (16 products of at most 16 per step, `EXACT_STEPS` steps in all), so f32 accumulation is
  exact in any order and the result must equal a reference computed once on the CPU,
  bit for bit.
- random: bf16 with random sign and mantissa (exponents kept in a range that cannot
  overflow). No CPU reference: the same tile computed on two SMs must agree bit for bit.

The drill (`flip_sm`): a block that starts on that SM flips bit 0 of its first result,
as a defective SM would, so the whole path from kernel to verdict can be shown on a good
GPU.

mt_fill / mt_check: the memory test. Word i (64 bits) of a slice holds its own address
xor a seed (address-in-address; seed ~0 is its complement) or mix64(i + seed) (seeded
random); mt_check recomputes each word on the GPU, counts the ones that differ and keeps
the first MT_KEEP (address, expected, got). Verifying on the GPU keeps a memory test of
~130 GB within seconds; the host only reads a few words back.
"""

from __future__ import annotations

import random
import struct

WARPS = 8                 # warps per qgemm block
THREADS = WARPS * 32
SETS = 8                  # distinct input tiles per kind (block b computes set b % SETS)
IN_WORDS = 12             # 32-bit words per lane: A (4 words, 8 bf16), four B (2 words each)
OUT_FLOATS = 16           # f32 results per lane: four 16x8 tiles, 4 per lane each
BLOCK_OUT_BYTES = WARPS * 32 * OUT_FLOATS * 4     # 16 KiB of results per block
SET_IN_BYTES = WARPS * 32 * IN_WORDS * 4
NO_VALUE = 0xFFFFFFFF     # "none" for qgemm's set and flip_sm parameters
EXACT_MAX = 4             # |a|, |b| of the exact kind
# A step adds at most 16 * 4 * 4 = 256 to a result; 2^24 / 256 = 65536 steps stay exact
# (summed over the accumulator copies).
EXACT_STEPS = 65536 - 1
FLOPS_PER_MMA = 16 * 8 * 16 * 2
MT_KEEP = 8               # mismatches whose address mt_check keeps
MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MASK64 = (1 << 64) - 1
PATTERN_ADDRESS, PATTERN_RANDOM = 0, 1

_MMA = ("  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%f{0},%f{1},%f{2},%f{3}}}, "
        "{{%r11,%r12,%r13,%r14}}, {{%r{4},%r{5}}}, {{%f{0},%f{1},%f{2},%f{3}}};\n")


def _mmas(copies: int) -> str:
    return "".join(_MMA.format(16 * c + 4 * j, 16 * c + 4 * j + 1, 16 * c + 4 * j + 2,
                               16 * c + 4 * j + 3, 15 + 2 * j, 16 + 2 * j)
                   for c in range(copies) for j in range(4))


def _zero(copies: int) -> str:
    return "".join(f"  mov.f32 %f{i}, 0f00000000;\n" for i in range(16 * copies))


def _fold(copies: int) -> str:
    """The copies' accumulators added into the first (each holds iters x A x B)."""
    return "".join(f"  add.f32 %f{i}, %f{i}, %f{16 * c + i};\n"
                   for c in range(1, copies) for i in range(16))

_STORE = "".join(f"  st.global.v4.f32 [%rd6+{16 * j}], {{%f{4 * j},%f{4 * j + 1},"
                 f"%f{4 * j + 2},%f{4 * j + 3}}};\n" for j in range(4))


def _mix_ptx(src: str, dst: str) -> str:
    """dst = mix64(src): the seeded-random pattern (the same function as mix64 below)."""
    return (f"  mul.lo.u64 {dst}, {src}, {MIX[0]:#x};\n"
            f"  shr.u64 %rd15, {dst}, 30;\n  xor.b64 {dst}, {dst}, %rd15;\n"
            f"  mul.lo.u64 {dst}, {dst}, {MIX[1]:#x};\n"
            f"  shr.u64 %rd15, {dst}, 27;\n  xor.b64 {dst}, {dst}, %rd15;\n"
            f"  mul.lo.u64 {dst}, {dst}, {MIX[2]:#x};\n"
            f"  shr.u64 %rd15, {dst}, 31;\n  xor.b64 {dst}, {dst}, %rd15;\n")


# The word a memory-test thread expects at index %rd4, address %rd9 (into %rd10).
_EXPECT = ("  @%p2 xor.b64 %rd10, %rd9, %rd3;\n  @%p2 bra.uni HAVE;\n"
           "  add.u64 %rd14, %rd4, %rd3;\n" + _mix_ptx("%rd14", "%rd10") + "HAVE:\n")
_GRID_STRIDE = """  ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [n]; ld.param.u32 %r1, [kind];
  ld.param.u64 %rd3, [seed];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mov.u32 %r5, %nctaid.x;
  mul.wide.u32 %rd4, %r2, %r3; cvt.u64.u32 %rd5, %r4; add.u64 %rd4, %rd4, %rd5;
  mul.wide.u32 %rd6, %r5, %r3;
  setp.eq.u32 %p2, %r1, 0;
LOOP:
  setp.ge.u64 %p1, %rd4, %rd2;
  @%p1 bra.uni DONE;
  shl.b64 %rd8, %rd4, 3; add.u64 %rd9, %rd1, %rd8;
"""

def build_ptx(copies: int) -> bytes:
    """The module's PTX; `copies` independent accumulator sets per warp (COPIES)."""
    return ("""
.version 7.0
.target sm_80
.address_size 64

.visible .entry qgemm(.param .u64 p_in, .param .u64 p_out, .param .u64 p_sm,
    .param .u32 p_sets, .param .u32 p_iters, .param .u32 p_set, .param .u32 p_flip)
{
  .reg .pred %p<4>; .reg .b32 %r<32>; .reg .f32 %f<""" + str(16 * copies) + """>;
  .reg .b64 %rd<10>;
  mov.u32 %r0, %smid;
  ld.param.u64 %rd0, [p_in]; ld.param.u64 %rd1, [p_out]; ld.param.u64 %rd2, [p_sm];
  ld.param.u32 %r1, [p_sets]; ld.param.u32 %r2, [p_iters]; ld.param.u32 %r3, [p_set];
  ld.param.u32 %r4, [p_flip];
  mov.u32 %r5, %ctaid.x; mov.u32 %r6, %tid.x;
  shr.u32 %r7, %r6, 5; and.b32 %r8, %r6, 31;
  rem.u32 %r9, %r5, %r1;
  setp.eq.u32 %p0, %r3, 0xFFFFFFFF;
  selp.b32 %r9, %r9, %r3, %p0;
  shl.b32 %r10, %r9, 3; add.u32 %r10, %r10, %r7; shl.b32 %r10, %r10, 5;
  add.u32 %r10, %r10, %r8;
  mul.wide.u32 %rd3, %r10, 48;
  cvta.to.global.u64 %rd4, %rd0; add.s64 %rd4, %rd4, %rd3;
  ld.global.v4.b32 {%r11,%r12,%r13,%r14}, [%rd4];
  ld.global.v4.b32 {%r15,%r16,%r17,%r18}, [%rd4+16];
  ld.global.v4.b32 {%r19,%r20,%r21,%r22}, [%rd4+32];
""" + _zero(copies) + """  mov.u32 %r23, %r2;
  setp.eq.u32 %p1, %r23, 0;
  @%p1 bra.uni DONE;
LOOP:
""" + _mmas(copies) + """  sub.u32 %r23, %r23, 1;
  setp.ne.u32 %p1, %r23, 0;
  @%p1 bra.uni LOOP;
DONE:
""" + _fold(copies) + """  mov.u32 %r24, %smid;
  setp.ne.u32 %p2, %r0, %r4;
  @%p2 bra.uni STORE;
  mov.b32 %r25, %f0; xor.b32 %r25, %r25, 1; mov.b32 %f0, %r25;
STORE:
  shl.b32 %r26, %r5, 3; add.u32 %r26, %r26, %r7; shl.b32 %r26, %r26, 5;
  add.u32 %r26, %r26, %r8;
  mul.wide.u32 %rd5, %r26, 64;
  cvta.to.global.u64 %rd6, %rd1; add.s64 %rd6, %rd6, %rd5;
""" + _STORE + """  setp.ne.u32 %p3, %r6, 0;
  @%p3 bra.uni END;
  mul.wide.u32 %rd7, %r5, 8;
  cvta.to.global.u64 %rd8, %rd2; add.s64 %rd8, %rd8, %rd7;
  st.global.v2.u32 [%rd8], {%r0, %r24};
END:
  ret;
}

.visible .entry mt_fill(.param .u64 p, .param .u64 n, .param .u32 kind, .param .u64 seed)
{
  .reg .pred %p<3>; .reg .b32 %r<6>; .reg .b64 %rd<16>;
""" + _GRID_STRIDE + _EXPECT + """  st.global.u64 [%rd9], %rd10;
  add.u64 %rd4, %rd4, %rd6;
  bra.uni LOOP;
DONE:
  ret;
}

.visible .entry mt_check(.param .u64 p, .param .u64 n, .param .u32 kind, .param .u64 seed,
    .param .u64 out)
{
  .reg .pred %p<4>; .reg .b32 %r<6>; .reg .b64 %rd<20>;
  ld.param.u64 %rd16, [out];
""" + _GRID_STRIDE + _EXPECT + """  ld.global.u64 %rd11, [%rd9];
  setp.eq.u64 %p3, %rd11, %rd10;
  @%p3 bra.uni NEXT;
  atom.global.add.u64 %rd12, [%rd16], 1;
  setp.ge.u64 %p3, %rd12, """ + str(MT_KEEP) + """;
  @%p3 bra.uni NEXT;
  mul.lo.u64 %rd13, %rd12, 24; add.u64 %rd13, %rd13, %rd16;
  st.global.u64 [%rd13+8], %rd9; st.global.u64 [%rd13+16], %rd10;
  st.global.u64 [%rd13+24], %rd11;
NEXT:
  add.u64 %rd4, %rd4, %rd6;
  bra.uni LOOP;
DONE:
  ret;
}
""").encode() + b"\0"


# Independent accumulator sets per warp: more mma.sync in flight per warp (issue 29's
# power target; bench/qualify_smoke.py measured 1 and 2 on an H200).
COPIES = 2
PTX = build_ptx(COPIES)


def mix64(x: int) -> int:
    """The seeded-random pattern's word, as mt_fill computes it: splitmix64 (word i of
    a slice is splitmix64's output number i + seed from state 0)."""
    z = (x * MIX[0]) & MASK64
    z = ((z ^ (z >> 30)) * MIX[1]) & MASK64
    z = ((z ^ (z >> 27)) * MIX[2]) & MASK64
    return z ^ (z >> 31)


def _bf16(value: float) -> int:
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits >> 16


def _pack(lo: int, hi: int) -> int:
    return lo | (hi << 16)


def _a_words(a: list[list[int]], lane: int) -> list[int]:
    """The four A registers of `lane` (PTX ISA, fragments of mma.m16n8k16 .bf16)."""
    g, t = lane >> 2, lane & 3
    return [_pack(_bf16(a[row][col]), _bf16(a[row][col + 1]))
            for row, col in ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))]


def _b_words(b: list[list[int]], lane: int) -> list[int]:
    g, t = lane >> 2, lane & 3
    return [_pack(_bf16(b[k][g]), _bf16(b[k + 1][g])) for k in (2 * t, 2 * t + 8)]


def _d_cells(lane: int) -> list[tuple[int, int]]:
    """The (row, column) of each of the lane's four accumulators of one 16x8 tile."""
    g, t = lane >> 2, lane & 3
    return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]


class ExactInputs:
    """The exact kind: SETS x WARPS tiles of small integers, the input buffer in the
    fragment order the kernel loads, and each lane's integer products, from which the
    expected results of any `iters` follow (iters x product, exact in f32)."""

    def __init__(self, rng: random.Random) -> None:
        words: list[int] = []
        self.products: list[list[int]] = []   # per set: WARPS * 32 * OUT_FLOATS ints
        for _ in range(SETS):
            per_set: list[int] = []
            for _ in range(WARPS):
                tile_words, tile_products = _exact_tile(rng)
                words += tile_words
                per_set += tile_products
            self.products.append(per_set)
        self.buffer = struct.pack(f"<{len(words)}I", *words)

    def expected(self, iters: int) -> list[bytes]:
        """One block's results per set after `iters` steps."""
        scale = iters * COPIES
        return [struct.pack(f"<{len(p)}f", *(float(v * scale) for v in p))
                for p in self.products]


def _small(rng: random.Random, rows: int, cols: int) -> list[list[int]]:
    return [[rng.randint(-EXACT_MAX, EXACT_MAX) for _ in range(cols)] for _ in range(rows)]


def _exact_tile(rng: random.Random) -> tuple[list[int], list[int]]:
    """One warp's input words (lane by lane, in the order qgemm loads them) and its
    results per lane and register, as integers (one step of A x B)."""
    a = _small(rng, 16, 16)
    bs = [_small(rng, 16, 8) for _ in range(4)]
    prods = [[[sum(a[r][k] * b[k][c] for k in range(16)) for c in range(8)]
              for r in range(16)] for b in bs]
    words: list[int] = []
    products: list[int] = []
    for lane in range(32):
        words += _a_words(a, lane)
        for b in bs:
            words += _b_words(b, lane)
        products += [prod[r][c] for prod in prods for r, c in _d_cells(lane)]
    return words, products


def random_inputs(rng: random.Random) -> bytes:
    """The random kind: random sign and mantissa, exponent 2^-8..2^7: no overflow or
    denormal in any sum of EXACT_STEPS steps, full mantissa bits exercised."""
    count = SETS * SET_IN_BYTES // 2
    halves = [(rng.getrandbits(1) << 15) | ((rng.randint(119, 134)) << 7)
              | rng.getrandbits(7) for _ in range(count)]
    return struct.pack(f"<{count}H", *halves)


def iters_for(seconds_per_iter: float, slice_s: float) -> int:
    """Steps per launch so that one launch lasts about `slice_s`."""
    return max(1, min(EXACT_STEPS // COPIES, int(slice_s / max(seconds_per_iter, 1e-12))))


def tflops(blocks: int, iters: int, seconds: float) -> float:
    flops = blocks * WARPS * iters * 4 * COPIES * FLOPS_PER_MMA
    return flops / max(seconds, 1e-9) / 1e12
