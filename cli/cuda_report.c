/* cuda_report.c — cuda_report.h: model.cu's kernels through NVRTC in cached pieces on all
 * cores, and ptxas's report of them as a table. */
#include "cuda_report.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/rt_internal.h" /* the caches' bound */
#include "cache_entry.h"
#include "../codegen/cuda_device.h"
#include "pieces.h"

const char *const cuda_report_arch[CUDA_REPORT_NARCH] = {"sm_80", "sm_90"};

/* The kernels go to NVRTC in pieces, each the common part (includes, __device__ functions,
 * templates) and a group of kernels, compiled on all cores and cached by their text (the
 * #line directives left out: a kernel that only moved compiles to the same CUBIN), the
 * NVRTC version, the architecture and the options. A group ends after a kernel whose text
 * hashes to 0 mod SPLIT, or at MAX kernels: the boundaries depend on the kernels' own code,
 * so that a changed kernel changes its piece alone. NVRTC's own cost is 30-50 ms a program;
 * gpt's kernels take about 50 ms each. */
#define CUDA_PIECE_SPLIT 8
#define CUDA_PIECE_MAX 12

typedef struct {
    const char *text;          /* the piece's source */
    const char *const *names;  /* name expressions: the template instances, in piece 0 */
    int nnames;
    const char *arch;
    char *entry;               /* its cache entry, NULL without a cache */
    char *log;                 /* ptxas's report (or NVRTC's errors) */
    int rc;
    bool cached;
} Task;

typedef struct {
    Task *tasks;
    int ntasks, next;
    const char *file_name;
    pthread_mutex_t mu;
} Queue;

static const char *const nvrtc_options[] = {"-I" KILN_RUNTIME_DIR "/cuda", "-I" KILN_RUNTIME_DIR};
#define NVRTC_NOPTIONS 2

/* A cache entry of a compiled piece: "KNVRTC1\n", the log's length (8 bytes), the log,
 * the CUBIN. */
static const char entry_magic[8] = {'K', 'N', 'V', 'R', 'T', 'C', '1', '\n'};

static char *task_entry(const char *dir, const Task *t)
{
    StrBuf key;
    sb_init(&key);
    sb_printf(&key, "kiln-nvrtc-1\n%s\n%s\n", nvrtc_version(), t->arch);
    for (int i = 0; i < NVRTC_NOPTIONS; i++) sb_printf(&key, "%s\n", nvrtc_options[i]);
    for (int i = 0; i < t->nnames; i++) sb_printf(&key, "name %s\n", t->names[i]);
    for (const char *l = t->text; *l;) { /* the text without its #line directives */
        size_t n = strcspn(l, "\n");
        if (strncmp(l, "#line ", 6)) sb_putn(&key, l, n + (l[n] == '\n'));
        l += n + (l[n] == '\n');
    }
    uint64_t h[2] = {0, 0};
    pieces_hash128(key.data, key.len, h);
    sb_free(&key);
    StrBuf path;
    sb_init(&path);
    sb_printf(&path, "%s/%016llx%016llx.nvrtc", dir, (unsigned long long)h[0], (unsigned long long)h[1]);
    return sb_take(&path);
}

static void run_task(Task *t, int index, const char *file_name)
{
    if (t->entry) {
        size_t len;
        char *bytes = cache_entry_read(t->entry, &len, false);
        uint64_t loglen;
        if (bytes && len >= 16 && !memcmp(bytes, entry_magic, 8) && (memcpy(&loglen, bytes + 8, 8), loglen <= len - 16)) {
            t->log = xstrndup(bytes + 16, (size_t)loglen);
            t->cached = true;
            free(bytes);
            utimensat(AT_FDCWD, t->entry, NULL, 0); /* recently used */
            return;
        }
        free(bytes);
    }
    NvrtcOutput out;
    t->rc = nvrtc_compile(t->text, file_name, t->arch, nvrtc_options, NVRTC_NOPTIONS, t->names, t->nnames, &out);
    t->log = out.log ? xstrdup(out.log) : xstrdup("");
    if (!t->rc && t->entry) {
        StrBuf e;
        sb_init(&e);
        const uint64_t loglen = strlen(t->log);
        sb_putn(&e, entry_magic, 8);
        sb_putn(&e, (const char *)&loglen, 8);
        sb_putn(&e, t->log, (size_t)loglen);
        sb_putn(&e, out.image, out.size);
        if (cache_entry_store(t->entry, e.data, e.len, index) != 0) {
            free(t->entry);
            t->entry = NULL; /* not stored: not counted */
        }
        sb_free(&e);
    }
    nvrtc_output_free(&out);
}

