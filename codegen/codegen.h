/* codegen.h — code generation from the IR: the C target (c.c) writes one C file that
 * defines a `kiln_model` (runtime/kiln_model.h), and build.c compiles it with the system
 * C compiler against the runtime and OpenBLAS. cuda.c writes model.cu for the GPU. Both
 * print the kernel bodies that kernel.c generates. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/ir.h"
#include "../passes/passes.h"

struct kiln_recipe;
/* What a code generator reads: the graphs of a program, each with the plan the pipeline
 * computed for it (fusion's kernels, memplan's offsets), which the generators follow and
 * never recompute. */
typedef struct {
    const Graph *graph; /* NULL: the program has no such step */
    const GraphPlan *plan;
} CodegenGraph;
typedef struct {
    /* train: the training graph (forward, loss, metrics, buffer updates and OUT_GRAD
     * outputs, after the pipeline), also the reference for the tables (parameter and input
     * order, the hash) of an inference program, which has no training step; eval: the
     * graph in eval mode (forward, loss, metrics); predict (inference programs): the eval
     * graph without its loss and metrics (codegen_predict_graph); decode: a language
     * model's decode step (frontend/decode.c, through codegen_predict_graph), which the C
     * training program's samples and an inference program's --generate use. */
    CodegenGraph train, eval, predict, decode;
    const char *decode_why;  /* NULL, or why a language model has no decode step */
    const char *source_path; /* the model file: kernels cite its lines */
    /* the checked train section as runtime/kiln_recipe.h's typed struct (frontend's
     * recipe_typed), which model.c carries for the programs; required */
    const struct kiln_recipe *recipe;
    /* a distributed training program (kiln build --distributed): the gradient bucket hook
     * (kiln_model.h's KILN_BUCKET_READY) called after the kernel that finishes each bucket
     * of at most bucket_bytes (codegen/buckets.c; 0: none) */
    int64_t bucket_bytes;
    /* identifies the model for checkpoints and distributed ranks (kiln_model.hash): the
     * driver hashes the graph as lowered with its precision (kiln_model_hash), so that the
     * passes (fused attention or not, a memory budget) and the target do not change it;
     * 0: a hash of the training graph here (tests) */
    uint64_t model_hash;
    bool partial; /* CUDA, tests: kernels the target cannot write yet are left out with a comment */
} CodegenInput;

/* c.c — the C source of a training program's model: a `kiln_model` with the training and
 * evaluation steps (and the decode step when given). Returns 0, or -1 with a message in
 * *err (an op or dtype the C target does not support yet, named with its model line). */
int codegen_c_train(const CodegenInput *in, StrBuf *out, StrBuf *err);
/* The C source of an inference program's model (kiln build --infer): the tables of
 * codegen_c_train, the evaluation step, the predict step and the decode step; no training
 * step. */
int codegen_c_infer(const CodegenInput *in, StrBuf *out, StrBuf *err);

/* cuda.c — writes model.cu, the CUDA of the same kernels in Kiln's dialect
 * (runtime/cuda/kiln_cuda.h). Returns 0, or -1 with "FILE:LINE: error: --target cuda does
 * not support <kind> kernels yet (...)" for the first kernel it cannot write yet (with
 * in->partial, such kernels are left out with a comment instead). The training program's
 * samples go through its evaluation step: a decode step would make gpt2-124m's model.cu
 * 40 % longer to compile (nvcc 31 s -> 45 s) for a few tokens an evaluation. */
int codegen_cuda(const CodegenInput *in, StrBuf *out, StrBuf *err);
/* An inference program's model.cu (kiln build --infer --target cuda|cuda-emu): what
 * codegen_c_infer writes, with the kernels and launches of codegen_cuda, the steps running
 * on the GPU; the decode step reads and writes the key/value caches in device memory. */
int codegen_cuda_infer(const CodegenInput *in, StrBuf *out, StrBuf *err);

#endif
