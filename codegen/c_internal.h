/* c_internal.h — what the files of the C target share: the generator's state and the
 * helpers that print C for dims, literals and elementwise expressions. c.c writes the
 * tables, the single-node kernels and the step functions; c_loops.c the fused kernels
 * (loop nests and GEMMs with epilogues) of passes/fusion.c. */
#ifndef KILN_CODEGEN_C_INTERNAL_H
#define KILN_CODEGEN_C_INTERNAL_H

#include "../passes/passes.h"
#include "codegen.h"

/* Loops over fewer elements than this stay on one thread: a parallel region costs a few
 * microseconds. */
#define PARALLEL_MIN 32768

typedef struct {
    const Graph *g;
    StrBuf *o;
    StrBuf *err;
    const char *prefix; /* "train" or "eval": kernel names */
    FusionPlan fp;
    MemPlan mp;
    int64_t *param_off, *buffer_off; /* per node: offsets in the caller's slabs */
    int *input_index;
    char **lines; /* source lines, for comments */
    int nlines;
    const char *source;
    int ngemms;
    /* Fused kernels with the same code (up to the names of their values) share one
     * function, across layers and between the train and eval graphs: */
    StrMap shared;        /* canonical code -> index in shared_code */
    char **shared_code, **shared_name;
    int nshared, capshared;
    char **fused_name;    /* per kernel of the current graph: the function it calls */
    /* Where each kernel of the training graph starts in the output, and where its step
     * function starts: the points at which the file may be cut in two halves. */
    size_t *kernel_at, step_at, kernel_bytes;
    int nkernel_at, capkernel_at;
    int nkernels[2]; /* of the training and evaluation steps: the profile tables */
    int ncheck;      /* index checks called so far in the step being written */
} Cg;

static inline const Node *N(const Cg *c, NodeId id) { return &c->g->nodes[id]; }

const char *cg_ctype(DType t);
void cg_dim(StrBuf *b, const Graph *g, Dim d);
void cg_literal(StrBuf *b, double v, DType t);
void cg_numel(Cg *c, const Shape *s);
/* Whether a loop over s can reach PARALLEL_MIN elements at the largest sizes the model
 * allows. One that cannot gets no parallel region at all: libgomp's call costs about 600
 * cycles even when its if clause is false, most of a small kernel's time at batch 1. */
bool cg_may_parallel(const Cg *c, const Shape *s);
void cg_declare_syms(Cg *c, NodeId id);
void cg_declare_dims(Cg *c, const char *prefix, const Shape *s);
void cg_declare_strides(Cg *c, const char *dims, int rank);
/* The C expression of elementwise node id applied to operand expressions a, b, w. */
void cg_elementwise_expr(Cg *c, NodeId id, const char *a, const char *b, const char *w);
/* " * FILE:LINE: source text" of a node, for kernel comments (nothing without a line). */
void cg_source_line(Cg *c, NodeId id);

/* c_loops.c: a loop or GEMM kernel of the fusion plan, and its call in the step. */
void cg_emit_fused_kernel(Cg *c, int32_t k);
void cg_emit_fused_call(Cg *c, int32_t k);
/* What fused kernel k is, in a few words: "matrix product over float[T*B, 384]". */
void cg_kernel_title(Cg *c, int32_t k, StrBuf *o);
void cg_free_shared(Cg *c);

#endif
