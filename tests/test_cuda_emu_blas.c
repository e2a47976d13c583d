/* test_cuda_emu_blas.c — the emulator's cuBLAS and cuBLASLt (runtime/cuda/emu/cublas.c)
 * against a naive column-major loop in double: every combination of op N/T/C for A and B,
 * leading dimensions larger than the rows (with the padding left untouched), alpha and
 * beta (beta 0 must not read C, so NaN there stays out), strided batches with gaps; the
 * cuBLASLt epilogues (bias, ReLU, GELU, the GELU input as aux) and the row-major Linear
 * layer the CUDA target will issue; and the argument checks that cuBLAS itself makes. The
 * mixed-precision forms (cublasGemmEx, cublasGemmStridedBatchedEx, cuBLASLt with bf16 or
 * fp16 A and B): against the naive loop over the widened values, and bit for bit against
 * the fp32 calls on those widened values. cuBLASLt with half C and D (and a bias and aux of
 * D's type, or an fp32 bias): bit for bit the same call with fp32 C and D rounded to nearest
 * even; the type combinations cuBLASLt refuses; half outputs outside their allocation. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cuda/emu/kemu_cublas.h"
#include "../runtime/cuda/emu/kemu_runtime.h"
#include "../runtime/kiln_half.h"

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = -1.0f + 2.0f * (float)(seed >> 8) / 16777216.0f;
    }
}

/* A device copy of n host floats. */
static float *to_device(const float *h, size_t n)
{
    float *d = NULL;
    cr_assert_eq(cudaMalloc((void **)&d, n * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void to_host(float *h, const float *d, size_t n)
{
    cr_assert_eq(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
}

static const char *type_name(cudaDataType t) { return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : "fp32"; }

/* x rounded to type t (fp32: unchanged), as a float. */
static float round_to(cudaDataType t, float x)
{
    return t == CUDA_R_16BF ? kiln_bf16_round(x) : t == CUDA_R_16F ? kiln_f16_round(x) : x;
}

static uint16_t half_bits(cudaDataType t, float x) { return t == CUDA_R_16BF ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x); }
static float half_value(cudaDataType t, uint16_t h) { return t == CUDA_R_16BF ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h); }

/* A device copy of n host floats stored as type t (fp32, or the bits of bf16/fp16, which
 * must hold each value exactly: round_to first). */
static void *to_device_as(cudaDataType t, const float *h, size_t n)
{
    if (t == CUDA_R_32F) return to_device(h, n);
    uint16_t *bits = malloc(n * sizeof *bits), *d = NULL;
    cr_assert(bits);
    for (size_t i = 0; i < n; i++) {
        bits[i] = half_bits(t, h[i]);
        cr_assert(isnan(h[i]) || half_value(t, bits[i]) == h[i], "%s does not hold %.9g", type_name(t), h[i]);
    }
    cr_assert_eq(cudaMalloc((void **)&d, n * sizeof *d), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d, bits, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    free(bits);
    return d;
}

/* op(X)[i, j] of a column-major X with leading dimension ld. */
static double at(const float *x, int ld, int trans, int i, int j)
{
    return trans ? x[j + (size_t)i * ld] : x[i + (size_t)j * ld];
}

/* C = alpha op(A) op(B) + beta C in double (beta 0: C is not read). */
static void reference(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, double *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
            double c = beta == 0.0f ? 0.0 : beta * C[i + (size_t)j * ldc];
            C[i + (size_t)j * ldc] = alpha * s + c;
        }
}

static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
/* The operand types of the mixed-precision calls. */
static const cudaDataType types[] = {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F};

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

/* ---- cuBLASLt ---------------------------------------------------------------------- */

static double gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

typedef struct {
    cublasLtEpilogue_t epilogue;
    int bias, relu, gelu, aux;
} Epi;

static const Epi epilogues[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, 0, 0, 0, 0},   {CUBLASLT_EPILOGUE_RELU, 0, 1, 0, 0},
    {CUBLASLT_EPILOGUE_BIAS, 1, 0, 0, 0},      {CUBLASLT_EPILOGUE_RELU_BIAS, 1, 1, 0, 0},
    {CUBLASLT_EPILOGUE_GELU, 0, 0, 1, 0},      {CUBLASLT_EPILOGUE_GELU_BIAS, 1, 0, 1, 0},
    {CUBLASLT_EPILOGUE_GELU_AUX, 0, 0, 1, 1},  {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1, 0, 1, 1},
};

static cublasLtMatrixLayout_t layout_as(cudaDataType type, int rows, int cols, int ld, int batch, long long stride)
{
    cublasLtMatrixLayout_t l;
    cr_assert_eq(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld), CUBLAS_STATUS_SUCCESS);
    int32_t b = batch;
    int64_t s = stride;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
                 CUBLAS_STATUS_SUCCESS);
    return l;
}

static cublasLtMatrixLayout_t layout(int rows, int cols, int ld, int batch, long long stride)
{
    return layout_as(CUDA_R_32F, rows, cols, ld, batch, stride);
}

/* D = epilogue(alpha op(A) op(B) + beta C + bias) with C and D distinct, batched; A and B
 * of type ab (bf16 or fp16: random values rounded to it, so the reference in double reads
 * the widened values, and the same tolerance holds; and D and aux bit for bit those of the
 * same call on fp32 copies of the widened A and B). */
