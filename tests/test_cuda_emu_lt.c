/* test_cuda_emu_lt.c — the emulator's cuBLASLt (emu/cublas.c) against a naive
 * column-major loop in double: the epilogues (bias, ReLU, GELU, the GELU input as aux, GELU's
 * backward, the bias gradients) with ops N/T, batches and leading dimensions, and the
 * row-major Linear layer the CUDA target issues; bf16 and fp16 A and B against the loop over
 * the widened values; half C and D (a bias and aux of D's type, or an fp32 bias) bit for bit
 * the same call with fp32 C and D rounded to nearest even; the type combinations cuBLASLt
 * refuses; matrices outside their allocation. cuBLAS: test_cuda_emu_blas.c. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_blas.h"

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

Test(cuda_emu_lt, lt_matmul_every_epilogue_and_op)
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
Test(cuda_emu_lt, lt_matmul_half_operands_every_epilogue)
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
Test(cuda_emu_lt, lt_matmul_half_output_every_epilogue)
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
Test(cuda_emu_lt, lt_bias_gradient_half_output)
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
Test(cuda_emu_lt, lt_half_output_refusals)
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
Test(cuda_emu_lt, lt_half_output_out_of_bounds, .init = cr_redirect_stderr)
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
Test(cuda_emu_lt, lt_row_major_linear_layer)
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
Test(cuda_emu_lt, lt_bias_gradient_epilogues)
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

Test(cuda_emu_lt, lt_unsupported_and_invalid)
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
    static const struct {
        uint32_t epilogue;
        cublasStatus_t want;
        const char *why;
    } refused[] = {{CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLAS_STATUS_NOT_SUPPORTED, "DGELU_BGRAD is not emulated"},
                   {CUBLASLT_EPILOGUE_DGELU, CUBLAS_STATUS_INVALID_VALUE, "DGELU without its aux input"},
                   {CUBLASLT_EPILOGUE_BIAS, CUBLAS_STATUS_INVALID_VALUE, "bias epilogue without a bias pointer"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &refused[i].epilogue,
                                                    sizeof refused[i].epilogue),
                     0);
        cr_expect_eq(cublasLtMatmul(lt, desc, &one, d, l4, d, l4, &zero, d, l4, d, l4, NULL, NULL, 0, NULL), refused[i].want,
                     "%s", refused[i].why);
    }
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
Test(cuda_emu_lt, lt_half_operand_out_of_bounds, .init = cr_redirect_stderr)
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
/* n values of type t at d (fp32, or bf16/fp16 bits) into h, widened. */
static void from_device_as(cudaDataType t, float *h, const void *d, size_t n)
{
    if (t == CUDA_R_32F) {
        to_host(h, d, n);
        return;
    }
    uint16_t *bits = malloc(n * sizeof *bits);
    cr_assert(bits);
    halves_to_host(bits, d, n);
    for (size_t i = 0; i < n; i++) h[i] = half_value(t, bits[i]);
    free(bits);
}

static double gelu_grad(double x)
{
    const double k = 0.7978845608028654, c = 0.044715, t = tanh(k * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
}

Test(cuda_emu_lt, lt_dgelu_every_type)
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
            from_device_as(t, D, dD, nd);
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
            from_device_as(t, X2, dX, nx);
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
