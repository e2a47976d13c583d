/* cuda_internal.h — what the CUDA target's files share (cuda.c, cuda_gemm.c), and what
 * test_cuda_codegen asks about a product: whether it runs through a cuBLASLt epilogue. */
#ifndef KILN_CODEGEN_CUDA_INTERNAL_H
#define KILN_CODEGEN_CUDA_INTERNAL_H

#include "kernel.h"

/* The cuBLASLt epilogues the CUDA target uses for a product's forward epilogue. */
typedef enum {
    CUDA_LT_NONE,
    CUDA_LT_DEFAULT, /* no bias: the product plus a residual (C) */
    CUDA_LT_BIAS,
    CUDA_LT_RELU_BIAS,
    CUDA_LT_GELU_BIAS,
    CUDA_LT_GELU_AUX_BIAS,
    CUDA_LT_DGELU /* GELU's backward: D = AB * gelu'(aux), aux the GELU's input (read) */
} CudaLtEpilogue;

typedef struct {
    CudaLtEpilogue epilogue;
    NodeId add, act; /* the bias add and the activation of it (IR_NONE: none) */
    bool relu;       /* the activation is relu (else tanh-GELU) */
    NodeId bias;     /* the bias vector, read in place (IR_NONE with DEFAULT) */
    NodeId res;      /* the residual add of the bias add (or of the product), or IR_NONE */
    NodeId residual; /* its other operand, float32 read in place: cuBLASLt's C, beta 1 */
    NodeId out;      /* D: the stored value cuBLASLt writes (the add or activation, or its half copy) */
    bool half_out;   /* D (and aux) in the operands' half precision, rounded to nearest even */
    NodeId aux;      /* the GELU's input (or its half copy): stored for the backward pass, or read by DGELU; or IR_NONE */
    char why[240];   /* why this epilogue, or why none */
} CudaLtPlan;

/* Which cuBLASLt epilogue GEMM kernel L's product takes (false: none, the cublasSgemm and
 * epilogue-kernel path), and why. */
bool cuda_gemm_lt_plan(const CgKernel *L, CudaLtPlan *p);

/* The cudaDataType of the operands of product mm when they are half precision (CUDA_R_16BF,
 * CUDA_R_16F: cuBLAS's tensor cores, accumulated in float), or NULL for float32 operands
 * (cublasSgemm). */
const char *cuda_gemm_half_type(const Graph *g, NodeId mm);
/* "CUBLASLT_EPILOGUE_GELU_AUX_BIAS" */
const char *cuda_gemm_lt_name(CudaLtEpilogue e);
/* In a GEMM kernel's launch function (M, N, K, lda, ldb, ldc declared): a comment saying
 * which epilogue and why, and with one, the cuBLASLt call that returns when every pointer
 * is aligned. Returns whether it wrote the call. */
bool cuda_gemm_emit_lt(CgKernel *L, const CgOperand *A, const CgOperand *B);

/* The bias gradient as a weight gradient's BGRADB epilogue (cuda_gemm.c): for column-sum
 * kernel k, the GEMM kernel that computes its sum instead (-1: none), and for GEMM kernel
 * j, the column-sum kernel it takes over (-1: none); *sum (when not NULL) the sum's node. */
/* Pairs them for c's graph (c->fp, c->bucket_bytes) into c->cuda_bgrad; freed by
 * cuda_gemm_free_bgrad. Without it nothing is paired. */
void cuda_gemm_plan_bgrad(Cg *c);
void cuda_gemm_free_bgrad(Cg *c);
int32_t cuda_gemm_bgrad_taker(const Cg *c, int32_t k, NodeId *sum);
int32_t cuda_gemm_bgrad_source(const Cg *c, int32_t j, NodeId *sum);
/* The stored value bias-gradient sum `sum` adds up (float32, or the half copy its kernel
 * widens), which the product reads as its A. */
NodeId cuda_gemm_bgrad_summed(const Cg *c, NodeId sum);
/* In GEMM kernel L's launch function: the comment and the BGRADB call that returns when
 * every pointer is aligned (false: L takes no bias gradient); after its cublasSgemm, the
 * column-sum kernel's launch. */
bool cuda_gemm_emit_bgrad(CgKernel *L, const CgOperand *A, const CgOperand *B);
void cuda_gemm_emit_bgrad_fallback(CgKernel *L);

/* cuda_attention.c: a kernel of attention ops. Why the target cannot write attention op
 * id's (NULL: it can); its __global__ wrappers and launcher, under the provisional name
 * `name` (the backward's dQ kernel: name_dq), `site` the model line its launches name;
 * its launch in the step. */
const char *cuda_attention_unsupported(const Cg *c, NodeId id);
void cuda_emit_attention_kernel(Cg *c, int32_t k, const char *name, const char *site);
void cuda_emit_attention_call(Cg *c, int32_t k, const char *name);

/* Threads per block of an elementwise kernel: a multiple of the warp, enough to hide
 * memory latency with a few blocks per SM, few enough registers per thread to spare. */
#define CUDA_MAP_BLOCK 256
/* Blocks of a grid-stride loop at most: beyond this the threads loop instead (about 120
 * resident blocks of 256 threads on an H100's 132 SMs times 8 is far below it). */
#define CUDA_MAP_GRID_MAX 65535

/* cuda.c: "models/mlp.kiln:12: x = relu(fc1(x))", the model line of node id, for launch
 * sites and errors. */
void cuda_model_line(Cg *c, NodeId id, StrBuf *b);
/* cuda_single.c: the single-node kernels. Whether the target writes op's; kernel k's
 * provisional name; the kernel; its launcher. */
bool cuda_single_supported(Op op);
void cuda_single_name(Cg *c, int32_t k, NodeId id, StrBuf *b);
void cuda_emit_single_kernel(Cg *c, int32_t k, NodeId id);
void cuda_emit_single_launcher(Cg *c, int32_t k, NodeId id);

#endif
