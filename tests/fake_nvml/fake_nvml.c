/*
 * A stand-in libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * The real pynvml loads it (LD_LIBRARY_PATH points at its folder), so the whole
 * NVML source runs for real: library loading, error classes, the forked worker,
 * the deadline. It exports only a few functions; pynvml turns every other call
 * into NVMLError_FunctionNotFound, which gpuguard must treat as "not supported".
 *
 * Environment switches:
 *   FAKE_NVML_GPUS=N           number of GPUs (default 1)
 *   FAKE_NVML_INIT_ERROR=code  nvmlInitWithFlags returns this NVML error code
 *   FAKE_NVML_HANG=name        this function never returns (as on a wedged GPU)
 *   FAKE_NVML_HANG_GPU=i       ... only for GPU i (default: every GPU)
 *   FAKE_NVML_HANG_FILE=path   ... only while this file exists (a test wedges and
 *                              un-wedges the GPU at run time); default: forever
 *   FAKE_NVML_TEMP_FILE=path   read the temperature from this file at every call
 *   FAKE_NVML_LOST_GPU=i       GPU i answers NVML_ERROR_GPU_IS_LOST (15), as after Xid 79
 *   FAKE_NVML_HANDLE_ERROR=code  nvmlDeviceGetHandleByIndex answers this NVML error code
 *                              (999: "Unknown Error", as `nvidia-smi` shows it for a GPU
 *                              that failed to initialise; 3: not supported)
 *   FAKE_NVML_HANDLE_ERROR_GPU=i ... only for GPU i (default: every GPU)
 *   FAKE_NVML_BUS_HANDLE_ERROR=code  nvmlDeviceGetHandleByPciBusId(_v2) answers this NVML
 *                              error code (999: "Unknown Error", as `nvidia-smi` shows it
 *                              for a GPU on the bus it cannot reach; 6: not found)
 *   FAKE_NVML_BUS_HANDLE_ERROR_BUS=id ... only for this bus id (any PCI domain width,
 *                              any case; default: every bus id). Otherwise a bus id is
 *                              found when it is a fake GPU's (GPU i at 0000:1i:00.0, of
 *                              those FAKE_NVML_GPUS counts), else NVML_ERROR_NOT_FOUND (6)
 *   FAKE_NVML_BUS_UNCOUNTED=1  ... a fake GPU's bus id beyond FAKE_NVML_GPUS is found too (a
 *                              GPU NVML reaches by bus id but does not count)
 *   FAKE_NVML_BUS_CALLS=path   each by-PCI lookup appends the bus id it was asked to this file
 *   (FAKE_NVML_HANG / _CRASH=nvmlDeviceGetHandleByPciBusId_v2 wedge the lookup; _GPU is the
 *   slot of the bus id asked, GPU i at 0000:1i:00.0)
 *   FAKE_NVML_TEMP=C           GPU temperature (default 40)
 *   FAKE_NVML_WIDTH=N          current PCIe link width (default 16; max is 16)
 *   FAKE_NVML_UTIL=P           GPU utilization percent (default 0)
 *   FAKE_NVML_CRASH=name       this function raises SIGSEGV (as a driver bug does)
 *   FAKE_NVML_CRASH_GPU=i      ... only for GPU i (default: every GPU)
 *   FAKE_NVML_CRASH_FILE=path  ... only while this file exists (default: always)
 *   FAKE_NVML_NVLINKS=n        NVLinks per GPU (default 0: NVLink not supported)
 *   FAKE_NVML_NVLINK_DOWN=g:l,...  these links (GPU g, link l) are down
 *   FAKE_NVML_NVLINK_COUNTER_FILE=path  lines "gpu link replay recovery crc_flit crc_data",
 *                              read at every call (a test grows them); other links read
 *                              0 0 0 23, as the healthy links of the real H200 pair
 *   FAKE_NVML_FABRIC=not_supported|not_started|in_progress|completed|failed
 *                              GPU fabric state (default not_supported; failed: completed
 *                              with an error status)
 *   FAKE_NVML_FABRIC_V1_ONLY=1 no nvmlDeviceGetGpuFabricInfoV (as drivers before 535)
 *   FAKE_NVML_P2P=ok|not_supported|error  peer-to-peer status between GPUs (default ok;
 *                              error: the call answers NVML_ERROR_UNKNOWN, 999)
 *   FAKE_NVML_GPUS_FILE, FAKE_NVML_NVLINK_DOWN_FILE, FAKE_NVML_FABRIC_FILE,
 *   FAKE_NVML_P2P_FILE=path    ... the switch without _FILE read from this file (its first
 *                              line) at every call instead, so a test changes it while the
 *                              daemon's worker runs; no file: the switch is unset
 *   FAKE_NVML_P2P_CALLS=path   each nvmlDeviceGetP2PStatus appends a line to this file
 *   FAKE_NVML_MIG_PENDING=1    MIG mode disabled now, enabled after a reset
 *   FAKE_NVML_MEM_TEMP=C       HBM temperature (default 35; its maximum is 95)
 *   FAKE_NVML_RECOVERY=code    the driver's recovery action field (0 none, 1 gpu_reset,
 *                              2 node_reboot, ...; default 0)
 *   FAKE_NVML_RECOVERY_GPU=i   ... only for GPU i (default: every GPU)
 *   Serial numbers are 1654000000000 + the GPU's index (a board's lasting identity).
 *   FAKE_NVML_INFOROM=corrupted  nvmlDeviceValidateInforom and the InfoROM's ECC object
 *                              version answer NVML_ERROR_CORRUPTED_INFOROM (14), as a board
 *                              whose InfoROM is damaged; otherwise the real H200's versions
 *   FAKE_NVML_INFOROM_GPU=i    ... only for GPU i (default: every GPU)
 *   FAKE_NVML_INFOROM_FILE=path  ... corrupted while this file exists (a test repairs it)
 *   FAKE_NVML_INFOROM_CALLS=path each nvmlDeviceValidateInforom appends a line to this file:
 *                              "GPU-index caller's-pid caller's-parent-pid"
 *   FAKE_NVML_INFOROM_MS=n     each nvmlDeviceValidateInforom takes n ms (the H200's: 70)
 *   FAKE_NVML_INFOROM_IMAGE=v  the InfoROM image version (a reflash; default the H200's)
 *   FAKE_NVML_APP_CLOCK_SM=MHz application SM clock (default: the default, 1980)
 *   FAKE_NVML_MEM_TOTAL_MIB=n  memory total (v1 memory info; default: not supported unless
 *                              FAKE_NVML_PROCS_FILE is set)
 *   FAKE_NVML_MEM_USED_MIB=n   ... and memory used (default 0; ignored with PROCS_FILE)
 *   FAKE_NVML_DRIVER_VERSION=v the driver version (default 580.159.04, the H200 host's)
 *   FAKE_NVML_CUDA_VERSION=n   the CUDA version the driver gives, as NVML's integer
 *                              (default 13000: 13.0; 12040 is 12.4)
 *   FAKE_NVML_BRAND=n          nvmlBrandType_t (default 14, NVIDIA: what the H200 reports;
 *                              2 Tesla, 5 GeForce, 1 Quadro)
 *   FAKE_NVML_CC=major.minor   CUDA compute capability (default 9.0, Hopper)
 *   FAKE_NVML_PROCS_FILE=path  per-process accounting: lines "gpu pid used_mib", read at
 *                              every call (a test grows them); with it set the GPUs also
 *                              report their memory (FAKE_NVML_MEM_TOTAL_MIB, default 143771,
 *                              used = the sum of the file's lines); unset, the process
 *                              call is not supported
 *   FAKE_NVML_LOAD=1           the readings of a GPU under load answer (`gpuguard qualify`'s
 *                              sampler): power, enforced limit, SM and memory clocks,
 *                              clock event reasons, volatile ECC totals, remapped rows;
 *                              unset, those functions answer FunctionNotFound as before
 *   FAKE_NVML_POWER_MW=n       ... power draw (default 690000: the H200 at full load)
 *   FAKE_NVML_POWER_LIMIT_MW=n ... enforced power limit (default 700000)
 *   FAKE_NVML_CLOCK_SM=MHz     ... current SM clock (default 1470)
 *   FAKE_NVML_CLOCK_MEM=MHz    ... current memory clock (default 3201)
 *   FAKE_NVML_REASONS=bits     ... clock event reasons (default 0x4, SW power cap)
 *   FAKE_NVML_ECC_CORRECTED=n  ... volatile corrected ECC total (default 0)
 *   FAKE_NVML_ECC_UNCORRECTED=n ... volatile uncorrected ECC total (default 0)
 *   FAKE_NVML_REMAP_PENDING=1, FAKE_NVML_REMAP_FAILED=1  ... remapped rows' flags
 *   FAKE_NVML_LATER_MS=N       from N ms after nvmlInit (default 0) the LATER values are
 *                              in force (a fault that appears during a run):
 *   FAKE_NVML_LATER_GPU=i      ... only on GPU i (default: every GPU; the Xid: GPU 0)
 *   FAKE_NVML_LATER_REASONS=bits    ... OR'd into the clock event reasons
 *   FAKE_NVML_LATER_CORRECTED=n     ... added to the corrected ECC total
 *   FAKE_NVML_LATER_UNCORRECTED=n   ... added to the uncorrected ECC total
 *   FAKE_NVML_LATER_REMAP_PENDING=1 ... a row remap pending
 *   FAKE_NVML_XID=code         NVML Xid events answer (unset: FunctionNotFound as before):
 *                              one event of this code, delivered at FAKE_NVML_LATER_MS
 *
 * Structs are laid out as nvidia-ml-py's ctypes declarations (pynvml.py) pass them.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct { int index; } fake_device;
typedef fake_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

static fake_device devices[64];

/* Says "this is the tests' fake, not a driver": gpuguard looks it up in the loaded NVML
 * (gpuguard/sources/nvml_fake.py) and `check` prints a note naming this library, so a
 * fake left on LD_LIBRARY_PATH is never taken for GPUs. No real libnvidia-ml has it. */
