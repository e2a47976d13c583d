/* jit_train.c — `kiln train FILE` (and `kiln run FILE`, the inference program's) in the
 * kiln process: the generated model.c is compiled by the Clang inside kiln, in its two
 * halves on two threads and with the flags `kiln build` gives the same compiler
 * (build_program_in_process in build.c), to objects in memory, which are cached beside
 * kiln train's programs; ORC links them into this process (jit.h); then the program's own
 * code, linked into kiln (programs/train_main.c or infer_main.c without its main,
 * programs.h), runs on the model. No program is written or executed, and the objects are
 * the code a built program would run, so the results are its results, bit for bit
 * (tests/test_jit.c).
 *
 * The process is prepared as a program prepares itself (runtime/env.c): thread counts,
 * denormals flushed, OpenBLAS single-threaded, which this file loads only now, so that the
 * other kiln commands do not start its threads. Its kernels: where OpenBLAS would choose
 * an older core than the CPU's, kiln re-executes itself with OPENBLAS_CORETYPE set, as a
 * program does. (The programs' GOMP_SPINCOUNT is libgomp's; kiln runs on LLVM's libomp.) */
#define _XOPEN_SOURCE 700
#include "jit_train.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../driver/jit.h"
#include "../driver/toolchain.h"
#include "progress.h"
#include "../programs/programs.h"
#include "../runtime/kiln_rt.h"

#define JIT_SOURCE "/kiln-jit/model.c" /* the name model.c has in the compiler's diagnostics */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One half of model.c (KILN_PART 1 or 2) compiled on a thread of its own. */
typedef struct {
    const char *code;
    size_t len;
    const char **flags;
    int nflags;
    JitObject obj;
    char *log;
    int rc;
    atomic_bool done; /* for the progress line, which the main thread draws */
} Half;

static void *compile_half(void *arg)
{
    Half *h = arg;
    h->rc = jit_compile_c(JIT_SOURCE, h->code, h->len, h->flags, h->nflags, &h->obj, &h->log);
    atomic_store(&h->done, true);
    return NULL;
}

/* Until both halves are compiled: on a terminal, kiln build's progress line (the parts
 * done, the seconds). */
static void wait_halves(Half h[2])
{
    BuildProgress pg;
    progress_init(&pg, 1);
    progress_stage(&pg, 2, "compiling model.c into kiln with %s", toolchain_version());
    bool seen[2] = {false, false};
    for (int left = 2; left > 0;) {
        for (int part = 0; part < 2; part++)
            if (!seen[part] && atomic_load(&h[part].done)) {
                seen[part] = true;
                left--;
                progress_piece_done(&pg);
            }
        if (left) {
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
            progress_tick(&pg);
        }
    }
    progress_clear(&pg);
}

/* The compile flags of part `part`: build_program_in_process's, word for word (the same
 * flags give the same code: keep the two in step; test_jit compares the results).
 * Returns the count; the words are literals or point into store. */
static int half_flags(int part, const char **v, char *store, size_t cap)
{
    int n = 0;
    v[n++] = "-std=c11";
    v[n++] = "-ffp-contract=off";
    v[n++] = "-fno-temp-file";
    snprintf(store, cap, "%s", KILN_DEFAULT_CFLAGS);
    char *save = NULL;
    for (char *s = strtok_r(store, " \t\n", &save); s && n < 60; s = strtok_r(NULL, " \t\n", &save)) v[n++] = s;
    v[n++] = "-I";
    v[n++] = KILN_RUNTIME_DIR;
    v[n++] = part == 1 ? "-DKILN_PART=1" : "-DKILN_PART=2";
    return n;
}

/* Writes data to path through a temporary name (two kilns may write the same object). */
static void cache_write(const char *path, const JitObject *obj)
{
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(obj->data, 1, obj->size, f) == obj->size;
    if (f && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) unlink(tmp); /* no cache: the next run compiles again */
    free(tmp);
}

