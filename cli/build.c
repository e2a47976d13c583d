/* build.c — turns a generated model.c into a training program with the system C
 * compiler: model.c + the runtime's train_main.o (infer_main.o for an inference program), linked against the runtime library,
 * OpenBLAS, OpenMP (libgomp), zlib, libm and pthreads. The compiler is $CC (default: the
 * one Kiln was built with) and flags are overridable, so users can build with their own
 * toolchain. The default flags (KILN_GENERATED_CFLAGS in CMakeLists.txt) are fast ones:
 * -O3 -march=native -fno-trapping-math -fopenmp; --cflags comes after them, so its flags win.
 * model.c is compiled in pieces on all cores, each piece's object cached (objcache.h), by
 * Clang inside kiln or by the external compiler, then linked here. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <limits.h>

#include <pthread.h>

#include "build.h"
#include "cuda_build.h"
#include "cuda_embed.h"
#include "objcache.h"
#include "../driver/toolchain.h"
#include "../runtime/kiln_model.h"

/* ---- the scratch directory ---- */

#define TEMP_PREFIX "kiln-build-"

/* What a build writes in its directory (write_model_c and build_program). */
static const char *const temp_files[] = {"model.c", "model.cu", "model1.o", "model2.o", "model3.o", "pieces.pch", "pieces_pch.h", "cpu_probe.c", "cpu_probe.o",
                                         /* and a library's (lib_build.c) */
                                         "lib_gen", "lib.h", "lib.c", "lib.syms", "lib.o", "lib_all.o", "lib_model.o", "lib.a", "lib.so"};

/* The live directory, for the signal handler: a fixed buffer, written before the handler
 * is installed, so that the handler only reads it. */
static char live_dir[4096];
static volatile sig_atomic_t have_live_dir;

/* Removes a scratch directory's files, then the directory: only calls that are safe in a
 * signal handler (no allocation, no stdio). */
static void remove_temp(const char *dir)
{
    char path[4096 + 32];
    size_t n = strlen(dir);
    if (n + 16 > sizeof path) return;
    for (size_t i = 0; i < sizeof temp_files / sizeof *temp_files; i++) {
        memcpy(path, dir, n);
        path[n] = '/';
        strcpy(path + n + 1, temp_files[i]);
        unlink(path);
    }
    /* the pieces' sources and objects (objcache.c): piece0000.c, piece0000.o, ... numbered
     * from 0; every piece has its object, its source while it compiles */
    for (int i = 0; i < 10000; i++) {
        memcpy(path, dir, n);
        memcpy(path + n, "/piece0000.o", 13);
        for (int k = 0, v = i; k < 4; k++, v /= 10) path[n + 9 - k] = (char)('0' + v % 10);
        int gone = unlink(path) != 0;
        path[n + 11] = 'c';
        gone &= unlink(path) != 0;
        if (gone) break;
    }
    rmdir(dir);
}

static void on_fatal_signal(int sig)
{
    if (have_live_dir) remove_temp(live_dir);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Directories of builds whose process is gone (killed with SIGKILL, or the machine went
 * down): kiln-build-PID-XXXXXX with no process PID. A live process's are left alone. */
static void remove_stale_dirs(const char *base)
{
    DIR *d = opendir(base);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TEMP_PREFIX, strlen(TEMP_PREFIX))) continue;
        char *end;
        long pid = strtol(e->d_name + strlen(TEMP_PREFIX), &end, 10);
        if (pid <= 0 || *end != '-' || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char dir[4096];
        if (snprintf(dir, sizeof dir, "%s/%s", base, e->d_name) >= (int)sizeof dir) continue;
        /* whatever the process left (a compiler's temporary too), then the directory */
        DIR *sub = opendir(dir);
        struct dirent *f;
        while (sub && (f = readdir(sub))) {
            char path[4400];
            if (strcmp(f->d_name, ".") && strcmp(f->d_name, "..") && snprintf(path, sizeof path, "%s/%s", dir, f->d_name) < (int)sizeof path)
                unlink(path);
        }
        if (sub) closedir(sub);
        remove_temp(dir);
    }
    closedir(d);
}

