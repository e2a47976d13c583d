/* gradcheck.c — checks the backward graph against finite differences, for any model.
 *
 * The forward graph is differentiated and simplified exactly as training will do it; the
 * interpreter (double precision) runs it on random inputs and PyTorch-initialised
 * parameters; then for a sample of elements of every parameter the analytic gradient is
 * compared with a central difference of the loss, refined by Richardson extrapolation
 * (error O(h^4)), so the comparison is limited by rounding, not by the step.
 *
 * Documented choices, so results never depend on luck:
 *   - Integer inputs get values in their valid range, found from how they are used: rows
 *     of the table they index (gather), or classes of the one-hot they are compared with
 *     (cross_entropy); otherwise [0, 256) for u8 and [0, 10) for other integers.
 *   - Every run records its discrete decisions (relu sides, max/min/reduce_max winners,
 *     comparisons). The step starts at 1e-3 and shrinks until the perturbed runs make the
 *     same decisions as the unperturbed one, so a difference never straddles a kink such
 *     as relu at 0; an element where no step down to 1e-9 manages that sits on a kink: it
 *     is replaced by another element and counted in `skipped`.
 *   - The relative error of an element is |analytic - numeric| / max(|analytic|,
 *     |numeric|, 1e-3 * the largest |analytic| gradient of that tensor): entries three
 *     orders of magnitude below a tensor's largest are measured against that floor,
 *     because their numeric estimate is pure rounding noise. */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/rng.h"

static NodeId loss_node(const Graph *g)
{
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_LOSS) return g->outputs[k].node;
    return IR_NONE;
}

static uint64_t hash_bit(uint64_t h, uint64_t bit) { return (h ^ bit) * UINT64_C(0x100000001b3); }

/* A hash of every discrete decision the run made: which side of 0 each relu input is,
 * which operand max/min/where picked, which elements reduce_max selected, and every
 * non-float value (comparisons, argmax). Two runs with equal patterns lie on the same
 * smooth piece of the loss, so a finite difference between them is valid. */
static uint64_t decision_pattern(const Interp *ip)
{
    const Graph *g = ip->g;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const ITensor *out = &ip->vals[i];
        if (!out->data) continue;
        if (!ir_dtype_is_float((DType)n->dtype)) {
            for (int64_t e = 0; e < out->n; e++) h = hash_bit(h, (uint64_t)(int64_t)out->data[e]);
            continue;
        }
        const ITensor *x = n->ninputs > 0 ? &ip->vals[ir_input(g, i, 0)] : NULL;
        const ITensor *y = n->ninputs > 1 ? &ip->vals[ir_input(g, i, 1)] : NULL;
        switch ((Op)n->op) {
        case OP_RELU:
        case OP_ABS:
            for (int64_t e = 0; e < x->n; e++) h = hash_bit(h, (uint64_t)(x->data[e] > 0) + 2 * (uint64_t)(x->data[e] == 0));
            break;
        case OP_MAX:
        case OP_MIN:
            for (int64_t e = 0; e < x->n; e++)
                h = hash_bit(h, (uint64_t)(x->data[e] > y->data[e]) + 2 * (uint64_t)(x->data[e] == y->data[e]));
            break;
        case OP_REDUCE_MAX: {
            /* For each input element: is it the maximum of its row? (keepdim layout) */
            uint64_t axes = (uint64_t)ir_attrs(g, i)[0];
            for (int64_t e = 0; e < x->n; e++) {
                int64_t rem = e, oi = 0, stride = 1;
                for (int k = x->rank - 1; k >= 0; k--) {
                    int64_t c = rem % x->dims[k];
                    rem /= x->dims[k];
                    if (!(axes >> k & 1)) oi += c * stride;
                    stride *= out->dims[k];
                }
                h = hash_bit(h, (uint64_t)(x->data[e] == out->data[oi]));
            }
            break;
        }
        default:
            break;
        }
    }
    return h;
}

static int run_loss(Interp *ip, NodeId loss, double *out, uint64_t *pattern, StrBuf *err)
{
    if (interp_run(ip) != 0) {
        sb_printf(err, "%s", ip->err.data ? ip->err.data : "interpreter failed");
        return -1;
    }
    *out = interp_value(ip, loss)->data[0];
    if (pattern) *pattern = decision_pattern(ip);
    return 0;
}

/* Central difference of the loss w.r.t. element e of leaf p with step h; *smooth is false
 * when either side made a different discrete decision than the unperturbed run. */
static int central(Interp *ip, NodeId p, NodeId loss, int64_t e, double h, uint64_t base, double *d, bool *smooth,
                   StrBuf *err)
{
    ITensor *t = &ip->vals[p];
    double orig = t->data[e], lp, lm;
    uint64_t pp, pm;
    t->data[e] = orig + h;
    if (run_loss(ip, loss, &lp, &pp, err)) return -1;
    t->data[e] = orig - h;
    if (run_loss(ip, loss, &lm, &pm, err)) return -1;
    t->data[e] = orig;
    *d = (lp - lm) / (2 * h);
    *smooth = pp == base && pm == base;
    return 0;
}