const int gpuguard_fake_nvml_marker = 1;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

/* A switch's value: from the file its NAME_FILE names (first line, read now), else the
 * environment. `buf` holds what a file gave. */
static const char *setting(const char *name, char *buf, size_t len) {
    char file_var[64];
    snprintf(file_var, sizeof file_var, "%s_FILE", name);
    const char *path = getenv(file_var);
    if (!path) return getenv(name);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    if (!fgets(buf, (int)len, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

static void maybe_crash(const char *fn, int gpu) {
    const char *target = getenv("FAKE_NVML_CRASH");
    if (!target || strcmp(target, fn) != 0) return;
    int only = env_int("FAKE_NVML_CRASH_GPU", -1);
    if (only >= 0 && only != gpu) return;
    const char *file = getenv("FAKE_NVML_CRASH_FILE");
    if (file && access(file, F_OK) != 0) return;
    raise(SIGSEGV);
}

static void maybe_hang(const char *fn, int gpu) {
    maybe_crash(fn, gpu);
    const char *target = getenv("FAKE_NVML_HANG");
    if (!target || strcmp(target, fn) != 0) return;
    int only = env_int("FAKE_NVML_HANG_GPU", -1);
    if (only >= 0 && only != gpu) return;
    const char *file = getenv("FAKE_NVML_HANG_FILE");
    if (!file) for (;;) pause();
    while (access(file, F_OK) == 0) usleep(20000);
}

/* CLOCK_MONOTONIC seconds, and when this process called nvmlInit (the LATER switches). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
static double init_at = -1.0;

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    init_at = now_s();
    maybe_hang("nvmlInit", -1);
    return env_int("FAKE_NVML_INIT_ERROR", NVML_SUCCESS);
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    case 14: return "Corrupted infoROM";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy(char *dst, unsigned int len, const char *src) {
    if (strlen(src) + 1 > len) return NVML_ERROR_INVALID_ARGUMENT;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    const char *version = getenv("FAKE_NVML_DRIVER_VERSION");
    maybe_hang("nvmlSystemGetDriverVersion", -1);
    return copy(v, len, version && *version ? version : "580.159.04");
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
    return copy(v, len, "13.580.159.04");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    *v = env_int("FAKE_NVML_CUDA_VERSION", 13000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    char buf[32];
    const char *gpus = setting("FAKE_NVML_GPUS", buf, sizeof buf);
    *count = (unsigned int)(gpus && *gpus ? atoi(gpus) : 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    if (index >= 64) return NVML_ERROR_INVALID_ARGUMENT;
    int failing = env_int("FAKE_NVML_HANDLE_ERROR", NVML_SUCCESS);
    int only = env_int("FAKE_NVML_HANDLE_ERROR_GPU", -1);
    if (failing != NVML_SUCCESS && (only < 0 || only == (int)index)) return failing;
    devices[index].index = (int)index;
    *dev = &devices[index];
    return NVML_SUCCESS;
}

/* "0000:11:00.0", "00000000:11:00.0", any case: domain, bus, device, function; -1 unparsable */
static int parse_bus_id(const char *id, unsigned *domain, unsigned *bus, unsigned *dev,
                        unsigned *fn) {
    if (!id || sscanf(id, "%x:%x:%x.%x", domain, bus, dev, fn) != 4) return -1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *dev) {
    unsigned d, b, s, f, od, ob, os, of;
    const char *calls = getenv("FAKE_NVML_BUS_CALLS");
    if (calls && *calls) {
        FILE *out = fopen(calls, "a");
        if (out) { fprintf(out, "%s\n", id ? id : "(null)"); fclose(out); }
    }
    if (parse_bus_id(id, &d, &b, &s, &f) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_hang("nvmlDeviceGetHandleByPciBusId_v2", (int)b - 0x10);
    int failing = env_int("FAKE_NVML_BUS_HANDLE_ERROR", NVML_SUCCESS);
    const char *only = getenv("FAKE_NVML_BUS_HANDLE_ERROR_BUS");
    int chosen = !(only && *only) ||
        (parse_bus_id(only, &od, &ob, &os, &of) == 0 && od == d && ob == b && os == s && of == f);
    if (failing != NVML_SUCCESS && chosen) return failing;
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    if (env_int("FAKE_NVML_BUS_UNCOUNTED", 0)) count = 64;
    if (d != 0 || s != 0 || f != 0 || b < 0x10 || b - 0x10 >= count || b - 0x10 >= 64)
        return 6; /* NVML_ERROR_NOT_FOUND */
    devices[b - 0x10].index = (int)(b - 0x10);
    *dev = &devices[b - 0x10];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *dev) {
    return nvmlDeviceGetHandleByPciBusId_v2(id, dev);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *v, unsigned int len) {
    char buf[80];
    maybe_hang("nvmlDeviceGetUUID", d->index);
    snprintf(buf, sizeof buf, "GPU-fa4e0000-0000-0000-0000-%012d", d->index);
    return copy(v, len, buf);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *v, unsigned int len) {
    char buf[32];
    maybe_hang("nvmlDeviceGetSerial", d->index);
    snprintf(buf, sizeof buf, "%lld", 1654000000000LL + d->index);
    return copy(v, len, buf);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int len) {
    (void)d;
    return copy(v, len, "NVIDIA H200");
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    maybe_hang("nvmlDeviceGetBrand", d->index);
    *brand = env_int("FAKE_NVML_BRAND", 14);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    const char *cc = getenv("FAKE_NVML_CC");
    maybe_hang("nvmlDeviceGetCudaComputeCapability", d->index);
    *major = 9;
    *minor = 0;
    if (cc && *cc && sscanf(cc, "%d.%d", major, minor) != 2) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    memset(p, 0, sizeof *p);
    p->bus = 0x10 + (unsigned)d->index;
    p->pciDeviceId = 0x233510de;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    maybe_hang("nvmlDeviceGetTemperature", d->index);
    if (env_int("FAKE_NVML_LOST_GPU", -1) == d->index) return 15;
    *t = (unsigned int)env_int("FAKE_NVML_TEMP", 40);
    const char *file = getenv("FAKE_NVML_TEMP_FILE");
    FILE *f = file ? fopen(file, "r") : NULL;
    if (f) {
        int v;
        if (fscanf(f, "%d", &v) == 1) *t = (unsigned int)v;
        fclose(f);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int which, unsigned int *t) {
    maybe_hang("nvmlDeviceGetTemperatureThreshold", d->index);
    switch (which) {
    case 0: *t = 95; return NVML_SUCCESS;  /* shutdown */
    case 1: *t = 89; return NVML_SUCCESS;  /* slowdown */
    case 2: *t = 95; return NVML_SUCCESS;  /* memory max */
    case 3: *t = 87; return NVML_SUCCESS;  /* GPU max */
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *w) {
    if (env_int("FAKE_NVML_LOST_GPU", -1) == d->index) return 15;
    *w = (unsigned int)env_int("FAKE_NVML_WIDTH", 16);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w) {
    (void)d;
    *w = 16;
    return NVML_SUCCESS;
}

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    (void)d;
    u->gpu = (unsigned int)env_int("FAKE_NVML_UTIL", 0);
    u->memory = 0;
    return NVML_SUCCESS;
}

/* Hopper answers NotSupported for page retirement. */
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *s) {
    (void)d; (void)s;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* --- issue 11: NVLink, fabric, P2P, MIG, HBM temperature, clocks, GSP ------------- */

static int nvlinks(void) { return env_int("FAKE_NVML_NVLINKS", 0); }

/* NotSupported on a GPU without NVLink; InvalidArgument past its last link. */
static nvmlReturn_t link_check(const char *fn, nvmlDevice_t d, unsigned int link) {
    maybe_hang(fn, d->index);
    if (nvlinks() <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if ((int)link >= nvlinks()) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static int link_down(int gpu, unsigned int link) {
    char buf[1024];
    const char *list = setting("FAKE_NVML_NVLINK_DOWN", buf, sizeof buf);
    char want[32];
    if (!list) return 0;
    snprintf(want, sizeof want, "%d:%u", gpu, link);
    size_t n = strlen(want);
    for (const char *p = list; (p = strstr(p, want)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    nvmlReturn_t r = link_check("nvmlDeviceGetNvLinkState", d, link);
    if (r == NVML_SUCCESS) *active = link_down(d->index, link) ? 0 : 1;
    return r;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t d, unsigned int link, unsigned int *v) {
    nvmlReturn_t r = link_check("nvmlDeviceGetNvLinkVersion", d, link);
    if (r == NVML_SUCCESS) *v = 6;
    return r;
}

/* The VM on the real pair hides the NVSwitch: every remote reads FFFFFFFF:FF:FF.0. */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link,
                                                 nvmlPciInfo_t *p) {
    nvmlReturn_t r = link_check("nvmlDeviceGetNvLinkRemotePciInfo", d, link);
    if (r != NVML_SUCCESS) return r;
    memset(p, 0, sizeof *p);
    p->domain = 0xFFFFFFFFu;
    p->bus = 0xFF;
    p->device = 0xFF;
    snprintf(p->busId, sizeof p->busId, "FFFFFFFF:FF:FF.0");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link,
                                             unsigned int counter, unsigned long long *v) {
    nvmlReturn_t r = link_check("nvmlDeviceGetNvLinkErrorCounter", d, link);
    if (r != NVML_SUCCESS) return r;
    if (counter > 3) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long values[4] = {0, 0, 0, 23};
    const char *file = getenv("FAKE_NVML_NVLINK_COUNTER_FILE");
    FILE *f = file ? fopen(file, "r") : NULL;
    if (f) {
        int gpu, l;
        unsigned long long c[4];
        while (fscanf(f, "%d %d %llu %llu %llu %llu", &gpu, &l, &c[0], &c[1], &c[2], &c[3]) == 6)
            if (gpu == d->index && l == (int)link) memcpy(values, c, sizeof values);
        fclose(f);
    }
    *v = values[counter];
    return NVML_SUCCESS;
}

/* c_nvmlGpuFabricInfo_t and c_nvmlGpuFabricInfo_v2_t of pynvml. */
typedef struct {
    uint8_t clusterUuid[16];
    nvmlReturn_t status;
    uint32_t cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    uint8_t clusterUuid[16];
    nvmlReturn_t status;
    uint32_t cliqueId;
    unsigned int state;
    uint32_t healthMask;
} nvmlGpuFabricInfo_v2_t;

#define NVML_GPU_FABRIC_INFO_V2 ((2u << 24) | (unsigned int)sizeof(nvmlGpuFabricInfo_v2_t))

/* state: 1 not started, 2 in progress, 3 completed; status: 999 for "failed". */
static nvmlReturn_t fabric(unsigned int *state, nvmlReturn_t *status) {
    char buf[32];
    const char *mode = setting("FAKE_NVML_FABRIC", buf, sizeof buf);
    *status = NVML_SUCCESS;
    if (!mode || !*mode || strcmp(mode, "not_supported") == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (strcmp(mode, "not_started") == 0) *state = 1;
    else if (strcmp(mode, "in_progress") == 0) *state = 2;
    else if (strcmp(mode, "completed") == 0) *state = 3;
    else if (strcmp(mode, "failed") == 0) { *state = 3; *status = 999; }
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *info) {
    maybe_hang("nvmlDeviceGetGpuFabricInfo", d->index);
    unsigned int state = 0;
    nvmlReturn_t status, r = fabric(&state, &status);
    if (r != NVML_SUCCESS) return r;
    memset(info, 0, sizeof *info);
    info->state = state;
    info->status = status;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfo_v2_t *info) {
    maybe_hang("nvmlDeviceGetGpuFabricInfoV", d->index);
    if (env_int("FAKE_NVML_FABRIC_V1_ONLY", 0)) return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND */
    /* The real driver crashed the caller on an unset version: refuse it loudly here. */
    if (info->version != NVML_GPU_FABRIC_INFO_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int state = 0;
    nvmlReturn_t status, r = fabric(&state, &status);
    if (r != NVML_SUCCESS) return r;
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    info->state = state;
    info->status = status;
    info->cliqueId = 0;
    info->healthMask = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, unsigned int index,
                                    unsigned int *status) {
    maybe_hang("nvmlDeviceGetP2PStatus", a->index);
    if (a == b || index > 4) return NVML_ERROR_INVALID_ARGUMENT;
    const char *calls = getenv("FAKE_NVML_P2P_CALLS");
    if (calls) {
        FILE *f = fopen(calls, "a");
        if (f) { fprintf(f, "%d %d %u\n", a->index, b->index, index); fclose(f); }
    }
    char buf[32];
    const char *mode = setting("FAKE_NVML_P2P", buf, sizeof buf);
    if (mode && strcmp(mode, "error") == 0) return 999; /* NVML_ERROR_UNKNOWN */
    if (mode && strcmp(mode, "not_supported") == 0)
        *status = index == 2 ? 5 : 1; /* NVLink: not supported; the rest: chipset */
    else
        *status = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    maybe_hang("nvmlDeviceGetMigMode", d->index);
    *current = 0;
    *pending = env_int("FAKE_NVML_MIG_PENDING", 0) ? 1 : 0;
    return NVML_SUCCESS;
}

/* c_nvmlFieldValue_t of pynvml. */
typedef struct {
    uint32_t fieldId;
    uint32_t scopeId;
    int64_t timestamp;
    int64_t latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; } value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    maybe_hang("nvmlDeviceGetFieldValues", d->index);
    for (int i = 0; i < count; i++) {
        values[i].latencyUsec = 0;
        values[i].timestamp = 0;
        if (values[i].fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            int only = env_int("FAKE_NVML_RECOVERY_GPU", -1);
            values[i].valueType = 1; /* unsigned int */
            values[i].value.ull = 0;
            values[i].value.ui = (only < 0 || only == d->index)
                ? (unsigned int)env_int("FAKE_NVML_RECOVERY", 0) : 0;
            values[i].nvmlReturn = NVML_SUCCESS;
        } else if (values[i].fieldId == NVML_FI_DEV_MEMORY_TEMP) {
            values[i].valueType = 1; /* unsigned int */
            values[i].value.ull = 0;
            values[i].value.ui = (unsigned int)env_int("FAKE_NVML_MEM_TEMP", 35);
            values[i].nvmlReturn = NVML_SUCCESS;
        } else {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* type: 0 graphics, 1 SM, 2 memory. */
static nvmlReturn_t app_clock(int type, unsigned int sm, unsigned int *mhz) {
    if (type == 0 || type == 1) *mhz = sm;
    else if (type == 2) *mhz = 3201;
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz) {
    maybe_hang("nvmlDeviceGetApplicationsClock", d->index);
    return app_clock(type, (unsigned int)env_int("FAKE_NVML_APP_CLOCK_SM", 1980), mhz);
}

nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz) {
    maybe_hang("nvmlDeviceGetDefaultApplicationsClock", d->index);
    return app_clock(type, 1980, mhz);
}

static int inforom_corrupted(int gpu) {
    const char *mode = getenv("FAKE_NVML_INFOROM");
    const char *file = getenv("FAKE_NVML_INFOROM_FILE");
    int on = (mode && strcmp(mode, "corrupted") == 0) || (file && access(file, F_OK) == 0);
    if (!on) return 0;
    int only = env_int("FAKE_NVML_INFOROM_GPU", -1);
    return only < 0 || only == gpu;
}

nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t d) {
    maybe_hang("nvmlDeviceValidateInforom", d->index);
    int ms = env_int("FAKE_NVML_INFOROM_MS", 0);
    if (ms > 0) {
        struct timespec wait = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&wait, NULL);
    }
    const char *calls = getenv("FAKE_NVML_INFOROM_CALLS");
    if (calls) {
        FILE *f = fopen(calls, "a");
        if (f) { fprintf(f, "%d %d %d\n", d->index, (int)getpid(), (int)getppid()); fclose(f); }
    }
    return inforom_corrupted(d->index) ? 14 : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t d, char *v, unsigned int len) {
    maybe_hang("nvmlDeviceGetInforomImageVersion", d->index);
    const char *image = getenv("FAKE_NVML_INFOROM_IMAGE");
    return copy(v, len, image ? image : "G520.0282.02.02");  /* the real H200's */
}

/* objects: 0 OEM, 1 ECC, 2 power (the real H200: 2.1, 7.16, N/A) */
nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t d, int object, char *v, unsigned int len) {
    if (object == 1 && inforom_corrupted(d->index)) return 14;
    if (object == 0) return copy(v, len, "2.1");
    if (object == 1) return copy(v, len, "7.16");
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t d, char *version) {
    maybe_hang("nvmlDeviceGetGspFirmwareVersion", d->index);
    strcpy(version, "580.159.04"); /* pynvml passes NVML_GSP_FIRMWARE_VERSION_BUF_SIZE (64) */
    return NVML_SUCCESS;
}

/* Per-process accounting (FAKE_NVML_PROCS_FILE): nvidia-ml-py calls the _v3 symbol with
 * c_nvmlProcessInfo_v3_t {uint pid; ulonglong usedGpuMemory; uint gpuInstanceId;
 * uint computeInstanceId}; first with a NULL array to learn the count. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define MIB (1024ULL * 1024ULL)

/* The file's lines for GPU `gpu`, at most `max` of them into pids/used; returns how many
 * lines the GPU has (-1 when the switch is off). */
static int read_procs(int gpu, unsigned int *pids, unsigned long long *used, int max) {
    const char *file = getenv("FAKE_NVML_PROCS_FILE");
    if (!file) return -1;
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    int n = 0, g;
    unsigned int pid;
    unsigned long long mib;
    while (fscanf(f, "%d %u %llu", &g, &pid, &mib) == 3) {
        if (g != gpu) continue;
        if (n < max) {
            pids[n] = pid;
            used[n] = mib * MIB;
        }
        n++;
    }
    fclose(f);
    return n;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    maybe_hang("nvmlDeviceGetComputeRunningProcesses", d->index);
    unsigned int pids[256];
    unsigned long long used[256];
    int n = read_procs(d->index, pids, used, 256);
    if (n < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (n > 256) n = 256;
    if (infos == NULL || *count < (unsigned int)n) {
        unsigned int had = *count;
        *count = (unsigned int)n;
        return n == 0 && had == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = used[i];
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

/* Memory info: with FAKE_NVML_PROCS_FILE, used is the sum of the GPU's processes; else
 * FAKE_NVML_MEM_TOTAL_MIB and FAKE_NVML_MEM_USED_MIB; with neither, not supported. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    unsigned int pids[256];
    unsigned long long used[256];
    int n = read_procs(d->index, pids, used, 256);
    if (n < 0) {
        int total = env_int("FAKE_NVML_MEM_TOTAL_MIB", 0);
        if (total <= 0) return NVML_ERROR_NOT_SUPPORTED;
        m->total = (unsigned long long)total * MIB;
        m->used = (unsigned long long)env_int("FAKE_NVML_MEM_USED_MIB", 0) * MIB;
        m->free = m->total - m->used;
        return NVML_SUCCESS;
    }
    if (n > 256) n = 256;
    m->total = (unsigned long long)env_int("FAKE_NVML_MEM_TOTAL_MIB", 143771) * MIB;
    m->used = 0;
    for (int i = 0; i < n; i++) m->used += used[i];
    if (m->used > m->total) m->used = m->total;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* --- a GPU under load (FAKE_NVML_LOAD, FAKE_NVML_LATER_*, FAKE_NVML_XID) ------------- */

#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_FUNCTION_NOT_FOUND 13

static unsigned long long env_ull(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : fallback;  /* base 0: 0x8 works */
}

/* Whether the LATER values are in force on GPU `gpu` now. */
static int later(int gpu) {
    int only = env_int("FAKE_NVML_LATER_GPU", -1);
    if (only >= 0 && only != gpu) return 0;
    return init_at >= 0 && (now_s() - init_at) * 1000.0 >= env_int("FAKE_NVML_LATER_MS", 0);
}

static nvmlReturn_t load_call(const char *fn, nvmlDevice_t d) {
    maybe_hang(fn, d->index);
    if (!env_int("FAKE_NVML_LOAD", 0)) return NVML_ERROR_FUNCTION_NOT_FOUND;
    return env_int("FAKE_NVML_LOST_GPU", -1) == d->index ? 15 : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = load_call("nvmlDeviceGetPowerUsage", d);
    if (r == NVML_SUCCESS) *mw = (unsigned int)env_ull("FAKE_NVML_POWER_MW", 690000);
    return r;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = load_call("nvmlDeviceGetEnforcedPowerLimit", d);
    if (r == NVML_SUCCESS) *mw = (unsigned int)env_ull("FAKE_NVML_POWER_LIMIT_MW", 700000);
    return r;
}

/* type: 0 graphics, 1 SM, 2 memory. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    nvmlReturn_t r = load_call("nvmlDeviceGetClockInfo", d);
    if (r != NVML_SUCCESS) return r;
    if (type == 0 || type == 1) *mhz = (unsigned int)env_int("FAKE_NVML_CLOCK_SM", 1470);
    else if (type == 2) *mhz = (unsigned int)env_int("FAKE_NVML_CLOCK_MEM", 3201);
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *bits) {
    nvmlReturn_t r = load_call("nvmlDeviceGetCurrentClocksEventReasons", d);
    if (r != NVML_SUCCESS) return r;
    *bits = env_ull("FAKE_NVML_REASONS", 0x4);
    if (later(d->index)) *bits |= env_ull("FAKE_NVML_LATER_REASONS", 0);
    return NVML_SUCCESS;
}

/* type: 0 corrected, 1 uncorrected; volatile and aggregate counters read the same. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *count) {
    nvmlReturn_t r = load_call("nvmlDeviceGetTotalEccErrors", d);
    (void)counter;
    if (r != NVML_SUCCESS) return r;
    if (type != 0 && type != 1) return NVML_ERROR_INVALID_ARGUMENT;
    *count = env_ull(type == 0 ? "FAKE_NVML_ECC_CORRECTED" : "FAKE_NVML_ECC_UNCORRECTED", 0);
    if (later(d->index))
        *count += env_ull(type == 0 ? "FAKE_NVML_LATER_CORRECTED" : "FAKE_NVML_LATER_UNCORRECTED",
                          0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    nvmlReturn_t r = load_call("nvmlDeviceGetRemappedRows", d);
    if (r != NVML_SUCCESS) return r;
    *corr = *unc = 0;
    *pending = env_int("FAKE_NVML_REMAP_PENDING", 0)
        || (later(d->index) && env_int("FAKE_NVML_LATER_REMAP_PENDING", 0));
    *failure = env_int("FAKE_NVML_REMAP_FAILED", 0) ? 1 : 0;
    return NVML_SUCCESS;
}

/* c_nvmlEventData_t of pynvml; the event set is an opaque pointer. */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef void *nvmlEventSet_t;
static int event_set;
static int xid_delivered;

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (env_int("FAKE_NVML_XID", 0) <= 0) return NVML_ERROR_FUNCTION_NOT_FOUND;
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      nvmlEventSet_t set) {
    (void)types; (void)set;
    maybe_hang("nvmlDeviceRegisterEvents", d->index);
    return NVML_SUCCESS;
}

/* The one Xid when it is due (within this wait), else NVML_ERROR_TIMEOUT after the wait. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeout_ms) {
    (void)set;
    double wait = timeout_ms / 1000.0;
    double left = init_at + env_int("FAKE_NVML_LATER_MS", 0) / 1000.0 - now_s();
    if (!xid_delivered && left <= wait) {
        int gpu = env_int("FAKE_NVML_LATER_GPU", 0);
        if (gpu < 0 || gpu >= 64) gpu = 0;
        sleep_s(left);
        xid_delivered = 1;
        memset(data, 0, sizeof *data);
        devices[gpu].index = gpu;
        data->device = &devices[gpu];
        data->eventType = 0x8; /* nvmlEventTypeXidCriticalError */
        data->eventData = (unsigned long long)env_int("FAKE_NVML_XID", 0);
        return NVML_SUCCESS;
    }
    sleep_s(wait);
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    (void)set;
    return NVML_SUCCESS;
}