static void check_lt(cublasLtHandle_t lt, cudaDataType ab, cublasOperation_t opa, cublasOperation_t opb, Epi e, int m,
                     int n, int k, float alpha, float beta, int batch)
{
    int ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = arows + 1, ldb = brows + 2, ldc = m + 3, ldd = m + 1, ldaux = m + 2;
    long long sa = (long long)lda * acols, sb = (long long)ldb * bcols, sc = (long long)ldc * n, sd = (long long)ldd * n;
    long long saux = (long long)ldaux * n, sbias = m;
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch), nd = (size_t)(sd * batch);
    size_t naux = (size_t)(saux * batch), nbias = (size_t)(sbias * batch);
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *D = malloc(nd * 4), *bias = malloc(nbias * 4);
    float *aux = malloc(naux * 4);
    double *want = malloc(nc * sizeof *want);
    cr_assert(A && B && C && D && bias && aux && want);
    fill(A, na, 5u);
    fill(B, nb, 6u);
    fill(C, nc, 7u);
    fill(bias, nbias, 8u);
    for (size_t i = 0; i < na; i++) A[i] = round_to(ab, A[i]);
    for (size_t i = 0; i < nb; i++) B[i] = round_to(ab, B[i]);
    for (size_t i = 0; i < nc; i++) want[i] = C[i];
    for (int b = 0; b < batch; b++)
        reference(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, want + b * sc, ldc);
    void *dA = to_device_as(ab, A, na), *dB = to_device_as(ab, B, nb);
    float *dC = to_device(C, nc), *dbias = to_device(bias, nbias);
    float *dD = NULL, *daux = NULL;
    cr_assert_eq(cudaMalloc((void **)&dD, nd * 4), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&daux, naux * 4), cudaSuccess);

    cublasLtMatmulDesc_t desc;
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    int32_t t = opa, u = opb;
    uint32_t epi = (uint32_t)e.epilogue;
    int64_t bias_stride = sbias, aux_ld = ldaux, aux_stride = saux;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &u, sizeof u), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
    if (e.bias) {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias), 0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                                    sizeof bias_stride),
                     0);
    }
    if (e.aux) {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux, sizeof daux),
                     0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                     0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride,
                                                    sizeof aux_stride),
                     0);
    }
    cublasLtMatrixLayout_t la = layout_as(ab, arows, acols, lda, batch, sa), lb = layout_as(ab, brows, bcols, ldb, batch, sb);
    cublasLtMatrixLayout_t lc = layout(m, n, ldc, batch, sc), ld = layout(m, n, ldd, batch, sd);
    cublasLtMatmulPreference_t pref;
    cr_assert_eq(cublasLtMatmulPreferenceCreate(&pref), 0);
    uint64_t ws = 1 << 20;
    cr_assert_eq(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                 0);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cr_assert_eq(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &heur, &found), 0);
    cr_assert_eq(found, 1);
    cr_assert_eq(cublasLtMatmul(lt, desc, &alpha, dA, la, dB, lb, &beta, dC, lc, dD, ld, &heur.algo, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "%s epilogue %d ops %d %d", type_name(ab), e.epilogue, opa, opb);
    to_host(D, dD, nd);
    to_host(aux, daux, naux);
    if (ab != CUDA_R_32F) {
        /* The same call on fp32 A and B holding the widened values: the same bits. */
        float *D32 = malloc(nd * 4), *aux32 = malloc(naux * 4), *dA32 = to_device(A, na), *dB32 = to_device(B, nb);
        cr_assert(D32 && aux32);
        cublasLtMatrixLayout_t la32 = layout(arows, acols, lda, batch, sa), lb32 = layout(brows, bcols, ldb, batch, sb);
        cr_assert_eq(cublasLtMatmul(lt, desc, &alpha, dA32, la32, dB32, lb32, &beta, dC, lc, dD, ld, NULL, NULL, 0, NULL),
                     CUBLAS_STATUS_SUCCESS);
        to_host(D32, dD, nd);
        to_host(aux32, daux, naux);
        for (int b = 0; b < batch; b++)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    size_t di = (size_t)(b * sd) + i + (size_t)j * ldd, ai = (size_t)(b * saux) + i + (size_t)j * ldaux;
                    cr_assert(memcmp(&D[di], &D32[di], 4) == 0, "%s epilogue %d ops %d %d: D[%d,%d] = %.9g, fp32 %.9g",
                              type_name(ab), e.epilogue, opa, opb, i, j, D[di], D32[di]);
                    cr_assert(!e.aux || memcmp(&aux[ai], &aux32[ai], 4) == 0, "%s aux[%d,%d] = %.9g, fp32 %.9g",
                              type_name(ab), i, j, aux[ai], aux32[ai]);
                }
        cublasLtMatrixLayoutDestroy(la32);
        cublasLtMatrixLayoutDestroy(lb32);
        cudaFree(dA32);
        cudaFree(dB32);
        free(D32);
        free(aux32);
    }
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double x = want[b * sc + i + (size_t)j * ldc];
                if (e.bias) x += bias[b * sbias + i];
                double pre = x;
                if (e.relu) x = x > 0 ? x : 0;
                if (e.gelu) x = gelu(x);
                float got = D[b * sd + i + (size_t)j * ldd];
                cr_assert(fabs(got - x) <= 1e-5 * (1.0 + fabs(x)), "epilogue %d ops %d %d batch %d D[%d,%d] = %.7g, want %.7g",
                          e.epilogue, opa, opb, b, i, j, got, x);
                if (e.aux) {
                    float a = aux[b * saux + i + (size_t)j * ldaux];
                    cr_assert(fabs(a - pre) <= 1e-5 * (1.0 + fabs(pre)), "aux[%d,%d] = %g, want %g", i, j, a, pre);
                }
            }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
    cudaFree(dbias);
    cudaFree(daux);
    free(A);
    free(B);
    free(C);
    free(D);
    free(bias);
    free(aux);
    free(want);
}

Test(cuda_emu_blas, lt_matmul_every_epilogue_and_op)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    for (size_t e = 0; e < sizeof epilogues / sizeof *epilogues; e++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                check_lt(lt, CUDA_R_32F, ops[a], ops[b], epilogues[e], 7, 6, 5, 1.0f, 0.0f, 1);
                check_lt(lt, CUDA_R_32F, ops[a], ops[b], epilogues[e], 5, 9, 8, 0.5f, -1.25f, 3);
            }
    cr_assert_eq(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}

/* The mixed-precision products the CUDA target will issue: bf16 or fp16 A and B, fp32 C, D,
 * bias and aux, with every epilogue (BIAS and GELU_AUX_BIAS among them) and ops N/T. */
Test(cuda_emu_blas, lt_matmul_half_operands_every_epilogue)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    for (int t = 1; t < 3; t++)
        for (size_t e = 0; e < sizeof epilogues / sizeof *epilogues; e++)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    check_lt(lt, types[t], ops[a], ops[b], epilogues[e], 7, 6, 5, 1.0f, 0.0f, 1);
                    check_lt(lt, types[t], ops[a], ops[b], epilogues[e], 5, 9, 8, 0.5f, -1.25f, 3);
                }
    cr_assert_eq(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}

/* ---- cuBLASLt with a half-precision C and D ------------------------------------------ */

static uint16_t *halves_to_device(const uint16_t *h, size_t n)
{
    uint16_t *d = NULL;
    cr_assert_eq(cudaMalloc((void **)&d, n * sizeof *d), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void halves_to_host(uint16_t *h, const uint16_t *d, size_t n)
{
    cr_assert_eq(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* A matmul descriptor (compute 32F, fp32 scale) with ops opa and opb and epilogue epi; the
 * bias pointer and batch stride when bias is not NULL, the aux pointer, leading dimension
 * and batch stride when aux is not NULL; BIAS_DATA_TYPE and EPILOGUE_AUX_DATA_TYPE set to
 * bias_type and aux_type unless -1 (left unset: D's type). */
static cublasLtMatmulDesc_t lt_desc(cublasOperation_t opa, cublasOperation_t opb, cublasLtEpilogue_t epi,
                                    const void *bias, int64_t bias_stride, int32_t bias_type, void *aux, int64_t aux_ld,
                                    int64_t aux_stride, int32_t aux_type)
{
    cublasLtMatmulDesc_t desc;
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    int32_t t = opa, u = opb;
    uint32_t e = (uint32_t)epi;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &u, sizeof u), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), 0);
    if (bias) {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), 0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                                    sizeof bias_stride),
                     0);
    }
    if (aux) {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), 0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                     0);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride,
                                                    sizeof aux_stride),
                     0);
    }
    if (bias_type != -1)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type),
                     0);
    if (aux_type != -1)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                    sizeof aux_type),
                     0);
    return desc;
}

/* The status of cublasLtMatmulAlgoGetHeuristic for a problem (with one algorithm found when
 * it succeeds, none otherwise). */
