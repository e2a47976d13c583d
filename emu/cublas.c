/* cublas.c — cuBLAS and cuBLASLt of the emulator, on OpenBLAS's cblas_sgemm.
 *
 * cuBLAS is column-major and so is this mapping: a call becomes cblas_sgemm(CblasColMajor,
 * ...) with the same m, n, k, operations and leading dimensions, so there is no transposing
 * trick to get wrong (tests/test_cuda_emu_blas.c checks every combination against a naive
 * loop). Arguments are validated with cuBLAS's rules before BLAS sees them (BLAS would
 * print its own message and return), and every matrix must lie inside memory from
 * cudaMalloc or cudaMallocHost over its whole extent (columns, leading dimension, batch
 * strides): what would be an illegal address on the GPU is reported here, sticky, as it
 * would be there.
 *
 * cuBLASLt descriptors live in the real header's opaque structs (the same sizes), so code
 * that copies or stack-allocates them behaves the same. The epilogue runs after the GEMM
 * over the output, in the order cuBLASLt documents: bias, then the activation. Half
 * precision (bf16, fp16) is storage only, as in Kiln's generated code: half A and B are
 * widened exactly to fp32, and a half C and D (cublasLtMatmul; cublasGemmEx keeps C fp32)
 * are computed as an fp32 D would be, C widened, product, beta C and epilogue in fp32, and
 * each element rounded once to nearest even (kiln_half.h's conversions, the C target's): a
 * half D holds the fp32 D's values rounded, bit for bit. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_half.h"
#include "kemu_cublas.h"
#include "kemu_internal.h"

#define HANDLE_MAGIC 0x4B424C53u /* "KBLS" */
#define LT_MAGIC 0x4B424C54u     /* "KBLT" */
#define LAYOUT_MAGIC 0x4B4C4159u /* "KLAY" */
#define DESC_MAGIC 0x4B444553u   /* "KDES" */
#define PREF_MAGIC 0x4B505246u   /* "KPRF" */

struct cublasContext {
    unsigned magic;
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
};

struct cublasLtContext {
    unsigned magic;
};

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    }
    return "unknown error";
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }
const char *cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

static int handle_ok(cublasHandle_t h) { return h && h->magic == HANDLE_MAGIC; }

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!kemu_stream_valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* TF32 and tensor-op modes are accepted and computed in full fp32: the emulator's results
 * are the reference the GPU's are compared with, not a model of the GPU's rounding. */
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* Does [p, p + extent of a rows x cols matrix of elem-byte elements with leading dimension
 * ld, over batch matrices stride apart) lie in memory the GPU can read? Reports (sticky)
 * when not. rows, cols, ld and stride count elements, not bytes. */
static int matrix_ok(const char *fn, const char *which, const void *p, size_t elem, int64_t rows, int64_t cols,
                     int64_t ld, int64_t batch, int64_t stride)
{
    if (rows <= 0 || cols <= 0 || batch <= 0) return 1;
    int64_t span = (cols - 1) * ld + rows;
    int64_t last = (batch - 1) * stride;
    int64_t lo = last < 0 ? last : 0;
    int64_t hi = (last > 0 ? last : 0) + span;
    const void *start = (const void *)((uintptr_t)p + (uintptr_t)(lo * (int64_t)elem));
    size_t bytes = (size_t)(hi - lo) * elem;
    if (p && kemu_memory_kind(start, bytes) != KEMU_MEM_NONE) return 1;
    kemu_fail(cudaErrorIllegalAddress, 1,
              "%s: matrix %s at %p (%lld x %lld, leading dimension %lld, %lld batch(es) %lld apart, %zu-byte "
              "elements) is not inside one allocation from cudaMalloc or cudaMallocHost: the GPU would fault",
              fn, which, p, (long long)rows, (long long)cols, (long long)ld, (long long)batch, (long long)stride, elem);
    return 0;
}

static void sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc)
{
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda,
                B, ldb, beta, C, ldc);
}

/* Bytes of an element of a matrix operand the emulator multiplies: fp32, or bf16 and fp16,
 * which it widens to fp32 first; 0 for any other type. */
static size_t operand_size(int32_t type)
{
    return type == CUDA_R_32F ? sizeof(float) : type == CUDA_R_16BF || type == CUDA_R_16F ? sizeof(uint16_t) : 0;
}

