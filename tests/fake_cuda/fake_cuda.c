/*
 * A stand-in libcuda.so.1 for tests of the active probe on machines without a GPU.
 *
 * gpuguard's probe worker loads it with ctypes (LD_LIBRARY_PATH points at its folder),
 * so the whole probe runs for real: the fork per GPU, the phases, the deadline, the lock.
 * "Device memory" is host memory (malloc); copies are memcpy; the one "kernel" (the
 * probe's `fill`) is emulated in cuLaunchKernel: word i becomes seed + i. GPUs are found
 * by the bus ids the fake NVML gives (00000000:1X:00.0, X = index).
 *
 * Environment switches:
 *   FAKE_CUDA_GPUS=N               devices (default 8: any the fake NVML lists)
 *   FAKE_CUDA_INIT_ERROR=code      cuInit returns this CUresult (802, 999, 3, ...)
 *   FAKE_CUDA_CTX_ERROR=code       cuDevicePrimaryCtxRetain returns this CUresult
 *   FAKE_CUDA_LAUNCH_ERROR=code    cuLaunchKernel returns this CUresult
 *   FAKE_CUDA_HANG=name            this function never returns (a wedged GPU); every
 *                                  call the probe makes can hang, the releases included
 *   FAKE_CUDA_CRASH=name           this function raises SIGSEGV (a driver bug)
 *   FAKE_CUDA_FAULT_GPU=i          HANG, CRASH, CORRUPT, SLOW and LAUNCH_ERROR apply only
 *                                  to GPU i
 *                                  (calls before a context, cuInit, always match)
 *   FAKE_CUDA_CORRUPT=compute|pattern   the kernel writes a wrong word / memset leaves a
 *                                  stuck bit
 *   FAKE_CUDA_SLOW=h2d|d2h|d2d|peer:US  this kind of copy sleeps US microseconds per MiB
 *   FAKE_CUDA_NO_PEER=1            cuDeviceCanAccessPeer answers 0
 *   FAKE_CUDA_INIT_REMOVES=path    cuInit deletes this file (a test tells by it when cuInit
 *                                  ran: the fake NVML can wait on it, FAKE_NVML_HANG_FILE)
 *   FAKE_CUDA_LOG=path             append "take KIND" / "give KIND" for every allocation,
 *                                  context and event, so a test can see all were released
 *
 * The qualify kernels (gpuguard/sources/qualify/kernels.py) are emulated too: qgemm
 * computes each warp's tiles as the PTX does (bf16 inputs in mma.m16n8k16 fragment order,
 * iters x COPIES x A x B), block b "runs" on SM (b * 7) % FAKE_CUDA_SMS; mt_fill and
 * mt_check write and check the memory-test patterns with the same mix64.
 *   FAKE_CUDA_SMS=N                SMs per GPU (default 10)
 *   FAKE_CUDA_FREE_MIB=N           free memory cuMemGetInfo reports (default 96 MiB)
 *   FAKE_CUDA_SDC_SM=k|all         every qgemm block on SM k (or on every SM) gets bit 3
 *                                  of its fifth result flipped: a defective SM / our bug
 *   FAKE_CUDA_SDC_ONCE=1           ... only in the first launch that has such a block (a
 *                                  one-off: the re-run does not reproduce it)
 *   FAKE_CUDA_ITER_NS=N            a qgemm step "takes" N ns (default 200): the launch
 *                                  sleeps iters x N, so calibration finds ~40 ms slices
 *   FAKE_CUDA_CORRUPT=memtest      mt_fill leaves bit 5 of word 100 of every slice flipped
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef struct { int device; } fake_ctx;

static fake_ctx contexts[64];
static __thread fake_ctx *current;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static int gpu_matches(void) {
    int only = env_int("FAKE_CUDA_FAULT_GPU", -1);
    return only < 0 || !current || current->device == only;
}

static void log_line(const char *what, const char *kind) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %s\n", what, kind);
    fclose(f);
}

static void faults(const char *fn) {
    const char *crash = getenv("FAKE_CUDA_CRASH");
    if (crash && strcmp(crash, fn) == 0 && gpu_matches()) raise(SIGSEGV);
    const char *hang = getenv("FAKE_CUDA_HANG");
    if (hang && strcmp(hang, fn) == 0 && gpu_matches()) for (;;) pause();
}

static void slow(const char *kind, size_t bytes) {
    const char *v = getenv("FAKE_CUDA_SLOW");
    size_t n = strlen(kind);
    if (!v || strncmp(v, kind, n) != 0 || v[n] != ':' || !gpu_matches()) return;
    usleep((useconds_t)(atof(v + n + 1) * (double)bytes / (1 << 20)));
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    faults("cuInit");
    const char *removes = getenv("FAKE_CUDA_INIT_REMOVES");
    if (removes && *removes) unlink(removes);
    return env_int("FAKE_CUDA_INIT_ERROR", 0);
}

CUresult cuDeviceGetByPCIBusId(int *dev, const char *bus) {
    unsigned domain, b, d, f;
    faults("cuDeviceGetByPCIBusId");
    if (sscanf(bus, "%x:%x:%x.%x", &domain, &b, &d, &f) != 4) return 1;
    int index = (int)b - 0x10;
    if (index < 0 || index >= env_int("FAKE_CUDA_GPUS", 8)) return 101;
    *dev = index;
    return 0;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    fake_ctx *saved = current;
    current = &contexts[dev];
    faults("cuDevicePrimaryCtxRetain");
    current = saved;
    int err = env_int("FAKE_CUDA_CTX_ERROR", 0);
    if (err) return err;
    contexts[dev].device = dev;
    *ctx = &contexts[dev];
    log_line("take", "context");
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    fake_ctx *saved = current;
    current = &contexts[dev];
    faults("cuDevicePrimaryCtxRelease_v2");
    current = saved;
    log_line("give", "context");
    return 0;
}

CUresult cuCtxSetCurrent(void *ctx) {
    current = ctx;
    return 0;
}

CUresult cuCtxSynchronize(void) {
    faults("cuCtxSynchronize");
    return 0;
}

CUresult cuMemAlloc_v2(uint64_t *ptr, size_t size) {
    faults("cuMemAlloc_v2");
    void *p = malloc(size);
    if (!p) return 2;
    *ptr = (uint64_t)(uintptr_t)p;
    log_line("take", "device");
    return 0;
}

CUresult cuMemFree_v2(uint64_t ptr) {
    faults("cuMemFree_v2");
    free((void *)(uintptr_t)ptr);
    log_line("give", "device");
    return 0;
}

CUresult cuMemAllocHost_v2(void **ptr, size_t size) {
    faults("cuMemAllocHost_v2");
    *ptr = malloc(size);
    if (!*ptr) return 2;
    log_line("take", "host");
    return 0;
}

CUresult cuMemFreeHost(void *ptr) {
    faults("cuMemFreeHost");
    free(ptr);
    log_line("give", "host");
    return 0;
}

CUresult cuMemsetD32_v2(uint64_t ptr, unsigned int value, size_t count) {
    uint32_t *p = (uint32_t *)(uintptr_t)ptr;
    faults("cuMemsetD32_v2");
    for (size_t i = 0; i < count; i++) p[i] = value;
    const char *corrupt = getenv("FAKE_CUDA_CORRUPT");
    /* A stuck bit 3 in the sixth word of every slice the probe writes. */
    if (corrupt && strcmp(corrupt, "pattern") == 0 && gpu_matches() && count > 5)
        p[5] ^= 8;
    return 0;
}

