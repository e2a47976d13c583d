/* test_cuda_emu.c — the CUDA emulator (emu/) running kernels written in Kiln's
 * dialect (the .cu files of tests/cuda, compiled as C++ with KILN_CUDA_EMU): known results for a block
 * reduction with shared memory and shuffles, a row softmax, a grid-stride elementwise
 * kernel, a tiled transpose, atomics, dynamic shared memory; the same bits in forward,
 * reverse and shuffled thread order, and a wrong result for a kernel missing a barrier in
 * reverse order; every misuse reported with what, where and which threads; the runtime
 * API's checks (directions, bounds, handles). */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../emu/kemu_driver.h"
#include "../emu/kemu_runtime.h"
#include "cuda/kernels.h"
#include "support.h"

/* Deterministic uniform floats in [lo, hi). */
static void fill(float *x, int n, float lo, float hi, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
}

/* What the test wrote to stderr so far (cr_redirect_stderr in the test's init). */
static char *captured_stderr(void)
{
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    static char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    return buf;
}

static void quiet_stderr(void) { cr_redirect_stderr(); }

/* ---- known results ------------------------------------------------------------------ */

static void check_sum(int n, int grid, int block)
{
    float *x = xmalloc((size_t)n * sizeof *x);
    fill(x, n, -1.0f, 2.0f, (uint32_t)n);
    double want = 0;
    for (int i = 0; i < n; i++) want += x[i];
    float got = NAN;
    cr_assert_eq(kt_sum(x, n, grid, block, &got), 0);
    cr_expect(fabs(got - want) <= 1e-5 * fabs(want) + 1e-4, "n %d grid %d block %d: %.7g, want %.7g", n, grid, block,
              got, want);
    free(x);
}

Test(cuda_emu, block_sum_reduction)
{
    check_sum(100000, 37, 256);
    check_sum(1000, 3, 32);
    check_sum(5000, 5, 1024);
    check_sum(1, 1, 64);
    kemu_stats s = kemu_get_stats();
    cr_expect_gt(s.barriers, 0);
    cr_expect_gt(s.shuffles, 0);
    cr_expect_gt(s.threads, 100000 / 256);
}

Test(cuda_emu, softmax_one_block_per_row)
{
    int shapes[][3] = {{13, 1000, 128}, {4, 5, 64}, {3, 1, 32}, {2, 4099, 1024}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], block = shapes[s][2];
        size_t n = (size_t)rows * cols;
        float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
        fill(x, (int)n, -8.0f, 8.0f, 7u + (uint32_t)s);
        cr_assert_eq(kt_softmax(x, rows, cols, block, y), 0);
        for (int r = 0; r < rows; r++) {
            double m = -INFINITY, sum = 0, total = 0;
            for (int j = 0; j < cols; j++) m = fmax(m, x[r * cols + j]);
            for (int j = 0; j < cols; j++) sum += exp(x[r * cols + j] - m);
            for (int j = 0; j < cols; j++) {
                double want = exp(x[r * cols + j] - m) / sum;
                cr_assert(fabs(y[r * cols + j] - want) <= 1e-6 + 1e-5 * want, "[%d,%d] %g want %g", r, j,
                          y[r * cols + j], want);
                total += y[r * cols + j];
            }
            cr_expect(fabs(total - 1.0) < 1e-5);
        }
        free(x);
        free(y);
    }
}

Test(cuda_emu, grid_stride_elementwise)
{
    int n = 10007;
    float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
    fill(x, n, -4.0f, 4.0f, 3u);
    /* Fewer threads than elements (grid stride), a block size that is not a multiple of 32
     * (no shuffles here, so allowed), and more threads than elements. */
    int shapes[][2] = {{7, 96}, {1, 1}, {100, 128}};
    for (size_t s = 0; s < 3; s++) {
        memset(y, 0, (size_t)n * sizeof *y);
        cr_assert_eq(kt_axpy_tanh(x, n, 0.5f, shapes[s][0], shapes[s][1], y), 0);
        for (int i = 0; i < n; i++) {
            float want = 0.5f * x[i] + tanhf(x[i]);
            cr_assert(fabsf(y[i] - want) <= 1e-6f * (1.0f + fabsf(want)), "[%d] %g want %g", i, y[i], want);
        }
    }
    free(x);
    free(y);
}

