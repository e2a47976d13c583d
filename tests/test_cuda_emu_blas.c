/* test_cuda_emu_blas.c — the emulator's cuBLAS (emu/cublas.c) against a naive
 * column-major loop in double: every combination of op N/T/C for A and B, leading
 * dimensions larger than the rows (with the padding left untouched), alpha and beta (beta 0
 * must not read C, so NaN there stays out), strided batches with gaps; the mixed-precision
 * forms (cublasGemmEx, cublasGemmStridedBatchedEx) against the naive loop over the widened
 * values and bit for bit against the fp32 calls on those values; and the argument checks
 * that cuBLAS itself makes. cuBLASLt: test_cuda_emu_lt.c. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_blas.h"


/* Quarters in [-4, 4] (at most 5 significant bits): exact in bf16 and in fp16. With k <= 17,
 * alpha in {1, 1.5, 0.5, -0.5} and beta in {0, 1, -0.75}, every product, every partial sum
 * (below 2^9 in magnitude, multiples of 2^-5) and the result are exact in float whatever
 * the order of summation: a product of such operands must equal the naive loop exactly. */
static void fill_quarters(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)((seed >> 8) % 33u) - 16) / 4.0f;
    }
}

/* NaN in x's padding rows (ld - rows of each column) and in the gaps between its batches
 * (stride - ld cols): the emulator must read neither. */
static void nan_padding(float *x, size_t n, int rows, int cols, int ld, long long stride)
{
    for (size_t e = 0; e < n; e++) {
        long long w = (long long)e % stride;
        if (w >= (long long)ld * cols || w % ld >= rows) x[e] = NAN;
    }
}

/* One product checked against the naive loop in double, with the padding rows of C
 * (between m and ldc) and the gaps between its batches unchanged. Without ex: cublasSgemm
 * (batch 1) or cublasSgemmStridedBatched on random floats, within float's rounding. With ex:
 * cublasGemmEx (batch 1) or cublasGemmStridedBatchedEx with A and B of type t, on values
 * every type holds (fill_quarters) with NaN in A's and B's padding, exactly. */