/* The widened copy of a half-precision matrix: the rows x cols matrix stored at src with
 * leading dimension lds, to float at dst with leading dimension ldd (padding rows neither
 * read nor written), exactly: bf16 is the top half of a float, fp16 widens without
 * rounding. */
static void widen(float *dst, int64_t ldd, const void *src, int64_t lds, int32_t type, int64_t rows, int64_t cols)
{
    const uint16_t *h = src;
    for (int64_t j = 0; j < cols; j++) {
        const uint16_t *col = h + j * lds;
        float *out = dst + j * ldd;
        if (type == CUDA_R_16BF)
            for (int64_t i = 0; i < rows; i++) out[i] = kiln_bf16_to_f32(col[i]);
        else
            for (int64_t i = 0; i < rows; i++) out[i] = kiln_f16_to_f32(col[i]);
    }
}

/* Matrix operand i of a batch as sgemm reads it: fp32 in place, or a half-precision matrix
 * widened into buf (room for its extent, (cols - 1) ld + rows floats). */
static const float *operand(const void *base, int32_t type, int64_t i, int64_t stride, float *buf, int64_t rows,
                            int64_t cols, int64_t ld)
{
    if (type == CUDA_R_32F) return (const float *)base + i * stride;
    widen(buf, ld, (const uint16_t *)base + i * stride, ld, type, rows, cols);
    return buf;
}

/* Room for the widened copies of the half-precision operands among A (arows x acols, lda)
 * and B: *wa and *wb point into one allocation (NULL for an fp32 operand, whose memory
 * sgemm reads in place). Returns the allocation (NULL when nothing needed widening), with
 * *failed set when malloc failed. */
static float *widen_room(int32_t atype, int64_t arows, int64_t acols, int64_t lda, int32_t btype, int64_t brows,
                         int64_t bcols, int64_t ldb, float **wa, float **wb, int *failed)
{
    size_t na = atype == CUDA_R_32F ? 0 : (size_t)((acols - 1) * lda + arows);
    size_t nb = btype == CUDA_R_32F ? 0 : (size_t)((bcols - 1) * ldb + brows);
    *wa = *wb = NULL;
    *failed = 0;
    if (na + nb == 0) return NULL;
    float *room = malloc((na + nb) * sizeof *room);
    if (!room) {
        *failed = 1;
        return NULL;
    }
    if (na) *wa = room;
    if (nb) *wb = room + na;
    return room;
}

static int op_ok(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }
static int max1(int v) { return v > 1 ? v : 1; }

/* cublasGemmEx's type combinations with fp32 output and accumulation, as cuBLAS's table
 * lists them: A and B of one type, fp32, bf16 or fp16, C fp32; compute 32F or 32F_PEDANTIC,
 * and for fp32 operands also the FAST forms (which let the GPU round the inputs down; here
 * they are computed in fp32, as the TF32 math mode is). */
static int gemm_types_ok(cudaDataType atype, cudaDataType btype, cudaDataType ctype, cublasComputeType_t compute)
{
    if (atype != btype || !operand_size(atype) || ctype != CUDA_R_32F) return 0;
    if (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC) return 1;
    return atype == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
                                   compute == CUBLAS_COMPUTE_32F_FAST_16F);
}