int gradcheck_run(const Graph *forward, const GradcheckOptions *opt, GradcheckResult **results, int *nresults,
                  StrBuf *err)
{
    *results = NULL;
    *nresults = 0;
    Graph *g = ir_graph_clone(forward);
    AutodiffOptions ao = {.wrt_inputs = opt->wrt_inputs};
    if (pass_autodiff(g, &ao, err) != 0) {
        ir_graph_free(g);
        return -1;
    }
    pass_simplify(g);
    /* Finite differences need only the loss: they run the forward graph, which is a
     * third of the work of the training graph. Both see the same inputs and params. */
    Graph *fwd = ir_graph_clone(forward);
    NodeId loss = loss_node(fwd);
    Interp ip, ipf;
    interp_init(&ip, g);
    interp_init(&ipf, fwd);
    ip.seed = ipf.seed = opt->seed;
    for (int i = 0; i < g->nsyms; i++) {
        int64_t v = opt->sym_value < g->syms[i].max ? opt->sym_value : g->syms[i].max;
        interp_set_symbol(&ip, g->syms[i].name, v < 1 ? 1 : v);
        interp_set_symbol(&ipf, g->syms[i].name, v < 1 ? 1 : v);
    }
    /* Random inputs: normal floats, integers in their valid range, random bools. */
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_INPUT) continue;
        int64_t count = 1;
        for (int k = 0; k < n->shape.rank; k++) count *= ir_dim_eval(n->shape.d[k], ip.symvals);
        double *v = xmalloc((size_t)(count ? count : 1) * sizeof *v);
        int64_t range = ir_dtype_is_float((DType)n->dtype) ? 0 : n->dtype == DT_BOOL ? 2 : ir_index_range(g, i);
        if (!range && !ir_dtype_is_float((DType)n->dtype)) range = n->dtype == DT_U8 ? 256 : 10;
        for (int64_t e = 0; e < count; e++) {
            if (range) v[e] = floor(kiln_rng_uniform53(opt->seed, 1000 + (uint64_t)i, 1, (uint64_t)e) * (double)range);
            else v[e] = kiln_rng_normal(opt->seed, 1000 + (uint64_t)i, 2, (uint64_t)e);
        }
        interp_set(&ip, i, v);
        interp_set(&ipf, ir_find_named(fwd, OP_INPUT, ir_node_name(g, i)), v);
        free(v);
    }
    interp_init_params(&ip, opt->seed);
    interp_init_params(&ipf, opt->seed);
    double base;
    uint64_t base_pattern;
    if (interp_run(&ip) != 0 || run_loss(&ipf, loss, &base, &base_pattern, err)) {
        if (!err->len) sb_printf(err, "%s", ip.err.data ? ip.err.data : "interpreter failed");
        interp_free(&ip);
        interp_free(&ipf);
        ir_graph_free(g);
        ir_graph_free(fwd);
        return -1;
    }
    /* Analytic gradients, copied before the finite differences rerun the graph. */
    int failures = 0;
    GradcheckResult *res = xcalloc((size_t)g->noutputs + 1, sizeof *res);
    int nres = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        const char *name = ir_str(g, g->outputs[k].name);
        NodeId leaf = ir_find_named(fwd, OP_PARAM, name);
        if (leaf == IR_NONE) leaf = ir_find_named(fwd, OP_INPUT, name);
        const ITensor *gt = interp_value(&ip, g->outputs[k].node);
        int64_t n = gt->n;
        double *grad = xmalloc((size_t)(n ? n : 1) * sizeof *grad);
        memcpy(grad, gt->data, (size_t)n * sizeof *grad);
        double gmax = 0;
        for (int64_t e = 0; e < n; e++) gmax = fmax(gmax, fabs(grad[e]));
        GradcheckResult *r = &res[nres++];
        r->name = xstrdup(name);
        r->max_abs_grad = gmax;
        double floor_ = 1e-3 * gmax;
        int want = opt->samples < n ? opt->samples : (int)n;
        for (int tries = 0; r->checked < want && tries < 4 * want + 8; tries++) {
            /* Element 0 and the last first, then a seeded random sample. */
            int64_t e = tries == 0 ? 0 : tries == 1 ? n - 1
                        : (int64_t)(kiln_rng_uniform53(opt->seed, 7, (uint64_t)k, (uint64_t)tries) * (double)n);
            if (e >= n) e = n - 1;
            double x = ipf.vals[leaf].data[e];
            /* The largest step (least rounding) whose runs all stay on the smooth piece
             * of the unperturbed point; Richardson's (4 D(h/2) - D(h)) / 3 then cancels
             * the h^2 error term. */
            double numeric = 0;
            bool found = false;
            for (double h = 1e-3 * fmax(1.0, fabs(x)); h > 1e-9 && !found; h /= 8) {
                double d1, d2;
                bool s1, s2;
                if (central(&ipf, leaf, loss, e, h, base_pattern, &d1, &s1, err) ||
                    central(&ipf, leaf, loss, e, h / 2, base_pattern, &d2, &s2, err)) {
                    failures = -1;
                    break;
                }
                if (s1 && s2) {
                    numeric = (4 * d2 - d1) / 3;
                    found = true;
                }
            }
            if (failures < 0) break;
            if (!found) {
                r->skipped++;
                continue;
            }
            double rel = fabs(grad[e] - numeric) / fmax(fmax(fabs(grad[e]), fabs(numeric)), fmax(floor_, 1e-300));
            if (grad[e] == 0 && numeric == 0) rel = 0;
            if (rel > r->max_rel_error) r->max_rel_error = rel;
            r->checked++;
        }
        free(grad);
        if (failures < 0) break;
        if (r->max_rel_error > opt->tolerance) failures++;
    }
    interp_free(&ip);
    interp_free(&ipf);
    ir_graph_free(g);
    ir_graph_free(fwd);
    *results = res;
    *nresults = nres;
    return failures;
}

void gradcheck_free(GradcheckResult *results, int n)
{
    for (int i = 0; i < n; i++) free(results[i].name);
    free(results);
}