int build_tempdir_make(char *dir, size_t size)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    remove_stale_dirs(base);
    if (snprintf(dir, size, "%s/" TEMP_PREFIX "%ld-XXXXXX", base, (long)getpid()) >= (int)size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (!mkdtemp(dir)) return -1;
    if (strlen(dir) < sizeof live_dir) {
        strcpy(live_dir, dir);
        have_live_dir = 1;
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_fatal_signal;
            sigemptyset(&sa.sa_mask);
            sigaction(sigs[i], &sa, NULL);
        }
    }
    return 0;
}

void build_tempdir_remove(const char *dir)
{
    have_live_dir = 0;
    remove_temp(dir);
}

/* Appends s as one single-quoted shell word. */
static void shell_word(StrBuf *b, const char *s)
{
    sb_putc(b, '\'');
    for (; *s; s++) {
        if (*s == '\'') sb_puts(b, "'\\''");
        else sb_putc(b, *s);
    }
    sb_puts(b, "' ");
}

void build_shell_word(StrBuf *b, const char *s) { shell_word(b, s); }

void build_cpu_features(StrBuf *key)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        int model = 0, flags = 0;
        while ((!model || !flags) && fgets(line, sizeof line, f)) {
            if (!model && !strncmp(line, "model name", 10)) {
                model = 1;
                sb_puts(key, line);
            }
            if (!flags && !strncmp(line, "flags", 5)) {
                flags = 1;
                sb_puts(key, line);
            }
        }
        fclose(f);
    }
}

void build_fingerprint(StrBuf *key)
{
    build_cpu_features(key);
    /* the runtime and every header the generated code includes */
    const char *files[] = {KILN_RUNTIME_LIB, KILN_TRAIN_MAIN, KILN_TRAIN_BENCH, KILN_TRAIN_CKPT, KILN_INFER_MAIN, KILN_DIST_SINGLE, KILN_DIST_MPI, KILN_DIST_GRADS_MPI, KILN_RUNTIME_DIR "/kiln_model.h", KILN_RUNTIME_DIR "/kiln_recipe.h",
                           KILN_RUNTIME_DIR "/kiln_gemm.h", KILN_RUNTIME_DIR "/kiln_attention.h", KILN_RUNTIME_DIR "/kiln_attention_desc.h",
                           KILN_RUNTIME_DIR "/kiln_math.h", KILN_RUNTIME_DIR "/kiln_half.h", KILN_RUNTIME_DIR "/kiln_rng.h", KILN_RUNTIME_DIR "/optim_elem.h",
                           KILN_RUNTIME_DIR "/cuda/kiln_cuda.h", KILN_RUNTIME_DIR "/cuda/kiln_cuda_model.h", KILN_RUNTIME_DIR "/cuda/kiln_cuda_attention.h", KILN_RUNTIME_DIR "/cuda/device.cu",
                           KILN_PROGRAMS_DIR "/dist_nccl.cu", KILN_PROGRAMS_DIR "/dist_mpi.h", KILN_CUDA_EMU_LIB, KILN_CUDA_EMU_NCCL_LIB};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat st;
        if (stat(files[i], &st) == 0) sb_printf(key, "|%lld.%lld", (long long)st.st_size, (long long)st.st_mtime);
    }
}

/* Moves what of pend is the compilers' output into log; the progress markers in it
 * (PROGRESS_MARK...\n, progress.h) go to pg instead. A marker not yet complete stays in pend
 * (unless at_end). */