static cublasStatus_t lt_heuristic(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld)
{
    cublasLtMatmulPreference_t pref;
    cr_assert_eq(cublasLtMatmulPreferenceCreate(&pref), 0);
    cublasLtMatmulHeuristicResult_t heur;
    int found = -1;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &heur, &found);
    cr_assert_eq(found, st == CUBLAS_STATUS_SUCCESS ? 1 : 0);
    cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

/* The bias and aux types of check_lt_half_d. */
typedef enum {
    BIAS_AS_D,     /* bias of D's type, BIAS_DATA_TYPE and EPILOGUE_AUX_DATA_TYPE unset */
    BIAS_F32,      /* an fp32 bias, BIAS_DATA_TYPE CUDA_R_32F (Kiln's), the aux type set to D's */
    BIAS_SET_TO_D, /* bias of D's type, BIAS_DATA_TYPE set to it, the aux type unset */
} BiasMode;

/* D = epilogue(alpha op(A) op(B) + beta C + bias) with A, B, C and D all of the half type dt
 * (C and D distinct, or in place: the same memory and layout), batched, against the same
 * call with fp32 C and D (C holding the widened values, the bias fp32 with the same values,
 * aux fp32): D and aux must be that call's values rounded to nearest even, element by
 * element, bit for bit; D's and aux's padding rows and the gaps between their batches must
 * be left as they were. Also against the reference in double, within dt's rounding, so that
 * two equally wrong calls do not pass. */
static void check_lt_half_d(cublasLtHandle_t lt, cudaDataType dt, BiasMode mode, int in_place, cublasOperation_t opa,
                            cublasOperation_t opb, Epi e, int m, int n, int k, float alpha, float beta, int batch)
{
    const int ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
    const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    const int lda = arows + 1, ldb = brows + 2, ldd = m + 1, ldc = in_place ? ldd : m + 3, ldaux = m + 2;
    const long long sa = (long long)lda * acols, sb = (long long)ldb * bcols, sd = (long long)ldd * n + 2;
    const long long sc = in_place ? sd : (long long)ldc * n, saux = (long long)ldaux * n + 1, sbias = m;
    const size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch),
                 nd = (size_t)(sd * batch), naux = (size_t)(saux * batch), nbias = (size_t)(sbias * batch);
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *bias = malloc(nbias * 4);
    float *D32 = malloc(nd * 4), *aux32 = malloc(naux * 4);
    uint16_t *Dh = malloc(nd * 2), *auxh = malloc(naux * 2), *D0 = malloc(nd * 2), *aux0 = malloc(naux * 2);
    double *want = malloc(nc * sizeof *want);
    cr_assert(A && B && C && bias && D32 && aux32 && Dh && auxh && D0 && aux0 && want);
    fill(A, na, 15u + (uint32_t)k);
    fill(B, nb, 16u + (uint32_t)n);
    fill(C, nc, 17u + (uint32_t)m);
    fill(bias, nbias, 18u);
    for (size_t i = 0; i < na; i++) A[i] = round_to(dt, A[i]);
    for (size_t i = 0; i < nb; i++) B[i] = round_to(dt, B[i]);
    for (size_t i = 0; i < nc; i++) C[i] = round_to(dt, C[i]);
    if (mode != BIAS_F32)
        for (size_t i = 0; i < nbias; i++) bias[i] = round_to(dt, bias[i]);
    /* What D and aux hold before the call: C in place, else patterns (finite halves). */
    for (size_t i = 0; i < nd; i++) D0[i] = in_place ? half_bits(dt, C[i]) : (uint16_t)(0x3c01u + i % 251u);
    for (size_t i = 0; i < naux; i++) aux0[i] = (uint16_t)(0x4001u + i % 97u);
    for (size_t i = 0; i < nc; i++) want[i] = C[i];
    for (int b = 0; b < batch; b++)
        reference(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, want + b * sc, ldc);
    void *dA = to_device_as(dt, A, na), *dB = to_device_as(dt, B, nb);
    float *dC32 = to_device(C, nc), *dbias32 = to_device(bias, nbias), *dD32 = NULL, *daux32 = NULL;
    cr_assert_eq(cudaMalloc((void **)&dD32, nd * 4), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&daux32, naux * 4), cudaSuccess);
    uint16_t *dDh = halves_to_device(D0, nd), *dauxh = halves_to_device(aux0, naux);
    void *dCh = in_place ? (void *)dDh : to_device_as(dt, C, nc);
    void *dbiash = mode == BIAS_F32 ? (void *)dbias32 : to_device_as(dt, bias, nbias);

    cublasLtMatmulDesc_t d32 = lt_desc(opa, opb, e.epilogue, e.bias ? dbias32 : NULL, sbias, -1,
                                       e.aux ? daux32 : NULL, ldaux, saux, -1);
    cublasLtMatmulDesc_t dh = lt_desc(opa, opb, e.epilogue, e.bias ? dbiash : NULL, sbias,
                                      mode == BIAS_F32 ? CUDA_R_32F : mode == BIAS_SET_TO_D ? (int32_t)dt : -1,
                                      e.aux ? (void *)dauxh : NULL, ldaux, saux, mode == BIAS_F32 ? (int32_t)dt : -1);
    cublasLtMatrixLayout_t la = layout_as(dt, arows, acols, lda, batch, sa), lb = layout_as(dt, brows, bcols, ldb, batch, sb);
    cublasLtMatrixLayout_t lc32 = layout(m, n, ldc, batch, sc), ld32 = layout(m, n, ldd, batch, sd);
    cublasLtMatrixLayout_t lch = layout_as(dt, m, n, ldc, batch, sc), ldh = layout_as(dt, m, n, ldd, batch, sd);
    cr_assert_eq(lt_heuristic(lt, dh, la, lb, lch, ldh), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatmul(lt, d32, &alpha, dA, la, dB, lb, &beta, dC32, lc32, dD32, ld32, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatmul(lt, dh, &alpha, dA, la, dB, lb, &beta, dCh, lch, dDh, ldh, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "%s D, bias mode %d, epilogue %d ops %d %d", type_name(dt), mode, e.epilogue,
                 opa, opb);
    to_host(D32, dD32, nd);
    to_host(aux32, daux32, naux);
    halves_to_host(Dh, dDh, nd);
    halves_to_host(auxh, dauxh, naux);
    const double tol = dt == CUDA_R_16BF ? 1e-2 : 2e-3; /* dt's rounding (2^-9, 2^-12) and float's */
    for (size_t idx = 0; idx < nd; idx++) {
        const int b = (int)(idx / (size_t)sd), i = (int)(idx % (size_t)sd % (size_t)ldd),
                  j = (int)(idx % (size_t)sd / (size_t)ldd);
        if (!(i < m && j < n)) {
            cr_assert_eq(Dh[idx], D0[idx], "%s D: padding element %zu changed", type_name(dt), idx);
            continue;
        }
        cr_assert_eq(Dh[idx], half_bits(dt, D32[idx]),
                     "%s D, bias mode %d, in place %d, epilogue %d ops %d %d batch %d: D[%d,%d] = %.9g (%#06x), fp32 "
                     "%.9g rounds to %#06x",
                     type_name(dt), mode, in_place, e.epilogue, opa, opb, b, i, j, half_value(dt, Dh[idx]), Dh[idx],
                     D32[idx], half_bits(dt, D32[idx]));
        double x = want[(size_t)(b * sc) + (size_t)i + (size_t)j * ldc];
        if (e.bias) x += bias[b * sbias + i];
        if (e.relu) x = x > 0 ? x : 0;
        if (e.gelu) x = gelu(x);
        cr_assert(fabs(half_value(dt, Dh[idx]) - x) <= tol * (1.0 + fabs(x)), "%s D[%d,%d] of batch %d = %.7g, want %.7g",
                  type_name(dt), i, j, b, half_value(dt, Dh[idx]), x);
    }
    for (size_t idx = 0; idx < naux; idx++) {
        const int i = (int)(idx % (size_t)saux % (size_t)ldaux), j = (int)(idx % (size_t)saux / (size_t)ldaux);
        if (!e.aux || !(i < m && j < n))
            cr_assert_eq(auxh[idx], aux0[idx], "%s aux: element %zu changed", type_name(dt), idx);
        else
            cr_assert_eq(auxh[idx], half_bits(dt, aux32[idx]),
                         "%s aux, bias mode %d, epilogue %d ops %d %d: aux[%d,%d] = %#06x, fp32 %.9g rounds to %#06x",
                         type_name(dt), mode, e.epilogue, opa, opb, i, j, auxh[idx], aux32[idx],
                         half_bits(dt, aux32[idx]));
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc32);
    cublasLtMatrixLayoutDestroy(ld32);
    cublasLtMatrixLayoutDestroy(lch);
    cublasLtMatrixLayoutDestroy(ldh);
    cublasLtMatmulDescDestroy(d32);
    cublasLtMatmulDescDestroy(dh);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC32);
    cudaFree(dbias32);
    cudaFree(dD32);
    cudaFree(daux32);
    cudaFree(dDh);
    cudaFree(dauxh);
    if (!in_place) cudaFree(dCh);
    if (mode != BIAS_F32) cudaFree(dbiash);
    free(A);
    free(B);
    free(C);
    free(bias);
    free(D32);
    free(aux32);
    free(Dh);
    free(auxh);
    free(D0);
    free(aux0);
    free(want);
}

