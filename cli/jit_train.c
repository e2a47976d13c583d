/* jit_train.c — `kiln train FILE` (and `kiln run FILE`, the inference program's) in the
 * kiln process: the generated model.c is compiled into the objects `kiln build` links
 * (objcache.h: the same pieces, compiler and flags, compiled on all cores by the Clang in
 * kiln, each cached by its code, so a second run compiles nothing and shares `kiln build`'s
 * cache); ORC links them into this process (jit.h); then the program's own code, linked into
 * kiln (programs/train_main.c or infer_main.c without its main, programs.h), runs on the
 * model. No program is written or executed, and the objects are the code a built program
 * runs, so the results are its results, bit for bit (tests/test_jit.c).
 *
 * The process is prepared as a program prepares itself (runtime/env.c): thread counts,
 * denormals flushed, OpenBLAS single-threaded, which this file loads only now, so that the
 * other kiln commands do not start its threads. Its kernels: where OpenBLAS would choose
 * an older core than the CPU's, kiln re-executes itself with OPENBLAS_CORETYPE set, as a
 * program does. (The programs' GOMP_SPINCOUNT is libgomp's; kiln runs on LLVM's libomp.)
 *
 * While the model compiles, a thread inflates the recipe's gzip data files into the data
 * cache (runtime/data_cache.c) that the run then reads: a first run's two slowest parts,
 * Clang and zlib, overlap. */
#define _XOPEN_SOURCE 700
#include "jit_train.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../driver/jit.h"
#include "../driver/toolchain.h"
#include "build.h"
#include "objcache.h"
#include "progress.h"
#include "../programs/programs.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/rt_internal.h" /* the data cache's entries */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The model's objects in memory: kiln build's pieces (objcache.h), each from the cache or
 * compiled by the Clang in kiln, with the progress line on a terminal. *r says which.
 * 0, or 1 after a message. */
static int model_objects(const KilnProgram *p, JitObject **objs, int *nobjs, ObjResult *r)
{
    const char *name = p->train.graph->name;
    *objs = NULL;
    *nobjs = 0;
    memset(r, 0, sizeof *r);
    char dir[4096];
    if (build_tempdir_make(dir, sizeof dir)) {
        fprintf(stderr, "kiln: error: cannot make a scratch directory for %s's objects: %s\n", name, strerror(errno));
        return 1;
    }
    BuildProgress pg;
    progress_init(&pg, 1);
    ObjOptions oo = {.dir = dir, .pg = &pg};
    StrBuf log;
    sb_init(&log);
    int rc = 0;
    if (objcache_compile(p->code.data ? p->code.data : "", p->code.len, &oo, r, &log)) {
        fprintf(stderr, "kiln: error: compiling %s's model.c failed:\n%s\n", name, log.data ? log.data : "");
        rc = 1;
    }
    progress_clear(&pg);
    *objs = xcalloc((size_t)r->nobjs + 1, sizeof **objs);
    for (int i = 0; i < r->nobjs && !rc; i++) {
        StrBuf err;
        sb_init(&err);
        size_t len = 0;
        JitObject *o = &(*objs)[(*nobjs)++];
        o->data = util_read_file(r->objs[i], &len, &err);
        o->size = len;
        char *why = NULL;
        if (!o->data || jit_check_object(o->data, o->size, &why)) {
            fprintf(stderr, "kiln: error: the JIT cannot run %s's model.c: %s; kiln train --no-jit builds a program instead\n", name,
                    why ? why : err.data ? err.data : "");
            rc = 1;
        }
        free(why);
        sb_free(&err);
    }
    sb_free(&log);
    build_tempdir_remove(dir);
    return rc;
}

/* ---- the recipe's gzip data, inflated while the model compiles ---- */

typedef struct {
    char *paths[2 * 16];
    int n;
    pthread_t thread;
    bool started;
} DataPrefetch;

static void *prefetch_run(void *arg)
{
    DataPrefetch *d = arg;
    for (int i = 0; i < d->n; i++) {
        krt_array a;
        krt_error err;
        if (krt_idx_load(d->paths[i], &a, &err) == KRT_OK) krt_array_free(&a); /* what matters is the cache's copy */
    }
    return NULL;
}

/* Adds the files whose data cache entry is missing: gzip files (the run reads a gzip file
 * as IDX) that the cache can hold. */
static void prefetch_add(DataPrefetch *d, const kiln_recipe_files *files)
{
    for (int32_t i = 0; i < files->n && d->n < (int)(sizeof d->paths / sizeof *d->paths); i++) {
        const char *path = files->v[i].path;
        int fd = path ? open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
        if (fd < 0) continue; /* the run will say why */
        unsigned char magic[2];
        char entry[4200];
        uint64_t key;
        if (pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b && krt_data_cache_entry(path, fd, entry, sizeof entry, &key) &&
            access(entry, F_OK) != 0)
            d->paths[d->n++] = xstrdup(path);
        close(fd);
    }
}

/* Starts the thread, for the recipe's data and eval_data files that the program's flags do
 * not replace (--data, --eval-data); nothing to do, no thread. */
