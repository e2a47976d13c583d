/* objcache.c — objcache.h: model.c's pieces (pieces.c) compiled on all cores, each piece's
 * object cached under the hash of everything that makes it (its code without comments, the
 * compiler and its version, the flags, the target CPU, the runtime headers). Compiles run
 * on threads: Clang in this process (toolchain.h) or one external compiler process per
 * piece. */
#define _XOPEN_SOURCE 700
#include "objcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../driver/toolchain.h"
#include "build.h"
#include "cache_entry.h"
#include "../runtime/rt_internal.h" /* the caches' bound */
#include "pieces.h"

/* ---- flags ---- */

void objcache_flags(const char *cpu, const char *cflags, bool in_process, char ***words, int *nwords)
{
    char **v = NULL;
    int n = 0;
    if (in_process) {
        util_words_add(&v, &n, "-std=c11");
        /* GCC's rule for ISO C, under which both compilers round every product and sum alike */
        util_words_add(&v, &n, "-ffp-contract=off");
        util_words_add(&v, &n, "-fno-temp-file"); /* the object itself, not a temporary beside it */
    }
    int at = n;
    util_words_split(KILN_DEFAULT_CFLAGS, &v, &n);
    if (cpu && *cpu) {
        char march[200];
        snprintf(march, sizeof march, "-march=%s", cpu);
        bool replaced = false;
        for (int i = at; i < n; i++)
            if (!strncmp(v[i], "-march=", 7)) {
                free(v[i]);
                v[i] = xstrdup(march);
                replaced = true;
            }
        if (!replaced) util_words_add(&v, &n, march);
    }
    if (!in_process) util_words_add(&v, &n, "-std=c11");
    util_words_split(cflags, &v, &n);
    util_words_add(&v, &n, "-I");
    util_words_add(&v, &n, KILN_RUNTIME_DIR);
    *words = v;
    *nwords = n;
}

/* ---- the key ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* What every piece's object depends on besides its code. */
static void environment_key(const ObjOptions *o, char **flags, int nflags, StrBuf *key)
{
    sb_puts(key, "kiln-objcache-1\n");
    if (o->cc) {
        sb_printf(key, "cc %s\n", o->cc);
        StrBuf cmd, out;
        sb_init(&cmd);
        sb_init(&out);
        sb_printf(&cmd, "%s --version 2>&1", o->cc);
        build_run_logged(cmd.data, &out, "C compiler", NULL);
        if (out.len) sb_putn(key, out.data, out.len);
        sb_free(&cmd);
        sb_free(&out);
    } else {
        sb_printf(key, "%s\n", toolchain_version());
    }
    for (int i = 0; i < nflags; i++) sb_printf(key, "%s ", flags[i]);
    sb_putc(key, '\n');
    if (o->cpu && *o->cpu && strcmp(o->cpu, "native")) sb_printf(key, "cpu %s\n", o->cpu);
    else build_cpu_features(key);
    /* the runtime's headers, by content: the pieces include them */
    DIR *d = opendir(KILN_RUNTIME_DIR);
    if (d) {
        char **names = NULL;
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l > 2 && !strcmp(e->d_name + l - 2, ".h")) util_words_add(&names, &n, e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        for (int i = 0; i < n; i++) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", KILN_RUNTIME_DIR, names[i]);
            size_t len = 0;
            char *text = cache_read_file(path, &len);
            sb_printf(key, "%s %016llx\n", names[i], text ? (unsigned long long)cache_hash64(text, len) : 0ULL);
            free(text);
        }
        util_words_free(names, n);
    }
}

/* ---- compiling ---- */

typedef struct {
    const ObjOptions *o;
    char **flags;
    int nflags;
    char **src, **obj; /* per piece */
    char **log;        /* per piece: the compiler's messages */
    int *rc;           /* per piece */
    int *order, norder; /* the pieces to compile, largest first */
    int next;
    pthread_mutex_t mu;
    pthread_cond_t finished; /* a worker has finished (running went down) */
    int running;             /* workers not finished */
    StrBuf *log_out; /* the caller's log */
    char **pch_flags;  /* -include-pch ...: for the pieces that use the precompiled header */
    int npch_flags;
    bool *with_pch;    /* per piece */
} Pool;