/* bf16 and fp16 C and D (A and B of the same type) with every epilogue, ops N/T, each bias
 * and aux type setting; beta 0 unbatched, and beta -1.25 with three batches, in place when
 * op(A) and op(B) are both N or both T. */
Test(cuda_emu_blas, lt_matmul_half_output_every_epilogue)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    for (int t = 1; t < 3; t++)
        for (int mode = BIAS_AS_D; mode <= BIAS_SET_TO_D; mode++)
            for (size_t e = 0; e < sizeof epilogues / sizeof *epilogues; e++)
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) {
                        check_lt_half_d(lt, types[t], (BiasMode)mode, 0, ops[a], ops[b], epilogues[e], 7, 6, 5, 1.0f,
                                        0.0f, 1);
                        check_lt_half_d(lt, types[t], (BiasMode)mode, a == b, ops[a], ops[b], epilogues[e], 5, 9, 8,
                                        0.5f, -1.25f, 3);
                    }
    cr_assert_eq(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}

/* BGRADA and BGRADB with a half D (A and B of its type): D bit for bit the fp32 D's values
 * rounded; the gradient summed in float as lt_bias_gradient_epilogues checks, stored in D's
 * type rounded to nearest even (BIAS_DATA_TYPE unset), or in fp32 (set to CUDA_R_32F). */
Test(cuda_emu_blas, lt_bias_gradient_half_output)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    const int m = 13, n = 9, k = 37;
    for (int ty = 1; ty < 3; ty++)
        for (int f32grad = 0; f32grad < 2; f32grad++)
            for (int which = 0; which < 2; which++)
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++) {
                        const cudaDataType dt = types[ty];
                        const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
                        const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
                        const int lda = arows + 1, ldb = brows + 2, ldd = m + 3, len = which ? n : m;
                        const size_t na = (size_t)lda * acols, nb = (size_t)ldb * bcols, nd = (size_t)ldd * n;
                        float *A = malloc(na * 4), *B = malloc(nb * 4), *D32 = malloc(nd * 4), *g32 = malloc((size_t)len * 4);
                        uint16_t *Dh = malloc(nd * 2);
                        cr_assert(A && B && D32 && g32 && Dh);
                        fill(A, na, 61u);
                        fill(B, nb, 62u);
                        for (size_t i = 0; i < na; i++) A[i] = round_to(dt, A[i]);
                        for (size_t i = 0; i < nb; i++) B[i] = round_to(dt, B[i]);
                        void *dA = to_device_as(dt, A, na), *dB = to_device_as(dt, B, nb);
                        float *dD32 = NULL, *dg32 = NULL;
                        uint16_t *dDh = NULL;
                        void *dg = NULL;
                        cr_assert_eq(cudaMalloc((void **)&dD32, nd * 4), cudaSuccess);
                        cr_assert_eq(cudaMalloc((void **)&dDh, nd * 2), cudaSuccess);
                        cr_assert_eq(cudaMalloc((void **)&dg32, (size_t)len * 4), cudaSuccess);
                        cr_assert_eq(cudaMalloc(&dg, (size_t)len * (f32grad ? 4 : 2)), cudaSuccess);
                        const cublasLtEpilogue_t epi = which ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                        cublasLtMatmulDesc_t d32 = lt_desc(opa, opb, epi, dg32, 0, -1, NULL, 0, 0, -1);
                        cublasLtMatmulDesc_t dh = lt_desc(opa, opb, epi, dg, 0, f32grad ? CUDA_R_32F : -1, NULL, 0, 0, -1);
                        cublasLtMatrixLayout_t la = layout_as(dt, arows, acols, lda, 1, 0),
                                               lb = layout_as(dt, brows, bcols, ldb, 1, 0), ld32 = layout(m, n, ldd, 1, 0),
                                               ldh = layout_as(dt, m, n, ldd, 1, 0);
                        float one = 1.0f, zero = 0.0f;
                        cr_assert_eq(lt_heuristic(lt, dh, la, lb, ldh, ldh), CUBLAS_STATUS_SUCCESS);
                        cr_assert_eq(cublasLtMatmul(lt, d32, &one, dA, la, dB, lb, &zero, dD32, ld32, dD32, ld32, NULL,
                                                    NULL, 0, NULL),
                                     CUBLAS_STATUS_SUCCESS);
                        cr_assert_eq(cublasLtMatmul(lt, dh, &one, dA, la, dB, lb, &zero, dDh, ldh, dDh, ldh, NULL, NULL,
                                                    0, NULL),
                                     CUBLAS_STATUS_SUCCESS);
                        to_host(D32, dD32, nd);
                        halves_to_host(Dh, dDh, nd);
                        to_host(g32, dg32, (size_t)len);
                        for (int j = 0; j < n; j++)
                            for (int i = 0; i < m; i++) {
                                const size_t x = (size_t)i + (size_t)j * ldd;
                                cr_assert_eq(Dh[x], half_bits(dt, D32[x]), "%s D[%d,%d] = %#06x, fp32 %.9g", type_name(dt),
                                             i, j, Dh[x], D32[x]);
                            }
                        float gf[16];
                        uint16_t gh[16];
                        cr_assert(len <= 16);
                        if (f32grad) to_host(gf, dg, (size_t)len);
                        else halves_to_host(gh, dg, (size_t)len);
                        for (int i = 0; i < len; i++) {
                            float sum = 0.0f;
                            for (int l = 0; l < k; l++)
                                sum += which ? (float)at(B, ldb, tb, l, i) : (float)at(A, lda, ta, i, l);
                            cr_assert_eq(g32[i], sum, "fp32 D: gradient element %d", i);
                            if (f32grad)
                                cr_assert_eq(gf[i], sum, "%s D, fp32 %s: element %d = %.9g, not %.9g", type_name(dt),
                                             which ? "BGRADB" : "BGRADA", i, gf[i], sum);
                            else
                                cr_assert_eq(gh[i], half_bits(dt, sum), "%s %s, op(A) %c, op(B) %c: element %d = %#06x, "
                                             "not %.9g rounded (%#06x)", type_name(dt), which ? "BGRADB" : "BGRADA",
                                             ta ? 'T' : 'N', tb ? 'T' : 'N', i, gh[i], sum, half_bits(dt, sum));
                        }
                        cublasLtMatrixLayoutDestroy(la);
                        cublasLtMatrixLayoutDestroy(lb);
                        cublasLtMatrixLayoutDestroy(ld32);
                        cublasLtMatrixLayoutDestroy(ldh);
                        cublasLtMatmulDescDestroy(d32);
                        cublasLtMatmulDescDestroy(dh);
                        cudaFree(dA);
                        cudaFree(dB);
                        cudaFree(dD32);
                        cudaFree(dDh);
                        cudaFree(dg32);
                        cudaFree(dg);
                        free(A);
                        free(B);
                        free(D32);
                        free(g32);
                        free(Dh);
                    }
    cublasLtDestroy(lt);
}

