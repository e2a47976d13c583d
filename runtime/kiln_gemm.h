/* kiln_gemm.h — how generated GEMM kernels call BLAS and share work between threads.
 *
 * All of a program's parallelism is OpenMP's: BLAS runs single-threaded (runtime/env.c),
 * and a kernel splits its products into tasks itself, so that no BLAS thread pool spins
 * beside the OpenMP threads. kiln_gemm_plan picks the tasks from the product's shape alone,
 * so that results do not depend on the number of threads: the products of a batch side by
 * side, or blocks of rows or columns of each product, each block small enough that its
 * epilogue finds the output still in cache. kiln_sgemm calls BLAS for one task, with the
 * matrix-vector routine where the block is a single row or column: sgemm would pack
 * (copy) the whole other operand for one row, which is most of a batch-1 inference. */
#ifndef KILN_GEMM_H
#define KILN_GEMM_H

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln_half.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Output floats of a block of a split product with an epilogue: 512 KiB, half a core's L2
 * here. */
#define KILN_GEMM_BLOCK_FLOATS 131072
/* Multiply-adds below which a kernel runs on one thread: 2^21, about 40 us on one core.
 * The program's idle threads spin between kernels (GOMP_SPINCOUNT, runtime/env.c), so a
 * fork-join costs a few microseconds, not the 20 us of waking sleeping threads: at 2^22,
 * cnn's batch-1 inference (conv2 is 3.6M multiply-adds at batch 1) took 0.167-0.191 ms,
 * at 2^21 0.136-0.169 ms (three alternating pairs, --profile). */
#define KILN_GEMM_PARALLEL_MIN 2097152.0
/* A matrix-vector product (one row or one column per product) reads its matrix once and
 * does little arithmetic on it: memory-bound, it is shared from this many multiply-adds
 * (a 256 KiB matrix, read from L2 by both cores in half the time). */
#define KILN_GEMV_PARALLEL_MIN 65536.0
/* Output elements from which a product with an epilogue is shared between threads
 * however few its multiply-adds (a product over K = 10 into [128, 256] and its ReLU mask):
 * the loop kernels' threshold. The epilogue runs in the product's tasks only; a parallel
 * loop inside a task of an inactive region would start a nested team, new threads each
 * time (0.2 ms for mlp's 30 us kernel). */
#define KILN_GEMM_EPILOGUE_PARALLEL_MIN 32768.0
/* Multiply-adds of a product small enough to run whole on one thread beside others, where
 * a batch has at least KILN_GEMM_SIDE_BY_SIDE_BATCH of them. */
#define KILN_GEMM_SIDE_BY_SIDE_MAX 16777216.0
#define KILN_GEMM_SIDE_BY_SIDE_BATCH 4
/* The work of a block of a split product, and its narrowest rows or columns: every block
 * packs all of the other operand again (1/width of its own work) and calls BLAS once more.
 * Blocks of 86 rows of gpt's [2048, 128] x [128, 128] ran at 130 GFLOP/s on one core,
 * of 256 at 155, of 512 at 157, of 1024 at 146-159; 80 columns of cnn's [128, 128] x
 * [128, 3136] at 106, 528 at 134-138, 1568 at 135-141 (one core of the 2-core Xeon,
 * best of 30). gpt's and cnn's training steps at 2 threads took the same time as with the
 * blocks of the thread count (within 1%, bench --bench-steps, interleaved); blocks of 512
 * rows and 2^24 multiply-adds did no better there and would leave more cores idle. */
#define KILN_GEMM_BLOCK_MACS 8388608.0
#define KILN_GEMM_BLOCK_MIN_WIDTH 256