static void compile_one(Pool *p, int i)
{
    if (!p->o->cc) {
        char **args = NULL;
        int n = 0;
        for (int k = 0; k < p->nflags; k++) util_words_add(&args, &n, p->flags[k]);
        for (int k = 0; p->with_pch[i] && k < p->npch_flags; k++) util_words_add(&args, &n, p->pch_flags[k]);
        util_words_add(&args, &n, "-c");
        util_words_add(&args, &n, p->src[i]);
        util_words_add(&args, &n, "-o");
        util_words_add(&args, &n, p->obj[i]);
        p->rc[i] = toolchain_run((const char *const *)args, n, &p->log[i]);
        util_words_free(args, n);
        return;
    }
    StrBuf cmd, out;
    sb_init(&cmd);
    sb_init(&out);
    sb_printf(&cmd, "%s ", p->o->cc);
    for (int k = 0; k < p->nflags; k++) {
        if (!strcmp(p->flags[k], KILN_RUNTIME_DIR)) build_shell_word(&cmd, p->flags[k]);
        else sb_printf(&cmd, "%s ", p->flags[k]);
    }
    sb_puts(&cmd, "-c ");
    build_shell_word(&cmd, p->src[i]);
    sb_puts(&cmd, "-o ");
    build_shell_word(&cmd, p->obj[i]);
    sb_puts(&cmd, "2>&1");
    p->rc[i] = build_run_logged(cmd.data, &out, "C compiler", NULL);
    p->log[i] = out.data;
    sb_free(&cmd);
}

/* The precompiled header of the pieces' #include lines (in-process Clang): every piece
 * parses the same runtime and C headers, about 30 ms of a small piece's 40. From the cache,
 * or compiled into dir. Returns 0 with its path in pch, else -1 with the compiler's
 * messages in log. */
static int get_pch(const char *includes, char **flags, int nflags, const char *cache_dir, const StrBuf *env, const char *dir, char *pch,
                   size_t pch_size, long long *stored, StrBuf *log)
{
    snprintf(pch, pch_size, "%s/pieces.pch", dir);
    /* The header the PCH was made from must exist where it was when the PCH is read: in the
     * cache, beside the PCH, under the same key (or in dir, without a cache). */
    char entry[4400] = "", hdr[4400];
    snprintf(hdr, sizeof hdr, "%s/pieces_pch.h", dir);
    if (cache_dir) {
        uint64_t h[2] = {0, 0};
        pieces_hash128(env->data, env->len, h);
        pieces_hash128("pch\n", 4, h);
        pieces_hash128(includes, strlen(includes), h);
        snprintf(entry, sizeof entry, "%s/%016llx%016llx.pch", cache_dir, (unsigned long long)h[0], (unsigned long long)h[1]);
        snprintf(hdr, sizeof hdr, "%s/%016llx%016llx.h", cache_dir, (unsigned long long)h[0], (unsigned long long)h[1]);
        size_t hl;
        char *have = cache_read_file(hdr, &hl);
        if (!have || hl != strlen(includes) || memcmp(have, includes, hl)) {
            char tmp[4500];
            snprintf(tmp, sizeof tmp, "%s.tmp.%ld", hdr, (long)getpid());
            if (cache_write_file(tmp, includes, strlen(includes)) != 0 || rename(tmp, hdr) != 0) {
                unlink(tmp);
                snprintf(hdr, sizeof hdr, "%s/pieces_pch.h", dir);
                entry[0] = 0; /* no cache for this one */
            }
        } else {
            utimensat(AT_FDCWD, hdr, NULL, 0);
        }
        free(have);
    }
    if (entry[0]) {
        size_t len;
        char *bytes = cache_entry_read(entry, &len, false);
        int ok = bytes && cache_write_file(pch, bytes, len) == 0;
        free(bytes);
        if (ok) {
            utimensat(AT_FDCWD, entry, NULL, 0);
            return 0;
        }
    }
    if (!entry[0] && cache_write_file(hdr, includes, strlen(includes)) != 0) {
        sb_printf(log, "cannot write %s: %s", hdr, strerror(errno));
        return -1;
    }
    char **args = NULL;
    int n = 0;
    for (int k = 0; k < nflags; k++) util_words_add(&args, &n, flags[k]);
    util_words_add(&args, &n, "-x");
    util_words_add(&args, &n, "c-header");
    util_words_add(&args, &n, hdr);
    util_words_add(&args, &n, "-o");
    util_words_add(&args, &n, pch);
    char *text = NULL;
    int rc = toolchain_run((const char *const *)args, n, &text);
    util_words_free(args, n);
    if (rc) {
        if (text) sb_puts(log, text);
        sb_printf(log, "\nthe in-process C compiler (%s) failed on the pieces' precompiled header", toolchain_version());
    } else if (entry[0]) {
        size_t len;
        char *bytes = cache_read_file(pch, &len);
        if (bytes && !cache_entry_store(entry, bytes, len, -1)) *stored += (long long)(len + CACHE_ENTRY_FOOTER_BYTES);
        free(bytes);
    }
    free(text);
    return rc;
}