/* The type combinations with a half output that cuBLASLt refuses, each NOT_SUPPORTED from
 * both cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul, with nothing written; and the bias
 * and aux type settings it takes with a bf16 D. */
Test(cuda_emu_blas, lt_half_output_refusals)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    float *d = NULL, one = 1.0f, zero = 0.0f, d0[64], d1[64];
    fill(d0, 64, 71u);
    d = to_device(d0, 64);
    cublasLtMatrixLayout_t f = layout(4, 4, 4, 1, 0), bf = layout_as(CUDA_R_16BF, 4, 4, 4, 1, 0),
                           hf = layout_as(CUDA_R_16F, 4, 4, 4, 1, 0);
    const cublasLtEpilogue_t dflt = CUBLASLT_EPILOGUE_DEFAULT, bias = CUBLASLT_EPILOGUE_BIAS,
                             aux = CUBLASLT_EPILOGUE_GELU_AUX, auxbias = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const struct {
        const char *what;
        cublasLtMatrixLayout_t ab, c, dd;
        cublasLtEpilogue_t epi;
        int32_t bias_type, aux_type;
        cublasStatus_t want;
    } cases[] = {
        {"fp16 A and B, bf16 C and D", hf, bf, bf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"bf16 A and B, fp16 C and D", bf, hf, hf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"bf16 A and B, fp32 C, bf16 D", bf, f, bf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"bf16 A and B, bf16 C, fp32 D", bf, bf, f, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp16 A and B, bf16 C, fp16 D", hf, bf, hf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp32 A and B, bf16 C and D", f, bf, bf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp32 A and B, fp16 C and D", f, hf, hf, dflt, -1, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp32 aux with a bf16 D", bf, bf, bf, aux, -1, CUDA_R_32F, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp32 aux with an fp16 D", hf, hf, hf, auxbias, CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_NOT_SUPPORTED},
        {"bf16 aux with an fp32 D", bf, f, f, aux, -1, CUDA_R_16BF, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp16 aux with a bf16 D", bf, bf, bf, aux, -1, CUDA_R_16F, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp16 bias with a bf16 D", bf, bf, bf, bias, CUDA_R_16F, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"bf16 bias with an fp32 D", bf, f, f, bias, CUDA_R_16BF, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp64 bias with a bf16 D", bf, bf, bf, bias, CUDA_R_64F, -1, CUBLAS_STATUS_NOT_SUPPORTED},
        {"fp16 bias gradient with a bf16 D", bf, bf, bf, CUBLASLT_EPILOGUE_BGRADB, CUDA_R_16F, -1,
         CUBLAS_STATUS_NOT_SUPPORTED},
        /* accepted */
        {"bf16 A to D", bf, bf, bf, dflt, -1, -1, CUBLAS_STATUS_SUCCESS},
        {"fp16 A to D", hf, hf, hf, dflt, -1, -1, CUBLAS_STATUS_SUCCESS},
        {"fp32 bias with a bf16 D", bf, bf, bf, bias, CUDA_R_32F, -1, CUBLAS_STATUS_SUCCESS},
        {"bf16 bias and aux set with a bf16 D", bf, bf, bf, auxbias, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_STATUS_SUCCESS},
        {"fp32 bias, fp16 aux set with an fp16 D", hf, hf, hf, auxbias, CUDA_R_32F, CUDA_R_16F, CUBLAS_STATUS_SUCCESS},
        {"fp32 bias gradient with an fp16 D", hf, hf, hf, CUBLASLT_EPILOGUE_BGRADA, CUDA_R_32F, -1,
         CUBLAS_STATUS_SUCCESS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cublasLtMatmulDesc_t desc = lt_desc(CUBLAS_OP_N, CUBLAS_OP_N, cases[i].epi, d + 32, 0, cases[i].bias_type,
                                            d + 48, 4, 0, cases[i].aux_type);
        cr_expect_eq(lt_heuristic(lt, desc, cases[i].ab, cases[i].ab, cases[i].c, cases[i].dd), cases[i].want,
                     "heuristic: %s", cases[i].what);
        if (cases[i].want != CUBLAS_STATUS_SUCCESS) {
            cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, cases[i].ab, d, cases[i].ab, &one, d + 16, cases[i].c, d + 16,
                                        cases[i].dd, NULL, NULL, 0, NULL),
                         cases[i].want, "matmul: %s", cases[i].what);
            to_host(d1, d, 64);
            cr_expect(memcmp(d0, d1, sizeof d0) == 0, "a refused call wrote memory: %s", cases[i].what);
        } else {
            cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, cases[i].ab, d, cases[i].ab, &zero, d + 16, cases[i].c,
                                        d + 16, cases[i].dd, NULL, NULL, 0, NULL),
                         cases[i].want, "matmul: %s", cases[i].what);
            cudaMemcpy(d, d0, sizeof d0, cudaMemcpyHostToDevice);
        }
        cublasLtMatmulDescDestroy(desc);
    }
    cublasLtMatrixLayoutDestroy(f);
    cublasLtMatrixLayoutDestroy(bf);
    cublasLtMatrixLayoutDestroy(hf);
    cudaFree(d);
    cublasLtDestroy(lt);
}

