/* build.h — compiling generated C into a training program (build.c). */
#ifndef KILN_CLI_BUILD_H
#define KILN_CLI_BUILD_H

#include <stdbool.h>

#include "../ir/ir.h"
#include "../util/util.h"
#include "objcache.h"
#include "progress.h"

/* What else a cached program depends on: the CPU (generated code is built with
 * -march=native), and the runtime library and driver it links (their size and time). */
void build_fingerprint(StrBuf *key);
/* The host CPU's model name and feature flags (/proc/cpuinfo): the target of -march=native. */
void build_cpu_features(StrBuf *key);

typedef struct {
    const char *cc;     /* --cc (NULL: build_c_compiler's choice) */
    const char *cflags; /* --cflags, after Kiln's flags */
    const char *cpu;    /* --cpu NAME: -march=NAME (NULL: the host's, -march=native) */
    /* infer: link the inference program's driver (infer_main.c) instead of train_main.c.
     * distributed: a training program of MPI ranks (programs/dist_mpi.c and MPI's
     * libraries, kiln build --distributed) instead of one process (dist_single.c); -1 with
     * a message when Kiln was built without MPI. */
    bool infer, distributed;
    BuildProgress *pg; /* may be NULL: the progress line, which the compile and link advance */
} BuildProgramOptions;

/* Compiles model_c into prog: its pieces through the object cache (objcache.h), on all
 * cores, then the link with the runtime's driver. Returns 0, or -1 with the compiler's
 * output in *log. *stats (may be NULL): how many pieces were compiled and cached (its objs
 * are not kept). */
int build_program(const char *model_c, const char *prog, const BuildProgramOptions *o, StrBuf *log, ObjResult *stats);
/* The C compiler a build uses: --cc when given, else $CC, else Clang in this process
 * (NULL) where Kiln has it (toolchain.h), else the compiler Kiln was built with. */
const char *build_c_compiler(const char *cc_flag);
/* Compiles model_cu (--target cuda, or cuda-emu when `emulated`) with the CUDA host runtime
 * and the driver (infer: the inference program's, infer_main.c) into prog. extra_flags go
 * to both compilations. Returns 0, or -1 with the compiler's output in *log. */
int build_cuda_program(const char *model_cu, const char *prog, bool emulated, bool nvcc, const char *cc, const char *extra_flags, bool infer, bool distributed,
                       StrBuf *log, BuildProgress *pg);
/* --target cuda-emu with Clang and lld in this process (emu_build.c): build_cuda_program's
 * choice when no compiler is named ($CXX, or --cc/$CC: build_c_compiler) and kiln has Clang. */
int build_cuda_emu_in_process(const char *model_cu, const char *prog, const char *extra_flags, bool infer, bool distributed, StrBuf *log,
                              BuildProgress *pg);
/* Compiles model_c (an inference model.c) into an embeddable library in dir: dir/NAME.h,
 * dir/libNAME.a and dir/libNAME.so (lib_build.c), with build_c_compiler(cc)'s compiler
 * (Clang, lld and LLVM's tools in this process when NULL). Returns 0, or -1 with the
 * tools' output in *log. */
int build_library(const char *model_c, const char *dir, const char *name, const char *cc, const char *extra_cflags, StrBuf *log, BuildProgress *pg);
/* Appends s as one single-quoted shell word (and a space); runs a shell command with its
 * output appended to log, 0 when it succeeded (`what` names it in the log), following
 * its progress markers (progress.h) on pg. */
void build_shell_word(StrBuf *b, const char *s);
int build_run_logged(const char *cmd, StrBuf *log, const char *what, BuildProgress *pg);
/* Whether Kiln was built with a CUDA toolkit (nvcc) for --target cuda. */
bool build_have_nvcc(void);
/* The GPUs --target cuda builds for: one compute_80 PTX, assembled by ptxas for the A100
 * (sm_80) and the H100/H200 (sm_90), and kept in the program so that the driver compiles it
 * for a newer GPU. The kernels use nothing of sm_90 that compute_80 lacks, and ptxas gives
 * sm_90 the same registers from either PTX (all 314 kernel reports of gpt); nvcc's front
 * end runs once instead of twice (gpt's model.cu: 13.1 s -> 9.7 s). The tests that run
 * nvcc on generated code use these flags too. */
#define BUILD_NVCC_ARCH "-gencode 'arch=compute_80,code=[sm_80,sm_90,compute_80]'" /* one shell word: [] quoted */

/* The build's scratch directory, $TMPDIR/kiln-build-PID-XXXXXX ($TMPDIR or /tmp), is
 * removed on every exit path: by build_tempdir_remove, by a handler on SIGINT, SIGTERM
 * and SIGHUP, and, for a build killed outright (SIGKILL), by the next build, which
 * removes the directories of processes that no longer exist. 0, or -1 with errno. */
int build_tempdir_make(char *dir, size_t size);
void build_tempdir_remove(const char *dir);

/* --embed-weights CKPT: checks the checkpoint's weights (a safetensors file or a checkpoint
 * directory) against graph g's parameters and buffers, as the program checks --weights,
 * then appends to the generated code c the assembler's .incbin of the file between the
 * symbols kiln_embedded_weights and kiln_embedded_weights_end, which infer_main.c reads.
 * Returns 0, or 1 after a message. */
int build_embed_weights(const char *ckpt, const Graph *g, bool cuda, StrBuf *c);

#endif