static void *worker(void *arg)
{
    Pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int k = p->next < p->norder ? p->order[p->next++] : -1;
        if (k < 0) {
            p->running--;
            pthread_cond_signal(&p->finished);
        }
        pthread_mutex_unlock(&p->mu);
        if (k < 0) return NULL;
        compile_one(p, k);
        pthread_mutex_lock(&p->mu);
        progress_piece_done(p->o->pg);
        pthread_mutex_unlock(&p->mu);
    }
}

/* --cpu NAME: compiles an empty piece with -march=NAME, so that a name the compiler does
 * not know is one message rather than one per piece. 0, or -1 with the message in log. */
static int check_cpu(const ObjOptions *o, Pool *p)
{
    char src[4400], obj[4400];
    snprintf(src, sizeof src, "%s/cpu_probe.c", o->dir);
    snprintf(obj, sizeof obj, "%s/cpu_probe.o", o->dir);
    static const char probe[] = "int kiln_cpu_probe;\n";
    if (cache_write_file(src, probe, sizeof probe - 1) != 0) return 0; /* the pieces will say */
    char *saved_src = p->src[0], *saved_obj = p->obj[0], *saved_log = p->log[0];
    p->src[0] = src, p->obj[0] = obj, p->log[0] = NULL;
    compile_one(p, 0);
    int rc = p->rc[0];
    char *text = p->log[0];
    p->src[0] = saved_src, p->obj[0] = saved_obj, p->log[0] = saved_log, p->rc[0] = 0;
    unlink(src);
    unlink(obj);
    if (rc) {
        StrBuf *log = p->log_out;
        const char *e = text ? strstr(text, "error") : NULL;
        while (e && e > text && e[-1] != '\n') e--;
        sb_printf(log, "--cpu %s: %s does not know this CPU", o->cpu, o->cc ? o->cc : toolchain_version());
        if (e) sb_printf(log, ": %.*s", (int)strcspn(e, "\n"), e);
        sb_puts(log, " (e.g. x86-64-v2, x86-64-v3, x86-64-v4, haswell, skylake-avx512, native)");
    }
    free(text);
    return rc ? -1 : 0;
}

