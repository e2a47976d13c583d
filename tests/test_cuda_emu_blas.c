/* test_cuda_emu_blas.c — the emulator's cuBLAS and cuBLASLt (runtime/cuda/emu/cublas.c)
 * against a naive column-major loop in double: every combination of op N/T/C for A and B,
 * leading dimensions larger than the rows (with the padding left untouched), alpha and
 * beta (beta 0 must not read C, so NaN there stays out), strided batches with gaps; the
 * cuBLASLt epilogues (bias, ReLU, GELU, the GELU input as aux) and the row-major Linear
 * layer the CUDA target will issue; and the argument checks that cuBLAS itself makes. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cuda/emu/kemu_cublas.h"
#include "../runtime/cuda/emu/kemu_runtime.h"

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

/* One strided-batched GEMM (batch 1 uses cublasSgemm) checked against the reference,
 * including that the padding rows of C (between m and ldc) and the gaps between batches are
 * unchanged. */
static void check_gemm(cublasHandle_t h, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                       float alpha, float beta, int batch)
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
    fill(A, na, 1u + (uint32_t)m);
    fill(B, nb, 2u + (uint32_t)n);
    fill(C, nc, 3u + (uint32_t)k);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) C[i] = NAN; /* must not be read */
    for (size_t i = 0; i < nc; i++) want[i] = C[i];
    for (int b = 0; b < batch; b++)
        reference(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, want + b * sc, ldc);
    float *dA = to_device(A, na), *dB = to_device(B, nb), *dC = to_device(C, nc);
    cublasStatus_t st;
    if (batch == 1)
        st = cublasSgemm(h, opa, opb, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc);
    else
        st = cublasSgemmStridedBatched(h, opa, opb, m, n, k, &alpha, dA, lda, sa, dB, ldb, sb, &beta, dC, ldc, sc,
                                       batch);
    cr_assert_eq(st, CUBLAS_STATUS_SUCCESS, "ops %d %d m %d n %d k %d batch %d", opa, opb, m, n, k, batch);
    to_host(got, dC, nc);
    for (int b = 0; b < batch; b++)
        for (long long e = 0; e < sc; e++) {
            size_t idx = (size_t)(b * sc + e);
            int i = (int)(e % ldc), j = (int)(e / ldc);
            if (i < m && j < n) {
                double w = want[idx];
                cr_assert(fabs(got[idx] - w) <= 1e-5 * (1.0 + fabs(w)),
                          "ops %d %d m %d n %d k %d alpha %g beta %g batch %d: C[%d,%d] of batch %d = %.7g, want %.7g",
                          opa, opb, m, n, k, alpha, beta, batch, i, j, b, got[idx], w);
            } else {
                /* Padding and gaps: bit-identical to what was there (NaN included). */
                cr_assert(memcmp(&got[idx], &C[idx], sizeof(float)) == 0, "padding element %zu changed", idx);
            }
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

static cublasLtMatrixLayout_t layout(int rows, int cols, int ld, int batch, long long stride)
{
    cublasLtMatrixLayout_t l;
    cr_assert_eq(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, (uint64_t)rows, (uint64_t)cols, ld), CUBLAS_STATUS_SUCCESS);
    int32_t b = batch;
    int64_t s = stride;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
                 CUBLAS_STATUS_SUCCESS);
    return l;
}

/* D = epilogue(alpha op(A) op(B) + beta C + bias) with C and D distinct, batched. */
static void check_lt(cublasLtHandle_t lt, cublasOperation_t opa, cublasOperation_t opb, Epi e, int m, int n, int k,
                     float alpha, float beta, int batch)
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
    for (size_t i = 0; i < nc; i++) want[i] = C[i];
    for (int b = 0; b < batch; b++)
        reference(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, want + b * sc, ldc);
    float *dA = to_device(A, na), *dB = to_device(B, nb), *dC = to_device(C, nc), *dbias = to_device(bias, nbias);
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
    cublasLtMatrixLayout_t la = layout(arows, acols, lda, batch, sa), lb = layout(brows, bcols, ldb, batch, sb);
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
                 CUBLAS_STATUS_SUCCESS, "epilogue %d ops %d %d", e.epilogue, opa, opb);
    to_host(D, dD, nd);
    to_host(aux, daux, naux);
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
                check_lt(lt, ops[a], ops[b], epilogues[e], 7, 6, 5, 1.0f, 0.0f, 1);
                check_lt(lt, ops[a], ops[b], epilogues[e], 5, 9, 8, 0.5f, -1.25f, 3);
            }
    cr_assert_eq(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
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
 * sums): checked bit for bit against that plain loop; batches are refused. */
Test(cuda_emu_blas, lt_bias_gradient_epilogues)
{
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    const int m = 13, n = 9, k = 37;
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
                reference(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, want, ldd);
                float *dA = to_device(A, na), *dB = to_device(B, nb), *dD = NULL, *dgrad = NULL;
                cr_assert_eq(cudaMalloc((void **)&dD, nd * 4), cudaSuccess);
                cr_assert_eq(cudaMalloc((void **)&dgrad, (size_t)len * 4), cudaSuccess);
                cublasLtMatmulDesc_t desc;
                cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
                int32_t t = ta ? CUBLAS_OP_T : CUBLAS_OP_N, u = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
                uint32_t epi = which ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), 0);
                cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &u, sizeof u), 0);
                cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
                cublasLtMatrixLayout_t la = layout(arows, acols, lda, 1, 0), lb = layout(brows, bcols, ldb, 1, 0),
                                       ld = layout(m, n, ldd, 1, 0);
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
                    cr_expect_eq(grad[i], sum, "%s, op(A) %c, op(B) %c: element %d: %.9g, not %.9g", which ? "BGRADB" : "BGRADA",
                                 ta ? 'T' : 'N', tb ? 'T' : 'N', i, grad[i], sum);
                }
                /* no batched bias gradients, as in cuBLASLt */
                cublasLtMatrixLayout_t la2 = layout(arows, acols, lda, 2, 0), lb2 = layout(brows, bcols, ldb, 2, 0),
                                       ld2 = layout(m, n, ldd, 2, 0);
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
    uint32_t dgelu = CUBLASLT_EPILOGUE_DGELU;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &dgelu, sizeof dgelu), 0);
    cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_NOT_SUPPORTED, "gradient epilogues are not emulated");
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
                 CUBLAS_STATUS_NOT_SUPPORTED, "half precision is not emulated yet");
    cublasLtMatmulDescDestroy(half);
    cublasLtMatrixLayoutDestroy(l4);
    cublasLtMatrixLayoutDestroy(l5);
    cublasLtMatrixLayoutDestroy(lrow);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(d);
}
