/* passes.h — graph-to-graph passes and the pipeline that runs them in order.
 *
 * Each pass is one file with one entry point that takes the Graph and leaves it valid
 * (ir_verify() holds after every pass; the pipeline checks it). The order is written once,
 * in pipeline.c. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

/* autodiff.c — reverse-mode differentiation of the scalar loss output with respect to
 * every trainable parameter (and, with wrt_inputs, every float input). Appends the
 * backward nodes to the graph and one OUT_GRAD output per parameter (named like it).
 * Returns 0, or -1 with a message (file:line:col: error: ...) in *err. */
typedef struct {
    bool wrt_inputs;
} AutodiffOptions;
int pass_autodiff(Graph *g, const AutodiffOptions *opt, StrBuf *err);

/* simplify.c — constant folding, algebraic identities, common-subexpression elimination
 * and dead-node elimination. Renumbers nodes; outputs keep their meaning. */
void pass_simplify(Graph *g);

/* pipeline.c — the passes in order. */
typedef struct {
    const char *name;
    const char *doc;
} PassInfo;
const PassInfo *pipeline_passes(int *n);
/* Runs the passes in order up to and including `after` ("lower" or NULL for none before
 * the first pass, or a pass name). With stats, appends one line per pass with node counts
 * before and after to *stats. Returns 0, or -1 with a message in *err (an unknown pass
 * name, a failing pass, or a verifier failure naming the pass). */
int pipeline_run(Graph *g, const char *after, StrBuf *stats, StrBuf *err);
bool pipeline_has_pass(const char *name);

/* gradcheck.c — every parameter gradient of the training graph (from autodiff, run by the
 * interpreter in double precision) against central finite differences of the loss on a
 * sample of elements of every tensor. */
typedef struct {
    uint64_t seed;
    double tolerance;    /* maximum relative error allowed */
    int samples;         /* elements checked per tensor */
    int64_t sym_value;   /* value for every symbolic size (clamped to its bound) */
    bool wrt_inputs;     /* also check gradients of float inputs */
} GradcheckOptions;

typedef struct {
    char *name;
    int64_t checked;
    int64_t skipped; /* samples at non-differentiable points, replaced by others */
    double max_rel_error;
    double max_abs_grad;
} GradcheckResult;

/* Runs the check on a forward graph (it is differentiated here). Returns the number of
 * tensors whose error exceeds the tolerance, or -1 with a message in *err. */
int gradcheck_run(const Graph *forward, const GradcheckOptions *opt, GradcheckResult **results, int *nresults,
                  StrBuf *err);
void gradcheck_free(GradcheckResult *results, int n);

#endif