static void take_output(StrBuf *pend, StrBuf *log, BuildProgress *pg, bool at_end)
{
    size_t i = 0, mlen = strlen(PROGRESS_MARK);
    while (i < pend->len) {
        char *m = memchr(pend->data + i, PROGRESS_MARK[0], pend->len - i);
        if (!m) {
            sb_putn(log, pend->data + i, pend->len - i);
            i = pend->len;
            break;
        }
        size_t at = (size_t)(m - pend->data);
        sb_putn(log, pend->data + i, at - i);
        i = at;
        char *nl = memchr(m, '\n', pend->len - at);
        if (!nl) {
            if (!at_end) break; /* the rest of it comes with the next read */
            sb_putn(log, m, pend->len - at);
            i = pend->len;
            break;
        }
        size_t n = (size_t)(nl - m) + 1;
        if (n > mlen && !memcmp(m, PROGRESS_MARK, mlen)) {
            const char *what = m + mlen;
            size_t wl = n - mlen - 1;
            if (wl == 4 && !memcmp(what, "done", 4)) progress_piece_done(pg);
            else if (wl > 6 && !memcmp(what, "stage ", 6)) progress_stage(pg, 0, "%.*s", (int)(wl - 6), what + 6);
        } else {
            sb_putn(log, m, n); /* a byte 1 of the compiler's own */
        }
        i += n;
    }
    if (!pend->data) return; /* nothing read (a compile that printed nothing) */
    memmove(pend->data, pend->data + i, pend->len - i);
    pend->len -= i;
    pend->data[pend->len] = 0;
}

/* Runs a shell command, its output appended to log; 0 when it succeeded. While it runs,
 * the progress line (pg, may be NULL) follows its markers and counts the seconds. */
static int run_logged(const char *cmd, StrBuf *log, const char *what, BuildProgress *pg)
{
    FILE *p = popen(cmd, "r");
    if (!p) {
        sb_printf(log, "cannot run the %s: %s", what, cmd);
        return -1;
    }
    int fd = fileno(p);
    StrBuf pend;
    sb_init(&pend);
    char chunk[4096];
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, pg && pg->on ? 1000 : -1);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            progress_tick(pg);
            continue;
        }
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        sb_putn(&pend, chunk, (size_t)n);
        take_output(&pend, log, pg, false);
        progress_tick(pg);
    }
    take_output(&pend, log, pg, true);
    sb_free(&pend);
    int rc = pclose(p) == 0 ? 0 : -1;
    if (rc) sb_printf(log, "\nthe %s failed (%s)", what, cmd);
    return rc;
}

int build_run_logged(const char *cmd, StrBuf *log, const char *what, BuildProgress *pg) { return run_logged(cmd, log, what, pg); }

/* The basename of a compiler command, for the progress line. */
static const char *tool_name(const char *cmd, char *buf, size_t n)
{
    size_t len = strcspn(cmd, " ");
    const char *slash = cmd;
    for (size_t i = 0; i < len; i++)
        if (cmd[i] == '/') slash = cmd + i + 1;
    snprintf(buf, n, "%.*s", (int)(len - (size_t)(slash - cmd)), slash);
    return buf;
}

const char *build_c_compiler(const char *cc_flag)
{
    if (cc_flag && *cc_flag) return cc_flag;
    const char *cc = getenv("CC");
    if (cc && *cc) return cc;
    return KILN_IN_PROCESS_DEFAULT && toolchain_available() ? NULL : KILN_DEFAULT_CC;
}

/* The link's words after the flags: the driver's objects (train_main.c's, or
 * infer_main.c's), -o prog and the libraries but OpenMP's. */
static void link_inputs(const char *prog, bool infer, bool distributed, char ***v, int *n)
{
    util_words_add(v, n, infer ? KILN_INFER_MAIN : KILN_TRAIN_MAIN);
    if (!infer) {
        util_words_add(v, n, KILN_TRAIN_BENCH);
        util_words_add(v, n, KILN_TRAIN_CKPT);
        /* the training program's processes: MPI's (dist_mpi.c, summing the gradients with
         * MPI: dist_grads_mpi.c), or one (dist_single.c) */
        util_words_add(v, n, distributed ? KILN_DIST_MPI : KILN_DIST_SINGLE);
        if (distributed) util_words_add(v, n, KILN_DIST_GRADS_MPI);
    }
    util_words_add(v, n, "-o");
    util_words_add(v, n, prog);
    util_words_add(v, n, KILN_RUNTIME_LIB);
    util_words_add(v, n, KILN_BLAS_LIB);
}