static CUresult copy(const char *fn, const char *kind, void *dst, const void *src, size_t n) {
    faults(fn);
    memcpy(dst, src, n);
    slow(kind, n);
    return 0;
}

CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
    return copy("cuMemcpyHtoD_v2", "h2d", (void *)(uintptr_t)dst, src, n);
}

CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
    return copy("cuMemcpyDtoH_v2", "d2h", dst, (const void *)(uintptr_t)src, n);
}

CUresult cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
    return copy("cuMemcpyDtoD_v2", "d2d", (void *)(uintptr_t)dst,
                (const void *)(uintptr_t)src, n);
}

CUresult cuMemcpyPeer(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t n) {
    (void)dctx; (void)sctx;
    return copy("cuMemcpyPeer", "peer", (void *)(uintptr_t)dst,
                (const void *)(uintptr_t)src, n);
}

CUresult cuDeviceCanAccessPeer(int *can, int dev, int peer) {
    *can = dev != peer && !env_int("FAKE_CUDA_NO_PEER", 0);
    return 0;
}

CUresult cuCtxEnablePeerAccess(void *peer, unsigned int flags) {
    (void)peer; (void)flags;
    return 0;
}

CUresult cuCtxDisablePeerAccess(void *peer) {
    (void)peer;
    faults("cuCtxDisablePeerAccess");
    return 0;
}

