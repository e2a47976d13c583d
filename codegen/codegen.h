/* codegen.h — code generation from the IR: the C target (c.c) writes one C file that
 * defines a `kiln_model` (runtime/kiln_model.h), and build.c compiles it with the system
 * C compiler against the runtime and OpenBLAS. cuda.c writes model.cu for the GPU. Both
 * print the kernel bodies that kernel.c generates. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/ir.h"

/* Writes the C source of a model: `train` is the training graph (forward, loss, metrics,
 * buffer updates and OUT_GRAD outputs, after autodiff and simplify), `eval` the graph in
 * eval mode (forward, loss, metrics). Returns 0, or -1 with a message in *err (an op or
 * dtype the C target does not support yet, named with its model line). `recipe` is the
 * checked train section as runtime/kiln_recipe.h's typed struct (frontend's recipe_typed),
 * which model.c carries for the programs; required. */
struct kiln_recipe;
/* The same with a language model's decode step (frontend/decode.c; NULL: none), which the
 * training program's samples use, and, for a distributed training program (kiln build
 * --distributed), the gradient bucket hook (kiln_model.h's KILN_BUCKET_READY) called after
 * the kernel that finishes each bucket of at most bucket_bytes (codegen/buckets.c; 0:
 * none). */
int codegen_c_train(const Graph *train, const Graph *eval, const Graph *decode, const char *source_path,
                    const struct kiln_recipe *recipe, int64_t bucket_bytes, StrBuf *out, StrBuf *err);
int codegen_c(const Graph *train, const Graph *eval, const char *source_path, const struct kiln_recipe *recipe,
              StrBuf *out, StrBuf *err);
/* The C source of an inference program's model (kiln build --infer): the tables of
 * codegen_c, the evaluation step of `eval` (forward, loss and metrics in eval mode, as the
 * training program's), and a predict step of `predict` (the eval graph without its loss
 * and metrics: codegen_predict_graph), planned and fused as any step; no training step.
 * `train` is the reference graph for the tables (parameter and input order, the hash). */
/* `decode`: a language model's decode graph (frontend/decode.c, through
 * codegen_predict_graph), emitted as a decode step, or NULL; `decode_why`: NULL, or why a
 * language model has none, which the program says when it generates. */
int codegen_c_infer(const Graph *train, const Graph *eval, const Graph *predict, const Graph *decode, const char *decode_why,
                    const char *source_path, const struct kiln_recipe *recipe, StrBuf *out, StrBuf *err);
/* The forward alone: a copy of the eval graph without its loss and metric outputs,
 * simplified (what only they read is dropped; the inputs stay). Free with ir_graph_free. */
Graph *codegen_predict_graph(const Graph *eval);

/* cuda.c — writes model.cu, the CUDA of the same kernels in Kiln's dialect
 * (runtime/cuda/kiln_cuda.h). Returns 0, or -1 with "FILE:LINE: error: --target cuda does
 * not support <kind> kernels yet (...)" for the first kernel it cannot write yet. With
 * `partial` (tests), such kernels are left out with a comment instead. `decode` and
 * `bucket_bytes` (a distributed program's gradient buckets, all-reduced by NCCL): as
 * codegen_c_train's. */
int codegen_cuda(const Graph *train, const Graph *eval, const Graph *decode, const char *source_path, const struct kiln_recipe *recipe,
                 int64_t bucket_bytes, bool partial, StrBuf *out, StrBuf *err);

/* An inference program's model.cu (kiln build --infer --target cuda|cuda-emu): what
 * codegen_c_infer writes for the C target (the evaluation step, the predict step, the
 * decode step, the inference tables), with the kernels and launches of codegen_cuda, the
 * steps running on the GPU; the decode step reads and writes the key/value caches in
 * device memory. Errors as codegen_cuda's. */
int codegen_cuda_infer(const Graph *train, const Graph *eval, const Graph *predict, const Graph *decode, const char *decode_why,
                       const char *source_path, const struct kiln_recipe *recipe, StrBuf *out, StrBuf *err);

/* Bytes of activation memory each step needs at the symbols' bounds (after planning). */
int64_t codegen_arena_bytes(const Graph *g);

#endif
