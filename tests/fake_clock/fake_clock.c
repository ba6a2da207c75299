/*
 * A wall clock set elsewhere, for one process tree only: preloaded (LD_PRELOAD), it
 * offsets CLOCK_REALTIME, as NTP stepping the host's clock or a VM restored from a
 * snapshot would, and leaves every other clock alone (CLOCK_MONOTONIC, CLOCK_BOOTTIME:
 * shifting those too would prove nothing). Python's time.time(), datetime.now() and
 * the C library's time() and gettimeofday() all go through the three functions below.
 *
 * Environment switches:
 *   FAKE_CLOCK_OFFSET=S        seconds added to the wall clock (may be negative or
 *                              fractional; default 0)
 *   FAKE_CLOCK_OFFSET_FILE=path  ... read from this file instead (text, seconds), again
 *                              at most every 20 ms: a test steps the clock of a running
 *                              process by writing it; no file or no number: 0
 *
 * The real clock_gettime is the next one in the link order (dlsym RTLD_NEXT).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static const char *offset_file;
static long long offset_ns;        /* read and written with __atomic: many threads */
static long long next_read_ns;     /* CLOCK_MONOTONIC time of the file's next read */

static long long seconds_to_ns(const char *text) {
    char *end;
    double s = strtod(text, &end);
    return end == text ? 0 : (long long)(s * 1e9);
}

__attribute__((constructor)) static void fake_clock_init(void) {
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    const char *fixed = getenv("FAKE_CLOCK_OFFSET");
    offset_file = getenv("FAKE_CLOCK_OFFSET_FILE");
    if (offset_file && !*offset_file) offset_file = NULL;
    if (fixed && *fixed) __atomic_store_n(&offset_ns, seconds_to_ns(fixed), __ATOMIC_RELAXED);
}

static long long current_offset(void) {
    if (!offset_file) return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
    struct timespec mono;
    real_clock_gettime(CLOCK_MONOTONIC, &mono);
    long long now = mono.tv_sec * 1000000000LL + mono.tv_nsec;
    if (now >= __atomic_load_n(&next_read_ns, __ATOMIC_RELAXED)) {
        __atomic_store_n(&next_read_ns, now + 20000000LL, __ATOMIC_RELAXED);
        char buf[64] = {0};
        long long value = 0;
        int fd = open(offset_file, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t got = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (got > 0) value = seconds_to_ns(buf);
        }
        __atomic_store_n(&offset_ns, value, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    long long t = ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset();
    ts->tv_sec = t / 1000000000LL;
    ts->tv_nsec = t % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) fake_clock_init();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {  /* tv is declared nonnull */
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
