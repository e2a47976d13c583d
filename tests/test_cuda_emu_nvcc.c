/* test_cuda_emu_nvcc.c — every dialect test file (the .cu files of tests/cuda) also compiles with nvcc
 * for the real chips, sm_80 and sm_90, against the real CUDA headers: the emulated kernels
 * are the GPU's kernels, not a CPU dialect of their own. The test fails on a compile error,
 * on ptxas reporting register spills (spill stores or loads) or a stack frame (local
 * memory, slow on a GPU), and on static shared memory over 48 KiB; it prints what ptxas
 * said per kernel (registers, shared memory) as a summary. Skipped when CMake found no CUDA
 * toolkit (KILN_NVCC empty). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#ifndef KILN_NVCC
#define KILN_NVCC ""
#endif

typedef struct {
    int kernels, max_regs, max_smem, spills, stack;
} Ptxas;

/* Reads ptxas -v output: "Compiling entry function '...' for 'sm_90'", "N bytes stack
 * frame, N bytes spill stores, N bytes spill loads", "Used N registers, ... N bytes smem". */
static Ptxas parse(const char *out, const char *file, const char *arch)
{
    Ptxas p = {0, 0, 0, 0, 0};
    char kernel[256] = "";
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        if (len >= sizeof buf) len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = 0;
        const char *s;
        int a, b, c;
        if ((s = strstr(buf, "Compiling entry function '")) && strstr(buf, arch)) {
            p.kernels++;
            sscanf(s + strlen("Compiling entry function '"), "%255[^']", kernel);
        } else if ((s = strstr(buf, "bytes stack frame")) && sscanf(buf, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &a, &b, &c) == 3) {
            if (*kernel) {
                if (b || c) {
                    p.spills++;
                    fprintf(stderr, "note: %s %s: %s spills (%d bytes stores, %d bytes loads)\n", file, arch, kernel, b, c);
                }
                if (a) {
                    p.stack++;
                    fprintf(stderr, "note: %s %s: %s has a %d-byte stack frame\n", file, arch, kernel, a);
                }
            }
        } else if ((s = strstr(buf, "Used ")) && sscanf(s, "Used %d registers", &a) == 1 && *kernel) {
            if (a > p.max_regs) p.max_regs = a;
            const char *sm = strstr(s, "bytes smem");
            if (sm) {
                const char *q = sm;
                while (q > s && q[-1] == ' ') q--;
                while (q > s && q[-1] >= '0' && q[-1] <= '9') q--;
                int bytes = atoi(q);
                if (bytes > p.max_smem) p.max_smem = bytes;
                if (bytes > 49152) fprintf(stderr, "note: %s %s: %s uses %d bytes of static shared memory\n", file, arch, kernel, bytes);
            }
            *kernel = 0;
        }
        line = end ? end + 1 : NULL;
    }
    return p;
}

/* Runs nvcc on tests/cuda/<file> for one architecture (one run per architecture, so that
 * the kernels' reports are not interleaved); returns what ptxas reported, its output in out
 * (initialised here). */
static Ptxas run_nvcc(const char *file, const char *arch, const char *flags, StrBuf *out)
{
    if (!*KILN_NVCC) cr_skip_test("no CUDA toolkit found by CMake (find_package(CUDAToolkit))");
    if (!SUPPORT_RUN_NVCC) cr_skip_test("sanitizer build: nvcc runs in the optimised build (support.h)");
    char dir[] = "/tmp/kiln-nvcc-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' -std=c++17 -O3 -arch=%s %s -Xptxas -v -I'%s/runtime/cuda' -I'%s/runtime' -I'%s/tests/cuda' -c "
             "'%s/tests/cuda/%s' -o '%s/out.o'",
             KILN_NVCC, arch, flags, KILN_SOURCE_DIR, KILN_SOURCE_DIR, KILN_SOURCE_DIR, KILN_SOURCE_DIR, file, dir);
    sb_init(out);
    int rc = support_run(cmd, out);
    support_remove_dir(dir);
    if (!out->data) sb_puts(out, "");
    cr_assert_eq(rc, 0, "nvcc failed on %s for %s:\n%s", file, arch, out->data);
    return parse(out->data, file, arch);
}

/* A dialect file: compiles, no kernel spills or has a stack frame, static shared memory
 * within 48 KiB; prints the summary. */
static void compile(const char *file, const char *arch)
{
    StrBuf out;
    Ptxas p = run_nvcc(file, arch, "", &out);
    printf("nvcc %s %s: %d kernels, at most %d registers and %d bytes of static shared memory, %d spilling, %d with "
           "a stack frame\n",
           arch, file, p.kernels, p.max_regs, p.max_smem, p.spills, p.stack);
    fflush(stdout);
    cr_expect_eq(p.spills, 0, "%s for %s: kernels spill registers:\n%s", file, arch, out.data);
    cr_expect_eq(p.stack, 0, "%s for %s: kernels use local memory:\n%s", file, arch, out.data);
    cr_expect_leq(p.max_smem, 49152, "%s for %s: static shared memory over 48 KiB", file, arch);
    /* api_compat.cu is host code only; the kernel files have kernels to report. */
    if (strcmp(file, "api_compat.cu") != 0) cr_expect_gt(p.kernels, 0, "no kernel compiled in %s:\n%s", file, out.data);
    sb_free(&out);
}

Test(cuda_nvcc, kernels_sm80) { compile("kernels.cu", "sm_80"); }
Test(cuda_nvcc, kernels_sm90) { compile("kernels.cu", "sm_90"); }
Test(cuda_nvcc, misuse_sm80) { compile("misuse.cu", "sm_80"); }
Test(cuda_nvcc, misuse_sm90) { compile("misuse.cu", "sm_90"); }
Test(cuda_nvcc, api_compat_sm90) { compile("api_compat.cu", "sm_90"); }
Test(cuda_nvcc, attention_sm80) { compile("attention.cu", "sm_80"); }
Test(cuda_nvcc, attention_sm90) { compile("attention.cu", "sm_90"); }
Test(cuda_nvcc, example_sm80) { compile("example.cu", "sm_80"); }
Test(cuda_nvcc, example_sm90) { compile("example.cu", "sm_90"); }

/* The check itself: a kernel held to 16 registers spills, and the parser says so. */
Test(cuda_nvcc, spills_are_detected)
{
    StrBuf out;
    Ptxas p = run_nvcc("bad/spills.cu", "sm_90", "-maxrregcount=16", &out);
    cr_expect_eq(p.kernels, 1, "%s", out.data);
    cr_expect_eq(p.spills, 1, "%s", out.data);
    cr_expect_eq(p.stack, 1, "%s", out.data);
    sb_free(&out);
}