static void check_product(cublasHandle_t h, cudaDataType t, bool ex, cublasOperation_t opa, cublasOperation_t opb, int m,
                          int n, int k, float alpha, float beta, int batch)
{
    int ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = arows + 3, ldb = brows + 2, ldc = m + 4;
    long long sa = (long long)lda * acols + 5, sb = (long long)ldb * bcols + 1, sc = (long long)ldc * n + 7;
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch);
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
    float *got = malloc(nc * sizeof *got);
    double *want = malloc(nc * sizeof *want);
    cr_assert(A && B && C && got && want);
    void (*fill_values)(float *, size_t, uint32_t) = ex ? fill_quarters : fill;
    fill_values(A, na, 1u + (uint32_t)m);
    fill_values(B, nb, 2u + (uint32_t)n);
    fill_values(C, nc, 3u + (uint32_t)k);
    if (ex) {
        nan_padding(A, na, arows, acols, lda, sa);
        nan_padding(B, nb, brows, bcols, ldb, sb);
    }
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) C[i] = NAN; /* must not be read */
    for (size_t i = 0; i < nc; i++) want[i] = C[i];
    /* A and B hold exactly what their bf16/fp16 copies widen to (to_device_as checks it). */
    for (int b = 0; b < batch; b++)
        reference(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, want + b * sc, ldc);
    void *dA = ex ? to_device_as(t, A, na) : to_device(A, na), *dB = ex ? to_device_as(t, B, nb) : to_device(B, nb);
    float *dC = to_device(C, nc);
    cublasStatus_t st;
    if (!ex && batch == 1)
        st = cublasSgemm(h, opa, opb, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc);
    else if (!ex)
        st = cublasSgemmStridedBatched(h, opa, opb, m, n, k, &alpha, dA, lda, sa, dB, ldb, sb, &beta, dC, ldc, sc,
                                       batch);
    else if (batch == 1)
        st = cublasGemmEx(h, opa, opb, m, n, k, &alpha, dA, t, lda, dB, t, ldb, &beta, dC, CUDA_R_32F, ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
    else
        st = cublasGemmStridedBatchedEx(h, opa, opb, m, n, k, &alpha, dA, t, lda, sa, dB, t, ldb, sb, &beta, dC,
                                        CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cr_assert_eq(st, CUBLAS_STATUS_SUCCESS, "%s ops %d %d m %d n %d k %d batch %d", ex ? type_name(t) : "sgemm", opa, opb, m,
                 n, k, batch);
    to_host(got, dC, nc);
    for (int b = 0; b < batch; b++)
        for (long long e = 0; e < sc; e++) {
            size_t idx = (size_t)(b * sc + e);
            int i = (int)(e % ldc), j = (int)(e / ldc);
            if (!(i < m && j < n)) { /* padding and gaps: bit-identical to what was there (NaN included) */
                cr_assert(memcmp(&got[idx], &C[idx], sizeof(float)) == 0, "padding element %zu changed", idx);
                continue;
            }
            double w = want[idx];
            if (!ex) {
                cr_assert(fabs(got[idx] - w) <= 1e-5 * (1.0 + fabs(w)),
                          "ops %d %d m %d n %d k %d alpha %g beta %g batch %d: C[%d,%d] of batch %d = %.7g, want %.7g",
                          opa, opb, m, n, k, alpha, beta, batch, i, j, b, got[idx], w);
                continue;
            }
            cr_assert_eq((double)(float)w, w, "the test's premise: %.17g is exact in float", w);
            cr_assert_eq(got[idx], (float)w,
                         "%s ops %d %d m %d n %d k %d alpha %g beta %g batch %d: C[%d,%d] of batch %d = %.9g, "
                         "want %.9g",
                         type_name(t), opa, opb, m, n, k, alpha, beta, batch, i, j, b, got[idx], w);
        }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    free(A);
    free(B);
    free(C);
    free(got);
    free(want);
}

static void check_gemm(cublasHandle_t h, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, float alpha,
                       float beta, int batch)
{
    check_product(h, CUDA_R_32F, false, opa, opb, m, n, k, alpha, beta, batch);
}

static void check_gemm_ex(cublasHandle_t h, cudaDataType t, cublasOperation_t opa, cublasOperation_t opb, int m, int n,
                          int k, float alpha, float beta, int batch)
{
    check_product(h, t, true, opa, opb, m, n, k, alpha, beta, batch);
}

Test(cuda_emu_blas, sgemm_every_op_combination_with_leading_dimensions)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float alphas[] = {1.0f, 1.5f, -0.5f}, betas[] = {0.0f, 1.0f, -0.75f};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int s = 0; s < 3; s++) {
                check_gemm(h, ops[a], ops[b], 7, 5, 9, alphas[s], betas[s], 1);
                check_gemm(h, ops[a], ops[b], 1, 13, 4, alphas[s], betas[s], 1);
                check_gemm(h, ops[a], ops[b], 33, 1, 17, alphas[s], betas[s], 1);
            }
    cr_assert_eq(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

Test(cuda_emu_blas, sgemm_strided_batched_every_op_combination)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s;
    cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
    cr_assert_eq(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            check_gemm(h, ops[a], ops[b], 6, 8, 5, 1.0f, 0.0f, 3);
            check_gemm(h, ops[a], ops[b], 9, 4, 11, 0.5f, 2.0f, 4);
        }
    cublasDestroy(h);
    cudaStreamDestroy(s);
}

Test(cuda_emu_blas, sgemm_edge_cases)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    /* k = 0: C = beta C. alpha = 0 with beta = 1: C unchanged. */
    check_gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 0, 1.0f, 0.5f, 1);
    check_gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 6, 0.0f, 1.0f, 1);
    /* Empty products succeed without touching anything. */
    float one = 1.0f, zero = 0.0f;
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 3, 2, &one, NULL, 1, NULL, 2, &zero, NULL, 1),
                 CUBLAS_STATUS_SUCCESS);
    cr_expect_eq(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, NULL, 2, 4, NULL, 2, 4, &zero,
                                           NULL, 2, 4, 0),
                 CUBLAS_STATUS_SUCCESS);
    cublasDestroy(h);
}

Test(cuda_emu_blas, argument_checks_as_cublas, .init = cr_redirect_stderr)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float one = 1.0f, zero = 0.0f;
    float *d = NULL;
    cr_assert_eq(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    /* lda < m for op N, lda < k for op T, ldb < k, ldc < m, negative sizes, bad op. */
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 3, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 5, &one, d, 4, d, 5, &zero, d, 4),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 5, &one, d, 4, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, d, 4, &zero, d, 3),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &one, d, 4, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(h, (cublasOperation_t)7, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasSgemm(NULL, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    /* A matrix that runs past its allocation: 4 x 17 with ld 4 needs 68 floats of 64. */
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 17, &one, d, 4, d, 17, &zero, d, 4),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cr_expect(strstr(kemu_last_error_message(), "matrix A") != NULL, "%s", kemu_last_error_message());
    cr_expect(strstr(kemu_last_error_message(), "the GPU would fault") != NULL);
    /* That fault is sticky, as on a GPU. */
    cr_expect_eq(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, d, 4, &zero, d, 4),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cudaDeviceReset();
    cublasDestroy(h);
    cr_expect_eq(cublasDestroy(NULL), CUBLAS_STATUS_NOT_INITIALIZED);
}