static int jobs(const ObjOptions *o)
{
    if (o->jobs > 0) return o->jobs;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void objcache_describe(const ObjResult *r, StrBuf *out)
{
    sb_printf(out, "compiled %d of %d piece%s (%d cached)", r->compiled, r->npieces, r->npieces == 1 ? "" : "s", r->cached);
    if (!r->compiled) return;
    sb_printf(out, ": %d of %d kernel pieces", r->kernels_compiled, r->kernel_pieces);
    if (r->step_pieces) sb_printf(out, ", %d of %d pieces of the steps' parts", r->step_compiled, r->step_pieces);
    if (r->recipe_compiled) sb_puts(out, ", the recipe");
    if (r->host_compiled) sb_puts(out, ", the host code");
}

void objcache_result_free(ObjResult *r)
{
    for (int i = 0; i < r->nobjs; i++) free(r->objs[i]);
    free(r->objs);
    memset(r, 0, sizeof *r);
}

/* Insertion sort of piece indices, largest piece first (few pieces; qsort has no context
 * argument in C11): the long compiles start first. */
static void sort_largest_first(int *v, int n, const PieceSet *s)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s->v[v[j - 1]].len < s->v[v[j]].len; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

/* The cache entry of a piece: the hash of everything its object depends on. */
static char *entry_path(const char *dir, const StrBuf *env, const Piece *pc, bool with_pch, bool debug)
{
    uint64_t h[2] = {0, 0};
    pieces_hash128(env->data, env->len, h);
    if (with_pch) pieces_hash128("with the precompiled header\n", 28, h);
    if (debug) pieces_hash128(pc->text, pc->len, h);
    else {
        size_t sl;
        char *stripped = pieces_strip_comments(pc->text, pc->len, &sl);
        pieces_hash128(stripped, sl, h);
        free(stripped);
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/%016llx%016llx.o", dir, (unsigned long long)h[0], (unsigned long long)h[1]);
    return xstrdup(path);
}

/* Starts compiling the pool's pieces on all cores, on threads of their own (this thread
 * reads the cached objects meanwhile), the progress line counting them; compile_join
 * waits for them. */
typedef struct {
    pthread_t *threads;
    bool *started;
    int n;
} Workers;

static void compile_start(Pool *p, int from, int n, int cached, Workers *w)
{
    const ObjOptions *o = p->o;
    StrBuf what;
    sb_init(&what);
    if (o->cc) { /* the compiler's name, without its directory and arguments */
        size_t l = strcspn(o->cc, " ");
        const char *base = o->cc;
        for (size_t k = 0; k < l; k++)
            if (o->cc[k] == '/') base = o->cc + k + 1;
        sb_printf(&what, "compiling %d of %d pieces of model.c with %.*s", p->norder - from, n, (int)(l - (size_t)(base - o->cc)), base);
    } else {
        sb_printf(&what, "compiling %d of %d pieces of model.c with %s", p->norder - from, n, toolchain_version());
    }
    if (cached) sb_printf(&what, " (%d cached)", cached);
    progress_stage(o->pg, p->norder - from, "%s", what.data);
    sb_free(&what);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->finished, NULL);
    p->next = from;
    w->n = jobs(o) < p->norder - from ? jobs(o) : p->norder - from;
    w->threads = xcalloc((size_t)w->n, sizeof *w->threads);
    w->started = xcalloc((size_t)w->n, sizeof *w->started);
    p->running = w->n;
    for (int t = 0; t < w->n; t++) {
        w->started[t] = pthread_create(&w->threads[t], NULL, worker, p) == 0;
        if (!w->started[t]) {
            pthread_mutex_lock(&p->mu);
            p->running--;
            pthread_mutex_unlock(&p->mu);
        }
    }
    bool any = false;
    for (int t = 0; t < w->n; t++) any |= w->started[t];
    if (!any) { /* no thread: this one compiles them all */
        p->running = 1;
        worker(p);
    }
}

static void compile_join(Pool *p, Workers *w)
{
    /* the seconds on the progress line go on while one long piece compiles */
    pthread_mutex_lock(&p->mu);
    while (p->running > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000 * 1000;
        if (until.tv_nsec >= 1000 * 1000 * 1000) until.tv_sec++, until.tv_nsec -= 1000 * 1000 * 1000;
        pthread_cond_timedwait(&p->finished, &p->mu, &until);
        progress_tick(p->o->pg);
    }
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < w->n; t++)
        if (w->started[t]) pthread_join(w->threads[t], NULL);
    free(w->threads);
    free(w->started);
    memset(w, 0, sizeof *w);
    pthread_cond_destroy(&p->finished);
    pthread_mutex_destroy(&p->mu);
}

/* 0, or -1 with the messages of the first piece that failed (in the file's order). */
static int first_failure(const Pool *p, int n, StrBuf *log)
{
    for (int k = 0; k < n; k++)
        if (p->rc[k]) {
            if (p->log[k]) sb_puts(log, p->log[k]);
            if (p->o->cc) sb_printf(log, "\nthe C compiler (%s) failed on a piece of model.c", p->o->cc);
            else sb_printf(log, "\nthe in-process C compiler (%s) failed on a piece of model.c", toolchain_version());
            return -1;
        }
    return 0;
}