static void *worker(void *arg)
{
    Queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int k = q->next < q->ntasks ? q->next++ : -1;
        pthread_mutex_unlock(&q->mu);
        if (k < 0) return NULL;
        run_task(&q->tasks[k], k, q->file_name);
    }
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
    /* the pieces' texts */
    char **pieces = NULL;
    int npieces = 0;
    StrBuf cur;
    sb_init(&cur);
    int in_cur = 0;
    for (int i = 0; i <= src.nkernel_texts; i++) {
        const bool last = i == src.nkernel_texts;
        if (!last) {
            if (!in_cur) sb_putn(&cur, src.common.data ? src.common.data : "", src.common.len);
            sb_puts(&cur, src.kernels[i]);
            in_cur++;
            const char *body = strchr(src.kernels[i], '\n'); /* after its #line */
            body = body ? body : "";
            if (!pieces_group_ends(body, body + strlen(body), CUDA_PIECE_SPLIT, in_cur, CUDA_PIECE_MAX)) continue;
        } else if (!in_cur && npieces) {
            break;
        } else if (!in_cur) { /* no kernel but templates: the common part alone */
            sb_putn(&cur, src.common.data ? src.common.data : "", src.common.len);
        }
        pieces = xrealloc(pieces, (size_t)(npieces + 1) * sizeof *pieces);
        pieces[npieces++] = sb_take(&cur);
        in_cur = 0;
    }
    sb_free(&cur);
    /* a task for every piece and architecture */
    char *dir = cache_dir("cuda");
    Queue q = {.ntasks = npieces * CUDA_REPORT_NARCH, .file_name = file_name};
    q.tasks = xcalloc((size_t)q.ntasks + 1, sizeof *q.tasks);
    for (int k = 0; k < CUDA_REPORT_NARCH; k++)
        for (int i = 0; i < npieces; i++) {
            Task *t = &q.tasks[k * npieces + i];
            t->text = pieces[i];
            t->arch = cuda_report_arch[k];
            if (i == 0) t->names = (const char *const *)src.names, t->nnames = src.nnames;
            t->entry = dir ? task_entry(dir, t) : NULL;
        }
    pthread_mutex_init(&q.mu, NULL);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = ncpu > 0 ? (int)ncpu : 1;
    if (nt > q.ntasks) nt = q.ntasks;
    pthread_t *threads = xcalloc((size_t)nt + 1, sizeof *threads);
    bool *started = xcalloc((size_t)nt + 1, sizeof *started);
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&threads[t], NULL, worker, &q) == 0;
    worker(&q);
    for (int t = 1; t < nt; t++)
        if (started[t]) pthread_join(threads[t], NULL);
    pthread_mutex_destroy(&q.mu);
    free(threads);
    free(started);
    r->seconds = now() - t0;
    r->npieces = npieces;
    int rc = 0;
    long long stored = 0;
    for (int k = 0; k < CUDA_REPORT_NARCH && !rc; k++) {
        StrBuf log; /* the architecture's pieces' reports, in order */
        sb_init(&log);
        for (int i = 0; i < npieces; i++) {
            const Task *t = &q.tasks[k * npieces + i];
            if (t->rc) {
                sb_printf(err, "%s failed on %s's kernels for %s:\n%s", nvrtc_version()[0] ? nvrtc_version() : "NVRTC", file_name, t->arch,
                          t->log ? t->log : "");
                rc = -1;
                break;
            }
            sb_puts(&log, t->log);
            sb_putc(&log, '\n');
        }
        if (!rc) {
            NvrtcKernelReport *v;
            int n = nvrtc_report(log.data ? log.data : "", &v);
            r->kernels = xrealloc(r->kernels, (size_t)(r->nkernels + n + 1) * sizeof *r->kernels);
            memcpy(r->kernels + r->nkernels, v, (size_t)n * sizeof *v);
            free(v);
            r->nkernels += n;
            r->kernels_per_arch[k] = n;
        }
        sb_free(&log);
    }
    for (int i = 0; i < q.ntasks; i++) {
        Task *t = &q.tasks[i];
        r->cached += t->cached;
        if (t->entry && !t->cached && !t->rc) {
            struct stat st;
            if (stat(t->entry, &st) == 0) stored += (long long)st.st_size;
        }
        free(t->entry);
        free(t->log);
    }
    if (dir && stored) cache_account(dir, stored, krt_cache_max_bytes());
    free(dir);
    free(q.tasks);
    if (!rc) /* each architecture's kernels in model.cu's order (ptxas reports them backwards) */
        for (int k = 0, at = 0; k < CUDA_REPORT_NARCH; at += r->kernels_per_arch[k++])
            sort_by_definition(r->kernels + at, r->kernels_per_arch[k], src.text.data ? src.text.data : "");
    for (int i = 0; i < r->nkernels; i++) {
        const NvrtcKernelReport *t = &r->kernels[i];
        r->spilling += t->spill_stores > 0 || t->spill_loads > 0;
        r->stack += t->stack > 0;
    }
    for (int i = 0; i < npieces; i++) free(pieces[i]);
    free(pieces);
    cuda_device_source_free(&src);
    if (rc) cuda_report_free(r);
    return rc;
}

void cuda_report_format(const CudaReport *r, StrBuf *out)
{
    const int n0 = r->kernels_per_arch[0];
    sb_printf(out, "device code: %d kernel%s compiled by %s for", n0, n0 == 1 ? "" : "s", nvrtc_version());
    for (int k = 0; k < CUDA_REPORT_NARCH; k++) sb_printf(out, "%s %s", k ? (k == CUDA_REPORT_NARCH - 1 ? " and" : ",") : "", cuda_report_arch[k]);
    sb_printf(out, " in %.2f s, %d piece%s of %d from the cache (registers; bytes spilled, of stack frame, of shared memory)\n", r->seconds,
              r->cached, r->cached == 1 ? "" : "s", r->npieces * CUDA_REPORT_NARCH);
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