/* Links the pieces' objects with the driver: lld in this process (OpenMP is LLVM's libomp,
 * which also serves the runtime's libgomp calls), or the external compiler's link. */
static int link_program(const ObjResult *objs, const char *prog, const char *cc, const BuildProgramOptions *o, StrBuf *log)
{
    char **link = NULL;
    int nlink = 0;
    util_words_split(KILN_DEFAULT_CFLAGS, &link, &nlink);
    util_words_split(o->cflags, &link, &nlink);
    const int nflags = nlink;
    for (int i = 0; i < objs->nobjs; i++) util_words_add(&link, &nlink, objs->objs[i]);
    link_inputs(prog, o->infer, o->distributed, &link, &nlink);
    int rc;
    if (!cc) {
        if (o->distributed) util_words_split(KILN_MPI_LIBS, &link, &nlink);
        /* libomp by name too: the runtime's loops need it even when --cflags says -fno-openmp */
        util_words_add(&link, &nlink, "-fopenmp");
        util_words_split("-lprotobuf-c -lz -lm -lpthread", &link, &nlink);
        char *text = NULL;
        rc = toolchain_run((const char *const *)link, nlink, &text);
        if (text) sb_puts(log, text);
        free(text);
        if (rc) sb_printf(log, "\nthe in-process linker (%s) failed", toolchain_version());
    } else {
        StrBuf cmd;
        sb_init(&cmd);
        sb_printf(&cmd, "%s ", cc);
        for (int i = 0; i < nlink; i++) {
            /* the flags as the shell splits them (as --cflags always was); paths quoted */
            if (i < nflags) sb_printf(&cmd, "%s ", link[i]);
            else shell_word(&cmd, link[i]);
        }
        if (o->distributed) sb_printf(&cmd, "%s ", KILN_MPI_LIBS);
        /* libgomp by name too: the runtime's loops need it even when --cflags says -fno-openmp */
        sb_printf(&cmd, "%s -lprotobuf-c -lz -lm -lpthread 2>&1", KILN_OPENMP_LIBS);
        rc = run_logged(cmd.data, log, "C compiler", NULL);
        sb_free(&cmd);
    }
    util_words_free(link, nlink);
    return rc;
}

int build_program(const char *model_c, const char *prog, const BuildProgramOptions *o, StrBuf *log, ObjResult *stats)
{
    if (stats) memset(stats, 0, sizeof *stats);
    if (o->distributed && !KILN_DIST_MPI[0]) {
        sb_puts(log, "--distributed needs MPI, and Kiln was built without it: install libopenmpi-dev and openmpi-bin "
                     "(scripts/deps.sh does), then configure Kiln again (cmake finds it with find_package(MPI))");
        return -1;
    }
    const char *cc = build_c_compiler(o->cc);
    size_t text_len;
    char *text = util_read_file(model_c, &text_len, log);
    if (!text) return -1;
    char dir[4200];
    const char *slash = strrchr(model_c, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - model_c) : 1, slash ? model_c : ".");
    ObjOptions oo = {.cc = cc, .cflags = o->cflags, .cpu = o->cpu, .dir = dir, .pg = o->pg};
    ObjResult objs;
    int rc = objcache_compile(text, text_len, &oo, &objs, log);
    free(text);
    if (!rc) {
        progress_stage(o->pg, 0, "linking the program");
        rc = link_program(&objs, prog, cc, o, log);
    }
    for (int i = 0; i < objs.nobjs; i++) unlink(objs.objs[i]);
    if (stats) {
        *stats = objs;
        stats->objs = NULL;
        stats->nobjs = 0;
    }
    objcache_result_free(&objs);
    return rc;
}

bool build_have_nvcc(void) { return KILN_NVCC[0] != 0; }