Test(cuda_emu, transpose_2d_blocks_and_tile)
{
    int rows = 67, cols = 45;
    float *x = xmalloc((size_t)rows * cols * sizeof *x), *y = xmalloc((size_t)rows * cols * sizeof *y);
    fill(x, rows * cols, 0.0f, 1.0f, 11u);
    cr_assert_eq(kt_transpose(x, rows, cols, y), 0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) cr_assert_eq(y[c * rows + r], x[r * cols + c], "[%d,%d]", r, c);
    free(x);
    free(y);
}

Test(cuda_emu, atomics_histogram_and_sums)
{
    int n = 50000, bins = 100;
    int *v = xmalloc((size_t)n * sizeof *v), hist[100], want[100] = {0};
    long long total = 0;
    uint32_t seed = 5;
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (int)(seed >> 16) % bins;
        want[v[i]]++;
        total += v[i];
    }
    float fsum = 0;
    double dsum = 0;
    cr_assert_eq(kt_histogram(v, n, bins, 13, 128, hist, &fsum, &dsum), 0);
    for (int b = 0; b < bins; b++) cr_expect_eq(hist[b], want[b], "bin %d", b);
    /* Integers below 2^24 add exactly in float whatever the order. */
    cr_expect_eq(fsum, (float)total);
    cr_expect_eq(dsum, (double)total);
    free(v);
}

Test(cuda_emu, dynamic_shared_memory)
{
    int n = 4096, block = 256;
    float x[4096], y[4096];
    fill(x, n, 0.0f, 1.0f, 17u);
    cr_assert_eq(kt_block_reverse(x, n, block, y), 0);
    for (int i = 0; i < n; i++) {
        int b = i / block, t = i % block;
        cr_assert_eq(y[i], x[b * block + block - 1 - t], "[%d]", i);
    }
}

Test(cuda_emu, opt_in_dynamic_shared_memory) { cr_expect_eq(kt_opt_in_shared(), 0); }

Test(cuda_emu, api_tour) { cr_expect_eq(kt_api_tour(), 0, "check at api_compat.cu:%d failed", kt_api_tour()); }

/* ---- thread orders ------------------------------------------------------------------ */

/* The outputs of every correct kernel, concatenated. */
typedef struct {
    float sum, fsum;
    double dsum;
    int hist[64];
    float softmax[5 * 300], transpose[40 * 33], reverse[1024], diff[1024];
} Outputs;

static void run_all(Outputs *o)
{
    static float x[5 * 300];
    fill(x, 5 * 300, -3.0f, 3.0f, 23u);
    int v[3000];
    for (int i = 0; i < 3000; i++) v[i] = (i * 37) % 64;
    memset(o, 0, sizeof *o);
    cr_assert_eq(kt_sum(x, 5 * 300, 3, 128, &o->sum), 0);
    cr_assert_eq(kt_softmax(x, 5, 300, 96, o->softmax), 0);
    cr_assert_eq(kt_transpose(x, 40, 33, o->transpose), 0);
    cr_assert_eq(kt_histogram(v, 3000, 64, 4, 64, o->hist, &o->fsum, &o->dsum), 0);
    cr_assert_eq(kt_block_reverse(x, 1024, 128, o->reverse), 0);
    cr_assert_eq(kt_adjacent_diff(x, 1024, 256, 0, o->diff), 0);
}