/* Threads a kernel may share work between: none more inside a parallel region. */
static inline int64_t kiln_threads(void)
{
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

/* A kernel's tasks: `tasks` = batch x blocks; block j of a product covers rows
 * [j / col_blocks * rows, + rows) and columns [j % col_blocks * cols, + cols). */
typedef struct {
    int64_t tasks, blocks, col_blocks, rows, cols;
    int parallel;
} kiln_gemm_split;

/* The blocks are chosen from the product's shape alone, never from the number of threads:
 * every thread count makes the same BLAS calls on the same blocks, and only which thread
 * runs a block differs, so results are the same bits whatever the threads (OpenBLAS sums a
 * block of another shape in another order: a 16 x 150 block and blocks of 80 and 70
 * columns differ in the last bit). A product is cut along its longer side (fewer copies of
 * the shorter operand) into blocks of about KILN_GEMM_BLOCK_MACS multiply-adds and at least
 * KILN_GEMM_BLOCK_MIN_WIDTH rows or columns, into two at least where it is worth sharing
 * (the parallel thresholds, the epilogue's included) and the side allows it; with an
 * epilogue, also into blocks of at most KILN_GEMM_BLOCK_FLOATS outputs, still in cache when
 * it runs. An even count: two threads share it evenly. A batch of
 * small products runs them side by side, whole. Whether the tasks run in parallel depends
 * on the threads and the work. */
static inline kiln_gemm_split kiln_gemm_plan(int64_t batch, int64_t M, int64_t N, int64_t K, int epilogue)
{
    kiln_gemm_split s = {batch, 1, 1, M, N, 0};
    if (M < 1 || N < 1) return s;
    const double macs = (double)batch * M * N * K, product = (double)M * N * K, outputs = (double)M * N;
    const double parallel_min = (M == 1 || N == 1) ? KILN_GEMV_PARALLEL_MIN : KILN_GEMM_PARALLEL_MIN;
    const int few_macs = macs < parallel_min;
    const int epilogue_parallel = epilogue && (double)batch * outputs >= KILN_GEMM_EPILOGUE_PARALLEL_MIN;
    if (!(batch >= KILN_GEMM_SIDE_BY_SIDE_BATCH && product <= KILN_GEMM_SIDE_BY_SIDE_MAX)) {
        /* the blocks the side allows: whole cache lines of C where it is cut into columns */
        const int64_t side = M >= N ? M : N, units = M >= N ? M : (N + 15) / 16;
        double n = product / KILN_GEMM_BLOCK_MACS;
        if ((product >= parallel_min || (epilogue && outputs >= KILN_GEMM_EPILOGUE_PARALLEL_MIN)) && n < 2) n = 2;
        if (epilogue && n < ceil(outputs / KILN_GEMM_BLOCK_FLOATS)) n = ceil(outputs / KILN_GEMM_BLOCK_FLOATS);
        double widest = side / KILN_GEMM_BLOCK_MIN_WIDTH;
        if (widest < 2) widest = units < 2 ? (double)units : 2;
        n = n < widest ? n : widest;
        const int64_t want = n >= 2 ? (int64_t)n / 2 * 2 : 1;
        if (M >= N) {
            s.rows = (M + want - 1) / want;
            s.blocks = (M + s.rows - 1) / s.rows;
        } else {
            s.cols = ((N + want - 1) / want + 15) / 16 * 16; /* whole cache lines of C */
            s.blocks = s.col_blocks = (N + s.cols - 1) / s.cols;
        }
    }
    s.tasks = batch * s.blocks;
    s.parallel = s.tasks > 1 && kiln_threads() > 1 && (!few_macs || epilogue_parallel);
    return s;
}

/* C (M x N, row stride ldc) = op(A) op(B) + beta C, as cblas_?gemm with alpha 1; kiln_?gemm
 * is beta 0. */
#define KILN_DEFINE_GEMM(name, T, gemm, gemv)                                                                          \
    static inline void name##_beta(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,  \
                                   const T *A, int lda, const T *B, int ldb, T beta, T *C, int ldc)                    \
    {                                                                                                                  \
        if (M == 1 && K > 0) /* the row of C is B's matrix times A's row */                                            \
            gemv(CblasRowMajor, tb == CblasTrans ? CblasNoTrans : CblasTrans, tb == CblasTrans ? (int)N : (int)K,    \
                 tb == CblasTrans ? (int)K : (int)N, 1, B, ldb, A, ta == CblasTrans ? lda : 1, beta, C, 1);            \
        else if (N == 1 && K > 0) /* the column of C is A's matrix times B's column */                                \
            gemv(CblasRowMajor, ta, ta == CblasTrans ? (int)K : (int)M, ta == CblasTrans ? (int)M : (int)K, 1, A, lda, \
                 B, tb == CblasTrans ? 1 : ldb, beta, C, ldc);                                                          \
        else                                                                                                           \
            gemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1, A, lda, B, ldb, beta, C, ldc);                      \
    }                                                                                                                  \
    static inline void name(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,         \
                            const T *A, int lda, const T *B, int ldb, T *C, int ldc)                                   \
    {                                                                                                                  \
        name##_beta(ta, tb, M, N, K, A, lda, B, ldb, 0, C, ldc);                                                       \
    }
KILN_DEFINE_GEMM(kiln_sgemm, float, cblas_sgemm, cblas_sgemv)
KILN_DEFINE_GEMM(kiln_dgemm, double, cblas_dgemm, cblas_dgemv)
#undef KILN_DEFINE_GEMM

/* ---- products of half-precision operands (mixed precision) ----
 * A product of bf16 or fp16 operands accumulates in float (passes/precision.c): BLAS has no
 * half-precision GEMM here (Debian's OpenBLAS does not export cblas_sbgemm, and without
 * AVX512-BF16 it would be slower than sgemm), so the operands are widened to float panel by
 * panel into a buffer of the thread's, and sgemm multiplies the panels, adding each panel of
 * k into C. The widening is exact: the product is sgemm's of the widened matrices, but no
 * float copy of an operand is ever stored, and the panels are read back from cache. A
 * panel of C sums its k-panels in order: the result does not depend on the threads. */
#define KILN_HGEMM_KC 256  /* the inner dimension of a panel */
#define KILN_HGEMM_MC 256  /* rows of op(A) in a panel */
#define KILN_HGEMM_NC 1024 /* columns of op(B) in a panel */

/* The thread's panel buffer: KC x (MC + NC) floats (1.25 MiB), made at its first product
 * and kept for the program's life (each OpenMP thread has its own). The thread-local
 * pointer is the runtime's (core.c), not the generated code's: code that kiln train links
 * into the kiln process (ORC's JIT) can hold no thread-local storage. */