/* Writes piece i's source and puts it on the pool's list to compile; counts it in r.
 * 0, or -1 with the reason in log. */
static int queue_piece(Pool *p, const PieceSet *ps, int i, ObjResult *r, StrBuf *log)
{
    const Piece *pc = &ps->v[i];
    if (cache_write_file(p->src[i], pc->text, pc->len) != 0) {
        sb_printf(log, "cannot write %s: %s", p->src[i], strerror(errno));
        return -1;
    }
    p->order[p->norder++] = i;
    if (pc->kind == PIECE_KERNELS) r->kernels_compiled++;
    else if (pc->kind == PIECE_STEP) r->step_compiled++;
    else if (pc->kind == PIECE_RECIPE) r->recipe_compiled = true;
    else r->host_compiled = true;
    return 0;
}

/* The precompiled header (get_pch) and the flags that use it, into the pool. */
static int pch_flags(Pool *p, const PieceSet *ps, const char *cache_dir, const StrBuf *env, const char *dir, char *pch, size_t pch_size,
                     long long *stored, StrBuf *log)
{
    int rc = get_pch(ps->includes, p->flags, p->nflags, cache_dir, env, dir, pch, pch_size, stored, log);
    util_words_add(&p->pch_flags, &p->npch_flags, "-include-pch");
    util_words_add(&p->pch_flags, &p->npch_flags, pch);
    /* the key holds the headers' content: their times need not match */
    util_words_add(&p->pch_flags, &p->npch_flags, "-Xclang");
    util_words_add(&p->pch_flags, &p->npch_flags, "-fno-validate-pch");
    return rc;
}