Test(cuda_emu_order, correct_kernels_same_bits_in_every_order)
{
    static Outputs forward, other;
    kemu_set_order(KEMU_ORDER_FORWARD, 1);
    run_all(&forward);
    struct {
        kemu_order order;
        uint64_t seed;
    } modes[] = {{KEMU_ORDER_REVERSE, 1}, {KEMU_ORDER_SHUFFLE, 1}, {KEMU_ORDER_SHUFFLE, 12345}};
    for (size_t m = 0; m < 3; m++) {
        kemu_set_order(modes[m].order, modes[m].seed);
        run_all(&other);
        cr_expect(memcmp(&forward, &other, sizeof forward) == 0, "order %d seed %llu differs from forward",
                  (int)modes[m].order, (unsigned long long)modes[m].seed);
    }
}

/* The x86-64 stack switch and the ucontext one (KILN_CUDA_EMU_SWITCH=ucontext) run the
 * same kernels to the same bits. */
Test(cuda_emu_order, ucontext_switch_same_bits)
{
    static Outputs fast, portable;
    kemu_set_order(KEMU_ORDER_SHUFFLE, 3);
    unsetenv("KILN_CUDA_EMU_SWITCH");
    run_all(&fast);
    setenv("KILN_CUDA_EMU_SWITCH", "ucontext", 1);
    run_all(&portable);
    unsetenv("KILN_CUDA_EMU_SWITCH");
    cr_expect(memcmp(&fast, &portable, sizeof fast) == 0);
}

static int diff_correct(const float *x, const float *y, int n, int block)
{
    for (int i = 0; i < n; i++) {
        float want = i % block ? x[i] - x[i - 1] : x[i];
        if (!(y[i] == want)) return 0;
    }
    return 1;
}

Test(cuda_emu_order, missing_barrier_is_exposed_by_reverse_and_shuffle)
{
    int n = 1024, block = 256;
    float x[1024], y[1024];
    fill(x, n, 1.0f, 2.0f, 29u);
    /* Forward order runs thread t-1 before thread t, which hides the race: that is why the
     * other orders exist. */
    kemu_set_order(KEMU_ORDER_FORWARD, 1);
    cr_assert_eq(kt_adjacent_diff(x, n, block, 1, y), 0);
    cr_expect(diff_correct(x, y, n, block), "forward order happens to give the right answer");
    kemu_set_order(KEMU_ORDER_REVERSE, 1);
    cr_assert_eq(kt_adjacent_diff(x, n, block, 1, y), 0);
    cr_expect(!diff_correct(x, y, n, block), "reverse order must expose the missing barrier");
    kemu_set_order(KEMU_ORDER_SHUFFLE, 7);
    cr_assert_eq(kt_adjacent_diff(x, n, block, 1, y), 0);
    cr_expect(!diff_correct(x, y, n, block), "shuffled order must expose the missing barrier");
    /* With the barrier, every order is right. */
    kemu_order orders[] = {KEMU_ORDER_FORWARD, KEMU_ORDER_REVERSE, KEMU_ORDER_SHUFFLE};
    for (int i = 0; i < 3; i++) {
        kemu_set_order(orders[i], 7);
        cr_assert_eq(kt_adjacent_diff(x, n, block, 0, y), 0);
        cr_expect(diff_correct(x, y, n, block), "order %d", i);
    }
}

Test(cuda_emu_order, order_from_environment)
{
    setenv("KILN_CUDA_EMU_ORDER", "reverse", 1);
    cr_expect_eq(kemu_get_order(), KEMU_ORDER_REVERSE);
    float x[256], y[256];
    fill(x, 256, 1.0f, 2.0f, 31u);
    cr_assert_eq(kt_adjacent_diff(x, 256, 256, 1, y), 0);
    cr_expect(!diff_correct(x, y, 256, 256));
}

Test(cuda_emu_order, shuffle_env_with_seed)
{
    setenv("KILN_CUDA_EMU_ORDER", "shuffle", 1);
    setenv("KILN_CUDA_EMU_SEED", "99", 1);
    cr_expect_eq(kemu_get_order(), KEMU_ORDER_SHUFFLE);
}

