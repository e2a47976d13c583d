/* cuda_build.c — `kiln build --target cuda` without nvcc: model.cu's kernels compiled by
 * NVRTC in this process (cuda_report.h: in cached pieces on all cores) into CUBINs for
 * sm_80 and sm_90 and compute_80 PTX, embedded in the program with the table of its
 * device code (cuda_embed.h); model.cu's host code, cut out of the same text
 * (cuda_device.h), compiled meanwhile as C++ against the toolkit's headers, launching by
 * name through the driver API (kiln_cuda.h's KILN_CUDA_DRIVER), by Clang in this process
 * (or $CXX / --cc); linked by lld with the runtime's CUDA files (device.cu and, distributed,
 * dist_nccl.cu: compiled the same way when Kiln was built, cuda_runtime_gen.c), cudart,
 * cuBLAS, cuBLASLt and NCCL. The driver API's calls are found through cudart at run time
 * (modules.cpp), so the program does not link libcuda. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../driver/toolchain.h"
#include "build.h"
#include "cuda_build.h"
#include "cuda_embed.h"

/* ---- compiles and the link ---- */

typedef struct {
    char **args;
    int nargs;
    const char *cxx; /* an external compiler, or NULL: Clang in this process */
    int rc;
    char *log;
} Job;

static void *run_job(void *arg)
{
    Job *j = arg;
    if (!j->cxx) {
        j->rc = toolchain_run((const char *const *)j->args, j->nargs, &j->log);
        return NULL;
    }
    StrBuf cmd, out;
    sb_init(&cmd);
    sb_init(&out);
    build_shell_word(&cmd, j->cxx);
    for (int i = 0; i < j->nargs; i++) build_shell_word(&cmd, j->args[i]);
    sb_puts(&cmd, "2>&1");
    j->rc = build_run_logged(cmd.data, &out, "C++ compiler", NULL);
    j->log = out.data ? sb_take(&out) : NULL;
    sb_free(&out);
    sb_free(&cmd);
    return NULL;
}

static void add(Job *j, const char *w) { util_words_add(&j->args, &j->nargs, w); }
static void add_split(Job *j, const char *w) { util_words_split(w, &j->args, &j->nargs); }

/* model.cu's host code is the steps' launches, the model's tables and the recipe: glue,
 * whose speed is the driver's launch, so it is not optimised (-O0: gpt2-124m's compiles in
 * 0.74 s where -O1 takes 3.1 s and -O2 more); the kernels' arguments are still packed
 * inline (kiln_cuda.h). */
static void compile_words(Job *j, const char *src, const char *obj, const char *extra_flags)
{
    add_split(j, "-x c++ -std=c++17 -O0 -ffp-contract=off -DKILN_CUDA_DRIVER");
    add_split(j, extra_flags ? extra_flags : "");
    add(j, "-I");
    add(j, KILN_RUNTIME_DIR "/cuda");
    add(j, "-I");
    add(j, KILN_RUNTIME_DIR);
    for (const char *p = KILN_CUDA_INCLUDE_DIRS; *p;) { /* CMake's list, '|' between */
        const size_t n = strcspn(p, "|");
        if (n) {
            char *d = xstrndup(p, n);
            add(j, "-isystem");
            add(j, d);
            free(d);
        }
        p += n + (p[n] == '|');
    }
    add(j, "-c");
    add(j, src);
    add(j, "-o");
    add(j, obj);
}