/* One GELU_AUX cublasLtMatmul on fresh zeroed allocations of 128 bytes for C, D and aux (64
 * halves, or 32 floats), with A 4 x 16 and B 16 x 16 of type ab, beta 1, C, D (of type dt)
 * and aux 4 x 16 with leading dimensions ldc, ldd and ldaux: it succeeds when fault is NULL,
 * else reports a fault whose message holds fault and "<elem>-byte elements", sticky. The
 * device is reset after. */
static void lt_output_bounds(cublasLtHandle_t lt, cudaDataType ab, cudaDataType dt, int ldc, int ldd, int ldaux,
                             const char *fault, int elem)
{
    void *dA = NULL, *dB = NULL, *dC = NULL, *dD = NULL, *daux = NULL;
    cr_assert_eq(cudaMalloc(&dA, 64 * 4), cudaSuccess);
    cr_assert_eq(cudaMalloc(&dB, 256 * 4), cudaSuccess);
    cr_assert_eq(cudaMalloc(&dC, 128), cudaSuccess);
    cr_assert_eq(cudaMalloc(&dD, 128), cudaSuccess);
    cr_assert_eq(cudaMalloc(&daux, 128), cudaSuccess);
    cr_assert_eq(cudaMemset(dA, 0, 64 * 4), cudaSuccess);
    cr_assert_eq(cudaMemset(dB, 0, 256 * 4), cudaSuccess);
    cr_assert_eq(cudaMemset(dC, 0, 128), cudaSuccess);
    cublasLtMatmulDesc_t desc = lt_desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_GELU_AUX, NULL, 0, -1, daux, ldaux, 0, -1);
    cublasLtMatrixLayout_t la = layout_as(ab, 4, 16, 4, 1, 0), lb = layout_as(ab, 16, 16, 16, 1, 0),
                           lc = layout_as(dt, 4, 16, ldc, 1, 0), ld = layout_as(dt, 4, 16, ldd, 1, 0);
    float one = 1.0f;
    cublasStatus_t st = cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &one, dC, lc, dD, ld, NULL, NULL, 0, NULL);
    if (!fault) {
        cr_expect_eq(st, CUBLAS_STATUS_SUCCESS, "%s D that fills its allocation", type_name(dt));
        cr_expect_eq(cudaDeviceSynchronize(), cudaSuccess);
    } else {
        char bytes[32];
        snprintf(bytes, sizeof bytes, "%d-byte elements", elem);
        cr_expect_eq(st, CUBLAS_STATUS_EXECUTION_FAILED, "%s: %s past its allocation", type_name(dt), fault);
        cr_expect(strstr(kemu_last_error_message(), fault) != NULL, "%s", kemu_last_error_message());
        cr_expect(strstr(kemu_last_error_message(), bytes) != NULL, "%s", kemu_last_error_message());
        cr_expect_eq(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaDeviceReset();
}

/* A half C, D and aux are checked against their allocation with 2-byte elements: 4 x 16
 * with leading dimension 4 fills 64 halves exactly, leading dimension 5 runs 15 past. An
 * fp32 D in the same 128 bytes is reported with 4-byte elements. */
Test(cuda_emu_blas, lt_half_output_out_of_bounds, .init = cr_redirect_stderr)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    for (int t = 1; t < 3; t++) {
        lt_output_bounds(lt, types[t], types[t], 4, 4, 4, NULL, 2);
        lt_output_bounds(lt, types[t], types[t], 4, 5, 4, "cublasLtMatmul: matrix D", 2);
        lt_output_bounds(lt, types[t], types[t], 5, 4, 4, "cublasLtMatmul: matrix C", 2);
        lt_output_bounds(lt, types[t], types[t], 4, 4, 5, "cublasLtMatmul: matrix aux", 2);
    }
    lt_output_bounds(lt, CUDA_R_16BF, CUDA_R_32F, 4, 4, 4, "cublasLtMatmul: matrix C", 4);
    cublasLtDestroy(lt);
}

/* The call the CUDA target will make for a Linear layer on row-major activations, as
 * llm.c does: out[N, O] = inp[N, I] @ W[O, I]^T + b[O], with GELU. Column-major, out^T
 * (O x N) = W (col-major I x O, so op T) times inp^T (col-major I x N, op N); the bias runs
 * along D's rows, O. Checked against the row-major formula directly. */
Test(cuda_emu_blas, lt_row_major_linear_layer)
{
    int N = 10, I = 12, O = 7;
    float inp[10 * 12], W[7 * 12], b[7], out[10 * 7];
    fill(inp, sizeof inp / 4, 1u);
    fill(W, sizeof W / 4, 2u);
    fill(b, 7, 3u);
    float *dinp = to_device(inp, sizeof inp / 4), *dW = to_device(W, sizeof W / 4), *db = to_device(b, 7);
    float *dout = NULL;
    cr_assert_eq(cudaMalloc((void **)&dout, sizeof out), cudaSuccess);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lw, li, lo;
    cr_assert_eq(cublasLtCreate(&lt), 0);
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), 0);
    int32_t opT = CUBLAS_OP_T;
    uint32_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof db), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&lw, CUDA_R_32F, (uint64_t)I, (uint64_t)O, I), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&li, CUDA_R_32F, (uint64_t)I, (uint64_t)N, I), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&lo, CUDA_R_32F, (uint64_t)O, (uint64_t)N, O), 0);
    float one = 1.0f, zero = 0.0f;
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, dW, lw, dinp, li, &zero, dout, lo, dout, lo, NULL, NULL, 0, NULL), 0);
    to_host(out, dout, sizeof out / 4);
    for (int r = 0; r < N; r++)
        for (int o = 0; o < O; o++) {
            double s = b[o];
            for (int i = 0; i < I; i++) s += (double)inp[r * I + i] * W[o * I + i];
            s = gelu(s);
            cr_assert(fabs(out[r * O + o] - s) <= 1e-5 * (1 + fabs(s)), "out[%d,%d] = %g, want %g", r, o,
                      out[r * O + o], s);
        }
    cublasLtMatrixLayoutDestroy(lw);
    cublasLtMatrixLayoutDestroy(li);
    cublasLtMatrixLayoutDestroy(lo);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(dinp);
    cudaFree(dW);
    cudaFree(db);
    cudaFree(dout);
}

/* BGRADA and BGRADB: D = op(A) op(B) as usual, and the bias gradient, op(A)'s rows or
 * op(B)'s columns summed over k in float in order l = 0 ... k - 1 (the C target's column
 * sums): checked bit for bit against that plain loop, for fp32, bf16 and fp16 A and B (the
 * loop over the widened values); batches are refused. */