/* ---- misuse ------------------------------------------------------------------------- */

TestSuite(cuda_emu_misuse, .init = quiet_stderr);

static void expect_has(const char *text, const char *part)
{
    cr_expect(strstr(text, part) != NULL, "expected \"%s\" in:\n%s", part, text);
}

Test(cuda_emu_misuse, barrier_not_reached_by_exited_threads)
{
    cr_expect_eq(kt_misuse_barrier_exit(), cudaErrorLaunchFailure);
    const char *m = kemu_last_error_message();
    expect_has(m, "kernel 'kt_barrier_exit'");
    expect_has(m, "block (0,0,0)");
    expect_has(m, "barrier divergence: __syncthreads at ");
    expect_has(m, "misuse.cu:");
    expect_has(m, "reached by 32 of 64 threads");
    expect_has(m, "exited without reaching it: 32-63");
    /* KILN_LAUNCH reported it with the kernel's name. */
    cr_expect_eq(kt_misuse_reports(), 1);
    char *err = captured_stderr();
    expect_has(err, "error: kernel 'kt_barrier_exit' failed: unspecified launch failure");
    /* Sticky, as a device fault: every later call fails until cudaDeviceReset. */
    void *p = NULL;
    cr_expect_eq(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
    cr_expect_eq(cudaGetLastError(), cudaErrorLaunchFailure);
    cr_expect_eq(cudaGetLastError(), cudaErrorLaunchFailure);
    cr_expect_eq(cudaDeviceReset(), cudaSuccess);
    cr_expect_eq(cudaMalloc(&p, 16), cudaSuccess);
    cr_expect_eq(cudaFree(p), cudaSuccess);
    /* And the emulator works again. */
    float x[64], s = 0;
    fill(x, 64, 0.0f, 1.0f, 1u);
    cr_expect_eq(kt_sum(x, 64, 1, 64, &s), 0);
}

Test(cuda_emu_misuse, threads_at_different_barriers)
{
    cr_expect_eq(kt_misuse_barrier_sites(), cudaErrorLaunchFailure);
    const char *m = kemu_last_error_message();
    expect_has(m, "threads wait at different __syncthreads");
    expect_has(m, "kt_barrier_sites");
}

Test(cuda_emu_misuse, shuffle_not_reached_by_whole_warp)
{
    cr_expect_eq(kt_misuse_shfl_partial(), cudaErrorLaunchFailure);
    const char *m = kemu_last_error_message();
    expect_has(m, "not reached by the whole warp 0");
    expect_has(m, "lanes waiting there: 0-15");
    expect_has(m, "exited: 16-31");
}

Test(cuda_emu_misuse, lanes_at_different_shuffles)
{
    cr_expect_eq(kt_misuse_shfl_sites(), cudaErrorLaunchFailure);
    const char *m = kemu_last_error_message();
    expect_has(m, "warp 0: lanes wait at different warp shuffles: lane 0 at ");
    expect_has(m, ", lane 1 at ");
}

Test(cuda_emu_misuse, shuffle_in_partial_warp)
{
    cr_expect_eq(kt_misuse_shfl_small_block(), cudaErrorLaunchFailure);
    const char *m = kemu_last_error_message();
    expect_has(m, "partial warp (threads 32-47 of a 48-thread block)");
}

Test(cuda_emu_misuse, shared_memory_over_the_limit)
{
    cr_expect_eq(kt_misuse_shared_limit(), cudaErrorLaunchOutOfResources);
    const char *m = kemu_last_error_message();
    expect_has(m, "shared memory over the limit: __shared__ 'big'");
    expect_has(m, "40960 bytes of static and 16384 of dynamic");
    expect_has(m, "limit is 49152 bytes");
}

/* In a sanitizer build the write itself is stopped, by UBSan's bounds check for an array
 * and by ASan for dynamic shared memory (the red zone is poisoned): the process ends there,
 * so these two only run in the plain build. */
Test(cuda_emu_misuse, write_past_a_shared_array)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("sanitizer build: UBSan stops at the write itself");
#else
    cr_expect_eq(kt_misuse_shared_overflow(), cudaErrorLaunchFailure);
    expect_has(kemu_last_error_message(), "wrote past the end of __shared__ 's'");
    expect_has(kemu_last_error_message(), "128 bytes");
#endif
}