int objcache_compile(const char *model_c, size_t len, const ObjOptions *o, ObjResult *r, StrBuf *log)
{
    memset(r, 0, sizeof *r);
    PieceSet ps;
    pieces_split(model_c, len, o->cc ? PIECES_SPLIT_EXTERNAL : PIECES_SPLIT_IN_PROCESS, &ps);
    Pool p;
    memset(&p, 0, sizeof p);
    p.o = o;
    objcache_flags(o->cpu, o->cflags, !o->cc, &p.flags, &p.nflags);
    char *dir = cache_dir("obj");
    StrBuf env;
    sb_init(&env);
    if (dir) environment_key(o, p.flags, p.nflags, &env);
    bool debug = false; /* with -g the comments' line numbers are in the object */
    for (int i = 0; i < p.nflags; i++)
        if (!strncmp(p.flags[i], "-g", 2) && strcmp(p.flags[i], "-g0")) debug = true;
    const int n = ps.n;
    r->npieces = n;
    p.src = xcalloc((size_t)n, sizeof *p.src);
    p.obj = xcalloc((size_t)n, sizeof *p.obj);
    p.log = xcalloc((size_t)n, sizeof *p.log);
    p.rc = xcalloc((size_t)n, sizeof *p.rc);
    p.order = xcalloc((size_t)n, sizeof *p.order);
    /* the kernels' and the host code's pieces start from the precompiled header (Clang
     * inside kiln); the recipe's includes kiln_model.h alone, quicker without it */
    p.with_pch = xcalloc((size_t)n, sizeof *p.with_pch);
    for (int i = 0; i < n; i++) p.with_pch[i] = !o->cc && ps.includes && (ps.v[i].kind == PIECE_KERNELS || ps.v[i].kind == PIECE_STEP || ps.v[i].kind == PIECE_HOST);
    char **entry = xcalloc((size_t)n, sizeof *entry);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        r->kernel_pieces += ps.v[i].kind == PIECE_KERNELS;
        r->step_pieces += ps.v[i].kind == PIECE_STEP;
    }
    /* Which pieces are in the cache: those are read while the others compile. An entry
     * that turns out unreadable (damaged, or evicted by another build meanwhile) is
     * compiled after them. */
    enum { COMPILE, CACHED, UNREADABLE };
    unsigned char *cached = xcalloc((size_t)n, sizeof *cached);
    for (int i = 0; i < n; i++) {
        const Piece *pc = &ps.v[i];
        char path[4400];
        snprintf(path, sizeof path, "%s/piece%04d.c", o->dir, i);
        p.src[i] = xstrdup(path);
        snprintf(path, sizeof path, "%s/piece%04d.o", o->dir, i);
        p.obj[i] = xstrdup(path);
        if (dir && pc->cacheable) {
            entry[i] = entry_path(dir, &env, pc, p.with_pch[i], debug);
            if (access(entry[i], F_OK) == 0) {
                cached[i] = CACHED;
                continue;
            }
        }
        if (!rc) rc = queue_piece(&p, &ps, i, r, log);
    }
    const int ncached = n - p.norder;
    if (!rc && !p.norder) progress_stage(o->pg, 0, "model.c's %d pieces all from the cache", n);
    p.log_out = log;
    if (!rc && p.norder && o->cpu && *o->cpu && check_cpu(o, &p)) rc = OBJCACHE_BAD_CPU;
    char pch[4400] = "";
    /* bytes this build put into the cache: counted once the pieces are compiled, since an
     * eviction before would take the header the precompiled header refers to */
    long long stored = 0;
    bool need_pch = false;
    for (int k = 0; k < p.norder; k++) need_pch |= p.with_pch[p.order[k]];
    if (!rc && need_pch) rc = pch_flags(&p, &ps, dir, &env, o->dir, pch, sizeof pch, &stored, log);
    Workers w = {0};
    int first = 0; /* p.order[first..]: the pieces of this round */
    if (!rc && p.norder) {
        sort_largest_first(p.order, p.norder, &ps);
        compile_start(&p, 0, n, ncached, &w);
    }
    for (int i = 0; i < n; i++) {
        if (cached[i] != CACHED) continue;
        size_t olen;
        char *objbytes = cache_entry_read(entry[i], &olen, true);
        if (objbytes && cache_write_file(p.obj[i], objbytes, olen) == 0) {
            utimensat(AT_FDCWD, entry[i], NULL, 0); /* recently used */
            r->cached++;
        } else {
            cached[i] = UNREADABLE;
        }
        free(objbytes);
    }
    if (w.n) compile_join(&p, &w);
    if (!rc && r->cached < ncached) { /* the entries that could not be read: compiled now */
        first = p.norder;
        for (int i = 0; i < n && !rc; i++)
            if (cached[i] == UNREADABLE) rc = queue_piece(&p, &ps, i, r, log);
        bool late_pch = false;
        for (int k = first; k < p.norder; k++) late_pch |= p.with_pch[p.order[k]];
        if (!rc && late_pch && !pch[0]) rc = pch_flags(&p, &ps, dir, &env, o->dir, pch, sizeof pch, &stored, log);
        if (!rc && p.norder > first) {
            sort_largest_first(p.order + first, p.norder - first, &ps);
            compile_start(&p, first, n, r->cached, &w);
            compile_join(&p, &w);
        }
    }
    r->compiled = p.norder;
    free(cached);
    if (!rc && p.norder) {
        rc = first_failure(&p, n, log);
        for (int k = 0; !rc && k < p.norder; k++) {
            int i = p.order[k];
            if (!entry[i]) continue;
            size_t olen;
            char *objbytes = cache_read_file(p.obj[i], &olen);
            if (objbytes && !cache_entry_store(entry[i], objbytes, olen, i)) stored += (long long)(olen + CACHE_ENTRY_FOOTER_BYTES);
            free(objbytes);
        }
        if (stored) cache_account(dir, stored, krt_cache_max_bytes());
    }
    if (pch[0]) unlink(pch);
    for (int i = 0; i < n; i++) {
        if (!p.src[i]) continue; /* (not reached: a write failed) */
        unlink(p.src[i]);
        if (rc) unlink(p.obj[i]);
        free(p.src[i]);
        free(p.log[i]);
        free(entry[i]);
    }
    if (!rc) {
        r->objs = p.obj;
        r->nobjs = n;
    } else {
        for (int i = 0; i < n; i++) free(p.obj[i]);
        free(p.obj);
    }
    free(p.src);
    free(p.log);
    free(p.rc);
    free(p.order);
    free(p.with_pch);
    util_words_free(p.pch_flags, p.npch_flags);
    free(entry);
    util_words_free(p.flags, p.nflags);
    sb_free(&env);
    free(dir);
    pieces_free(&ps);
    return rc;
}
