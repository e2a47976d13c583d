/* pipeline.c — the order of the passes, written once. `kiln ir --after PASS` stops after
 * any of them, `kiln ir --passes` lists them, `--stats` reports node counts around each.
 * The verifier runs after every pass: a pass that breaks an invariant is caught at once,
 * with its name, instead of producing wrong code later. */
#include "passes.h"

#include <string.h>

typedef int (*PassFn)(Graph *g, StrBuf *err);

/* The options of the run in progress (pipeline_run_opts), for the passes that take some. */
static RematOptions *run_remat_options;
static const PrecisionOptions *run_precision_options;

static int run_autodiff(Graph *g, StrBuf *err)
{
    AutodiffOptions opt = {.wrt_inputs = false, .scale_loss = run_precision_options && run_precision_options->scale_loss};
    return pass_autodiff(g, &opt, err);
}

static int run_simplify(Graph *g, StrBuf *err)
{
    (void)err;
    pass_simplify(g);
    return 0;
}


static int run_precision(Graph *g, StrBuf *err)
{
    return pass_precision(g, run_precision_options, NULL, err);
}

static int run_remat(Graph *g, StrBuf *err)
{
    return pass_remat(g, run_remat_options, NULL, err);
}

static const struct {
    PassInfo info;
    PassFn run;
} passes[] = {
    {{"autodiff", "reverse-mode gradients of the loss for every trainable parameter"}, run_autodiff},
    {{"simplify", "constant folding, algebraic identities, CSE, dead-node elimination"}, run_simplify},
    {{"precision", "mixed precision (precision = bf16|fp16): half-precision matmul inputs and kept activations, explicit casts"}, run_precision},
    {{"remat", "checkpoint(...) regions: the backward pass recomputes their values (copies marked recomputed)"}, run_remat},
    /* Planning passes: they annotate the final graph (kernels, memory) without changing it;
     * `kiln ir --after fusion|memplan` prints their plan. */
    {{"fusion", "kernel groups: elementwise chains, row reductions, GEMM epilogues (plan only)"}, NULL},
    {{"memplan", "kernel order and activation-arena offsets by liveness (plan only)"}, NULL},
};
#define NPASSES ((int)(sizeof passes / sizeof passes[0]))

const PassInfo *pipeline_passes(int *n)
{
    static PassInfo infos[NPASSES + 1];
    infos[0] = (PassInfo){"lower", "the model file as lowered by the frontend (forward, loss, metrics)"};
    for (int i = 0; i < NPASSES; i++) infos[i + 1] = passes[i].info;
    *n = NPASSES + 1;
    return infos;
}

bool pipeline_has_pass(const char *name)
{
    int n;
    const PassInfo *p = pipeline_passes(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return true;
    return false;
}

int pipeline_run(Graph *g, const char *after, StrBuf *stats, StrBuf *err) { return pipeline_run_with(g, after, NULL, stats, err); }

int pipeline_run_with(Graph *g, const char *after, RematOptions *remat, StrBuf *stats, StrBuf *err)
{
    PipelineOptions opt = {.remat = remat};
    return pipeline_run_opts(g, after, &opt, stats, err);
}

int pipeline_run_opts(Graph *g, const char *after, const PipelineOptions *opt, StrBuf *stats, StrBuf *err)
{
    run_remat_options = opt ? opt->remat : NULL;
    run_precision_options = opt ? opt->precision : NULL;
    if (after && !pipeline_has_pass(after)) {
        sb_printf(err, "unknown pass '%s'; passes:", after);
        int n;
        const PassInfo *p = pipeline_passes(&n);
        for (int i = 0; i < n; i++) sb_printf(err, " %s", p[i].name);
        return -1;
    }
    if (stats) sb_printf(stats, "%-10s %6d nodes\n", "lower", g->nnodes);
    if (after && !strcmp(after, "lower")) return 0;
    for (int i = 0; i < NPASSES; i++) {
        int before = g->nnodes;
        if (!passes[i].run) {
            if (after && !strcmp(after, passes[i].info.name)) break;
            continue;
        }
        if (passes[i].run(g, err) != 0) return -1;
        StrBuf verr;
        sb_init(&verr);
        int problems = ir_verify(g, &verr);
        if (problems) {
            sb_printf(err, "internal error: the graph is invalid after pass %s:\n%s", passes[i].info.name, verr.data);
            sb_free(&verr);
            return -1;
        }
        sb_free(&verr);
        if (stats) sb_printf(stats, "%-10s %6d nodes (%+d)\n", passes[i].info.name, g->nnodes, g->nnodes - before);
        if (after && !strcmp(after, passes[i].info.name)) break;
    }
    return 0;
}