/* ---- cublasGemmEx and cublasGemmStridedBatchedEx ---------------------------------------- */

Test(cuda_emu_blas, gemm_ex_every_type_and_op_combination)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float alphas[] = {1.0f, 1.5f, -0.5f}, betas[] = {0.0f, 1.0f, -0.75f};
    for (int t = 0; t < 3; t++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int s = 0; s < 3; s++) {
                    check_gemm_ex(h, types[t], ops[a], ops[b], 7, 5, 9, alphas[s], betas[s], 1);
                    check_gemm_ex(h, types[t], ops[a], ops[b], 1, 13, 4, alphas[s], betas[s], 1);
                    check_gemm_ex(h, types[t], ops[a], ops[b], 33, 1, 17, alphas[s], betas[s], 1);
                }
    cr_assert_eq(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

Test(cuda_emu_blas, gemm_strided_batched_ex_every_type_and_op_combination)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    for (int t = 0; t < 3; t++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                check_gemm_ex(h, types[t], ops[a], ops[b], 6, 8, 5, 1.0f, 0.0f, 3);
                check_gemm_ex(h, types[t], ops[a], ops[b], 9, 4, 11, 0.5f, 1.0f, 4);
            }
    cublasDestroy(h);
}

/* The C target's sum of products (a convolution's weight gradient: one product per batch
 * element, beta 0 for the first and 1 after) with bf16 and fp16 operands: C = sum of the
 * three products, exactly (fill_quarters). */
Test(cuda_emu_blas, gemm_ex_half_beta_one_accumulates)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    enum { M = 6, N = 5, K = 7, P = 3 };
    for (int t = 1; t < 3; t++) {
        float A[P * M * K], B[P * K * N], C[M * N];
        double want[M * N] = {0};
        fill_quarters(A, P * M * K, 21u);
        fill_quarters(B, P * K * N, 22u);
        for (int p = 0; p < P; p++)
            reference(0, 1, M, N, K, 1.0f, A + p * M * K, M, B + p * K * N, N, p ? 1.0f : 0.0f, want, M);
        uint16_t *dA = to_device_as(types[t], A, P * M * K), *dB = to_device_as(types[t], B, P * K * N);
        float *dC = NULL, one = 1.0f, zero = 0.0f;
        cr_assert_eq(cudaMalloc((void **)&dC, sizeof C), cudaSuccess);
        for (int p = 0; p < P; p++)
            cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, &one, dA + p * M * K, types[t], M,
                                      dB + p * K * N, types[t], N, p ? &one : &zero, dC, CUDA_R_32F, M,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP),
                         CUBLAS_STATUS_SUCCESS);
        to_host(C, dC, M * N);
        for (int i = 0; i < M * N; i++)
            cr_assert_eq(C[i], (float)want[i], "%s: C[%d] = %.9g, want %.9g", type_name(types[t]), i, C[i], want[i]);
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);
    }
    cublasDestroy(h);
}

/* As cublasSgemm: k = 0 gives C = beta C and alpha = 0 reads neither A nor B (here NULL, so
 * no widening either); an empty product touches nothing. */
Test(cuda_emu_blas, gemm_ex_half_edge_cases)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float c0[12], c[12], one = 1.0f, zero = 0.0f, half = 0.5f;
    fill_quarters(c0, 12, 51u);
    for (int t = 1; t < 3; t++) {
        float *dC = to_device(c0, 12);
        uint16_t *dA = to_device_as(types[t], c0, 12);
        cr_expect_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 0, &one, dA, types[t], 4, dA, types[t], 1, &half,
                                  dC, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        to_host(c, dC, 12);
        for (int i = 0; i < 12; i++) cr_expect_eq(c[i], 0.5f * c0[i], "%s k = 0: C[%d]", type_name(types[t]), i);
        cr_expect_eq(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 5, &zero, NULL, types[t], 5, 20,
                                                NULL, types[t], 5, 15, &one, dC, CUDA_R_32F, 4, 0, 1,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        to_host(c, dC, 12);
        for (int i = 0; i < 12; i++) cr_expect_eq(c[i], 0.5f * c0[i], "%s alpha = 0: C[%d]", type_name(types[t]), i);
        cr_expect_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 3, 2, &one, NULL, types[t], 1, NULL, types[t], 2,
                                  &zero, NULL, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        cudaFree(dC);
        cudaFree(dA);
    }
    cublasDestroy(h);
}

