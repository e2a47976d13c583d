/* c_internal.h — what the files of the C target share: the helpers that print C loops
 * over shapes. The generator's state and the scalar expressions are the targets' shared
 * part (kernel.h). c.c writes the single-node kernels and calls host.c for the tables and the steps;
 * c_loops.c the fused kernels (loop nests and GEMMs with epilogues) of passes/fusion.c. */
#ifndef KILN_CODEGEN_C_INTERNAL_H
#define KILN_CODEGEN_C_INTERNAL_H

#include "kernel.h"

/* Loops over fewer elements than this stay on one thread: a parallel region costs a few
 * microseconds. */
#define PARALLEL_MIN 32768

/* Whether a loop over s can reach PARALLEL_MIN elements at the largest sizes the model
 * allows. One that cannot gets no parallel region at all: libgomp's call costs about 600
 * cycles even when its if clause is false, most of a small kernel's time at batch 1. */
bool cg_may_parallel(const Cg *c, const Shape *s);
void cg_declare_syms(Cg *c, NodeId id);

/* c_loops.c: a loop or GEMM kernel of the fusion plan, and its call in the step. */
void cg_emit_fused_kernel(Cg *c, int32_t k);
void cg_emit_fused_call(Cg *c, int32_t k);
void cg_free_shared(Cg *c);
/* c_attention.c: the fused attention kernels (a kernel of attention ops, named by `name`
 * after its anchor) and their calls in the step. */
void cg_emit_attention_kernel(Cg *c, int32_t k, void (*name)(Cg *c, NodeId id, StrBuf *b));
void cg_emit_attention_call(Cg *c, int32_t k, void (*name)(Cg *c, NodeId id, StrBuf *b));

#endif