static int module_token;
static int fn_tokens[4];   /* fill, qgemm, mt_fill, mt_check */
static const char *fn_names[4] = {"fill", "qgemm", "mt_fill", "mt_check"};

CUresult cuModuleLoadData(void **module, const void *image) {
    faults("cuModuleLoadData");
    if (!strstr((const char *)image, ".entry fill") && !strstr((const char *)image, ".entry qgemm"))
        return 218;
    *module = &module_token;
    log_line("take", "module");
    return 0;
}

CUresult cuModuleUnload(void *module) {
    (void)module;
    faults("cuModuleUnload");
    log_line("give", "module");
    return 0;
}

CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
    (void)module;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, fn_names[i]) == 0) { *fn = &fn_tokens[i]; return 0; }
    return 500;
}

static int sms(void) { return env_int("FAKE_CUDA_SMS", 10); }

static float bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int sdc_launched;   /* FAKE_CUDA_SDC_ONCE: a launch with a wrong block happened */

/* qgemm as the PTX computes it: per warp, A (16x16) x four B (16x8), fragments as
 * kernels.py lays them out; every result is iters x COPIES x (A x B). */
static void qgemm(unsigned blocks, void **params) {
    const uint32_t *in = (const uint32_t *)(uintptr_t)*(uint64_t *)params[0];
    float *out = (float *)(uintptr_t)*(uint64_t *)params[1];
    uint32_t *sm_out = (uint32_t *)(uintptr_t)*(uint64_t *)params[2];
    uint32_t sets = *(uint32_t *)params[3], iters = *(uint32_t *)params[4];
    uint32_t set_override = *(uint32_t *)params[5], flip = *(uint32_t *)params[6];
    const char *sdc = getenv("FAKE_CUDA_SDC_SM");
    int once = env_int("FAKE_CUDA_SDC_ONCE", 0), wrong_here = 0;
    int copies = env_int("FAKE_CUDA_COPIES", 2);
    usleep((useconds_t)((double)iters * env_int("FAKE_CUDA_ITER_NS", 200) / 1000.0));
    for (unsigned b = 0; b < blocks; b++) {
        uint32_t sm = (uint32_t)((b * 7u) % (unsigned)sms());
        uint32_t set = set_override == 0xFFFFFFFFu ? b % sets : set_override;
        for (int w = 0; w < 8; w++) {
            float a[16][16], bm[4][16][8];
            for (int lane = 0; lane < 32; lane++) {
                const uint32_t *r = in + (((size_t)set * 8 + w) * 32 + lane) * 12;
                int g = lane >> 2, t = lane & 3;
                int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
                for (int i = 0; i < 4; i++) {
                    a[arow[i]][acol[i]] = bf16((uint16_t)(r[i] & 0xFFFF));
                    a[arow[i]][acol[i] + 1] = bf16((uint16_t)(r[i] >> 16));
                }
                for (int j = 0; j < 4; j++)
                    for (int i = 0; i < 2; i++) {
                        uint32_t word = r[4 + 2 * j + i];
                        int k0 = 2 * t + 8 * i;
                        bm[j][k0][g] = bf16((uint16_t)(word & 0xFFFF));
                        bm[j][k0 + 1][g] = bf16((uint16_t)(word >> 16));
                    }
            }
            for (int lane = 0; lane < 32; lane++) {
                int g = lane >> 2, t = lane & 3;
                int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
                float *o = out + (((size_t)b * 8 + w) * 32 + lane) * 16;
                for (int j = 0; j < 4; j++)
                    for (int i = 0; i < 4; i++) {
                        double sum = 0;
                        for (int k = 0; k < 16; k++) sum += (double)a[rows[i]][k] * bm[j][k][cols[i]];
                        o[4 * j + i] = (float)(sum * iters * copies);
                    }
            }
        }
        if (flip == sm) {
            uint32_t bits;
            float *first = out + (size_t)b * 8 * 32 * 16;
            memcpy(&bits, first, 4); bits ^= 1; memcpy(first, &bits, 4);
        }
        if (sdc && gpu_matches() && (strcmp(sdc, "all") == 0 || (uint32_t)atoi(sdc) == sm)
            && !(once && sdc_launched)) {
            uint32_t bits;
            float *word = out + (size_t)b * 8 * 32 * 16 + 4;
            memcpy(&bits, word, 4); bits ^= 8; memcpy(word, &bits, 4);
            wrong_here = 1;
        }
        sm_out[2 * b] = sm_out[2 * b + 1] = sm;
    }
    if (wrong_here) sdc_launched = 1;
}