/* One call of each form on random operands (not exact: the order of summation shows) against
 * the fp32 call on the same values as floats: the same bits. fp32 operands: cublasGemmEx
 * against cublasSgemm, with every accepted compute type and two algorithms; bf16 and fp16
 * operands: against cublasSgemm on their widened copies (what the C target computes). */
static void check_gemm_ex_bits(cublasHandle_t h, cudaDataType t, cublasComputeType_t compute, cublasGemmAlgo_t algo,
                               cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, int batch)
{
    int ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
    int lda = (ta ? k : m) + 1, ldb = (tb ? n : k) + 2, ldc = m + 1;
    long long sa = (long long)lda * (ta ? m : k) + 3, sb = (long long)ldb * (tb ? k : n), sc = (long long)ldc * n + 2;
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch);
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *ex = malloc(nc * 4), *s = malloc(nc * 4);
    cr_assert(A && B && C && ex && s);
    fill(A, na, 31u + (uint32_t)k);
    fill(B, nb, 32u + (uint32_t)n);
    fill(C, nc, 33u + (uint32_t)m);
    for (size_t i = 0; i < na; i++) A[i] = round_to(t, A[i]);
    for (size_t i = 0; i < nb; i++) B[i] = round_to(t, B[i]);
    void *dA = to_device_as(t, A, na), *dB = to_device_as(t, B, nb);
    float *dAf = to_device(A, na), *dBf = to_device(B, nb), *dCex = to_device(C, nc), *dCs = to_device(C, nc);
    float alpha = 1.5f, beta = -0.75f;
    if (batch == 1) {
        cr_assert_eq(cublasGemmEx(h, opa, opb, m, n, k, &alpha, dA, t, lda, dB, t, ldb, &beta, dCex, CUDA_R_32F, ldc,
                                  compute, algo),
                     CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasSgemm(h, opa, opb, m, n, k, &alpha, dAf, lda, dBf, ldb, &beta, dCs, ldc),
                     CUBLAS_STATUS_SUCCESS);
    } else {
        cr_assert_eq(cublasGemmStridedBatchedEx(h, opa, opb, m, n, k, &alpha, dA, t, lda, sa, dB, t, ldb, sb, &beta,
                                                dCex, CUDA_R_32F, ldc, sc, batch, compute, algo),
                     CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasSgemmStridedBatched(h, opa, opb, m, n, k, &alpha, dAf, lda, sa, dBf, ldb, sb, &beta, dCs,
                                               ldc, sc, batch),
                     CUBLAS_STATUS_SUCCESS);
    }
    to_host(ex, dCex, nc);
    to_host(s, dCs, nc);
    for (size_t i = 0; i < nc; i++)
        cr_assert(memcmp(&ex[i], &s[i], 4) == 0, "%s compute %d algo %d ops %d %d batch %d: element %zu %.9g, fp32 %.9g",
                  type_name(t), compute, algo, opa, opb, batch, i, ex[i], s[i]);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dAf);
    cudaFree(dBf);
    cudaFree(dCex);
    cudaFree(dCs);
    free(A);
    free(B);
    free(C);
    free(ex);
    free(s);
}

Test(cuda_emu_blas, gemm_ex_same_bits_as_sgemm)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const cublasComputeType_t computes[] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC,
                                            CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_FAST_16BF,
                                            CUBLAS_COMPUTE_32F_FAST_16F};
    const cublasGemmAlgo_t algos[] = {CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            for (int c = 0; c < 5; c++)
                for (int g = 0; g < 2; g++) {
                    check_gemm_ex_bits(h, CUDA_R_32F, computes[c], algos[g], ops[a], ops[b], 19, 7, 45, 1);
                    check_gemm_ex_bits(h, CUDA_R_32F, computes[c], algos[g], ops[a], ops[b], 8, 11, 23, 3);
                }
            for (int t = 1; t < 3; t++)
                for (int c = 0; c < 2; c++) {
                    check_gemm_ex_bits(h, types[t], computes[c], algos[c], ops[a], ops[b], 19, 7, 45, 1);
                    check_gemm_ex_bits(h, types[t], computes[c], algos[c], ops[a], ops[b], 8, 11, 23, 3);
                }
        }
    cublasDestroy(h);
}