int build_cuda_nvrtc(const char *model_cu, const char *prog, const char *cxx, const char *extra_flags, bool infer, bool distributed, StrBuf *log,
                     BuildProgress *pg)
{
    const char *why;
    if (!nvrtc_available(&why)) {
        sb_printf(log, "--target cuda compiles its kernels with NVRTC: %s", why);
        return -1;
    }
    if (!KILN_CUDA_DEVICE_LIB[0] || (distributed && !KILN_CUDA_DIST_LIB[0])) {
        sb_puts(log, "--target cuda needs the CUDA toolkit's headers and libraries, and Kiln was built without them (cmake finds them with "
                     "find_package(CUDAToolkit))");
        return -1;
    }
    if (!cxx && !toolchain_available()) cxx = KILN_CXX;
    const char *slash = strrchr(model_cu, '/');
    char *dir = slash ? xstrndup(model_cu, (size_t)(slash - model_cu)) : xstrdup(".");
    /* model.cu, and the runtime's files for the check that no kernel name is taken twice */
    CudaUnit units[3];
    int nread = 0, rc = 0;
    for (; nread < 3 && !rc; nread++) rc = cuda_embed_read_unit(nread, model_cu, &units[nread], log);
    if (rc) nread--;
    if (!rc) rc = cuda_embed_check_names(units, 3, log);
    for (int u = 1; u < nread; u++) cuda_device_source_free(&units[u].src);
    if (rc) {
        if (nread) cuda_device_source_free(&units[0].src);
        free(dir);
        return -1;
    }
    /* the host code, compiled on a thread while NVRTC compiles the kernels; then the table */
    Job jobs[2];
    memset(jobs, 0, sizeof jobs);
    char srcs[2][4200], objs[2][4200];
    snprintf(srcs[0], sizeof srcs[0], "%s/host.cpp", dir);
    snprintf(objs[0], sizeof objs[0], "%s/host.o", dir);
    snprintf(srcs[1], sizeof srcs[1], "%s/" CUDA_EMBED_MODEL_TABLE ".cpp", dir);
    snprintf(objs[1], sizeof objs[1], "%s/" CUDA_EMBED_MODEL_TABLE ".o", dir);
    rc = cuda_embed_write_file(srcs[0], units[0].src.host.data ? units[0].src.host.data : "", units[0].src.host.len, log);
    for (int i = 0; i < 2; i++) {
        jobs[i].cxx = cxx;
        compile_words(&jobs[i], srcs[i], objs[i], i ? "" : extra_flags);
    }
    pthread_t thread;
    bool started = false;
    progress_stage(pg, 3, "compiling the kernels with %s, the host code with %s", nvrtc_version(), cxx ? cxx : toolchain_version());
    if (!rc) started = pthread_create(&thread, NULL, run_job, &jobs[0]) == 0;
    CudaCompiled compiled;
    memset(&compiled, 0, sizeof compiled);
    const int nvrtc_rc = rc ? -1 : cuda_units_compile(units, 1, &compiled, log);
    progress_piece_done(pg);
    if (started) pthread_join(thread, NULL);
    else if (!rc) run_job(&jobs[0]);
    progress_piece_done(pg);
    rc = rc || nvrtc_rc;
    if (jobs[0].log) sb_puts(log, jobs[0].log);
    if (jobs[0].rc && !rc) {
        sb_printf(log, "\nthe C++ compiler (%s) failed on model.cu's host code", cxx ? cxx : toolchain_version());
        rc = -1;
    }
    if (!rc) rc = cuda_embed_write_table(dir, CUDA_EMBED_MODEL_TABLE, units, 1, &compiled, log);
    if (!rc) {
        run_job(&jobs[1]);
        if (jobs[1].log) sb_puts(log, jobs[1].log);
        if (jobs[1].rc) {
            sb_puts(log, "\nthe C++ compiler failed on the table of the program's kernels");
            rc = -1;
        }
        progress_piece_done(pg);
    }
    if (!rc) {
        progress_stage(pg, 0, "linking the program");
        Job link;
        memset(&link, 0, sizeof link);
        link.cxx = cxx;
        for (int i = 0; i < 2; i++) add(&link, objs[i]);
        add(&link, infer ? KILN_INFER_MAIN : KILN_TRAIN_MAIN);
        if (!infer) {
            add(&link, KILN_TRAIN_BENCH);
            add(&link, KILN_TRAIN_CKPT);
            add(&link, distributed ? KILN_DIST_MPI : KILN_DIST_SINGLE);
        }
        add(&link, "-o");
        add(&link, prog);
        if (distributed) add(&link, KILN_CUDA_DIST_LIB);
        add(&link, KILN_CUDA_DEVICE_LIB); /* the runtime's device.cu, its table, modules.cpp */
        add(&link, KILN_RUNTIME_LIB);
        StrBuf w;
        sb_init(&w);
        if (distributed) {
            sb_printf(&w, "-L%s", KILN_NCCL_LIB_DIR);
            add(&link, w.data);
            w.len = 0;
            sb_printf(&w, "-Wl,-rpath,%s", KILN_NCCL_LIB_DIR);
            add(&link, w.data);
            add(&link, "-lnccl");
        }
        w.len = 0;
        sb_printf(&w, "-L%s", KILN_CUDA_LIB_DIR);
        add(&link, w.data);
        w.len = 0;
        sb_printf(&w, "-Wl,-rpath,%s", KILN_CUDA_LIB_DIR);
        add(&link, w.data);
        sb_free(&w);
        add_split(&link, "-lcublasLt -lcublas -lcudart"); /* not libcuda: modules.cpp finds the driver through cudart */
        if (distributed) add_split(&link, KILN_MPI_LIBS);
        add_split(&link, KILN_DEFAULT_LDFLAGS);
        add_split(&link, "-lstdc++ -fopenmp -lprotobuf-c -lz -lm -lpthread -ldl");
        run_job(&link);
        if (link.log) sb_puts(log, link.log);
        if (link.rc) {
            sb_printf(log, "\nthe linker (%s) failed", cxx ? cxx : toolchain_version());
            rc = -1;
        }
        free(link.log);
        util_words_free(link.args, link.nargs);
    }
    for (int i = 0; i < 2; i++) {
        unlink(srcs[i]);
        unlink(objs[i]);
        free(jobs[i].log);
        util_words_free(jobs[i].args, jobs[i].nargs);
    }
    /* the table's files */
    StrBuf p;
    sb_init(&p);
    p.len = 0;
    sb_printf(&p, "%s/" CUDA_EMBED_MODEL_TABLE "_source0.cu", dir);
    unlink(p.data);
    for (int i = 0; i < 2 * compiled.npieces; i++) {
        p.len = 0;
        sb_printf(&p, "%s/" CUDA_EMBED_MODEL_TABLE "_image%d.cubin", dir, i);
        unlink(p.data);
        p.len = 0;
        sb_printf(&p, "%s/" CUDA_EMBED_MODEL_TABLE "_image%d.ptx", dir, i);
        unlink(p.data);
    }
    sb_free(&p);
    cuda_compiled_free(&compiled);
    cuda_device_source_free(&units[0].src);
    free(dir);
    return rc;
}