Test(cuda_emu_blas, lt_bias_gradient_epilogues)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    const int m = 13, n = 9, k = 37;
    for (int ty = 0; ty < 3; ty++) {
        const cudaDataType ab = types[ty];
        for (int which = 0; which < 2; which++)
            for (int oa = 0; oa < 2; oa++)
                for (int ob = 0; ob < 2; ob++) {
                    const int ta = oa, tb = ob;
                    const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
                    const int lda = arows + 1, ldb = brows + 2, ldd = m + 3;
                    const size_t na = (size_t)lda * acols, nb = (size_t)ldb * bcols, nd = (size_t)ldd * n;
                    const int len = which ? n : m;
                    float *A = malloc(na * 4), *B = malloc(nb * 4), *D = malloc(nd * 4), *grad = malloc((size_t)len * 4);
                    double *want = calloc(nd, sizeof *want);
                    cr_assert(A && B && D && grad && want);
                    fill(A, na, 11u);
                    fill(B, nb, 12u);
                    for (size_t i = 0; i < na; i++) A[i] = round_to(ab, A[i]);
                    for (size_t i = 0; i < nb; i++) B[i] = round_to(ab, B[i]);
                    reference(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, want, ldd);
                    void *dA = to_device_as(ab, A, na), *dB = to_device_as(ab, B, nb);
                    float *dD = NULL, *dgrad = NULL;
                    cr_assert_eq(cudaMalloc((void **)&dD, nd * 4), cudaSuccess);
                    cr_assert_eq(cudaMalloc((void **)&dgrad, (size_t)len * 4), cudaSuccess);
                    cublasLtMatmulDesc_t desc;
                    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
                    int32_t t = ta ? CUBLAS_OP_T : CUBLAS_OP_N, u = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
                    uint32_t epi = which ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), 0);
                    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &u, sizeof u), 0);
                    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
                    cublasLtMatrixLayout_t la = layout_as(ab, arows, acols, lda, 1, 0),
                                           lb = layout_as(ab, brows, bcols, ldb, 1, 0), ld = layout(m, n, ldd, 1, 0);
                    float one = 1.0f, zero = 0.0f;
                    cr_expect_eq(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, NULL),
                                 CUBLAS_STATUS_INVALID_VALUE, "a bias gradient epilogue without its pointer");
                    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dgrad, sizeof dgrad), 0);
                    cr_assert_eq(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, NULL),
                                 CUBLAS_STATUS_SUCCESS);
                    to_host(D, dD, nd);
                    to_host(grad, dgrad, (size_t)len);
                    for (int j = 0; j < n; j++)
                        for (int i = 0; i < m; i++) {
                            const double w = want[i + (size_t)j * ldd];
                            cr_expect_leq(fabs(D[i + (size_t)j * ldd] - w), 1e-5 * (1 + fabs(w)), "D(%d, %d)", i, j);
                        }
                    for (int i = 0; i < len; i++) {
                        float sum = 0.0f;
                        for (int l = 0; l < k; l++) sum += which ? (float)at(B, ldb, tb, l, i) : (float)at(A, lda, ta, i, l);
                        cr_expect_eq(grad[i], sum, "%s %s, op(A) %c, op(B) %c: element %d: %.9g, not %.9g", type_name(ab),
                                     which ? "BGRADB" : "BGRADA", ta ? 'T' : 'N', tb ? 'T' : 'N', i, grad[i], sum);
                    }
                    /* no batched bias gradients, as in cuBLASLt */
                    cublasLtMatrixLayout_t la2 = layout_as(ab, arows, acols, lda, 2, 0),
                                           lb2 = layout_as(ab, brows, bcols, ldb, 2, 0), ld2 = layout(m, n, ldd, 2, 0);
                    cr_expect_eq(cublasLtMatmul(lt, desc, &one, dA, la2, dB, lb2, &zero, dD, ld2, dD, ld2, NULL, NULL, 0, NULL),
                                 CUBLAS_STATUS_NOT_SUPPORTED);
                    cublasLtMatrixLayoutDestroy(la2);
                    cublasLtMatrixLayoutDestroy(lb2);
                    cublasLtMatrixLayoutDestroy(ld2);
                    cublasLtMatrixLayoutDestroy(la);
                    cublasLtMatrixLayoutDestroy(lb);
                    cublasLtMatrixLayoutDestroy(ld);
                    cublasLtMatmulDescDestroy(desc);
                    cudaFree(dA);
                    cudaFree(dB);
                    cudaFree(dD);
                    cudaFree(dgrad);
                    free(A);
                    free(B);
                    free(D);
                    free(grad);
                    free(want);
                }
    }
    cublasLtDestroy(lt);
}

