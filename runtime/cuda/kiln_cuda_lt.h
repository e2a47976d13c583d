/* kiln_cuda_lt.h — a matrix product into float32 through cuBLASLt with a fused epilogue (bias,
 * bias + relu, bias + tanh-GELU, the latter keeping its input in an aux buffer), for the
 * CUDA target's model.cu (codegen/cuda_gemm.c writes the calls).
 *
 * Why a helper: cuBLASLt wants a descriptor, three layouts, a preference and an algorithm
 * from its heuristic per problem, and creating those per call would allocate in every step.
 * Each product of model.cu owns one kiln_lt_gemm: its descriptors are created at its first
 * call (the program's first step) and kept; the heuristic runs again only when the problem
 * changes (a smaller last batch, the evaluation step's other batch size), which updates the
 * layouts in place. The workspace is allocated once, at the first call of any product.
 * Nothing here allocates after that.
 *
 * The caller checks alignment first: cuBLASLt's bias and aux pointers want 16 bytes, which a
 * parameter's place in its slab need not have (kiln_lt_aligned), and takes the cublasSgemm
 * path otherwise. Compiled by nvcc, or by the host compiler against the emulator. */
#ifndef KILN_CUDA_LT_H
#define KILN_CUDA_LT_H

#include <stdint.h>

#include "kiln_cuda.h"

/* The workspace cuBLASLt may use (llm.c's size for Hopper): device memory, allocated once,
 * within what the program keeps free for cuBLAS (device.cu's memory check). */
#define KILN_LT_WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;
    uint64_t m, n, k; /* the problem the algorithm was chosen for (0 x 0: none yet) */
    bool refused;     /* cuBLASLt had no algorithm: the product takes cublasGemmEx from then on */
} kiln_lt_gemm;

static inline cublasLtHandle_t kiln_lt_handle(void)
{
    static cublasLtHandle_t handle;
    if (!handle) KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
    return handle;
}

static inline void *kiln_lt_workspace(void)
{
    static void *workspace;
    if (!workspace) KILN_CUDA_CHECK(cudaMalloc(&workspace, KILN_LT_WORKSPACE_BYTES));
    return workspace;
}

/* Are the pointers cuBLASLt reads and writes 16-byte aligned (NULL counts as aligned)? */
static inline bool kiln_lt_aligned(const void *a, const void *b, const void *c, const void *d, const void *bias, const void *aux)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)bias | (uintptr_t)aux) % 16 == 0;
}

static inline void kiln_lt_layout(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!*l) {
        KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
        return;
    }
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld));
}

/* Column-major D (m x n, leading dimension ldd) = op(A) op(B) (k the inner dimension), plus C
 * when C is not NULL (a residual: D's type and layout, beta 1; C == D in place is allowed),
 * then the epilogue: bias (length m, along D's rows) added, then relu or GELU; with an aux
 * epilogue the GELU's input is written to aux (m x n, leading dimension ldd) too. A row-major
 * product is the column-major transposed one (codegen/cuda_gemm.c's call). A and B are of
 * type ab: float32, or bf16/fp16 (mixed precision: the tensor cores, accumulated in float32).
 * D is of type d: float32, or ab's half type (the epilogue computed in float32, then rounded
 * to nearest even: what the next products read), and aux of D's type (cuBLASLt's default);
 * the bias is float32 (a parameter's master copy, read in place). With BGRADB, bias is the
 * gradient written, of D's type (float32 here).
 * Returns false, having done nothing, when cuBLASLt has no algorithm for the epilogue and
 * types (a combination a GPU or cuBLAS version lacks: the caller takes the cublasGemmEx path
 * and the epilogue kernel); after a refusal the product is not asked again. */
static inline bool kiln_lt_matmul(kiln_lt_gemm *g, cublasLtEpilogue_t epilogue, cudaDataType ab, cudaDataType d,
                                  cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
                                  const void *B, int ldb, const void *C, void *D, int ldd, const float *bias, void *aux,
                                  cudaStream_t stream)
{
    if (g->refused) return false;
    if (!g->desc) {
        KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const int32_t opa = ta, opb = tb;
        const uint32_t epi = epilogue;
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (d != CUDA_R_32F) { /* a float32 bias beside a half D (its default would be D's type) */
            const int32_t bias_type = CUDA_R_32F;
            KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
        }
        KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&g->pref));
        const uint64_t bytes = KILN_LT_WORKSPACE_BYTES;
        KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes));
    }
    /* the pointers are the step's (fixed arena offsets); setting them costs nothing */
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        const int64_t ld = ldd;
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    if (g->m != (uint64_t)m || g->n != (uint64_t)n || g->k != (uint64_t)k) {
        kiln_lt_layout(&g->a, ab, ta == CUBLAS_OP_N ? (uint64_t)m : (uint64_t)k, ta == CUBLAS_OP_N ? (uint64_t)k : (uint64_t)m, lda);
        kiln_lt_layout(&g->b, ab, tb == CUBLAS_OP_N ? (uint64_t)k : (uint64_t)n, tb == CUBLAS_OP_N ? (uint64_t)n : (uint64_t)k, ldb);
        kiln_lt_layout(&g->d, d, (uint64_t)m, (uint64_t)n, ldd);
        cublasLtMatmulHeuristicResult_t h;
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(kiln_lt_handle(), g->desc, g->a, g->b, g->d, g->d, g->pref, 1, &h, &found);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found < 1)) {
            g->refused = true; /* no algorithm for this epilogue and these types */
            return false;
        }
        KILN_CUBLAS_CHECK(st);
        g->algo = h.algo;
        g->m = (uint64_t)m;
        g->n = (uint64_t)n;
        g->k = (uint64_t)k;
    }
    const float one = 1, zero = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmul(kiln_lt_handle(), g->desc, &one, A, g->a, B, g->b, C ? &one : &zero, C ? C : D, g->d, D, g->d, &g->algo,
                                     kiln_lt_workspace(), KILN_LT_WORKSPACE_BYTES, stream));
    return true;
}

#endif
