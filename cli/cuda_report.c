/* cuda_report.c — cuda_report.h: model.cu's kernels through NVRTC, one thread an
 * architecture, and ptxas's report of them as a table. */
#include "cuda_report.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_device.h"

const char *const cuda_report_arch[CUDA_REPORT_NARCH] = {"sm_80", "sm_90"};

typedef struct {
    const CudaDeviceSource *src;
    const char *file_name, *arch;
    NvrtcOutput out;
    int rc;
} ArchCompile;

static void *compile_arch(void *arg)
{
    ArchCompile *a = arg;
    const char *const options[] = {"-I" KILN_RUNTIME_DIR "/cuda", "-I" KILN_RUNTIME_DIR};
    a->rc = nvrtc_compile(a->src->text.data ? a->src->text.data : "", a->file_name, a->arch, options, 2, (const char *const *)a->src->names,
                          a->src->nnames, &a->out);
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Where the kernel is defined in the device source: " NAME(" (a template's instance at
 * its template's); the end when it is not found. */
static size_t definition_at(const char *text, const char *name)
{
    size_t n = strcspn(name, "<");
    for (const char *p = strstr(text, name); p; p = strstr(p + 1, name))
        if (p > text && p[-1] == ' ' && !strncmp(p, name, n) && p[n] == '(') return (size_t)(p - text);
    return strlen(text);
}

static void sort_by_definition(NvrtcKernelReport *v, int n, const char *text)
{
    size_t *at = xcalloc((size_t)n + 1, sizeof *at);
    for (int i = 0; i < n; i++) at[i] = definition_at(text, v[i].name);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && at[j - 1] > at[j]; j--) {
            NvrtcKernelReport t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
            size_t u = at[j];
            at[j] = at[j - 1], at[j - 1] = u;
        }
    free(at);
}

int cuda_report_compile(const char *model_cu, size_t len, const char *file_name, CudaReport *r, StrBuf *err)
{
    memset(r, 0, sizeof *r);
    CudaDeviceSource src;
    if (cuda_device_source(model_cu, len, file_name, &src, err)) return -1;
    r->nglobal = src.nkernels;
    r->ninstances = src.nnames;
    r->ntemplates = src.ntemplates;
    const double t0 = now();
    ArchCompile a[CUDA_REPORT_NARCH];
    pthread_t threads[CUDA_REPORT_NARCH];
    bool started[CUDA_REPORT_NARCH];
    for (int k = 0; k < CUDA_REPORT_NARCH; k++) {
        a[k] = (ArchCompile){.src = &src, .file_name = file_name, .arch = cuda_report_arch[k]};
        started[k] = k > 0 && pthread_create(&threads[k], NULL, compile_arch, &a[k]) == 0;
    }
    for (int k = 0; k < CUDA_REPORT_NARCH; k++)
        if (!started[k]) compile_arch(&a[k]);
    for (int k = 0; k < CUDA_REPORT_NARCH; k++)
        if (started[k]) pthread_join(threads[k], NULL);
    r->seconds = now() - t0;
    int rc = 0;
    for (int k = 0; k < CUDA_REPORT_NARCH; k++) {
        if (a[k].rc && !rc) {
            sb_printf(err, "%s failed on %s's kernels for %s:\n%s", nvrtc_version()[0] ? nvrtc_version() : "NVRTC", file_name, a[k].arch, a[k].out.log ? a[k].out.log : "");
            rc = -1;
        }
        if (!a[k].rc) {
            NvrtcKernelReport *v;
            int n = nvrtc_report(a[k].out.log, &v);
            r->kernels = xrealloc(r->kernels, (size_t)(r->nkernels + n + 1) * sizeof *r->kernels);
            memcpy(r->kernels + r->nkernels, v, (size_t)n * sizeof *v);
            free(v);
            r->nkernels += n;
            r->kernels_per_arch[k] = n;
        }
        nvrtc_output_free(&a[k].out);
    }
    /* each architecture's kernels in model.cu's order (ptxas reports them backwards) */
    for (int k = 0, at = 0; k < CUDA_REPORT_NARCH; at += r->kernels_per_arch[k++])
        sort_by_definition(r->kernels + at, r->kernels_per_arch[k], src.text.data ? src.text.data : "");
    for (int i = 0; i < r->nkernels; i++) {
        const NvrtcKernelReport *q = &r->kernels[i];
        r->spilling += q->spill_stores > 0 || q->spill_loads > 0;
        r->stack += q->stack > 0;
    }
    cuda_device_source_free(&src);
    if (rc) cuda_report_free(r);
    return rc;
}

void cuda_report_format(const CudaReport *r, StrBuf *out)
{
    const int n0 = r->kernels_per_arch[0];
    sb_printf(out, "device code: %d kernel%s compiled by %s for", n0, n0 == 1 ? "" : "s", nvrtc_version());
    for (int k = 0; k < CUDA_REPORT_NARCH; k++) sb_printf(out, "%s %s", k ? (k == CUDA_REPORT_NARCH - 1 ? " and" : ",") : "", cuda_report_arch[k]);
    sb_printf(out, " in %.2f s (registers; bytes spilled, of stack frame, of shared memory)\n", r->seconds);
    sb_printf(out, "  %-44s", "kernel");
    for (int k = 0; k < CUDA_REPORT_NARCH; k++) sb_printf(out, "  %5s: regs spill stack  smem", cuda_report_arch[k]);
    sb_putc(out, '\n');
    /* a line per kernel of the first architecture, the others' report of it beside */
    for (int i = 0; i < n0; i++) {
        const NvrtcKernelReport *q = &r->kernels[i];
        sb_printf(out, "  %-44s", q->name);
        int at = 0;
        for (int k = 0; k < CUDA_REPORT_NARCH; k++) {
            const NvrtcKernelReport *m = NULL;
            for (int j = at; j < at + r->kernels_per_arch[k] && !m; j++)
                if (!strcmp(r->kernels[j].name, q->name)) m = &r->kernels[j];
            if (m) sb_printf(out, "         %4d %5ld %5ld %5ld", m->registers, m->spill_stores + m->spill_loads, m->stack, m->shared);
            else sb_printf(out, "         %4s %5s %5s %5s", "-", "-", "-", "-");
            at += r->kernels_per_arch[k];
        }
        sb_putc(out, '\n');
    }
    if (!r->spilling && !r->stack) sb_puts(out, "no kernel spills registers or has a stack frame\n");
    for (int pass = 0; pass < 2; pass++) { /* spills, then stack frames (local memory, slow on a GPU) */
        const int count = pass ? r->stack : r->spilling;
        if (!count) continue;
        sb_printf(out, "%s %d kernel%s:", pass ? "a stack frame (local memory) in" : "register spills (local memory) in", count, count == 1 ? "" : "s");
        for (int i = 0; i < r->nkernels; i++) {
            const NvrtcKernelReport *q = &r->kernels[i];
            if (pass ? q->stack > 0 : q->spill_stores > 0 || q->spill_loads > 0) sb_printf(out, " %s (%s)", q->name, q->arch);
        }
        sb_putc(out, '\n');
    }
}

void cuda_report_free(CudaReport *r)
{
    nvrtc_report_free(r->kernels, r->nkernels);
    memset(r, 0, sizeof *r);
}