Test(cuda_emu_blas, lt_unsupported_and_invalid)
{
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l4, l5, lrow;
    cr_assert_eq(cublasLtCreate(&lt), 0);
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&l4, CUDA_R_32F, 4, 4, 4), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&l5, CUDA_R_32F, 5, 4, 5), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&lrow, CUDA_R_32F, 4, 4, 4), 0);
    int32_t row = CUBLASLT_ORDER_ROW;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(lrow, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row), 0);
    /* An attribute of the wrong size is refused, as cuBLASLt does. */
    int64_t wrong = 0;
    cr_expect_eq(cublasLtMatrixLayoutSetAttribute(l4, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &wrong, sizeof wrong),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_expect_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &wrong, sizeof wrong),
                 CUBLAS_STATUS_INVALID_VALUE);
    float *d = NULL, one = 1.0f, zero = 0.0f;
    cr_assert_eq(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l5, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_INVALID_VALUE, "inner dimensions 4 and 5 differ");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lrow, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "row order");
    uint32_t dgelu_bgrad = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &dgelu_bgrad, sizeof dgelu_bgrad), 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "DGELU_BGRAD is not emulated");
    uint32_t dgelu = CUBLASLT_EPILOGUE_DGELU;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &dgelu, sizeof dgelu), 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_INVALID_VALUE, "DGELU without its aux input");
    uint32_t bias = CUBLASLT_EPILOGUE_BIAS;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &bias, sizeof bias), 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_INVALID_VALUE, "bias epilogue without a bias pointer");
    uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    size_t written = 0;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
    cr_expect_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, NULL, 0, &written), 0);
    cr_expect_eq(written, sizeof(uint32_t));
    cublasLtMatmulDesc_t half;
    cr_assert_eq(cublasLtMatmulDescCreate(&half, CUBLAS_COMPUTE_16F, CUDA_R_16F), 0);
    cr_expect_eq(cublasLtMatmul(lt, half, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "half-precision compute is not emulated");
    cublasLtMatmulDescDestroy(half);
    /* Half-precision A and B: both bf16 or both fp16 with C and D both fp32 or both of their
     * type, compute 32F; mixed A and B types, C and D of different types, and FAST_TF32 with
     * half operands are refused (lt_half_output_refusals has the rest). */
    cublasLtMatrixLayout_t lbf, lhf;
    cr_assert_eq(cublasLtMatrixLayoutCreate(&lbf, CUDA_R_16BF, 4, 4, 4), 0);
    cr_assert_eq(cublasLtMatrixLayoutCreate(&lhf, CUDA_R_16F, 4, 4, 4), 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lbf, d, lbf, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "bf16 A and B");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lhf, d, lhf, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "fp16 A and B");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lbf, d, lhf, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "bf16 A, fp16 B");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, lbf, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A, bf16 B");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lbf, d, lbf, &zero, d, lbf, d, lbf, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "bf16 C and D");
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, lhf, d, lhf, &zero, d, l4, d, lhf, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 C, fp16 D");
    cublasLtMatmulDesc_t tf32;
    cr_assert_eq(cublasLtMatmulDescCreate(&tf32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), 0);
    cr_expect_eq(cublasLtMatmul(lt, tf32, &one, d, lbf, d, lbf, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "FAST_TF32 with bf16 operands");
    cr_expect_eq(cublasLtMatmul(lt, tf32, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "FAST_TF32 with fp32 operands");
    cublasLtMatmulDescDestroy(tf32);
    cublasLtMatrixLayoutDestroy(lbf);
    cublasLtMatrixLayoutDestroy(lhf);
    cublasLtMatrixLayoutDestroy(l4);
    cublasLtMatrixLayoutDestroy(l5);
    cublasLtMatrixLayoutDestroy(lrow);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(d);
}

/* cuBLASLt checks a half-precision A with 2-byte elements too: 4 x 16 fills 64 bf16, 5 x 13
 * runs one element past. */
Test(cuda_emu_blas, lt_half_operand_out_of_bounds, .init = cr_redirect_stderr)
{
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cr_assert_eq(cublasLtCreate(&lt), 0);
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    uint16_t *dA = NULL, *dB = NULL;
    float *dD = NULL, one = 1.0f, zero = 0.0f;
    cr_assert_eq(cudaMalloc((void **)&dA, 64 * sizeof(uint16_t)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&dB, 64 * sizeof(uint16_t)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&dD, 64 * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemset(dA, 0, 64 * sizeof(uint16_t)), cudaSuccess);
    cr_assert_eq(cudaMemset(dB, 0, 64 * sizeof(uint16_t)), cudaSuccess);
    cublasLtMatrixLayout_t la = layout_as(CUDA_R_16BF, 4, 16, 4, 1, 0), lb = layout_as(CUDA_R_16BF, 16, 4, 16, 1, 0);
    cublasLtMatrixLayout_t ld = layout(4, 4, 4, 1, 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS, "a bf16 A that fills its allocation");
    cublasLtMatrixLayout_t la5 = layout_as(CUDA_R_16BF, 5, 13, 5, 1, 0), lb5 = layout_as(CUDA_R_16BF, 13, 4, 13, 1, 0);
    cublasLtMatrixLayout_t ld5 = layout(5, 4, 5, 1, 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, dA, la5, dB, lb5, &zero, dD, ld5, dD, ld5, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_EXECUTION_FAILED, "a bf16 A one element past its allocation");
    cr_expect(strstr(kemu_last_error_message(), "cublasLtMatmul: matrix A") != NULL, "%s", kemu_last_error_message());
    cr_expect(strstr(kemu_last_error_message(), "2-byte elements") != NULL, "%s", kemu_last_error_message());
    cr_expect_eq(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(la5);
    cublasLtMatrixLayoutDestroy(lb5);
    cublasLtMatrixLayoutDestroy(ld5);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaDeviceReset();
}

/* DGELU (GELU's backward in the product's epilogue): D = op(A) op(B) * gelu'(aux), aux the
 * GELU's input, read (m x n, its own leading dimension), of D's type: fp32, and bf16 and
 * fp16 A, B, D and aux. Against the product in double times the derivative in double, within
 * float's rounding (a half D: within one rounding step of the type); aux left unchanged. */
static double gelu_grad(double x)
{
    const double k = 0.7978845608028654, c = 0.044715, t = tanh(k * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
}

Test(cuda_emu_blas, lt_dgelu_every_type)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    const int m = 11, n = 7, k = 19;
    for (int ty = 0; ty < 3; ty++)
        for (int oa = 0; oa < 2; oa++) {
            const cudaDataType t = types[ty];
            const int ta = oa, arows = ta ? k : m, acols = ta ? m : k, lda = arows + 1, ldb = k, ldd = m + 2, ldx = m + 3;
            const size_t na = (size_t)lda * acols, nb = (size_t)ldb * n, nd = (size_t)ldd * n, nx = (size_t)ldx * n;
            float *A = malloc(na * 4), *B = malloc(nb * 4), *X = malloc(nx * 4), *D = malloc(nd * 4);
            double *prod = calloc(nd, sizeof *prod);
            cr_assert(A && B && X && D && prod);
            fill(A, na, 21u);
            fill(B, nb, 22u);
            fill(X, nx, 23u);
            for (size_t i = 0; i < nx; i++) X[i] = round_to(t, 4.0f * X[i]); /* GELU inputs in [-4, 4] */
            for (size_t i = 0; i < na; i++) A[i] = round_to(t, A[i]);
            for (size_t i = 0; i < nb; i++) B[i] = round_to(t, B[i]);
            reference(ta, 0, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, prod, ldd);
            void *dA = to_device_as(t, A, na), *dB = to_device_as(t, B, nb), *dX = to_device_as(t, X, nx), *dD = NULL;
            cr_assert_eq(cudaMalloc(&dD, nd * (t == CUDA_R_32F ? 4 : 2)), cudaSuccess);
            cublasLtMatmulDesc_t desc = lt_desc(ta ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DGELU, NULL, 0, -1,
                                                dX, ldx, 0, -1);
            cublasLtMatrixLayout_t la = layout_as(t, arows, acols, lda, 1, 0), lb = layout_as(t, k, n, ldb, 1, 0),
                                   ld = layout_as(t, m, n, ldd, 1, 0);
            const float one = 1.0f, zero = 0.0f;
            cr_assert_eq(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, NULL),
                         CUBLAS_STATUS_SUCCESS, "%s", type_name(t));
            if (t == CUDA_R_32F) {
                to_host(D, dD, nd);
            } else {
                uint16_t *h = malloc(nd * 2);
                cr_assert(h);
                halves_to_host(h, dD, nd);
                for (size_t i = 0; i < nd; i++) D[i] = half_value(t, h[i]);
                free(h);
            }
            const double tol = t == CUDA_R_32F ? 1e-5 : t == CUDA_R_16BF ? 8e-3 : 1e-3;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    const double want = prod[i + (size_t)j * ldd] * gelu_grad(X[i + (size_t)j * ldx]);
                    const double got = D[i + (size_t)j * ldd];
                    cr_assert(fabs(got - want) <= tol * (1 + fabs(want)), "%s op %d: D[%d, %d] = %.9g, want %.9g",
                              type_name(t), ta, i, j, got, want);
                }
            float *X2 = malloc(nx * 4); /* aux is read, not written */
            cr_assert(X2);
            if (t == CUDA_R_32F) {
                to_host(X2, dX, nx);
            } else {
                uint16_t *h = malloc(nx * 2);
                cr_assert(h);
                halves_to_host(h, dX, nx);
                for (size_t i = 0; i < nx; i++) X2[i] = half_value(t, h[i]);
                free(h);
            }
            cr_assert(!memcmp(X, X2, nx * 4), "%s: aux was written", type_name(t));
            free(X2);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
            cudaFree(dA);
            cudaFree(dB);
            cudaFree(dX);
            cudaFree(dD);
            free(A);
            free(B);
            free(X);
            free(D);
            free(prod);
        }
    cr_assert_eq(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}
