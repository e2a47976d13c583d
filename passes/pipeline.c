/* pipeline.c — the order of the passes, written once. `kiln ir --after PASS` stops after
 * any of them, `kiln ir --passes` lists them, `--stats` reports node counts around each and
 * `kiln build --time-passes` the time of each. The verifier runs after every pass that
 * changes the graph: a pass that breaks an invariant is caught at once, with its name,
 * instead of producing wrong code later. The last two stages, fusion and memplan, leave
 * the graph as it is and compute its plan (PipelineOptions.plan), which the code
 * generators and the reports read: a build plans each graph once. */
#include "passes.h"

#include <string.h>
#include <time.h>

typedef int (*PassFn)(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err);
static int pass_index(const char *name);

static int run_attention(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    if (opt->unfused_attention) {
        sb_puts(note, "skipped: attention computed unfused");
        return 0;
    }
    int fused = 0, large = 0;
    if (pass_fuse_attention(g, opt->attention_max_head, &fused, &large, err)) return -1;
    if (fused) sb_printf(note, "%d fused", fused);
    if (large) sb_printf(note, "%s%d unfused: a head size over %lld, the target's kernels' largest", fused ? "; " : "", large, (long long)opt->attention_max_head);
    return 0;
}

static int run_autodiff(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    (void)note;
    AutodiffOptions ad = {.wrt_inputs = false, .scale_loss = opt->precision && opt->precision->scale_loss};
    return pass_autodiff(g, &ad, err);
}

static int run_simplify(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    (void)opt, (void)note, (void)err;
    pass_simplify(g);
    return 0;
}

static int run_precision(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    PrecisionStats st;
    const PrecisionOptions f32 = {.half = DT_F32};
    const PrecisionOptions *p = opt->precision ? opt->precision : &f32;
    if (pass_precision(g, p, &st, err)) return -1;
    /* the pass decides what to narrow by what fusion would store of its input graph */
    if (p->half != DT_F32) sb_printf(note, "%d casts, consulted a fusion plan of its input", st.narrowed + st.widened);
    return 0;
}

static int run_remat(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    RematStats st;
    int rc = pass_remat(g, opt->remat, &st, err);
    if (st.candidates)
        sb_printf(note, "budget search: planned %d candidate graph%s", st.candidates, st.candidates == 1 ? "" : "s");
    return rc;
}

static int run_fusion(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    (void)err;
    fusion_plan(g, &opt->plan->fusion);
    opt->plan->fused = true;
    sb_printf(note, "%d kernels", opt->plan->fusion.nkernels);
    return 0;
}

static int run_memplan(Graph *g, const PipelineOptions *opt, StrBuf *note, StrBuf *err)
{
    (void)err;
    memplan_run(g, &opt->plan->fusion, &opt->plan->mem);
    opt->plan->placed = true;
    sb_printf(note, "arena %lld bytes", (long long)opt->plan->mem.arena_bytes);
    return 0;
}

enum { TRAINING = 1, PLANNING = 2 };

/* The stages in order: row 0 is the frontend's lowering, which the pipeline does not run. */
static const PassInfo pass_infos[] = {
    {"lower", "the model file as lowered by the frontend (forward, loss, metrics)"},
    {"attention", "attention recognised and replaced by the fused attention op (no T x T tensor)"},
    {"autodiff", "reverse-mode gradients of the loss for every trainable parameter"},
    {"simplify", "constant folding, algebraic identities, CSE, dead-node elimination"},
    {"precision", "mixed precision (precision = bf16|fp16): half-precision matmul inputs and kept activations, explicit casts"},
    {"remat", "checkpoint(...) regions: the backward pass recomputes their values (copies marked recomputed)"},
    /* `kiln ir --after fusion|memplan` prints their plan */
    {"fusion", "kernel groups: elementwise chains, row reductions, GEMM epilogues (the plan: graph unchanged)"},
    {"memplan", "kernel order and activation-arena offsets by liveness (the plan: graph unchanged)"},
};
static const struct {
    PassFn run;
    int kind; /* TRAINING: training graphs only; PLANNING: computes the plan, graph unchanged */
} passes[] = {
    {run_attention, 0}, {run_autodiff, TRAINING}, {run_simplify, 0}, {run_precision, TRAINING}, {run_remat, TRAINING},
    {run_fusion, PLANNING},   {run_memplan, PLANNING},
};
#define NPASSES ((int)(sizeof passes / sizeof passes[0]))
_Static_assert(sizeof pass_infos / sizeof pass_infos[0] == NPASSES + 1, "one name per pass");

