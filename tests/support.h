/* support.h — helpers shared by the Criterion tests: reading and compiling files of the
 * source tree and running the built `kiln` command, capturing what it prints. */
#ifndef KILN_TESTS_SUPPORT_H
#define KILN_TESTS_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../frontend/frontend.h"
#include "../util/util.h"

/* Reads KILN_SOURCE_DIR/relpath; NULL when missing. */
char *support_read(const char *relpath, size_t *len);
/* Compiles the model file relpath (relative to the source tree) in a graph mode, its
 * diagnostics in d (initialised here); fails the test when it cannot. */
Model *support_compile_file(const char *relpath, GraphMode mode, Diag *d);
/* Runs `KILN_BINARY args` with stdout and stderr captured together into out; returns the
 * exit status (or -1 when it was killed by a signal). */
int support_run_kiln(const char *args, StrBuf *out);
/* Runs a shell command line with stdout and stderr captured into out; returns the exit
 * status, or -1 when it was killed by a signal. */
int support_run(const char *cmdline, StrBuf *out);
/* Makes a fresh directory /tmp/kiln-TAG-XXXXXX (into dir, at least 64 bytes) and builds
 * the model file `model` (relative to the source tree) into dir/NAME with `kiln build`;
 * returns kiln's exit status, its output in out. */
int support_build_in_temp(const char *tag, const char *model, const char *name, char *dir, size_t dirsize, StrBuf *out);
/* rm -rf of a directory made by support_build_in_temp. */
void support_remove_dir(const char *dir);
/* Runs a shell command in directory dir, out emptied first (stdout and stderr); the exit
 * status as support_run. */
int support_run_in(const char *dir, const char *cmd, StrBuf *out);
/* The "loss" values of a program's JSON-lines log, at most cap of them into v: how many
 * (-1 when the file cannot be read). */
int support_log_losses(const char *path, double *v, int cap);
/* The names in directory dir (hidden ones too, at most 64), sorted, joined by '|' (static
 * buffer, valid until the next call); fails the test when dir cannot be read. */
const char *support_listing(const char *dir);
/* Writes a 2-D (cols > 0) or 1-D (cols == 0) .npy file of float32 (descr "<f4") or int64
 * ("<i8") values; false when it cannot. */
bool support_write_npy(const char *path, const char *descr, int64_t rows, int64_t cols, const double *values);
/* Absolute path of a file in the source tree (static buffer, valid until the next call). */
const char *support_path(const char *relpath);

/* What ptxas -v printed for each kernel (nvcc -Xptxas -v): how many kernels it reported,
 * how many spill registers, how many have a stack frame, and the most registers one uses. */
typedef struct {
    int kernels, spilling, stack, max_registers;
} SupportPtxas;
SupportPtxas support_ptxas_summary(const char *out);

/* Whether this is the sanitizer build (ASan + UBSan). CI runs every test in the optimised
 * build too, so checks whose verdict does not depend on how kiln and the programs were
 * built run once, there:
 *   - SUPPORT_RUN_NVCC: nvcc's verdict on a model.cu (compiles, no spills) depends on the
 *     text kiln wrote; the sanitizer build still runs kiln emit on every model (its memory
 *     is what ASan checks there) and leaves the minutes of nvcc to the other;
 *   - SUPPORT_REPEAT_RUNS: a second run of the same code for a numerical verdict (another
 *     thread order of the emulator beside the shuffled one, a checkpoint resumed across
 *     targets as well as on its own, more seeds or more elements of a gradient check):
 *     the sanitizer sees no other memory accesses in it. */
#if defined(__SANITIZE_ADDRESS__)
#define SUPPORT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SUPPORT_SANITIZED 1
/* Test data written here, no installed dataset needed (test_threads, test_bits): a u8
 * IDX file of `rank` dims whose values are a linear congruential sequence (labels < 10),
 * and text for the language models, words drawn from a short list. */
void support_write_idx(const char *path, int rank, const uint32_t *dims, bool labels);
void support_write_text(const char *path);
/* In dir: img.idx (384 images of 28x28) and lab.idx (their labels) for the image models,
 * text.txt for the language models. */
void support_write_training_data(const char *dir);

#endif
/* Test data written here, no installed dataset needed (test_threads, test_bits): a u8
 * IDX file of `rank` dims whose values are a linear congruential sequence (labels < 10),
 * and text for the language models, words drawn from a short list. */
void support_write_idx(const char *path, int rank, const uint32_t *dims, bool labels);
void support_write_text(const char *path);
/* In dir: img.idx (384 images of 28x28) and lab.idx (their labels) for the image models,
 * text.txt for the language models. */
void support_write_training_data(const char *dir);

#endif
#ifndef SUPPORT_SANITIZED
#define SUPPORT_SANITIZED 0
/* Test data written here, no installed dataset needed (test_threads, test_bits): a u8
 * IDX file of `rank` dims whose values are a linear congruential sequence (labels < 10),
 * and text for the language models, words drawn from a short list. */
void support_write_idx(const char *path, int rank, const uint32_t *dims, bool labels);
void support_write_text(const char *path);
/* In dir: img.idx (384 images of 28x28) and lab.idx (their labels) for the image models,
 * text.txt for the language models. */
void support_write_training_data(const char *dir);

#endif
#define SUPPORT_RUN_NVCC (!SUPPORT_SANITIZED)

/* mpirun as the distributed tests run it: as root (CI's containers), more ranks than cores,
 * and without LeakSanitizer in the ranks (OpenMPI's own allocations at exit). */
#define SUPPORT_MPIRUN                                                                                                     \
    "ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
#define SUPPORT_REPEAT_RUNS (!SUPPORT_SANITIZED)
/* Test data written here, no installed dataset needed (test_threads, test_bits): a u8
 * IDX file of `rank` dims whose values are a linear congruential sequence (labels < 10),
 * and text for the language models, words drawn from a short list. */
void support_write_idx(const char *path, int rank, const uint32_t *dims, bool labels);
void support_write_text(const char *path);
/* In dir: img.idx (384 images of 28x28) and lab.idx (their labels) for the image models,
 * text.txt for the language models. */
void support_write_training_data(const char *dir);

#endif
