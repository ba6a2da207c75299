# ruff: noqa  (kept byte for byte as recorded, so its numbers stay comparable)
# Copied from ../shared/fixtures/h200x2-2026-11-30/ (the feasibility probe issue 12 cites): the
# reference the active probe's timings and bandwidths are compared with in the same device run.
"""Feasibility of an active GPU probe through the CUDA driver API with ctypes only (no torch)."""
import ctypes, json, sys, time
T = {}
def t(name, t0): T[name] = round((time.perf_counter() - t0) * 1000, 2)
t00 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1"); t("dlopen_ms", t00)
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p(); cu.cuGetErrorString(r, ctypes.byref(s)); raise SystemExit(f"{what}: {r} {s.value}")
t0 = time.perf_counter(); ck(cu.cuInit(0), "cuInit"); t("cuInit_ms", t0)
n = ctypes.c_int(); ck(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
PTX = b"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry fill(.param .u64 p, .param .u32 n)
{
  .reg .pred %p<2>; .reg .b32 %r<8>; .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  mad.lo.s32 %r6, %r5, 3, 7;
  st.global.u32 [%rd4], %r6;
DONE:
  ret;
}
\0"""
out = {"devices": n.value}
for d in range(n.value):
    R = {}
    dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), d), "dev")
    ctx = ctypes.c_void_p()
    t0 = time.perf_counter(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "set"); R["ctx_ms"] = round((time.perf_counter()-t0)*1000, 2)
    size = 256 << 20
    dptr = ctypes.c_uint64(); hptr = ctypes.c_void_p()
    t0 = time.perf_counter(); ck(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(size)), "alloc"); ck(cu.cuMemAllocHost_v2(ctypes.byref(hptr), ctypes.c_size_t(size)), "allochost"); R["alloc_ms"] = round((time.perf_counter()-t0)*1000, 2)
    ctypes.memset(hptr, 0x5A, size)
    for rep in range(3):
        t0 = time.perf_counter(); ck(cu.cuMemcpyHtoD_v2(dptr, hptr, ctypes.c_size_t(size)), "h2d"); h2d = time.perf_counter()-t0
        t0 = time.perf_counter(); ck(cu.cuMemcpyDtoH_v2(hptr, dptr, ctypes.c_size_t(size)), "d2h"); d2h = time.perf_counter()-t0
    R["h2d_GBps"] = round(size/h2d/1e9, 1); R["d2h_GBps"] = round(size/d2h/1e9, 1)
    mod = ctypes.c_void_p(); fn = ctypes.c_void_p()
    t0 = time.perf_counter(); ck(cu.cuModuleLoadData(ctypes.byref(mod), PTX), "module"); ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"fill"), "fn"); R["ptx_jit_ms"] = round((time.perf_counter()-t0)*1000, 2)
    cnt = size // 4
    p = ctypes.c_uint64(dptr.value); nn = ctypes.c_uint32(cnt)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p), ctypes.cast(ctypes.byref(nn), ctypes.c_void_p))
    t0 = time.perf_counter()
    ck(cu.cuLaunchKernel(fn, (cnt + 255)//256, 1, 1, 256, 1, 1, 0, None, params, None), "launch"); ck(cu.cuCtxSynchronize(), "sync")
    R["kernel_ms"] = round((time.perf_counter()-t0)*1000, 2)
    ck(cu.cuMemcpyDtoH_v2(hptr, dptr, ctypes.c_size_t(size)), "d2h2")
    arr = (ctypes.c_uint32 * cnt).from_address(hptr.value)
    bad = sum(1 for i in range(0, cnt, 4099) if arr[i] != (i*3+7) & 0xffffffff)
    R["sampled_mismatches"] = bad
    cu.cuMemFree_v2(dptr); cu.cuMemFreeHost(hptr); cu.cuDevicePrimaryCtxRelease(dev)
    out[f"gpu{d}"] = R
# peer access
if n.value > 1:
    can = ctypes.c_int(); cu.cuDeviceCanAccessPeer(ctypes.byref(can), 0, 1); out["peer_0_1"] = can.value
out.update(T); out["total_ms"] = round((time.perf_counter()-t00)*1000, 1)
print(json.dumps(out, indent=1))