/* The algorithms of cublas_api.h but CUBLAS_GEMM_AUTOTUNE. */
static int algo_ok(cublasGemmAlgo_t algo)
{
    return (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
           (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

/* Every GEMM of the cuBLAS API: cublasSgemm and cublasSgemmStridedBatched are the fp32 case
 * (CUDA_R_32F types, COMPUTE_32F, the default algorithm). */
static cublasStatus_t gemm_batched(const char *fn, cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k, const void *alpha, const void *A,
                                   cudaDataType atype, int lda, long long strideA, const void *B, cudaDataType btype,
                                   int ldb, long long strideB, const void *beta, void *C, cudaDataType ctype, int ldc,
                                   long long strideC, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!gemm_types_ok(atype, btype, ctype, compute) || !algo_ok(algo)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    int ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (kemu_sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    float a = *(const float *)alpha, b = *(const float *)beta;
    const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    /* With k = 0 or alpha = 0, BLAS reads neither A nor B (C = beta C): they are neither
     * checked nor widened, and sgemm gets NULL for a half-precision one. */
    const int reads = k > 0 && a != 0.0f;
    if (reads) {
        if (!matrix_ok(fn, "A", A, operand_size(atype), arows, acols, lda, batch, strideA) ||
            !matrix_ok(fn, "B", B, operand_size(btype), brows, bcols, ldb, batch, strideB))
            return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (!matrix_ok(fn, "C", C, sizeof(float), m, n, ldc, batch, strideC)) return CUBLAS_STATUS_EXECUTION_FAILED;
    float *wa = NULL, *wb = NULL, *room = NULL;
    if (reads) {
        int failed;
        room = widen_room(atype, arows, acols, lda, btype, brows, bcols, ldb, &wa, &wb, &failed);
        if (failed) return CUBLAS_STATUS_ALLOC_FAILED;
    }
    for (int i = 0; i < batch; i++) {
        const float *Ai = reads ? operand(A, atype, i, strideA, wa, arows, acols, lda)
                                : atype == CUDA_R_32F ? (const float *)A + i * strideA : NULL;
        const float *Bi = reads ? operand(B, btype, i, strideB, wb, brows, bcols, ldb)
                                : btype == CUDA_R_32F ? (const float *)B + i * strideB : NULL;
        sgemm(ta, tb, m, n, k, a, Ai, lda, Bi, ldb, b, (float *)C + i * strideC, ldc);
    }
    free(room);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc)
{
    return gemm_batched("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F,
                        ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb, long long int strideB,
                                         const float *beta, float *C, int ldc, long long int strideC, int batchCount)
{
    return gemm_batched("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda,
                        strideA, B, CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm_batched("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
                        beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm_batched("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA,
                        B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

/* ---- cuBLASLt ------------------------------------------------------------------------ */

typedef struct {
    uint32_t magic, type;
    int32_t order, batch;
    uint64_t rows, cols;
    int64_t ld, stride;
} Layout;

typedef struct {
    uint32_t magic;
    int32_t compute, scale, pointer_mode, transa, transb;
    uint32_t epilogue;
    int32_t bias_type, aux_type;
    const void *bias;
    void *aux;
    int64_t bias_stride, aux_ld, aux_stride;
} Desc;

typedef struct {
    uint32_t magic, search;
    uint64_t workspace;
} Pref;

_Static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout fits the real opaque size");
_Static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc fits the real opaque size");
_Static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref fits the real opaque size");

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *h = calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = LT_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lightHandle || lightHandle->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

static Layout *layout_of(cublasLtMatrixLayout_t l)
{
    Layout *p = (Layout *)(void *)l;
    return p && p->magic == LAYOUT_MAGIC ? p : NULL;
}

static Desc *desc_of(cublasLtMatmulDesc_t d)
{
    Desc *p = (Desc *)(void *)d;
    return p && p->magic == DESC_MAGIC ? p : NULL;
}

static Pref *pref_of(cublasLtMatmulPreference_t d)
{
    Pref *p = (Pref *)(void *)d;
    return p && p->magic == PREF_MAGIC ? p : NULL;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    Layout *l = calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    l->magic = LAYOUT_MAGIC;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->batch = 1;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    *matLayout = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    Layout *l = layout_of(matLayout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies an attribute's value when buf has exactly its size, as cuBLASLt checks. */
#define SET_ATTR(field, ctype)                                                  \
    do {                                                                        \
        if (!buf || sizeInBytes != sizeof(ctype)) return CUBLAS_STATUS_INVALID_VALUE; \
        ctype v_;                                                               \
        memcpy(&v_, buf, sizeof v_);                                            \
        field = v_;                                                             \
    } while (0)

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                size_t sizeInBytes)
{
    Layout *l = layout_of(matLayout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: SET_ATTR(l->type, uint32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: SET_ATTR(l->order, int32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: SET_ATTR(l->rows, uint64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: SET_ATTR(l->cols, uint64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: SET_ATTR(l->ld, int64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: SET_ATTR(l->batch, int32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: SET_ATTR(l->stride, int64_t); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType)
{
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    Desc *d = calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = DESC_MAGIC;
    d->compute = computeType;
    d->scale = scaleType;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
    *matmulDesc = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    Desc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    Desc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: SET_ATTR(d->compute, int32_t); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: SET_ATTR(d->scale, int32_t); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: SET_ATTR(d->pointer_mode, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: SET_ATTR(d->transa, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: SET_ATTR(d->transb, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: SET_ATTR(d->epilogue, uint32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: SET_ATTR(d->bias, const void *); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: SET_ATTR(d->bias_stride, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: SET_ATTR(d->aux, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: SET_ATTR(d->aux_ld, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: SET_ATTR(d->aux_stride, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: SET_ATTR(d->aux_type, int32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: SET_ATTR(d->bias_type, int32_t); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Reads an attribute: with sizeInBytes 0, only its size (in *sizeWritten). */
#define GET_ATTR(field, ctype)                                                  \
    do {                                                                        \
        ctype v_ = (ctype)(field);                                              \
        if (sizeInBytes == 0) {                                                 \
            if (!sizeWritten) return CUBLAS_STATUS_INVALID_VALUE;               \
            *sizeWritten = sizeof v_;                                           \
            return CUBLAS_STATUS_SUCCESS;                                       \
        }                                                                       \
        if (!buf || sizeInBytes < sizeof v_) return CUBLAS_STATUS_INVALID_VALUE; \
        memcpy(buf, &v_, sizeof v_);                                            \
        if (sizeWritten) *sizeWritten = sizeof v_;                              \
    } while (0)

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void *buf, size_t sizeInBytes, size_t *sizeWritten)
{
    Desc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: GET_ATTR(d->compute, int32_t); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: GET_ATTR(d->scale, int32_t); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: GET_ATTR(d->pointer_mode, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: GET_ATTR(d->transa, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: GET_ATTR(d->transb, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: GET_ATTR(d->epilogue, uint32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: GET_ATTR(d->bias, const void *); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: GET_ATTR(d->bias_stride, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: GET_ATTR(d->aux, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: GET_ATTR(d->aux_ld, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: GET_ATTR(d->aux_stride, int64_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: GET_ATTR(d->aux_type, int32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: GET_ATTR(d->bias_type, int32_t); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    Pref *p = calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = PREF_MAGIC;
    *pref = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    Pref *p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes)
{
    Pref *p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: SET_ATTR(p->search, uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: SET_ATTR(p->workspace, uint64_t); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* A checked matmul problem. */
typedef struct {
    const Desc *d;
    const Layout *a, *b, *c, *dd;
    int ta, tb, m, n, k, batch, bias, gelu, relu, aux;
    int dgelu; /* DGELU: D = AB * gelu'(aux), aux read */
    int bgrad; /* 'A' or 'B': the bias gradient, op(A)'s rows or op(B)'s columns summed over k */
    /* The type of C and D (one type), of the bias or bias gradient vector and of aux, the
     * last two resolved (-1, unset, is D's type). */
    int32_t dtype, bias_type, aux_type;
} Problem;

static int is_f32(int32_t t) { return t == CUDA_R_32F; }

/* Validates a matmul as cuBLASLt would: NOT_SUPPORTED for what the emulator does not do,
 * INVALID_VALUE for inconsistent shapes. Emulated, as cuBLASLt's table has them, with
 * compute 32F and an fp32 scale: A and B of one type; fp32 A and B (also with compute
 * FAST_TF32, computed in fp32) with fp32 C and D; bf16 or fp16 A and B with C and D both
 * of that type or both fp32. The bias (or bias gradient) vector has D's type, or fp32 with
 * a half D (BIAS_DATA_TYPE CUDA_R_32F: Kiln keeps its biases in fp32); aux has D's type.
 * Column order only, and of the epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS,
 * GELU_AUX, GELU_AUX_BIAS, DGELU (aux read: the GELU's input), BGRADA and BGRADB. */
static cublasStatus_t lt_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                 cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, Problem *p)
{
    memset(p, 0, sizeof *p);
    p->d = desc_of(desc);
    p->a = layout_of(A);
    p->b = layout_of(B);
    p->c = layout_of(C);
    p->dd = layout_of(D);
    if (!p->d || !p->a || !p->b || !p->c || !p->dd) return CUBLAS_STATUS_INVALID_VALUE;
    const Desc *d = p->d;
    /* Half A and B are widened to fp32 and a half D rounded from fp32 (to nearest even), so
     * every product is computed in fp32 whatever the types. */
    const int32_t abtype = (int32_t)p->a->type, dtype = (int32_t)p->dd->type;
    int compute_ok = d->compute == CUBLAS_COMPUTE_32F || d->compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                     (is_f32(abtype) && d->compute == CUBLAS_COMPUTE_32F_FAST_TF32);
    if (!compute_ok || !is_f32(d->scale) || !operand_size(abtype) || (int32_t)p->b->type != abtype ||
        (int32_t)p->c->type != dtype || (!is_f32(dtype) && dtype != abtype))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (p->a->order != CUBLASLT_ORDER_COL || p->b->order != CUBLASLT_ORDER_COL || p->c->order != CUBLASLT_ORDER_COL ||
        p->dd->order != CUBLASLT_ORDER_COL)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST && d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_RELU: p->relu = 1; break;
    case CUBLASLT_EPILOGUE_BIAS: p->bias = 1; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: p->relu = p->bias = 1; break;
    case CUBLASLT_EPILOGUE_GELU: p->gelu = 1; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: p->gelu = p->bias = 1; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: p->gelu = p->aux = 1; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: p->gelu = p->aux = p->bias = 1; break;
    case CUBLASLT_EPILOGUE_DGELU: p->dgelu = p->aux = 1; break;
    case CUBLASLT_EPILOGUE_BGRADA: p->bgrad = 'A'; break;
    case CUBLASLT_EPILOGUE_BGRADB: p->bgrad = 'B'; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    p->dtype = dtype;
    p->bias_type = d->bias_type == -1 ? dtype : d->bias_type;
    p->aux_type = d->aux_type == -1 ? dtype : d->aux_type;
    if ((p->bias_type != dtype && !is_f32(p->bias_type)) || p->aux_type != dtype) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!op_ok(d->transa) || !op_ok(d->transb)) return CUBLAS_STATUS_INVALID_VALUE;
    p->ta = d->transa != CUBLAS_OP_N;
    p->tb = d->transb != CUBLAS_OP_N;
    uint64_t m = p->dd->rows, n = p->dd->cols;
    uint64_t am = p->ta ? p->a->cols : p->a->rows, k = p->ta ? p->a->rows : p->a->cols;
    uint64_t bk = p->tb ? p->b->cols : p->b->rows, bn = p->tb ? p->b->rows : p->b->cols;
    if (am != m || bk != k || bn != n || p->c->rows != m || p->c->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
    const Layout *all[4] = {p->a, p->b, p->c, p->dd};
    for (int i = 0; i < 4; i++)
        if (all[i]->ld < (int64_t)(all[i]->rows ? all[i]->rows : 1) || all[i]->ld > INT32_MAX)
            return CUBLAS_STATUS_INVALID_VALUE;
    int batch = p->dd->batch;
    if (batch < 1 || p->a->batch != batch || p->b->batch != batch || p->c->batch != batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p->aux && (d->aux_ld < (int64_t)m || !d->aux)) return CUBLAS_STATUS_INVALID_VALUE;
    if ((p->bias || p->bgrad) && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (p->bgrad && batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED; /* as cuBLASLt: no batched bias gradients */
    p->m = (int)m;
    p->n = (int)n;
    p->k = (int)k;
    p->batch = batch;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    if (!lightHandle || lightHandle->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount || !pref_of(preference))
        return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    *returnAlgoCount = 0;
    cublasStatus_t st = lt_problem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(&heuristicResultsArray[0], 0, sizeof heuristicResultsArray[0]);
    heuristicResultsArray[0].workspaceSize = 0;
    heuristicResultsArray[0].state = CUBLAS_STATUS_SUCCESS;
    heuristicResultsArray[0].wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLASLt's GELU is the tanh form (as GPT-2's), here in the order of Kiln's expansion of
 * gelu(x, tanh) (x^3 first, then times 0.044715): the arithmetic of the CUDA epilogue
 * kernel that a fused product replaces, so that fusing changes no bit under the emulator
 * (the C target differs from both by its own tanh, kiln_math.h's, within an ulp or so; the
 * GPU's order is its own: compared there with a tolerance). */
static float gelu(float x)
{
    const float u = (x + x * x * x * 0.044715f) * 0.7978845608028654f;
    return x * 0.5f * (tanhf(u) + 1.0f);
}

/* The tanh-GELU's derivative, as cuBLASLt's DGELU applies it: 0.5 (1 + t) + 0.5 x (1 - t^2)
 * sqrt(2 / pi) (1 + 3 * 0.044715 x^2), t = tanh(sqrt(2 / pi) (x + 0.044715 x^3)), in float.
 * Kiln's generated kernels compute autodiff's expansion of the same derivative in their own
 * order: an ulp or so apart. */
static float gelu_grad(float x)
{
    const float k = 0.7978845608028654f, c = 0.044715f, t = tanhf(k * (x + c * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
}

/* Element i of a vector or matrix of type t (fp32, bf16 or fp16) at base, as a float
 * (exactly), and x stored there, rounded to nearest even for a half type. */
static float load(int32_t t, const void *base, int64_t i)
{
    if (is_f32(t)) return ((const float *)base)[i];
    const uint16_t h = ((const uint16_t *)base)[i];
    return t == CUDA_R_16BF ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

static void store(int32_t t, void *base, int64_t i, float x)
{
    if (is_f32(t)) ((float *)base)[i] = x;
    else ((uint16_t *)base)[i] = t == CUDA_R_16BF ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x);
}

/* Where element i of a vector or matrix of type t at base is. */
static void *elem_at(const void *base, int32_t t, int64_t i)
{
    return (void *)((uintptr_t)base + (uintptr_t)(i * (int64_t)operand_size(t)));
}

/* BGRADA: bias[i] = sum over l of op(A)[i, l], i < m; BGRADB: bias[j] = sum over l of
 * op(B)[l, j], j < n. Each sum in float, l = 0, 1, ..., k - 1 in order: the order of the
 * CUDA target's column-sum kernel (each column walked down its rows), so that a product that
 * takes its bias gradient from cuBLASLt gives the bits of the kernel it replaces here (the C
 * target adds the rows into 8 lanes: an ulp or so apart). Stored
 * as the vector's type: a half one rounded once, from the fp32 sum, as the output is. */
static void bias_gradient(const Problem *p, const float *A, const float *B, void *bias)
{
    const int len = p->bgrad == 'A' ? p->m : p->n;
    for (int i = 0; i < len; i++) {
        float s = 0.0f;
        for (int l = 0; l < p->k; l++) {
            if (p->bgrad == 'A') s += p->ta ? A[(size_t)i * p->a->ld + l] : A[(size_t)l * p->a->ld + i];
            else s += p->tb ? B[(size_t)l * p->b->ld + i] : B[(size_t)i * p->b->ld + l];
        }
        store(p->bias_type, bias, i, s);
    }
}

/* The epilogue of one batch: y holds alpha op(A) op(B) + beta C in fp32 (leading dimension
 * ldd, D's), bias and aux point at the batch's vector and matrix (NULL when the epilogue has
 * none). In cuBLASLt's order, in fp32: the bias added, the sum written to aux (the GELU's
 * input), the activation; then the result stored to D, rounded once to a half D's type.
 * With an fp32 D, y is D itself, so a half D gets the fp32 D's values rounded, bit for bit. */
static void epilogue(const Problem *p, const float *y, void *D, int64_t ldd, const void *bias, void *aux)
{
    const int64_t aux_ld = p->d->aux_ld;
    for (int64_t j = 0; j < p->n; j++)
        for (int64_t r = 0; r < p->m; r++) {
            float x = y[j * ldd + r];
            if (bias) x += load(p->bias_type, bias, r);
            if (aux && p->dgelu) x *= gelu_grad(load(p->aux_type, aux, j * aux_ld + r)); /* aux read */
            else if (aux) store(p->aux_type, aux, j * aux_ld + r, x);
            if (p->relu) x = x > 0.0f ? x : 0.0f;
            if (p->gelu) x = gelu(x);
            store(p->dtype, D, j * ldd + r, x);
        }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                              cudaStream_t stream)
{
    (void)algo;
    (void)workspace;
    (void)workspaceSizeInBytes;
    const char *fn = "cublasLtMatmul";
    if (!lightHandle || lightHandle->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || !kemu_stream_valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    cublasStatus_t st = lt_problem(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (kemu_sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* In place (C == D) only with the same layout, as cuBLASLt requires. */
    if (C == D && (p.c->ld != p.dd->ld || p.c->stride != p.dd->stride)) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    float a = *(const float *)alpha, b = *(const float *)beta;
    const Desc *d = p.d;
    const int32_t atype = (int32_t)p.a->type, btype = (int32_t)p.b->type;
    const int64_t arows = (int64_t)p.a->rows, acols = (int64_t)p.a->cols;
    const int64_t brows = (int64_t)p.b->rows, bcols = (int64_t)p.b->cols;
    /* A and B are read for the product (k > 0, alpha != 0) and for a bias gradient. */
    const int reads = (p.k > 0 && a != 0.0f) || (p.bgrad && p.k > 0);
    if (reads) {
        if (!matrix_ok(fn, "A", A, operand_size(atype), arows, acols, p.a->ld, p.batch, p.a->stride) ||
            !matrix_ok(fn, "B", B, operand_size(btype), brows, bcols, p.b->ld, p.batch, p.b->stride))
            return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    /* C and D share D's type; the bias and aux element sizes follow their resolved types. */
    const size_t de = operand_size(p.dtype), be = operand_size(p.bias_type), xe = operand_size(p.aux_type);
    const int glen = p.bgrad == 'A' ? p.m : p.n;
    if ((b != 0.0f && !matrix_ok(fn, "C", C, de, p.m, p.n, p.c->ld, p.batch, p.c->stride)) ||
        !matrix_ok(fn, "D", D, de, p.m, p.n, p.dd->ld, p.batch, p.dd->stride) ||
        (p.bias && !matrix_ok(fn, "bias", d->bias, be, p.m, 1, p.m, p.batch, d->bias_stride)) ||
        (p.bgrad && !matrix_ok(fn, "bias gradient", d->bias, be, glen, 1, glen, 1, 0)) ||
        (p.aux && !matrix_ok(fn, "aux", d->aux, xe, p.m, p.n, d->aux_ld, p.batch, d->aux_stride)))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    int lda = (int)p.a->ld, ldb = (int)p.b->ld, ldc = (int)p.c->ld, ldd = (int)p.dd->ld;
    const int half_d = !is_f32(p.dtype);
    /* A half D's fp32 values: one batch, with D's leading dimension, so that sgemm is called
     * with the same shapes as for an fp32 D and gives the same bits. */
    float *y = NULL;
    if (half_d && !(y = malloc(((size_t)(p.n - 1) * (size_t)ldd + (size_t)p.m) * sizeof *y)))
        return CUBLAS_STATUS_ALLOC_FAILED;
    float *wa = NULL, *wb = NULL, *room = NULL;
    if (reads) {
        int failed;
        room = widen_room(atype, arows, acols, p.a->ld, btype, brows, bcols, p.b->ld, &wa, &wb, &failed);
        if (failed) {
            free(y);
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
    }
    for (int i = 0; i < p.batch; i++) {
        /* Half-precision A and B widened (when read; NULL for sgemm otherwise, which reads
         * neither with k = 0 or alpha = 0). */
        const float *Ai = reads ? operand(A, atype, i, p.a->stride, wa, arows, acols, p.a->ld)
                                : is_f32(atype) ? (const float *)A + i * p.a->stride : NULL;
        const float *Bi = reads ? operand(B, btype, i, p.b->stride, wb, brows, bcols, p.b->ld)
                                : is_f32(btype) ? (const float *)B + i * p.b->stride : NULL;
        const void *Ci = elem_at(C, p.dtype, i * p.c->stride);
        void *Di = elem_at(D, p.dtype, i * p.dd->stride);
        /* y = beta C first (C is not read when beta is 0, as in cuBLASLt), then BLAS
         * accumulates alpha op(A) op(B) into it. y is an fp32 D itself, or a half C widened
         * (before D is written: in place, C == D, works too). */
        float *yi = half_d ? y : Di;
        if (b != 0.0f && half_d) widen(yi, ldd, Ci, ldc, p.dtype, p.m, p.n);
        else if (b != 0.0f && Ci != Di)
            for (int j = 0; j < p.n; j++)
                memcpy(yi + (size_t)j * ldd, (const float *)Ci + (size_t)j * ldc, (size_t)p.m * sizeof(float));
        sgemm(p.ta, p.tb, p.m, p.n, p.k, a, Ai, lda, Bi, ldb, b, yi, ldd);
        if (p.bgrad) bias_gradient(&p, Ai, Bi, (void *)d->bias);
        /* An fp32 D without an epilogue is done; a half one still needs its rounding. */
        if (!p.bias && !p.relu && !p.gelu && !p.dgelu && !half_d) continue;
        epilogue(&p, yi, Di, ldd, p.bias ? elem_at(d->bias, p.bias_type, i * d->bias_stride) : NULL,
                 p.aux ? elem_at(d->aux, p.aux_type, i * d->aux_stride) : NULL);
    }
    free(y);
    free(room);
    return CUBLAS_STATUS_SUCCESS;
}