Test(cuda_emu_misuse, write_past_dynamic_shared_memory)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("sanitizer build: ASan stops at the write itself");
#else
    cr_expect_eq(kt_misuse_dynamic_overflow(), cudaErrorLaunchFailure);
    expect_has(kemu_last_error_message(), "wrote past the end of dynamic shared memory (128 bytes given at launch)");
    expect_has(kemu_last_error_message(), "kt_dynamic_overflow");
#endif
}

Test(cuda_emu_misuse, block_of_2048_threads)
{
    cr_expect_eq(kt_misuse_block_too_large(), cudaErrorInvalidConfiguration);
    expect_has(kemu_last_error_message(), "block (2048,1,1) = 2048 threads");
    /* Not sticky: a configuration error leaves the device usable. */
    void *p = NULL;
    cr_expect_eq(cudaMalloc(&p, 4), cudaSuccess);
    cudaFree(p);
}

Test(cuda_emu_misuse, dynamic_shared_over_48k_without_opting_in)
{
    cr_expect_eq(kt_misuse_dynamic_too_large(), cudaErrorInvalidValue);
    expect_has(kemu_last_error_message(), "65536 bytes of dynamic shared memory, over the limit of 49152");
}

Test(cuda_emu_misuse, host_pointer_as_kernel_argument)
{
    cr_expect_eq(kt_misuse_host_pointer(), cudaErrorIllegalAddress);
    expect_has(kemu_last_error_message(), "kernel 'kt_write_index'");
    expect_has(kemu_last_error_message(), "argument 1 is a pointer to memory from neither cudaMalloc");
}

/* ---- runtime API checks --------------------------------------------------------------- */

TestSuite(cuda_emu_api, .init = quiet_stderr);