/* --target cuda: NVRTC and Clang (cuda_build.h), or with --nvcc this. model.cu and the
 * CUDA host runtime (runtime/cuda/device.cu) compiled at the same time,
 * then linked with the driver, the runtime and the CUDA libraries (or the emulator's) by
 * the host C++ compiler. nvcc's build targets sm_80 and sm_90 (BUILD_NVCC_ARCH); device.cu
 * without FMA contraction, so that the optimizer rounds as the host's does. A distributed
 * program adds the NCCL gradient transport (programs/dist_nccl.cu, against the
 * emulator's NCCL for cuda-emu), dist_mpi.c and MPI. */
int build_cuda_program(const char *model_cu, const char *prog, bool emulated, bool nvcc, const char *cc, const char *extra_flags, bool infer, bool distributed,
                       StrBuf *log, BuildProgress *pg)
{
    if (distributed && !KILN_DIST_MPI[0]) {
        sb_puts(log, "--distributed needs MPI, and Kiln was built without it: install libopenmpi-dev and openmpi-bin "
                     "(scripts/deps.sh does), then configure Kiln again (cmake finds it with find_package(MPI))");
        return -1;
    }
    if (distributed && !emulated && !KILN_NCCL_LIB_DIR[0]) {
        sb_puts(log, "--target cuda --distributed needs NCCL (libnccl.so and nccl.h), and Kiln found none beside the CUDA toolkit: "
                     "install NCCL (libnccl-dev), then configure Kiln again; --target cuda-emu --distributed needs none");
        return -1;
    }
    const char *cxx = getenv("CXX");
    const bool in_process = (!cxx || !*cxx) && !build_c_compiler(cc);
    if (emulated && in_process) return build_cuda_emu_in_process(model_cu, prog, extra_flags, infer, distributed, log, pg);
    if (!emulated && !nvcc) return build_cuda_nvrtc(model_cu, prog, in_process ? NULL : cxx && *cxx ? cxx : KILN_CXX, extra_flags, infer, distributed, log, pg);
    if (!cxx || !*cxx) cxx = KILN_CXX;
    if (!emulated && !build_have_nvcc()) {
        sb_puts(log, "--target cuda needs nvcc, and Kiln was built without a CUDA toolkit (cmake finds one with find_package(CUDAToolkit)); "
                     "--target cuda-emu needs none");
        return -1;
    }
    const char *slash = strrchr(model_cu, '/');
    int dirlen = slash ? (int)(slash - model_cu + 1) : 0;
    StrBuf table; /* a cuda-emu program's table of its kernels (cuda_embed.h), compiled in the link */
    sb_init(&table);
    if (emulated) {
        char *dir = dirlen ? xstrndup(model_cu, (size_t)dirlen - 1) : xstrdup(".");
        const int trc = cuda_embed_emulated(model_cu, distributed, dir, log);
        sb_printf(&table, "%s/" CUDA_EMBED_MODEL_TABLE ".cpp", dir);
        free(dir);
        if (trc) {
            sb_free(&table);
            return -1;
        }
    }
    StrBuf compile, cmd, obj[2];
    sb_init(&compile);
    sb_init(&cmd);
    if (emulated) sb_printf(&compile, "%s %s -DKILN_CUDA_EMU ", cxx, KILN_EMU_CXXFLAGS);
    else
        sb_printf(&compile, "%s -std=c++17 -O3 " BUILD_NVCC_ARCH " ", KILN_NVCC);
    if (extra_flags && *extra_flags) sb_printf(&compile, "%s ", extra_flags);
    sb_puts(&compile, "-I");
    shell_word(&compile, KILN_RUNTIME_DIR "/cuda");
    sb_puts(&compile, "-I");
    shell_word(&compile, KILN_RUNTIME_DIR);
    const char *sources[2] = {model_cu, KILN_RUNTIME_DIR "/cuda/device.cu"};
    StrBuf obj3; /* dist_nccl.cu's object (--distributed) */
    sb_init(&obj3);
    sb_printf(&obj3, "%.*smodel3.o", dirlen, model_cu);
    for (int part = 0; part < 2; part++) {
        sb_init(&obj[part]);
        sb_printf(&obj[part], "%.*smodel%d.o", dirlen, model_cu, part + 1);
        sb_printf(&cmd, "%s%s%s%s-c ", part ? "" : "( ", compile.data, part ? (emulated ? "-ffp-contract=off " : "-fmad=false ") : "", emulated ? "-x c++ " : "");
        shell_word(&cmd, sources[part]);
        sb_puts(&cmd, "-o ");
        shell_word(&cmd, obj[part].data);
        if (part && distributed) { /* then, on the same core, the gradient transport: NCCL's, bootstrapped over MPI */
            sb_printf(&cmd, "2>&1 && " PROGRESS_SH_DONE " && %s%s%s ", compile.data, emulated ? "-x c++ " : "", KILN_MPI_INCLUDES);
            if (!emulated) {
                sb_puts(&cmd, "-I");
                shell_word(&cmd, KILN_NCCL_INCLUDE_DIR);
            }
            sb_puts(&cmd, "-c ");
            shell_word(&cmd, KILN_PROGRAMS_DIR "/dist_nccl.cu");
            sb_puts(&cmd, "-o ");
            shell_word(&cmd, obj3.data);
        }
        sb_puts(&cmd, part ? "2>&1; second=$?; " PROGRESS_SH_DONE "; wait $!; first=$?; " : "2>&1; s=$?; " PROGRESS_SH_DONE "; exit $s ) & ");
    }
    sb_printf(&cmd, "[ $first = 0 ] && [ $second = 0 ] && " PROGRESS_SH_STAGE("linking the program") " && %s %s ", cxx, emulated ? KILN_EMU_CXXFLAGS : "");
    shell_word(&cmd, obj[0].data);
    shell_word(&cmd, obj[1].data);
    if (distributed) shell_word(&cmd, obj3.data);
    if (emulated) {
        sb_puts(&cmd, "-I");
        shell_word(&cmd, KILN_RUNTIME_DIR "/cuda");
        shell_word(&cmd, table.data);
    }
    shell_word(&cmd, infer ? KILN_INFER_MAIN : KILN_TRAIN_MAIN);
    if (!infer) {
        shell_word(&cmd, KILN_TRAIN_BENCH);
        shell_word(&cmd, KILN_TRAIN_CKPT);
    }
    /* the processes: MPI's, or one */
    if (!infer) shell_word(&cmd, distributed ? KILN_DIST_MPI : KILN_DIST_SINGLE);
    sb_puts(&cmd, "-o ");
    shell_word(&cmd, prog);
    shell_word(&cmd, KILN_RUNTIME_LIB);
    if (emulated) {
        if (distributed) shell_word(&cmd, KILN_CUDA_EMU_NCCL_LIB);
        shell_word(&cmd, KILN_CUDA_EMU_MODULES_LIB);
        shell_word(&cmd, KILN_CUDA_EMU_LIB);
    } else {
        if (distributed) {
            sb_puts(&cmd, "-L");
            shell_word(&cmd, KILN_NCCL_LIB_DIR);
            sb_puts(&cmd, "-Wl,-rpath,");
            shell_word(&cmd, KILN_NCCL_LIB_DIR);
            sb_puts(&cmd, "-lnccl ");
        }
        sb_puts(&cmd, "-L");
        shell_word(&cmd, KILN_CUDA_LIB_DIR);
        sb_puts(&cmd, "-Wl,-rpath,");
        shell_word(&cmd, KILN_CUDA_LIB_DIR);
        sb_puts(&cmd, "-lcublasLt -lcublas -lcudart ");
    }
    if (emulated) shell_word(&cmd, KILN_BLAS_LIB); /* the emulator's cuBLAS; the GPU program needs no OpenBLAS */
    if (distributed) sb_printf(&cmd, "%s ", KILN_MPI_LIBS);
    sb_printf(&cmd, "%s %s -lprotobuf-c -lz -lm -lpthread 2>&1", KILN_DEFAULT_LDFLAGS, KILN_OPENMP_LIBS);
    char tool[64];
    progress_stage(pg, distributed ? 3 : 2, "compiling model.cu%s with %s", emulated ? " for the CUDA emulator" : "",
                   tool_name(emulated ? cxx : KILN_NVCC, tool, sizeof tool));
    int rc = run_logged(cmd.data, log, emulated ? "C++ compiler" : "CUDA compiler", pg);
    for (int part = 0; part < 2; part++) {
        unlink(obj[part].data);
        sb_free(&obj[part]);
    }
    unlink(obj3.data);
    sb_free(&obj3);
    if (table.len) unlink(table.data);
    sb_free(&table);
    sb_free(&compile);
    sb_free(&cmd);
    return rc;
}