/* The two objects of the model: from the cache, else compiled (and cached). *compiled
 * says which. 0, or 1 after the compiler's message. */
static int model_objects(const KilnProgram *p, const char *base, JitObject obj[2], bool *compiled)
{
    char path[2][4200];
    int cached = 0;
    for (int part = 0; part < 2; part++) {
        snprintf(path[part], sizeof path[part], "%s.jit%d.o", base, part + 1);
        StrBuf err;
        sb_init(&err);
        size_t len = 0;
        obj[part].data = util_read_file(path[part], &len, &err);
        obj[part].size = len;
        sb_free(&err);
        char *why = NULL;
        cached += obj[part].data != NULL && !jit_check_object(obj[part].data, len, &why); /* a damaged file: compiled again */
        free(why);
    }
    *compiled = cached < 2;
    if (!*compiled) return 0;
    for (int part = 0; part < 2; part++) jit_object_free(&obj[part]);
    Half h[2];
    pthread_t threads[2];
    bool started[2];
    char store[2][1024];
    const char *flags[2][64];
    for (int part = 0; part < 2; part++) {
        h[part] = (Half){.code = p->code.data ? p->code.data : "", .len = p->code.len, .flags = flags[part]};
        atomic_init(&h[part].done, false);
        h[part].nflags = half_flags(part + 1, flags[part], store[part], sizeof store[part]);
        started[part] = pthread_create(&threads[part], NULL, compile_half, &h[part]) == 0;
        if (!started[part]) compile_half(&h[part]);
    }
    wait_halves(h);
    int rc = 0;
    for (int part = 0; part < 2; part++) {
        if (started[part]) pthread_join(threads[part], NULL);
        if (h[part].rc) {
            if (!rc) fprintf(stderr, "kiln: error: compiling %s's model.c failed:\n%s\n", p->train.graph->name, h[part].log ? h[part].log : "");
            rc = 1;
        }
        free(h[part].log);
        obj[part] = h[part].obj;
        char *why = NULL;
        if (!h[part].rc && jit_check_object(obj[part].data, obj[part].size, &why)) {
            if (!rc) fprintf(stderr, "kiln: error: the JIT cannot run %s's model.c: %s; kiln train --no-jit builds a program instead\n",
                             p->train.graph->name, why ? why : "");
            rc = 1;
        } else if (!h[part].rc) {
            cache_write(path[part], &obj[part]);
        }
        free(why);
    }
    return rc;
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
    JitObject obj[2] = {{0}};
    bool compiled = false;
    int rc = model_objects(p, o->cache_base, obj, &compiled);
    char *name = xstrdup(p->train.graph->name);
    kiln_program_free(p); /* the compiler's memory, before the run's */
    const double t1 = now();
    if (!rc) rc = prepare_process(o->kiln_argv);
    const double t2 = now();
    char *log = NULL;
    KilnJit *jit = rc ? NULL : jit_new(&log);
    const kiln_model *model = NULL;
    if (jit) {
        static const char *const names[2] = {"model1.o", "model2.o"};
        for (int part = 0; part < 2 && !log; part++) jit_add_object(jit, names[part], obj[part].data, obj[part].size, &log);
        if (!log) model = jit_lookup(jit, "kiln_model_def", &log);
    }
    for (int part = 0; part < 2; part++) jit_object_free(&obj[part]);
    const double t3 = now();
    if (!rc && !model) {
        fprintf(stderr, "kiln: error: %s\n", log ? log : "the JIT failed");
        rc = 1;
    }
    free(log);
    if (!rc && o->time_passes) {
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "compile", "jit", (t1 - t0) * 1e3, "",
                compiled ? "Clang in kiln: model.c to objects in memory, then cached" : "the cached objects read");
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "prepare", "jit", (t2 - t1) * 1e3, "", "threads, denormals, OpenBLAS loaded");
        fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s\n", "link", "jit", (t3 - t2) * 1e3, "", "ORC LLJIT: the objects linked into kiln");
    }
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
    free(name);
    return rc;
}