Test(cuda_emu_api, copies_check_direction_and_bounds)
{
    float *d = NULL, host[16] = {0};
    cr_assert_eq(cudaMalloc((void **)&d, 16 * sizeof(float)), cudaSuccess);
    /* New device memory reads as NaN until written. */
    cr_expect_eq(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_expect(isnan(host[0]) && isnan(host[15]));
    cr_expect_eq(cudaMemcpy(host, d, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    expect_has(kemu_last_error_message(), "cudaMemcpy(cudaMemcpyHostToDevice, 64 bytes): the destination");
    cr_expect_eq(cudaGetLastError(), cudaErrorInvalidValue);
    cr_expect_eq(cudaGetLastError(), cudaSuccess);
    cr_expect_eq(cudaMemcpy(d + 8, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    expect_has(kemu_last_error_message(), "not inside one cudaMalloc allocation for the whole copy");
    cr_expect_eq(cudaMemcpy(d + 8, host, sizeof host / 2, cudaMemcpyHostToDevice), cudaSuccess);
    cr_expect_eq(cudaMemcpy(d, host, sizeof host, cudaMemcpyDefault), cudaSuccess);
    cr_expect_eq(cudaMemcpy(d + 1, host, sizeof host, cudaMemcpyDefault), cudaErrorInvalidValue);
    cr_expect_eq(cudaMemset(d + 1, 0, sizeof host), cudaErrorInvalidValue);
    cr_expect_eq(cudaMemset(host, 0, sizeof host), cudaErrorInvalidValue);
    cr_expect_eq(cudaMemcpy(host, host + 8, 0, (enum cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
    cr_expect_eq(cudaFree(d), cudaSuccess);
}

Test(cuda_emu_api, frees_check_what_they_free)
{
    void *d = NULL, *h = NULL;
    int on_stack = 0;
    cr_assert_eq(cudaMalloc(&d, 100), cudaSuccess);
    cr_assert_eq(cudaMallocHost(&h, 100), cudaSuccess);
    cr_expect_eq(cudaFree(h), cudaErrorInvalidValue);
    expect_has(kemu_last_error_message(), "free it with cudaFreeHost");
    cr_expect_eq(cudaFreeHost(d), cudaErrorInvalidValue);
    cr_expect_eq(cudaFree(&on_stack), cudaErrorInvalidValue);
    cr_expect_eq(cudaFree((char *)d + 4), cudaErrorInvalidValue);
    cr_expect_eq(cudaFree(d), cudaSuccess);
    cr_expect_eq(cudaFree(d), cudaErrorInvalidValue);
    expect_has(kemu_last_error_message(), "freed twice, or never allocated");
    cr_expect_eq(cudaFreeHost(h), cudaSuccess);
    cr_expect_eq(cudaFree(NULL), cudaSuccess);
    cr_expect_eq(cudaMalloc(&d, 0), cudaSuccess);
    cr_expect_null(d);
}

Test(cuda_emu_api, streams_and_events)
{
    cudaStream_t s;
    cudaEvent_t a, b, untimed;
    float ms;
    cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
    cr_assert_eq(cudaEventCreate(&a), cudaSuccess);
    cr_assert_eq(cudaEventCreate(&b), cudaSuccess);
    cr_assert_eq(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
    cr_expect_eq(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle); /* not recorded */
    cr_expect_eq(cudaEventRecord(a, s), cudaSuccess);
    cr_expect_eq(cudaEventRecord(b, s), cudaSuccess);
    cr_expect_eq(cudaEventRecord(untimed, s), cudaSuccess);
    cr_expect_eq(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    cr_expect(ms >= 0.0f);
    cr_expect_eq(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
    cr_expect_eq(cudaStreamQuery(s), cudaSuccess);
    cr_expect_eq(cudaEventQuery(b), cudaSuccess);
    cr_expect_eq(cudaStreamDestroy(s), cudaSuccess);
    cr_expect_eq(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    cr_expect_eq(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    cr_expect_eq(cudaEventDestroy(a), cudaSuccess);
    cr_expect_eq(cudaEventRecord(a, NULL), cudaErrorInvalidResourceHandle);
    cudaEventDestroy(b);
    cudaEventDestroy(untimed);
}

Test(cuda_emu_api, device_queries)
{
    struct cudaDeviceProp p;
    int v = 0;
    cr_expect_eq(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    cr_expect_eq(cudaGetDeviceProperties(&p, 1), cudaErrorInvalidDevice);
    cr_expect_eq(p.sharedMemPerBlock, 49152);
    cr_expect_eq(p.sharedMemPerBlockOptin, 166912);
    cr_expect(p.totalGlobalMem > ((size_t)1 << 28));
    cr_expect_eq(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 0), cudaSuccess);
    cr_expect_eq(v, 32);
    cr_expect_eq(cudaGetDeviceCount(&v), cudaSuccess);
    cr_expect_eq(v, 1);
}

/* ---- a whole program ---------------------------------------------------------------- */

/* tests/cuda/example.cu built as docs/cuda.md says a model.cu is built for the emulator,
 * run in every order; with "misuse", KILN_LAUNCH_AT stops it with exit status 1 and the
 * kernel's description. */
Test(cuda_emu_program, example_builds_and_runs_in_every_order)
{
    char dir[] = "/tmp/kiln-emu-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' %s -Wall -Wextra -Wshadow -Werror -DKILN_CUDA_EMU -I'%s/runtime/cuda' -x c++ "
             "'%s/tests/cuda/example.cu' -x none '%s' '%s' -lpthread -lm -o '%s/example'",
             KILN_CXX, KILN_EMU_CXXFLAGS, KILN_SOURCE_DIR, KILN_SOURCE_DIR, KILN_CUDA_EMU_LIB, KILN_OPENBLAS, dir);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out.data ? out.data : "");
    const char *orders[] = {"forward", "reverse", "shuffle"};
    for (int i = 0; i < 3; i++) {
        sb_free(&out);
        sb_init(&out);
        snprintf(cmd, sizeof cmd, "KILN_CUDA_EMU_ORDER=%s '%s/example'", orders[i], dir);
        rc = support_run(cmd, &out);
        cr_expect_eq(rc, 0, "%s: %s", orders[i], out.data ? out.data : "");
        cr_expect_str_eq(out.data ? out.data : "", "-0.8 0.2 1\n", "%s", orders[i]);
    }
    sb_free(&out);
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "'%s/example' misuse", dir);
    rc = support_run(cmd, &out);
    cr_expect_eq(rc, 1, "%s", out.data ? out.data : "");
    expect_has(out.data ? out.data : "", "barrier divergence");
    expect_has(out.data ? out.data : "", "example.cu:");
    expect_has(out.data ? out.data : "", "error: kernel 'k9_bad_barrier' (model.kiln:9: bad_barrier) failed: unspecified "
                                         "launch failure");
    sb_free(&out);
    support_remove_dir(dir);
}

/* ---- the driver API: modules, functions by name, launches (kemu_driver.h) ------------- */

Test(cuda_emu_misuse, driver_api_modules_functions_and_launches)
{
    CUmodule m;
    cr_assert_eq(cuModuleLoadData(&m, kt_driver_image()), CUDA_SUCCESS);
    CUfunction axpy, fill, none;
    cr_assert_eq(cuModuleGetFunction(&axpy, m, "kt_drv_axpy"), CUDA_SUCCESS);
    cr_assert_eq(cuModuleGetFunction(&fill, m, "kt_drv_fill<double>"), CUDA_SUCCESS);
    cr_expect_eq(cuModuleGetFunction(&none, m, "kt_drv_nothing"), CUDA_ERROR_NOT_FOUND);
    expect_has(kemu_last_error_message(), "no kernel 'kt_drv_nothing' in the module");
    cr_expect_eq(cudaGetLastError(), cudaSuccess, "a driver call's failure is not the runtime's last error");

    enum { N = 1000 };
    float hx[N], hy[N];
    for (int i = 0; i < N; i++) hx[i] = (float)i, hy[i] = 1;
    float *x, *y;
    cr_assert_eq(cudaMalloc((void **)&x, sizeof hx), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&y, sizeof hy), cudaSuccess);
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    cudaMemcpy(y, hy, sizeof hy, cudaMemcpyHostToDevice);
    /* an array of pointers to the arguments */
    int n = N;
    float a = 2;
    void *params[] = {&n, &a, &x, &y};
    cr_expect_eq(cuLaunchKernel(axpy, 3, 1, 1, 128, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    /* one buffer: int at 0, float at 4, the pointers at 8 and 16 */
    char buf[24];
    memcpy(buf, &n, 4), memcpy(buf + 4, &a, 4), memcpy(buf + 8, &x, 8), memcpy(buf + 16, &y, 8);
    size_t size = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    cr_expect_eq(cuLaunchKernel(axpy, 2, 1, 1, 256, 1, 1, 0, NULL, NULL, extra), CUDA_SUCCESS);
    cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; i++) cr_expect_eq(hy[i], 1.0f + 4.0f * (float)i, "y[%d] = %g", i, hy[i]);
    /* a template's instance */
    double *d, hd[N], v = 0.25;
    cr_assert_eq(cudaMalloc((void **)&d, sizeof hd), cudaSuccess);
    void *fparams[] = {&d, &v, &n};
    cr_expect_eq(cuLaunchKernel(fill, 4, 1, 1, 64, 1, 1, 0, NULL, fparams, NULL), CUDA_SUCCESS);
    cudaMemcpy(hd, d, sizeof hd, cudaMemcpyDeviceToHost);
    cr_expect(hd[0] == 0.25 && hd[N - 1] == 0.25);

    /* what the launch checks, each with the kernel's name */
    size = 20; /* a buffer of another size: another kernel, or another build of it */
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra), CUDA_ERROR_INVALID_VALUE);
    expect_has(kemu_last_error_message(), "cuLaunchKernel('kt_drv_axpy'): the parameter buffer has 20 bytes, the kernel's 4 parameters take 24");
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, NULL, params, extra), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE); /* over 1024 threads */
    expect_has(kemu_last_error_message(), "kernel 'kt_drv_axpy'");
    void *nparams[] = {&n, NULL, &x, &y};
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, NULL, nparams, NULL), CUDA_ERROR_INVALID_VALUE);
    expect_has(kemu_last_error_message(), "kernelParams[1] is NULL");
    cr_expect_eq(cudaGetLastError(), cudaSuccess);

    /* an ELF image that is no CUBIN, and an image that is nothing (a CUBIN's kernels load
     * by their mangled names: test_cuda_train's NVRTC run); a module's functions and its
     * unloading */
    static const char cubin[64] = "\177ELF";
    CUmodule bad;
    cr_expect_eq(cuModuleLoadData(&bad, cubin), CUDA_ERROR_INVALID_IMAGE);
    expect_has(kemu_last_error_message(), "an ELF image that is not a 64-bit CUBIN");
    static const char junk[64] = "not a module";
    cr_expect_eq(cuModuleLoadData(&bad, junk), CUDA_ERROR_INVALID_IMAGE);
    expect_has(kemu_last_error_message(), "neither an emulator module");
    const char *name;
    cr_expect_eq(cuGetErrorName(CUDA_ERROR_NOT_FOUND, &name), CUDA_SUCCESS);
    cr_expect_str_eq(name, "CUDA_ERROR_NOT_FOUND");
    /* a host pointer for a kernel: an illegal address, sticky as a GPU's fault is */
    float host[4];
    float *hp = host;
    void *hparams[] = {&n, &a, &hp, &y};
    cr_expect_eq(cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, NULL, hparams, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    expect_has(kemu_last_error_message(), "kernel 'kt_drv_axpy'");
    expect_has(kemu_last_error_message(), "argument 3 is a pointer to memory from neither cudaMalloc nor cudaMallocHost");
    cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress);
    cr_expect_eq(cuModuleUnload(m), CUDA_SUCCESS);
    cr_expect_eq(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE, "a module unloaded twice");
    cr_expect_eq(cudaDeviceReset(), cudaSuccess);
}

/* A generated model.cu's launches (KILN_CUDA_BY_NAME): by name from the file's module table,
 * through the driver API; a kernel the table lacks, or a launch out of range, is reported
 * with the kernel's name and the model line. */
Test(cuda_emu_misuse, launches_by_name_as_model_cu_does)
{
    enum { N = 300 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    cr_expect_eq(kt_by_name(x, N, 0.5f, 128, y), 0);
    for (int i = 0; i < N; i++) cr_expect_eq(y[i], 0.5f * (float)i, "y[%d] = %g", i, y[i]);
    cr_expect_eq(kt_by_name_missing(), 1);
    char *err = captured_stderr();
    expect_has(err, "error: kernel 'kt_bn_missing' (by_name.cu: missing) failed: named symbol not found (CUDA_ERROR_NOT_FOUND)");
    cr_expect_eq(cudaGetLastError(), cudaSuccess);
    cr_expect_eq(kt_by_name(x, N, 0.5f, 2048, y), 1); /* over 1024 threads a block */
    expect_has(kemu_last_error_message(), "kernel 'kt_bn_scale'");
    err = captured_stderr(); /* (what was written since the last read) */
    expect_has(err, "error: kernel 'kt_bn_scale' (by_name.cu: scale) failed: invalid argument (CUDA_ERROR_INVALID_VALUE)");
}
