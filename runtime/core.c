/* core.c — the small shared pieces of the runtime: status and dtype names, arrays, the
 * clock of step timings and profiles. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdarg.h>
#include <stdio.h>

#include "kiln_model.h"
#include "rt_internal.h"

/* kiln_gemm.h's half-precision panel buffer: one per thread, made at its first product and
 * kept; out of memory ends the program, as the product cannot go on. */
float *krt_hgemm_buffer(size_t floats)
{
    static _Thread_local float *buffer;
    if (!buffer) {
        buffer = (float *)malloc(sizeof(float) * floats);
        if (!buffer) {
            fprintf(stderr, "kiln: out of memory (the half-precision matrix products' panel buffer)\n");
            exit(1);
        }
    }
    return buffer;
}

double kiln_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kiln_profile_mark(kiln_profile *p, int k)
{
    double t = kiln_now();
    p->seconds[k] += t - p->last;
    p->last = t;
}

const char *krt_status_name(krt_status s)
{
    switch (s) {
    case KRT_OK: return "ok";
    case KRT_EIO: return "I/O error";
    case KRT_EFORMAT: return "bad format";
    case KRT_EINVAL: return "invalid value";
    case KRT_ENOMEM: return "out of memory";
    case KRT_ENOSPC: return "disk full";
    case KRT_EMISMATCH: return "mismatch";
    }
    return "unknown status";
}

size_t krt_dtype_size(krt_dtype t)
{
    static const size_t sizes[KRT_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
    return t < KRT_DTYPE_COUNT ? sizes[t] : 0;
}

const char *krt_dtype_name(krt_dtype t)
{
    static const char *names[KRT_DTYPE_COUNT] = {"bool", "u8", "i32", "i64", "f16", "bf16", "f32", "f64"};
    return t < KRT_DTYPE_COUNT ? names[t] : "?";
}

void krt_array_free(krt_array *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

int64_t krt_array_count(const krt_array *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->rank; i++) n *= a->dims[i];
    return n;
}

krt_status krt_fail(krt_error *err, krt_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

krt_status krt_fail_errno(krt_error *err, int e, const char *path, const char *what)
{
    bool full = e == ENOSPC;
#ifdef EDQUOT
    full = full || e == EDQUOT;
#endif
    return krt_fail(err, full ? KRT_ENOSPC : KRT_EIO, "%s: %s: %s%s", path, what, strerror(e), full ? " (disk full)" : "");
}

krt_status krt_ok(krt_error *err)
{
    if (err) {
        err->code = KRT_OK;
        err->msg[0] = '\0';
    }
    return KRT_OK;
}