/* --embed-weights CKPT: checks the checkpoint's weights against the model's parameters
 * and buffers (as the program checks --weights), then appends to the generated C the
 * file's bytes (the assembler's .incbin, read when model.c is compiled) between the
 * symbols kiln_embedded_weights and kiln_embedded_weights_end, which infer_main.c reads.
 * Returns 0, or 1 after a message. */
int build_embed_weights(const char *ckpt, const Graph *g, bool cuda, StrBuf *c)
{
    krt_error err;
    struct stat st;
    char found[4096], file[4200], real[PATH_MAX];
    if (stat(ckpt, &st) == 0 && S_ISDIR(st.st_mode)) {
        int64_t step;
        bool stale;
        if (krt_ckpt_find(ckpt, found, sizeof found, &step, &stale, &err) != KRT_OK) {
            fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
            return 1;
        }
        snprintf(file, sizeof file, "%s/model.safetensors", found);
    } else {
        snprintf(file, sizeof file, "%s", ckpt);
    }
    krt_safetensors *w = NULL;
    if (krt_safetensors_read(file, &w, &err) != KRT_OK) {
        fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
        return 1;
    }
    int np = 0;
    kiln_param *ps = xcalloc((size_t)g->nnodes + 1, sizeof *ps);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM) continue;
        kiln_param *p = &ps[np++];
        p->name = ir_node_name(g, i);
        p->dtype = (krt_dtype)n->dtype;
        p->rank = n->shape.rank;
        for (int k = 0; k < n->shape.rank; k++) p->dims[k] = n->shape.d[k].k;
        p->trainable = ir_attrs(g, i)[1] != 0;
    }
    krt_status s = kiln_weights_check(ps, np, w, file, &err);
    free(ps);
    krt_safetensors_free(w);
    if (s != KRT_OK) {
        fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
        return 1;
    }
    if (!realpath(file, real)) {
        fprintf(stderr, "kiln: error: --embed-weights: %s: %s\n", file, strerror(errno));
        return 1;
    }
    for (const char *q = real; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 32) {
            fprintf(stderr, "kiln: error: --embed-weights: %s: the path has a quote, backslash or control character, which the assembler's .incbin cannot name; copy the file elsewhere\n", real);
            return 1;
        }
    /* model.cu (CUDA): the host compilation only (nvcc compiles the file once per GPU
     * architecture too, with __CUDA_ARCH__ set), and the name with C linkage, as
     * infer_main.c declares it */
    sb_printf(c, "\n#if %s\n"
                 "/* The weights, embedded by kiln build --embed-weights from %s (safetensors). */\n"
                 "__asm__(\".section .rodata\\n.balign 64\\n.globl kiln_embedded_weights\\nkiln_embedded_weights:\\n\"\n"
                 "        \".incbin \\\"%s\\\"\\n.globl kiln_embedded_weights_end\\nkiln_embedded_weights_end:\\n.previous\\n\");\n"
                 "%sconst char kiln_embedded_weights_name[] = \"%s\";\n#endif\n",
              cuda ? "!defined(__CUDA_ARCH__)" : "KILN_PART != 1", real, real, cuda ? "extern \"C\" " : "", real);
    return 0;
}