/* The combinations cuBLAS refuses (CUBLAS_STATUS_NOT_SUPPORTED), with C left untouched; the
 * ones it accepts besides COMPUTE_32F and the default algorithm; the argument checks of
 * cublasSgemm, the same for half operands. */
Test(cuda_emu_blas, gemm_ex_refusals_and_argument_checks)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float *d = NULL, *dC = NULL, one = 1.0f, zero = 0.0f, c0[16], c1[16];
    cr_assert_eq(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemset(d, 0, 64 * sizeof(float)), cudaSuccess);
    fill(c0, 16, 41u);
    dC = to_device(c0, 16);
    const cublasOperation_t N = CUBLAS_OP_N;
    const cublasComputeType_t c32 = CUBLAS_COMPUTE_32F;
    const cublasGemmAlgo_t dflt = CUBLAS_GEMM_DEFAULT;
    const cudaDataType bf = CUDA_R_16BF, hf = CUDA_R_16F, f = CUDA_R_32F;
    /* Atype != Btype */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, hf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "bf16 A, fp16 B");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, f, 4, d, bf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A, bf16 B");
    cr_expect_eq(cublasGemmStridedBatchedEx(h, N, N, 4, 4, 4, &one, d, hf, 4, 0, d, bf, 4, 0, &zero, dC, f, 4, 0, 2,
                                            c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp16 A, bf16 B, batched");
    /* a half C (cuBLAS has it; not emulated) and other C types */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, bf, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "bf16 C");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, hf, 4, d, hf, 4, &zero, dC, hf, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp16 C");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, f, 4, d, f, 4, &zero, dC, CUDA_R_64F, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp64 C");
    /* compute types: half compute, and the FAST forms, which cuBLAS takes for fp32 operands only */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, hf, 4, d, hf, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_16F, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "COMPUTE_16F");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_32F_FAST_TF32,
                              dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "bf16 operands with FAST_TF32");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, hf, 4, d, hf, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_32F_FAST_16F,
                              dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp16 operands with FAST_16F");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, f, 4, d, f, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_64F, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "COMPUTE_64F with fp32");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, f, 4, d, f, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_32I, dflt),
                 CUBLAS_STATUS_NOT_SUPPORTED, "COMPUTE_32I with fp32");
    /* algorithms outside cublasGemmAlgo_t's list */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, CUBLAS_GEMM_AUTOTUNE),
                 CUBLAS_STATUS_NOT_SUPPORTED, "AUTOTUNE");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, (cublasGemmAlgo_t)24),
                 CUBLAS_STATUS_NOT_SUPPORTED, "algorithm 24");
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, (cublasGemmAlgo_t)-2),
                 CUBLAS_STATUS_NOT_SUPPORTED, "algorithm -2");
    to_host(c1, dC, 16);
    cr_expect(memcmp(c0, c1, sizeof c0) == 0, "a refused call wrote C");
    /* accepted: PEDANTIC, the numbered and tensor-op algorithms, fp32 with FAST_16BF */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_32F_PEDANTIC,
                              CUBLAS_GEMM_ALGO23),
                 CUBLAS_STATUS_SUCCESS);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, hf, 4, d, hf, 4, &zero, dC, f, 4, c32,
                              CUBLAS_GEMM_ALGO15_TENSOR_OP),
                 CUBLAS_STATUS_SUCCESS);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, f, 4, d, f, 4, &zero, dC, f, 4, CUBLAS_COMPUTE_32F_FAST_16BF,
                              CUBLAS_GEMM_ALGO0),
                 CUBLAS_STATUS_SUCCESS);
    /* cublasSgemm's argument checks: lda < m, ldb < k with op N, ldc < m, a negative size, a
     * bad op, no alpha, no handle */
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 3, d, bf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 5, &one, d, hf, 4, d, hf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 3, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmStridedBatchedEx(h, N, N, 4, 4, 4, &one, d, bf, 4, 16, d, bf, 4, 16, &zero, dC, f, 4, 16,
                                            -1, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmEx(h, (cublasOperation_t)7, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, NULL, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasGemmEx(NULL, N, N, 4, 4, 4, &one, d, bf, 4, d, bf, 4, &zero, dC, f, 4, c32, dflt),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    cudaFree(d);
    cudaFree(dC);
    cublasDestroy(h);
}

/* Half operands are checked against their allocation with 2-byte elements (fp32 ones with
 * 4): a bf16 matrix that fills its allocation exactly runs, one that runs one element past
 * it (or whose last batch does) is reported as cublasSgemm reports its A, sticky. */
Test(cuda_emu_blas, gemm_ex_half_operand_out_of_bounds, .init = cr_redirect_stderr)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    float one = 1.0f, zero = 0.0f;
    for (int t = 1; t < 3; t++) {
        const cudaDataType ht = types[t];
        uint16_t *dA = NULL, *dB = NULL;
        float *dC = NULL;
        /* 64 halves: 128 bytes, as many as 32 floats */
        cr_assert_eq(cudaMalloc((void **)&dA, 64 * sizeof(uint16_t)), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&dB, 64 * sizeof(uint16_t)), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&dC, 256 * sizeof(float)), cudaSuccess);
        cr_assert_eq(cudaMemset(dA, 0, 64 * sizeof(uint16_t)), cudaSuccess);
        cr_assert_eq(cudaMemset(dB, 0, 64 * sizeof(uint16_t)), cudaSuccess);
        /* A 4 x 16, lda 4: 64 halves, all of A's allocation (as floats it would need 256 bytes) */
        cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 16, &one, dA, ht, 4, dB, ht, 16, &zero, dC, CUDA_R_32F, 4,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS, "%s: a matrix that fills its allocation", type_name(ht));
        /* op T: A stored 16 x 4 with lda 16; two batches of B 8 x 4 (ldb 8, stride 32) */
        cr_expect_eq(cublasGemmStridedBatchedEx(h, T, N, 4, 4, 8, &one, dA, ht, 16, 0, dB, ht, 8, 32, &zero, dC,
                                                CUDA_R_32F, 4, 16, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS, "%s: batches that fill their allocation", type_name(ht));
        cr_expect_eq(cudaDeviceSynchronize(), cudaSuccess);
        /* A 5 x 13, lda 5: 65 halves, one past the end */
        cr_expect_eq(cublasGemmEx(h, N, N, 5, 4, 13, &one, dA, ht, 5, dB, ht, 13, &zero, dC, CUDA_R_32F, 5,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_EXECUTION_FAILED, "%s: A one element past its allocation", type_name(ht));
        cr_expect(strstr(kemu_last_error_message(), "cublasGemmEx: matrix A") != NULL, "%s", kemu_last_error_message());
        cr_expect(strstr(kemu_last_error_message(), "2-byte elements") != NULL, "%s", kemu_last_error_message());
        cr_expect(strstr(kemu_last_error_message(), "the GPU would fault") != NULL);
        cr_expect_eq(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
        cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, dA, ht, 4, dB, ht, 4, &zero, dC, CUDA_R_32F, 4,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_EXECUTION_FAILED, "the fault is sticky");
        cudaDeviceReset();
        cr_assert_eq(cudaMalloc((void **)&dA, 64 * sizeof(uint16_t)), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&dB, 64 * sizeof(uint16_t)), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&dC, 256 * sizeof(float)), cudaSuccess);
        /* B's second batch (stride 33) ends one element past */
        cr_expect_eq(cublasGemmStridedBatchedEx(h, T, N, 4, 4, 8, &one, dA, ht, 16, 0, dB, ht, 8, 33, &zero, dC,
                                                CUDA_R_32F, 4, 16, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_EXECUTION_FAILED, "%s: B's last batch one element past", type_name(ht));
        cr_expect(strstr(kemu_last_error_message(), "cublasGemmStridedBatchedEx: matrix B") != NULL, "%s",
                  kemu_last_error_message());
        cudaDeviceReset();
    }
    /* fp32 operands through cublasGemmEx: 4-byte elements, so 64 floats hold 4 x 16 but not 5 x 13 */
    float *d = NULL, *dC = NULL;
    cr_assert_eq(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&dC, 64 * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemset(d, 0, 64 * sizeof(float)), cudaSuccess);
    cr_expect_eq(cublasGemmEx(h, N, N, 4, 4, 16, &one, d, CUDA_R_32F, 4, d, CUDA_R_32F, 16, &zero, dC, CUDA_R_32F, 4,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    cr_expect_eq(cublasGemmEx(h, N, N, 5, 4, 13, &one, d, CUDA_R_32F, 5, d, CUDA_R_32F, 13, &zero, dC, CUDA_R_32F, 5,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cr_expect(strstr(kemu_last_error_message(), "4-byte elements") != NULL, "%s", kemu_last_error_message());
    cudaDeviceReset();
    cublasDestroy(h);
}