static uint64_t mix64(uint64_t z) {
    z *= 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void memtest(int check, void **params) {
    uint64_t *p = (uint64_t *)(uintptr_t)*(uint64_t *)params[0];
    uint64_t n = *(uint64_t *)params[1], seed = *(uint64_t *)params[3];
    uint32_t kind = *(uint32_t *)params[2];
    uint64_t *out = check ? (uint64_t *)(uintptr_t)*(uint64_t *)params[4] : NULL;
    const char *corrupt = getenv("FAKE_CUDA_CORRUPT");
    for (uint64_t i = 0; i < n; i++) {
        uint64_t want = kind == 0 ? ((uint64_t)(uintptr_t)(p + i)) ^ seed : mix64(i + seed);
        if (!check) { p[i] = want; continue; }
        if (p[i] != want) {
            uint64_t slot = out[0]++;
            if (slot < 8) {
                out[1 + 3 * slot] = (uint64_t)(uintptr_t)(p + i);
                out[2 + 3 * slot] = want;
                out[3 + 3 * slot] = p[i];
            }
        }
    }
    if (!check && corrupt && strcmp(corrupt, "memtest") == 0 && gpu_matches() && n > 100)
        p[100] ^= 32;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int dev) {
    (void)dev;
    *value = attribute == 16 ? sms() : attribute == 75 ? 9 : 0;
    return 0;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    faults("cuMemGetInfo_v2");
    *free_bytes = (size_t)env_int("FAKE_CUDA_FREE_MIB", 96) << 20;
    *total = (size_t)80 << 30;
    return 0;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *stream) {
    (void)stream;
    return copy("cuMemcpyDtoHAsync_v2", "d2h", dst, (const void *)(uintptr_t)src, n);
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream,
                        void **params, void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream;
    (void)extra;
    faults("cuLaunchKernel");
    int err = env_int("FAKE_CUDA_LAUNCH_ERROR", 0);
    if (err && gpu_matches()) return err;
    if (fn == &fn_tokens[1]) { qgemm(gx, params); return 0; }
    if (fn == &fn_tokens[2] || fn == &fn_tokens[3]) { memtest(fn == &fn_tokens[3], params); return 0; }
    uint32_t *p = (uint32_t *)(uintptr_t)*(uint64_t *)params[0];
    uint32_t n = *(uint32_t *)params[1], seed = *(uint32_t *)params[2];
    uint64_t threads = (uint64_t)gx * bx;
    for (uint32_t i = 0; i < n && i < threads; i++) p[i] = seed + i;
    const char *corrupt = getenv("FAKE_CUDA_CORRUPT");
    if (corrupt && strcmp(corrupt, "compute") == 0 && gpu_matches() && n > 7) p[7] ^= 1;
    return 0;
}

typedef struct { double t; } fake_event;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

CUresult cuEventCreate(void **event, unsigned int flags) {
    (void)flags;
    *event = calloc(1, sizeof(fake_event));
    log_line("take", "event");
    return *event ? 0 : 2;
}

CUresult cuEventDestroy_v2(void *event) {
    faults("cuEventDestroy_v2");
    free(event);
    log_line("give", "event");
    return 0;
}

CUresult cuEventRecord(void *event, void *stream) {
    (void)stream;
    ((fake_event *)event)->t = now();
    return 0;
}

CUresult cuEventSynchronize(void *event) {
    (void)event;
    faults("cuEventSynchronize");
    return 0;
}

CUresult cuEventElapsedTime(float *ms, void *start, void *stop) {
    *ms = (float)((((fake_event *)stop)->t - ((fake_event *)start)->t) * 1000.0);
    return 0;
}
