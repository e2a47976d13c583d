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
    const char *const *names;  /* name expressions: its kernels (and, in a file's piece 0, the template instances) */
    int nnames;
    const char *arch;
    const char *const *options; /* the file's own NVRTC options */
    int noptions;
    int unit, piece;
    char *entry;               /* its cache entry, NULL without a cache */
    char *log;                 /* ptxas's report (or NVRTC's errors) */
    char *image, *ptx;         /* the CUBIN, the PTX of its compile */
    size_t size, ptx_size;
    char **lowered;            /* the names' mangled names */
    int rc;
    bool cached;
} Task;

typedef struct {
    Task *tasks;
    int ntasks, next;
    const CudaUnit *units;
    pthread_mutex_t mu;
} Queue;

static const char *const nvrtc_include_options[] = {"-I" KILN_RUNTIME_DIR "/cuda", "-I" KILN_RUNTIME_DIR};
#define NVRTC_NINCLUDES 2

/* A cache entry of a compiled piece: "KNVRTC2\n", then the log, the names' mangled names,
 * the CUBIN and the PTX, each an 8-byte length and the bytes (a name ends in its NUL). */
static const char entry_magic[8] = {'K', 'N', 'V', 'R', 'T', 'C', '2', '\n'};

static char *task_entry(const char *dir, const Task *t)
{
    StrBuf key;
    sb_init(&key);
    sb_printf(&key, "kiln-nvrtc-2\n%s\n%s\n", nvrtc_version(), t->arch);
    for (int i = 0; i < NVRTC_NINCLUDES; i++) sb_printf(&key, "%s\n", nvrtc_include_options[i]);
    for (int i = 0; i < t->noptions; i++) sb_printf(&key, "option %s\n", t->options[i]);
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

/* The next field of an entry: its bytes and length; false past the end. */
static bool entry_field(const char *bytes, size_t len, size_t *at, const char **field, size_t *n)
{
    uint64_t k;
    if (len - *at < 8) return false;
    memcpy(&k, bytes + *at, 8);
    *at += 8;
    if (k > len - *at) return false;
    *field = bytes + *at;
    *n = (size_t)k;
    *at += (size_t)k;
    return true;
}

static bool read_entry(Task *t)
{
    size_t len;
    char *bytes = cache_entry_read(t->entry, &len, false);
    if (!bytes || len < 8 || memcmp(bytes, entry_magic, 8)) {
        free(bytes);
        return false;
    }
    size_t at = 8, n[4];
    const char *f[4];
    bool ok = true;
    for (int i = 0; i < 4 && ok; i++) ok = entry_field(bytes, len, &at, &f[i], &n[i]);
    char **lowered = xcalloc((size_t)t->nnames + 1, sizeof *lowered);
    int k = 0;
    for (size_t p = 0; ok && k < t->nnames; k++) { /* the names */
        const char *z = p < n[1] ? memchr(f[1] + p, 0, n[1] - p) : NULL;
        if (!z) break;
        lowered[k] = xstrdup(f[1] + p);
        p = (size_t)(z - f[1]) + 1;
    }
    if (!ok || k < t->nnames) {
        for (int i = 0; i < k; i++) free(lowered[i]);
        free(lowered);
        free(bytes);
        return false;
    }
    t->log = xstrndup(f[0], n[0]);
    t->lowered = lowered;
    t->image = xmalloc(n[2] + 1);
    memcpy(t->image, f[2], n[2]);
    t->size = n[2];
    if (n[3]) {
        t->ptx = xmalloc(n[3]);
        memcpy(t->ptx, f[3], n[3]);
        t->ptx_size = n[3];
    }
    free(bytes);
    return true;
}

static void put_field(StrBuf *e, const void *p, size_t n)
{
    const uint64_t k = n;
    sb_putn(e, (const char *)&k, 8);
    if (n) sb_putn(e, p, n);
}

static void run_task(Task *t, int index, const CudaUnit *u)
{
    if (t->entry && read_entry(t)) {
        t->cached = true;
        utimensat(AT_FDCWD, t->entry, NULL, 0); /* recently used */
        return;
    }
    const char *opts[NVRTC_NINCLUDES + 16];
    int nopts = 0;
    for (int i = 0; i < NVRTC_NINCLUDES; i++) opts[nopts++] = nvrtc_include_options[i];
    for (int i = 0; i < t->noptions && nopts < NVRTC_NINCLUDES + 16; i++) opts[nopts++] = t->options[i];
    NvrtcOutput out;
    t->rc = nvrtc_compile(t->text, u->file, t->arch, opts, nopts, t->names, t->nnames, &out);
    t->log = out.log ? xstrdup(out.log) : xstrdup("");
    if (t->rc) {
        nvrtc_output_free(&out);
        return;
    }
    t->image = out.image, t->size = out.size, out.image = NULL;
    t->ptx = out.ptx, t->ptx_size = out.ptx_size, out.ptx = NULL;
    t->lowered = xcalloc((size_t)t->nnames + 1, sizeof *t->lowered);
    for (int i = 0; i < t->nnames; i++) t->lowered[i] = xstrdup(i < out.nlowered ? out.lowered[i] : "");
    nvrtc_output_free(&out);
    if (t->entry) {
        StrBuf e, names;
        sb_init(&e);
        sb_init(&names);
        for (int i = 0; i < t->nnames; i++) sb_putn(&names, t->lowered[i], strlen(t->lowered[i]) + 1);
        sb_putn(&e, entry_magic, 8);
        put_field(&e, t->log, strlen(t->log));
        put_field(&e, names.data, names.len);
        put_field(&e, t->image, t->size);
        put_field(&e, t->ptx, t->ptx_size);
        if (cache_entry_store(t->entry, e.data, e.len, index) != 0) {
            free(t->entry);
            t->entry = NULL; /* not stored: not counted */
        }
        sb_free(&e);
        sb_free(&names);
    }
}

static void *worker(void *arg)
{
    Queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int k = q->next < q->ntasks ? q->next++ : -1;
        pthread_mutex_unlock(&q->mu);
        if (k < 0) return NULL;
        run_task(&q->tasks[k], k, &q->units[q->tasks[k].unit]);
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

/* A unit's pieces: the common part and a group of kernels each (texts, and the names of
 * their kernels, piece 0 with the template instances). */
static int unit_pieces(const CudaUnit *u, char ***texts, char ****names, int **nnames, StrBuf *err)
{
    const CudaDeviceSource *src = &u->src;
    if (src->nkernel_names != src->nkernel_texts) {
        sb_printf(err, "%s: a kernel whose name cannot be read", u->file);
        return -1;
    }
    int npieces = 0;
    *texts = NULL, *names = NULL, *nnames = NULL;
    StrBuf cur;
    sb_init(&cur);
    int in_cur = 0, first = 0;
    for (int i = 0; i <= src->nkernel_texts; i++) {
        const bool last = i == src->nkernel_texts;
        if (!last) {
            if (!in_cur) sb_putn(&cur, src->common.data ? src->common.data : "", src->common.len), first = i;
            sb_puts(&cur, src->kernels[i]);
            in_cur++;
            const char *body = strchr(src->kernels[i], '\n'); /* after its #line */
            body = body ? body : "";
            if (!pieces_group_ends(body, body + strlen(body), CUDA_PIECE_SPLIT, in_cur, CUDA_PIECE_MAX)) continue;
        } else if (!in_cur && npieces) {
            break;
        } else if (!in_cur) { /* no kernel but templates: the common part alone */
            sb_putn(&cur, src->common.data ? src->common.data : "", src->common.len);
        }
        *texts = xrealloc(*texts, (size_t)(npieces + 1) * sizeof **texts);
        *names = xrealloc(*names, (size_t)(npieces + 1) * sizeof **names);
        *nnames = xrealloc(*nnames, (size_t)(npieces + 1) * sizeof **nnames);
        const int extra = npieces == 0 ? src->nnames : 0;
        char **v = xcalloc((size_t)(in_cur + extra) + 1, sizeof *v);
        for (int k = 0; k < in_cur; k++) v[k] = src->kernel_names[first + k];
        for (int k = 0; k < extra; k++) v[in_cur + k] = src->names[k];
        (*texts)[npieces] = sb_take(&cur);
        (*names)[npieces] = v;
        (*nnames)[npieces] = in_cur + extra;
        npieces++;
        in_cur = 0;
    }
    sb_free(&cur);
    return npieces;
}

int cuda_units_compile(const CudaUnit *units, int nunits, CudaCompiled *c, StrBuf *err)
{
    memset(c, 0, sizeof *c);
    CudaReport *r = &c->report;
    for (int u = 0; u < nunits; u++) {
        r->nglobal += units[u].src.nkernels;
        r->ninstances += units[u].src.nnames;
        r->ntemplates += units[u].src.ntemplates;
    }
    const double t0 = now();
    int *npieces = xcalloc((size_t)nunits + 1, sizeof *npieces), total = 0;
    char ***texts = xcalloc((size_t)nunits + 1, sizeof *texts);
    char ****names = xcalloc((size_t)nunits + 1, sizeof *names);
    int **nnames = xcalloc((size_t)nunits + 1, sizeof *nnames);
    char ***options = xcalloc((size_t)nunits + 1, sizeof *options);
    int *noptions = xcalloc((size_t)nunits + 1, sizeof *noptions);
    int rc = 0;
    for (int u = 0; u < nunits && !rc; u++) {
        npieces[u] = unit_pieces(&units[u], &texts[u], &names[u], &nnames[u], err);
        if (npieces[u] < 0) rc = -1, npieces[u] = 0;
        total += npieces[u];
        util_words_split(units[u].options ? units[u].options : "", &options[u], &noptions[u]);
    }
    /* a task for every piece and architecture */
    char *dir = rc ? NULL : cache_dir("cuda");
    Queue q = {.ntasks = rc ? 0 : total * CUDA_REPORT_NARCH, .units = units};
    q.tasks = xcalloc((size_t)q.ntasks + 1, sizeof *q.tasks);
    for (int k = 0, at = 0; k < CUDA_REPORT_NARCH && !rc; k++)
        for (int u = 0; u < nunits; u++)
            for (int i = 0; i < npieces[u]; i++) {
                Task *t = &q.tasks[at++];
                t->text = texts[u][i];
                t->arch = cuda_report_arch[k];
                t->names = (const char *const *)names[u][i], t->nnames = nnames[u][i];
                t->options = (const char *const *)options[u], t->noptions = noptions[u];
                t->unit = u, t->piece = i;
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
    r->npieces = total;
    long long stored = 0;
    for (int k = 0; k < CUDA_REPORT_NARCH && !rc; k++) {
        StrBuf log; /* the architecture's pieces' reports, in order */
        sb_init(&log);
        for (int i = 0; i < total; i++) {
            const Task *t = &q.tasks[k * total + i];
            if (t->rc) {
                sb_printf(err, "%s failed on %s's kernels for %s:\n%s", nvrtc_version()[0] ? nvrtc_version() : "NVRTC", units[t->unit].file, t->arch,
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
    c->pieces = xcalloc((size_t)q.ntasks + 1, sizeof *c->pieces);
    for (int i = 0; i < q.ntasks; i++) {
        Task *t = &q.tasks[i];
        r->cached += t->cached;
        if (t->entry && !t->cached && !t->rc) {
            struct stat st;
            if (stat(t->entry, &st) == 0) stored += (long long)st.st_size;
        }
        if (!rc) {
            CudaPieceImage *p = &c->pieces[c->npieces++];
            p->unit = t->unit, p->piece = t->piece, p->arch = t->arch;
            p->image = t->image, p->size = t->size, p->ptx = t->ptx, p->ptx_size = t->ptx_size;
            p->nnames = t->nnames, p->lowered = t->lowered;
            p->names = xcalloc((size_t)t->nnames + 1, sizeof *p->names);
            for (int k = 0; k < t->nnames; k++) p->names[k] = xstrdup(t->names[k]);
        } else {
            free(t->image);
            free(t->ptx);
            for (int k = 0; t->lowered && k < t->nnames; k++) free(t->lowered[k]);
            free(t->lowered);
        }
        free(t->entry);
        free(t->log);
    }
    if (dir && stored) cache_account(dir, stored, krt_cache_max_bytes());
    free(dir);
    free(q.tasks);
    if (!rc) /* each architecture's kernels in the files' order (ptxas reports them backwards) */
        for (int k = 0, at = 0; k < CUDA_REPORT_NARCH; at += r->kernels_per_arch[k++]) {
            StrBuf all;
            sb_init(&all);
            for (int u = 0; u < nunits; u++) sb_putn(&all, units[u].src.text.data ? units[u].src.text.data : "", units[u].src.text.len);
            sort_by_definition(r->kernels + at, r->kernels_per_arch[k], all.data ? all.data : "");
            sb_free(&all);
        }
    for (int i = 0; i < r->nkernels; i++) {
        const NvrtcKernelReport *t = &r->kernels[i];
        r->spilling += t->spill_stores > 0 || t->spill_loads > 0;
        r->stack += t->stack > 0;
    }
    for (int u = 0; u < nunits; u++) {
        for (int i = 0; i < npieces[u]; i++) {
            free(texts[u][i]);
            free(names[u][i]);
        }
        free(texts[u]);
        free(names[u]);
        free(nnames[u]);
        util_words_free(options[u], noptions[u]);
    }
    free(texts), free(names), free(nnames), free(options), free(noptions), free(npieces);
    if (rc) cuda_compiled_free(c);
    return rc;
}

void cuda_compiled_free(CudaCompiled *c)
{
    cuda_report_free(&c->report);
    for (int i = 0; i < c->npieces; i++) {
        CudaPieceImage *p = &c->pieces[i];
        free(p->image);
        free(p->ptx);
        for (int k = 0; k < p->nnames; k++) free(p->names[k]), free(p->lowered[k]);
        free(p->names);
        free(p->lowered);
    }
    free(c->pieces);
    memset(c, 0, sizeof *c);
}

int cuda_report_compile(const char *model_cu, size_t len, const char *file_name, CudaReport *r, StrBuf *err)
{
    memset(r, 0, sizeof *r);
    CudaUnit u = {.file = file_name, .options = ""};
    if (cuda_device_source(model_cu, len, file_name, &u.src, err)) return -1;
    CudaCompiled c;
    const int rc = cuda_units_compile(&u, 1, &c, err);
    if (!rc) {
        *r = c.report;
        memset(&c.report, 0, sizeof c.report);
        cuda_compiled_free(&c);
    }
    cuda_device_source_free(&u.src);
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
