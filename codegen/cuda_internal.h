/* cuda_internal.h — what the CUDA target's files share (cuda.c, cuda_gemm.c), and what
 * test_cuda_codegen asks about a product: whether it runs through a cuBLASLt epilogue. */
#ifndef KILN_CODEGEN_CUDA_INTERNAL_H
#define KILN_CODEGEN_CUDA_INTERNAL_H

#include "kernel.h"

/* The cuBLASLt epilogues the CUDA target uses for a product's forward epilogue. */
typedef enum { CUDA_LT_NONE, CUDA_LT_BIAS, CUDA_LT_RELU_BIAS, CUDA_LT_GELU_BIAS, CUDA_LT_GELU_AUX_BIAS } CudaLtEpilogue;

typedef struct {
    CudaLtEpilogue epilogue;
    NodeId add, act; /* the bias add and the activation of it (IR_NONE: none) */
    bool relu;       /* the activation is relu (else tanh-GELU) */
    NodeId bias;     /* the bias vector, read in place */
    NodeId out;      /* D: the stored value cuBLASLt writes */
    NodeId aux;      /* the GELU's input, stored for the backward pass, or IR_NONE */
    char why[240];   /* why this epilogue, or why none */
} CudaLtPlan;

/* Which cuBLASLt epilogue GEMM kernel L's product takes (false: none, the cublasSgemm and
 * epilogue-kernel path), and why. */
bool cuda_gemm_lt_plan(const CgKernel *L, CudaLtPlan *p);
/* "CUBLASLT_EPILOGUE_GELU_AUX_BIAS" */
const char *cuda_gemm_lt_name(CudaLtEpilogue e);
/* In a GEMM kernel's launch function (M, N, K, lda, ldb, ldc declared): a comment saying
 * which epilogue and why, and with one, the cuBLASLt call that returns when every pointer
 * is aligned. Returns whether it wrote the call. */
bool cuda_gemm_emit_lt(CgKernel *L, const CgOperand *A, const CgOperand *B);

#endif