const PassInfo *pipeline_passes(int *n)
{
    *n = NPASSES + 1;
    return pass_infos;
}

bool pipeline_has_pass(const char *name) { return pass_index(name) != -2; }

/* The index in passes[] of a pass name; -1 for "lower" or NULL (before the first), -2 for
 * no pass of that name. */
static int pass_index(const char *name)
{
    if (!name || !strcmp(name, "lower")) return -1;
    for (int i = 0; i < NPASSES; i++)
        if (!strcmp(pass_infos[i + 1].name, name)) return i;
    return -2;
}

int pipeline_run(Graph *g, const char *after, StrBuf *stats, StrBuf *err) { return pipeline_run_opts(g, after, NULL, stats, err); }

double pipeline_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void pipeline_time_row(StrBuf *times, const char *pass, const char *graph, double seconds, int32_t before, int32_t after,
                       const char *note)
{
    if (!times) return;
    if (!times->len) sb_printf(times, "%-10s %-8s %9s  %17s  %s\n", "pass", "graph", "ms", "nodes", "");
    sb_printf(times, "%-10s %-8s %9.2f  %7d -> %7d  %s\n", pass, graph ? graph : "-", seconds * 1e3, before, after, note ? note : "");
}

int pipeline_run_opts(Graph *g, const char *after, const PipelineOptions *opt, StrBuf *stats, StrBuf *err)
{
    const PipelineOptions none = {0};
    if (!opt) opt = &none;
    const int stop = after ? pass_index(after) : NPASSES - 1, from = opt->from ? pass_index(opt->from) : -1;
    if (stop == -2 || from == -2) {
        sb_printf(err, "unknown pass '%s'; passes:", stop == -2 ? after : opt->from);
        for (int i = 0; i <= NPASSES; i++) sb_printf(err, " %s", pass_infos[i].name);
        return -1;
    }
    if (stats && from == -1) sb_printf(stats, "%-10s %6d nodes\n", "lower", g->nnodes);
    GraphPlan local;
    memset(&local, 0, sizeof local);
    PipelineOptions o = *opt;
    /* the plan is computed for a caller that takes it, or to stop after it (`kiln ir --after
     * memplan` without a plan: computed, then dropped) */
    const bool plan = o.plan || (after && stop >= NPASSES - 2);
    if (!o.plan) o.plan = &local;
    int rc = 0;
    StrBuf note;
    sb_init(&note);
    for (int i = from + 1; i <= stop && !rc; i++) {
        if (((passes[i].kind & TRAINING) && o.forward_only) || ((passes[i].kind & PLANNING) && !plan)) continue;
        const int32_t before = g->nnodes;
        note.len = 0;
        if (note.data) note.data[0] = 0;
        const double t0 = pipeline_seconds();
        rc = passes[i].run(g, &o, &note, err);
        const double t1 = pipeline_seconds();
        if (rc) break;
        if (!(passes[i].kind & PLANNING)) {
            StrBuf verr;
            sb_init(&verr);
            if (ir_verify(g, &verr)) {
                sb_printf(err, "internal error: the graph is invalid after pass %s:\n%s", pass_infos[i + 1].name, verr.data);
                rc = -1;
            }
            sb_free(&verr);
        }
        if (stats && !rc && !(passes[i].kind & PLANNING)) sb_printf(stats, "%-10s %6d nodes (%+d)\n", pass_infos[i + 1].name, g->nnodes, g->nnodes - before);
        pipeline_time_row(o.times, pass_infos[i + 1].name, o.graph_name, t1 - t0, before, g->nnodes, note.data);
    }
    sb_free(&note);
    graph_plan_free(&local);
    return rc;
}

void graph_plan_free(GraphPlan *p)
{
    if (p->fused) fusion_free(&p->fusion);
    if (p->placed) memplan_free(&p->mem);
    memset(p, 0, sizeof *p);
}