static void prefetch_start(DataPrefetch *d, const KilnProgram *p, const JitTrainOptions *o)
{
    memset(d, 0, sizeof *d);
    if (o->infer || !p->recipe_typed) return;
    bool own_data = false, own_eval = false;
    for (int i = 0; i < o->argc; i++) {
        own_data |= !strncmp(o->argv[i], "--data", 6);
        own_eval |= !strncmp(o->argv[i], "--eval-data", 11);
    }
    if (!own_data) prefetch_add(d, &p->recipe.data_files);
    if (!own_eval) prefetch_add(d, &p->recipe.eval_data_files);
    if (d->n) d->started = pthread_create(&d->thread, NULL, prefetch_run, d) == 0;
}

static void prefetch_finish(DataPrefetch *d)
{
    if (d->started) pthread_join(d->thread, NULL);
    for (int i = 0; i < d->n; i++) free(d->paths[i]);
    d->n = 0;
    d->started = false;
}

/* The environment a training program gives itself (krt_fast_environment), before
 * OpenBLAS is loaded; then OpenBLAS. Returns 0, or 1 after a message. Re-executes kiln
 * (does not return) when OpenBLAS's kernels should be another core's. */
static int prepare_process(char **kiln_argv)
{
    krt_fast_environment(0, NULL); /* no re-exec here: argc 0 */
    char *log = NULL;
    if (jit_load_library(KILN_BLAS_LIB, &log)) {
        fprintf(stderr, "%s\n", log ? log : "kiln: error: cannot load OpenBLAS");
        free(log);
        return 1;
    }
    char *(*corename)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
    char *(*config)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_config");
    const char *core = corename ? corename() : NULL, *conf = config ? config() : NULL;
    const char *verbose = getenv("KILN_VERBOSE");
    if (verbose && *verbose && strcmp(verbose, "0"))
        fprintf(stderr, "kiln: the JIT loaded %s: BLAS core %s, %d thread%s\n", KILN_BLAS_LIB, core ? core : "unknown", krt_blas_threads(),
                krt_blas_threads() == 1 ? "" : "s");
    const char *better = krt_blas_core_upgrade(core, krt_cpu_blas_core());
    const char *ready = getenv("KILN_ENV_READY"), *set = getenv("OPENBLAS_CORETYPE");
    if (better && conf && strstr(conf, "DYNAMIC_ARCH") && !(set && *set) && !(ready && *ready) && kiln_argv) {
        setenv("OPENBLAS_CORETYPE", better, 1);
        setenv("KILN_ENV_READY", "OMP_NUM_THREADS OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE", 1);
        fflush(NULL);
        execv("/proc/self/exe", kiln_argv);
        unsetenv("OPENBLAS_CORETYPE"); /* no exec: on with OpenBLAS's own choice */
        unsetenv("KILN_ENV_READY");
    }
    return 0;
}

int jit_train(KilnProgram *p, const JitTrainOptions *o)
{
    const double t0 = now();
    DataPrefetch prefetch;
    prefetch_start(&prefetch, p, o);
    JitObject *obj;
    int nobj;
    ObjResult made;
    int rc = model_objects(p, &obj, &nobj, &made);
    char *name = xstrdup(p->train.graph->name);
    kiln_program_free(p); /* the compiler's memory, before the run's */
    const double t1 = now();
    if (!rc) rc = prepare_process(o->kiln_argv);
    const double t2 = now();
    char *log = NULL;
    KilnJit *jit = rc ? NULL : jit_new(&log);
    const kiln_model *model = NULL;
    if (jit) {
        for (int i = 0; i < nobj && !log; i++) {
            const char *slash = strrchr(made.objs[i], '/');
            jit_add_object(jit, slash ? slash + 1 : made.objs[i], obj[i].data, obj[i].size, &log);
        }
        if (!log) model = jit_lookup(jit, "kiln_model_def", &log);
    }
    for (int i = 0; i < nobj; i++) jit_object_free(&obj[i]);
    free(obj);
    const double t3 = now();
    if (!rc && !model) {
        fprintf(stderr, "kiln: error: %s\n", log ? log : "the JIT failed");
        rc = 1;
    }
    free(log);
    if (!rc && o->time_passes) {
        StrBuf what;
        sb_init(&what);
        objcache_describe(&made, &what);
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "compile", "jit", (t1 - t0) * 1e3, "", what.data ? what.data : "");
        sb_free(&what);
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "prepare", "jit", (t2 - t1) * 1e3, "", "threads, denormals, OpenBLAS loaded");
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "link", "jit", (t3 - t2) * 1e3, "", "ORC LLJIT: the objects linked into kiln");
    }
    prefetch_finish(&prefetch); /* the run reads its files from the cache */
    if (!rc) {
        char **args = xcalloc((size_t)o->argc + 2, sizeof *args);
        args[0] = name;
        for (int i = 0; i < o->argc; i++) args[i + 1] = o->argv[i];
        fflush(stdout);
#if KILN_HAVE_JIT /* the training program's code is linked into kiln (CMakeLists.txt) */
        rc = (o->infer ? kiln_infer_main : kiln_train_main)(model, o->argc + 1, args);
#else
        rc = 1; /* not reached: without the JIT, jit_new fails */
#endif
        fflush(stdout);
        free(args);
    }
    jit_free(jit);
    objcache_result_free(&made);
    free(name);
    return rc;
}