#ifdef __cplusplus
extern "C" float *krt_hgemm_buffer(size_t floats);
#else
float *krt_hgemm_buffer(size_t floats);
#endif
static inline float *kiln_hgemm_buffer(void) { return krt_hgemm_buffer((size_t)KILN_HGEMM_KC * (KILN_HGEMM_MC + KILN_HGEMM_NC)); }

/* rows x cols of half matrix x (row stride ld, bf16 bits if bf16, else fp16) widened into
 * dst (row stride cols). */
static inline void kiln_widen_panel(int bf16, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols, float *dst)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *restrict src = x + r * ld;
        float *restrict out = dst + r * cols;
        if (bf16) {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++) out[c] = kiln_bf16_to_f32(src[c]);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++) out[c] = kiln_f16_to_f32(src[c]);
        }
    }
}

/* C (M x N, row stride ldc) = op(A) op(B) + beta C for half-precision A and B (bf16 bits if
 * bf16, else fp16), accumulated in float: kiln_sgemm_beta's contract. */
static inline void kiln_hgemm_beta(int bf16, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N,
                                   int64_t K, const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
                                   int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: C = beta C, C not read when beta is 0, as BLAS */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) C[m * ldc + n] = beta == 0 ? 0 : beta * C[m * ldc + n];
        return;
    }
    float *const bp = kiln_hgemm_buffer(), *const ap = bp + KILN_HGEMM_KC * KILN_HGEMM_NC;
    for (int64_t k0 = 0; k0 < K; k0 += KILN_HGEMM_KC) {
        const int64_t kc = K - k0 < KILN_HGEMM_KC ? K - k0 : KILN_HGEMM_KC;
        const float b_k = k0 ? 1.0f : beta; /* the first panel of k scales C, the others add */
        for (int64_t n0 = 0; n0 < N; n0 += KILN_HGEMM_NC) {
            const int64_t nc = N - n0 < KILN_HGEMM_NC ? N - n0 : KILN_HGEMM_NC;
            /* op(B)'s panel [k0, +kc) x [n0, +nc), widened as stored (transposed or not) */
            if (tb == CblasTrans) kiln_widen_panel(bf16, B + n0 * ldb + k0, ldb, nc, kc, bp);
            else kiln_widen_panel(bf16, B + k0 * ldb + n0, ldb, kc, nc, bp);
            for (int64_t m0 = 0; m0 < M; m0 += KILN_HGEMM_MC) {
                const int64_t mc = M - m0 < KILN_HGEMM_MC ? M - m0 : KILN_HGEMM_MC;
                if (ta == CblasTrans) kiln_widen_panel(bf16, A + k0 * lda + m0, lda, kc, mc, ap);
                else kiln_widen_panel(bf16, A + m0 * lda + k0, lda, mc, kc, ap);
                kiln_sgemm_beta(ta, tb, mc, nc, kc, ap, (int)(ta == CblasTrans ? mc : kc), bp, (int)(tb == CblasTrans ? kc : nc),
                                b_k, C + m0 * ldc + n0, ldc);
            }
        }
    }
}

/* The generated kernels' names for them, beside kiln_sgemm and kiln_dgemm. */
#define KILN_DEFINE_HGEMM(name, bf16)                                                                                  \
    static inline void name##_beta(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,  \
                                   const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,      \
                                   int ldc)                                                                            \
    {                                                                                                                  \
        kiln_hgemm_beta(bf16, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);                                          \
    }                                                                                                                  \
    static inline void name(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,         \
                            const uint16_t *A, int lda, const uint16_t *B, int ldb, float *C, int ldc)                 \
    {                                                                                                                  \
        kiln_hgemm_beta(bf16, ta, tb, M, N, K, A, lda, B, ldb, 0, C, ldc);                                             \
    }
KILN_DEFINE_HGEMM(kiln_bf16gemm, 1)
KILN_DEFINE_HGEMM(kiln_f16gemm, 0)
#undef KILN_DEFINE_HGEMM

/* Where BLAS has threads of its own (OPENBLAS_NUM_THREADS set by the user), a kernel's
 * parallel tasks make it single-threaded for their duration. Only with OpenBLAS's
 * cblas.h; elsewhere BLAS threads are left alone. */
static inline int kiln_blas_serial_begin(void)
{
#ifdef OPENBLAS_VERSION
    int n = openblas_get_num_threads();
    if (n > 1) openblas_set_num_threads(1);
    return n;
#else
    return 0;
#endif
}

static inline void kiln_blas_serial_end(int threads)
{
#ifdef OPENBLAS_VERSION
    if (threads > 1) openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
}

/* The leading dimension of a matrix that generated code hands to BLAS: its row stride,
 * or, where a single row makes the stride meaningless, the smallest value BLAS accepts. */
static inline int64_t kiln_blas_ld(int64_t stride, int64_t cols) { return stride >= cols && stride > 0 ? stride : cols > 1 ? cols : 1; }

#endif
