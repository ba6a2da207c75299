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
 *   FAKE_NVML_TEMP=C           GPU temperature (default 40)
 *   FAKE_NVML_WIDTH=N          current PCIe link width (default 16; max is 16)
 *   FAKE_NVML_UTIL=P           GPU utilization percent (default 0)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct { int index; } fake_device;
typedef fake_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3

static fake_device devices[64];

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static void maybe_hang(const char *fn, int gpu) {
    const char *target = getenv("FAKE_NVML_HANG");
    if (!target || strcmp(target, fn) != 0) return;
    int only = env_int("FAKE_NVML_HANG_GPU", -1);
    if (only >= 0 && only != gpu) return;
    const char *file = getenv("FAKE_NVML_HANG_FILE");
    if (!file) for (;;) pause();
    while (access(file, F_OK) == 0) usleep(20000);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    maybe_hang("nvmlInit", -1);
    return env_int("FAKE_NVML_INIT_ERROR", NVML_SUCCESS);
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
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
    maybe_hang("nvmlSystemGetDriverVersion", -1);
    return copy(v, len, "580.159.04");
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
    return copy(v, len, "13.580.159.04");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = (unsigned int)env_int("FAKE_NVML_GPUS", 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    if (index >= 64) return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].index = (int)index;
    *dev = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *v, unsigned int len) {
    char buf[80];
    maybe_hang("nvmlDeviceGetUUID", d->index);
    snprintf(buf, sizeof buf, "GPU-fa4e0000-0000-0000-0000-%012d", d->index);
    return copy(v, len, buf);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int len) {
    (void)d;
    return copy(v, len, "NVIDIA H200");
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
    (void)d;
    switch (which) {
    case 0: *t = 95; return NVML_SUCCESS;  /* shutdown */
    case 1: *t = 89; return NVML_SUCCESS;  /* slowdown */
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
