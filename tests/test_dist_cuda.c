/* test_dist_cuda.c — distributed CUDA programs (kiln build --target cuda|cuda-emu
 * --distributed, docs/distributed.md): their gradients go through NCCL, on a stream of
 * their own (programs/dist_nccl.cu). No GPU here, so the emulated program runs the same
 * model.cu, host runtime and transport against the emulator's NCCL over MPI
 * (emu/nccl.c):
 *   - 2 emulated ranks × batch b/2 train to the weights of 1 emulated rank × batch b, and
 *     to those of the C target's 2-rank program (within 1e-5 relative, as test_dist.c's
 *     oracle: the ranks' sum adds in another order than one process);
 *   - a checkpoint of 2 emulated ranks resumes on 1;
 *   - --deterministic (an all-gather, then a kernel adding the ranks' copies in rank order)
 *     gives the bits of the emulated all-reduce, which adds in rank order too;
 *   - the GPU program compiles and links with nvcc against NCCL and MPI, and without a GPU
 *     says so and exits 1 (not in the sanitizer build, as SUPPORT_RUN_NVCC).
 * Tiny runs (the emulator is slow), and one emulated build: its 1-rank runs (without
 * mpirun) are the one-process oracle, to keep this file's time down. mpirun as root and
 * beyond the cores: test_dist.c's flags. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

#define ARGS " --batch 32 --limit 1000 --eval-every 1000 --eval-batches 1 "

static char dir[96];

static const char *at(const char *rel)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, rel);
    return buf[k];
}

static void build(const char *name, const char *flags)
{
    struct stat st;
    if (stat(at(name), &st) == 0) return;
    StrBuf out;
    sb_init(&out);
    char args[1024];
    snprintf(args, sizeof args, "build models/mlp.kiln %s -o %s", flags, at(name));
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args, out.data);
    sb_free(&out);
}

static void setup(void)
{
    StrBuf out;
    sb_init(&out);
    int have = support_run("command -v mpirun", &out) == 0;
    sb_free(&out);
    if (!have) cr_skip_test("mpirun is not installed (scripts/deps.sh installs openmpi-bin)");
    snprintf(dir, sizeof dir, "/tmp/kiln-dist-cuda-%ld", (long)getppid());
    mkdir(dir, 0700);
    build("mlp_ed", "--target cuda-emu --distributed");
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    snprintf(dir, sizeof dir, "/tmp/kiln-dist-cuda-%ld", (long)getpid());
    support_remove_dir(dir);
}

TestSuite(dist_cuda, .init = setup, .timeout = 300);

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

/* |a - b| / |b| over all tensors of two checkpoint files (L2 norms); *bitwise: all bits equal. */
static double weights_difference(const char *a, const char *b, bool *bitwise)
{
    *bitwise = true;
    krt_safetensors *x = NULL, *y = NULL;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(at(a), &x, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_safetensors_read(at(b), &y, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_safetensors_count(x), krt_safetensors_count(y), "%s and %s hold other tensors", a, b);
    double diff = 0, norm = 0;
    for (int i = 0; i < krt_safetensors_count(x); i++) {
        const krt_st_tensor *t = krt_safetensors_tensor(x, i), *u = krt_safetensors_find(y, t->name);
        cr_assert(u && u->dtype == KRT_F32 && t->dtype == KRT_F32, "%s: %s", b, t->name);
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++) n *= t->dims[d];
        const float *p = t->data, *q = u->data;
        for (int64_t e = 0; e < n; e++) {
            diff += ((double)p[e] - q[e]) * ((double)p[e] - q[e]), norm += (double)q[e] * q[e];
            if (p[e] != q[e]) *bitwise = false;
        }
    }
    krt_safetensors_free(x);
    krt_safetensors_free(y);
    return sqrt(diff / norm);
}

static void assert_close(const char *a, const char *b)
{
    bool bitwise;
    double d = weights_difference(a, b, &bitwise);
    cr_assert(d <= 1e-5, "%s and %s differ by %g relative (at most 1e-5)", a, b, d);
    fprintf(stderr, "test_dist_cuda: %s vs %s: %.3g relative\n", a, b, d);
}

/* One emulated rank, 6 steps of the whole batch: the oracle of both tests. */
static void one_process(void)
{
    struct stat st;
    if (stat(at("one/step-00000006/model.safetensors"), &st) == 0) return;
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 1 ./mlp_ed" ARGS "--steps 6 --checkpoint-dir one", &out), 0, "%s", out.data);
    sb_free(&out);
}

Test(dist_cuda, emulated_nccl_ranks_train_what_one_process_and_the_c_target_train)
{
    build("mlp_d", "--distributed");
    one_process();
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_ed" ARGS "--steps 6 --checkpoint-dir two", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "steps of 32 (2 ranks × batch 16)"), "the start line states the split:\n%s", out.data);
    cr_assert(strstr(out.data, "eval at step 6 ("), "%s", out.data);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_d" ARGS "--steps 6 --checkpoint-dir c", &out), 0, "%s", out.data);
    assert_close("two/step-00000006/model.safetensors", "one/step-00000006/model.safetensors");
    assert_close("two/step-00000006/model.safetensors", "c/step-00000006/model.safetensors");
    /* --deterministic's gather and sum kernel add in rank order, as the emulated all-reduce does */
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_ed --deterministic" ARGS "--steps 6 --checkpoint-dir det", &out), 0, "%s", out.data);
    bool bitwise;
    weights_difference("det/step-00000006/model.safetensors", "two/step-00000006/model.safetensors", &bitwise);
    cr_assert(bitwise, "--deterministic's sum in rank order differs from the emulated all-reduce's");
    sb_free(&out);
}

Test(dist_cuda, emulated_checkpoint_of_two_ranks_resumes_on_one)
{
    one_process();
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_ed" ARGS "--steps 3 --checkpoint-dir a", &out), 0, "%s", out.data);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 1 ./mlp_ed" ARGS "--steps 6 --checkpoint-dir a --resume a", &out), 0, "%s", out.data);
    assert_close("a/step-00000006/model.safetensors", "one/step-00000006/model.safetensors");
    sb_free(&out);
}

Test(dist_cuda, gpu_program_links_nccl_and_mpi_and_needs_a_gpu)
{
    if (!SUPPORT_RUN_NVCC) cr_skip_test("the GPU program is built and run in the optimised build (tests/support.h)");
    if (!KILN_NVCC[0]) cr_skip_test("no CUDA toolkit: --target cuda is not available");
    build("mlp_gd", "--target cuda --distributed");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("ldd ./mlp_gd", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "libnccl.so") && strstr(out.data, "libmpi"), "linked against NCCL and MPI:\n%s", out.data);
    int rc = run(SUPPORT_MPIRUN "-np 1 ./mlp_gd" ARGS "--steps 1", &out);
    if (!strstr(out.data, "no CUDA GPU")) { /* a machine with a GPU: then it trains */
        cr_assert_eq(rc, 0, "%s", out.data);
    } else {
        cr_assert_eq(rc, 1, "%s", out.data);
        cr_assert(strstr(out.data, "This program was built with --target cuda; --target cuda-emu builds the same model.cu"), "%s", out.data);
    }
    sb_free(&out);
}
