/* emu_build.c — `kiln build --target cuda-emu` with the compiler inside kiln: model.cu and
 * the CUDA runtime's device.cu (and, --distributed, the NCCL gradient transport) compiled
 * as C++17 by Clang in this process, on threads, then linked by lld with the emulator's
 * libraries, so that an emulated build needs no C++ compiler on PATH, as a C build needs
 * no C compiler. Both files without contraction into fused multiply-adds
 * (-ffp-contract=off: what GCC's ISO C++ mode does, so the emulator rounds as before).
 * A named compiler ($CXX, --cc, $CC) or a kiln without Clang runs the external one
 * (build.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../driver/toolchain.h"
#include "build.h"
#include "cuda_embed.h"

typedef struct {
    char **args;
    int nargs;
    int rc;
    char *log;
} Job;

static void *run_job(void *arg)
{
    Job *j = arg;
    j->rc = toolchain_run((const char *const *)j->args, j->nargs, &j->log);
    return NULL;
}

/* The words of one compile: src to obj, with the includes of extra (MPI's). */
static void compile_words(Job *j, const char *src, const char *obj, const char *extra_flags, const char *includes)
{
    util_words_add(&j->args, &j->nargs, "-x");
    util_words_add(&j->args, &j->nargs, "c++");
    util_words_split(KILN_EMU_CXXFLAGS, &j->args, &j->nargs);
    util_words_split("-ffp-contract=off -DKILN_CUDA_EMU", &j->args, &j->nargs);
    util_words_split(extra_flags, &j->args, &j->nargs);
    util_words_add(&j->args, &j->nargs, "-I");
    util_words_add(&j->args, &j->nargs, KILN_RUNTIME_DIR "/cuda");
    util_words_add(&j->args, &j->nargs, "-I");
    util_words_add(&j->args, &j->nargs, KILN_RUNTIME_DIR);
    util_words_split(includes, &j->args, &j->nargs);
    util_words_add(&j->args, &j->nargs, "-c");
    util_words_add(&j->args, &j->nargs, src);
    util_words_add(&j->args, &j->nargs, "-o");
    util_words_add(&j->args, &j->nargs, obj);
}

int build_cuda_emu_in_process(const char *model_cu, const char *prog, const char *extra_flags, bool infer, bool distributed, StrBuf *log,
                              BuildProgress *pg)
{
    const char *slash = strrchr(model_cu, '/');
    const int dirlen = slash ? (int)(slash - model_cu + 1) : 0;
    /* the table of the program's kernels (cuda_embed.h), compiled last */
    char table[4300];
    snprintf(table, sizeof table, "%.*s" CUDA_EMBED_MODEL_TABLE ".cpp", dirlen, model_cu);
    char *dir = dirlen ? xstrndup(model_cu, (size_t)dirlen - 1) : xstrdup(".");
    const int trc = cuda_embed_emulated(model_cu, distributed, dir, log);
    free(dir);
    if (trc) return -1;
    const char *sources[4] = {model_cu, KILN_RUNTIME_DIR "/cuda/device.cu", KILN_PROGRAMS_DIR "/dist_nccl.cu", table};
    const int njobs = distributed ? 4 : 3;
    char objs[4][4300];
    Job jobs[4];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < njobs; i++) {
        const int src = !distributed && i == 2 ? 3 : i;
        snprintf(objs[i], sizeof objs[i], "%.*smodel%d.o", dirlen, model_cu, i + 1);
        compile_words(&jobs[i], sources[src], objs[i], extra_flags, src == 2 ? KILN_MPI_INCLUDES : "");
    }
    progress_stage(pg, njobs, "compiling model.cu for the CUDA emulator with %s", toolchain_version());
    pthread_t threads[4];
    bool started[4] = {false, false, false, false};
    for (int i = 1; i < njobs; i++) started[i] = pthread_create(&threads[i], NULL, run_job, &jobs[i]) == 0;
    run_job(&jobs[0]); /* model.cu, the longest, on this thread */
    progress_piece_done(pg);
    for (int i = 1; i < njobs; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
        else run_job(&jobs[i]);
        progress_piece_done(pg);
    }
    int rc = 0;
    for (int i = 0; i < njobs; i++) {
        if (jobs[i].log) sb_puts(log, jobs[i].log);
        if (jobs[i].rc && !rc) {
            sb_printf(log, "\nthe in-process C++ compiler (%s) failed on %s", toolchain_version(), sources[!distributed && i == 2 ? 3 : i]);
            rc = -1;
        }
    }
    if (!rc) {
        progress_stage(pg, 0, "linking the program");
        Job link;
        memset(&link, 0, sizeof link);
        for (int i = 0; i < njobs; i++) util_words_add(&link.args, &link.nargs, objs[i]);
        util_words_add(&link.args, &link.nargs, infer ? KILN_INFER_MAIN : KILN_TRAIN_MAIN);
        if (!infer) {
            util_words_add(&link.args, &link.nargs, KILN_TRAIN_BENCH);
            util_words_add(&link.args, &link.nargs, KILN_TRAIN_CKPT);
            util_words_add(&link.args, &link.nargs, distributed ? KILN_DIST_MPI : KILN_DIST_SINGLE);
        }
        util_words_add(&link.args, &link.nargs, "-o");
        util_words_add(&link.args, &link.nargs, prog);
        util_words_add(&link.args, &link.nargs, KILN_RUNTIME_LIB);
        if (distributed) util_words_add(&link.args, &link.nargs, KILN_CUDA_EMU_NCCL_LIB);
        util_words_add(&link.args, &link.nargs, KILN_CUDA_EMU_MODULES_LIB);
        util_words_add(&link.args, &link.nargs, KILN_CUDA_EMU_LIB);
        util_words_add(&link.args, &link.nargs, KILN_BLAS_LIB); /* the emulator's cuBLAS */
        if (distributed) util_words_split(KILN_MPI_LIBS, &link.args, &link.nargs);
        util_words_split(KILN_DEFAULT_LDFLAGS, &link.args, &link.nargs);
        /* the emulator's C++ runtime; OpenMP is LLVM's libomp, which serves libgomp's calls */
        util_words_split("-lstdc++ -fopenmp -lprotobuf-c -lz -lm -lpthread", &link.args, &link.nargs);
        run_job(&link);
        if (link.log) sb_puts(log, link.log);
        if (link.rc) {
            sb_printf(log, "\nthe in-process linker (%s) failed", toolchain_version());
            rc = -1;
        }
        free(link.log);
        util_words_free(link.args, link.nargs);
    }
    for (int i = 0; i < njobs; i++) {
        unlink(objs[i]);
        free(jobs[i].log);
        util_words_free(jobs[i].args, jobs[i].nargs);
    }
    return rc;
}
