/* gradcheck.c — checks the backward graph against finite differences, for any model.
 *
 * Requires a forward graph with a loss output. Guarantees that every gradient output of
 * the training graph gets a verdict — pass, FAIL, identically zero, or not checked — that
 * depends on the gradients, not on the seed's luck.
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
 *   - Kinks. Every run records the discrete decisions of the nodes the loss depends on:
 *     the side of 0 of every relu/abs/sign input and pow base, which operand max/min
 *     chose, which elements won each reduce_max, and every non-float value (comparisons
 *     and so where's condition, argmax, casts to integers). A difference is used only
 *     when its four runs (x +- h, x +- h/2) make the same decisions as the unperturbed
 *     one: then all of them lie on one smooth piece of the loss. The step starts at
 *     1e-3 * max(1, |x|) and shrinks by 8 at most 4 times (GC_LEVELS); an element whose
 *     window still crosses a kink is replaced by another element (without repetition)
 *     and counted in `skipped`; when no element is left the tensor says so. The step is
 *     not shrunk further because the rounding noise of a difference grows as 1/h: steps
 *     shrunk down to 1e-9 made the verdict of models with many kinks (max pooling after
 *     relu, larger batches) depend on the seed.
 *   - Criterion (torch.autograd.gradcheck's): an element passes when
 *         |analytic - numeric| <= atol + rtol * |numeric|
 *     with rtol = opt->tolerance and atol the rounding noise of the difference: a loss
 *     computed in double carries an error of about eps * |loss| (times a factor that
 *     grows with the number of operations), and a central difference divides it by h,
 *     so atol = 100 * eps * max(|loss|, 1) / h (GC_NOISE) for the step h the element used
 *     (opt->atol replaces it when set). A relative error against the tensor's own
 *     largest gradient would call the rounding noise of a gradient that is exactly zero
 *     (a conv bias followed by batch norm) a failure.
 *   - A tensor whose analytic gradient is at noise level everywhere (below the atol of
 *     the largest step) and whose numeric gradients are at noise level too is reported as
 *     identically zero rather than as a pass: its true gradient is zero.
 *   - detach. The analytic gradient leaves out every path through a detach by design, so
 *     the finite differences hold each detach's value fixed at the unperturbed one: they
 *     measure the same partial derivative. A detach whose value the loss depends on (a
 *     user's detach, unlike softmax's max shift, which cancels) is reported per tensor
 *     whose gradient it cuts, with its source location. */
#include "passes.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/rng.h"

enum {
    GC_LEVELS = 5, /* steps tried: 1e-3, 1.25e-4, 1.6e-5, 2e-6, 2.4e-7 (times max(1, |x|)) */
};
/* Rounding noise of a central difference in units of eps * max(|loss|, 1) / h. Measured
 * on the reference models (gpt's is among the largest) and on every op and module test,
 * it stays below about 2; 100 leaves a margin for deeper graphs and longer sums, while
 * an element that needed the smallest step is still held to an absolute error of about
 * 1e-7 * max(|loss|, 1). */
#define GC_NOISE 100.0
#define GC_H0 1e-3

static NodeId loss_node(const Graph *g)
{
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_LOSS) return g->outputs[k].node;
    return IR_NONE;
}

static uint64_t hash_bit(uint64_t h, uint64_t bit) { return (h ^ bit) * UINT64_C(0x100000001b3); }

static uint64_t side_of_zero(double v) { return (uint64_t)(v > 0) + 2 * (uint64_t)(v == 0); }

/* A hash of every discrete decision of the nodes the loss depends on (on_path): which
 * side of 0 each relu/abs/sign input and pow base is, which operand max/min picked,
 * which elements reduce_max selected, and every non-float value (comparisons, hence
 * where's condition, argmax, casts to integers). Two runs with equal patterns lie on the
 * same smooth piece of the loss, so a finite difference between them is valid. Nodes off
 * the path (a metric's argmax, the max feeding a frozen detach) cannot bend the loss and
 * are left out, so that they do not reject good samples. */
static uint64_t decision_pattern(const Interp *ip, const bool *on_path)
{
    const Graph *g = ip->g;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const ITensor *out = &ip->vals[i];
        if (!on_path[i] || !out->data) continue;
        if (!ir_dtype_is_float((DType)n->dtype)) {
            for (int64_t e = 0; e < out->n; e++) h = hash_bit(h, (uint64_t)(int64_t)out->data[e]);
            continue;
        }
        const ITensor *x = n->ninputs > 0 ? &ip->vals[ir_input(g, i, 0)] : NULL;
        const ITensor *y = n->ninputs > 1 ? &ip->vals[ir_input(g, i, 1)] : NULL;
        switch ((Op)n->op) {
        case OP_RELU:
        case OP_ABS:
        case OP_SIGN:
        case OP_POW: /* the exponent's gradient is 0 where the base is <= 0 */
            for (int64_t e = 0; e < x->n; e++) h = hash_bit(h, side_of_zero(x->data[e]));
            break;
        case OP_FLOOR: /* a step at every integer */
            for (int64_t e = 0; e < out->n; e++) h = hash_bit(h, (uint64_t)(int64_t)out->data[e]);
            break;
        case OP_MAX:
        case OP_MIN:
            for (int64_t e = 0; e < x->n; e++) h = hash_bit(h, side_of_zero(x->data[e] - y->data[e]));
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

/* The finite-difference side: the forward graph with its detach nodes frozen. */
typedef struct {
    Graph *g;
    Interp ip;
    NodeId loss;
    bool *on_path;       /* nodes the loss depends on (in the frozen graph) */
    NodeId *detach_src;  /* for a frozen detach, its operand; else IR_NONE */
    bool *detach_cuts;   /* frozen detach whose value the loss depends on */
    uint64_t base_pattern;
    double base_loss;
    double noise; /* atol * h: GC_NOISE * eps * max(|loss|, 1) */
} Fd;

static int run_loss(Fd *f, double *out, uint64_t *pattern, StrBuf *err)
{
    if (interp_run(&f->ip) != 0) {
        sb_printf(err, "%s", f->ip.err.data ? f->ip.err.data : "interpreter failed");
        return -1;
    }
    *out = interp_value(&f->ip, f->loss)->data[0];
    if (pattern) *pattern = decision_pattern(&f->ip, f->on_path);
    return 0;
}

/* Central difference of the loss w.r.t. element e of leaf p with step h; *smooth is false
 * when either side made a different discrete decision than the unperturbed run. */
static int central(Fd *f, NodeId p, int64_t e, double h, double *d, bool *smooth, StrBuf *err)
{
    ITensor *t = &f->ip.vals[p];
    double orig = t->data[e], lp, lm;
    uint64_t pp, pm;
    t->data[e] = orig + h;
    int rc = run_loss(f, &lp, &pp, err);
    t->data[e] = orig - h;
    if (!rc) rc = run_loss(f, &lm, &pm, err);
    t->data[e] = orig;
    if (rc) return -1;
    *d = (lp - lm) / (2 * h);
    *smooth = pp == f->base_pattern && pm == f->base_pattern;
    return 0;
}

/* Marks the nodes the loss depends on, then runs the unperturbed point: the loss, its
 * decisions and its rounding noise. */
static int fd_prepare(Fd *f, StrBuf *err)
{
    const Graph *g = f->g;
    f->on_path = xcalloc((size_t)g->nnodes + 1, sizeof *f->on_path);
    f->on_path[f->loss] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--)
        if (f->on_path[i])
            for (uint32_t k = 0; k < g->nodes[i].ninputs; k++) f->on_path[ir_input(g, i, (int)k)] = true;
    if (run_loss(f, &f->base_loss, &f->base_pattern, err)) return -1;
    f->noise = GC_NOISE * DBL_EPSILON * fmax(fabs(f->base_loss), 1.0);
    return 0;
}

/* Turns every detach of the (already run) forward graph into a leaf holding its current
 * value, so that finite differences keep it fixed as autodiff does. The node keeps its
 * dtype, shape and location; its name is cleared so that no lookup of an input by name
 * can find it. */
static void freeze_detaches(Fd *f)
{
    Graph *g = f->g;
    f->detach_src = xmalloc(((size_t)g->nnodes + 1) * sizeof *f->detach_src);
    for (NodeId i = 0; i < g->nnodes; i++) {
        f->detach_src[i] = IR_NONE;
        Node *n = &g->nodes[i];
        if (n->op != OP_DETACH) continue;
        f->detach_src[i] = ir_input(g, i, 0);
        /* The value is copied before the node changes: interp_set accepts only leaves. */
        const ITensor *v = &f->ip.vals[i];
        double *copy = xmalloc((size_t)(v->n ? v->n : 1) * sizeof *copy);
        if (v->n) memcpy(copy, v->data, (size_t)v->n * sizeof *copy);
        n->op = OP_INPUT;
        n->ninputs = 0;
        n->nattrs = 0;
        n->name = 0;
        interp_set(&f->ip, i, copy);
        free(copy);
    }
}

/* Decides, for each frozen detach the loss depends on, whether the loss changes when its
 * value does: a difference in a random direction above the rounding noise. Softmax's and
 * logsumexp's max shifts cancel exactly, so they cut nothing and are not reported. */
static int find_cutting_detaches(Fd *f, uint64_t seed, StrBuf *err)
{
    const Graph *g = f->g;
    f->detach_cuts = xcalloc((size_t)g->nnodes + 1, sizeof *f->detach_cuts);
    for (NodeId i = 0; i < g->nnodes; i++) {
        /* An integer detach carries no gradient either way (and must stay an integer). */
        if (f->detach_src[i] == IR_NONE || !f->on_path[i] || !ir_dtype_is_float((DType)g->nodes[i].dtype)) continue;
        ITensor *t = &f->ip.vals[i];
        double scale = 1;
        for (int64_t e = 0; e < t->n; e++)
            if (isfinite(t->data[e])) scale = fmax(scale, fabs(t->data[e]));
        double delta = GC_H0 * scale, lp, lm;
        double *orig = xmalloc((size_t)(t->n ? t->n : 1) * sizeof *orig);
        if (t->n) memcpy(orig, t->data, (size_t)t->n * sizeof *orig);
        int rc = 0;
        for (int side = 0; side < 2 && !rc; side++) {
            for (int64_t e = 0; e < t->n; e++)
                t->data[e] = orig[e] + (side ? -delta : delta) * kiln_rng_normal(seed, 11, (uint64_t)i, (uint64_t)e);
            rc = run_loss(f, side ? &lm : &lp, NULL, err);
        }
        if (t->n) memcpy(t->data, orig, (size_t)t->n * sizeof *orig);
        free(orig);
        if (rc) return -1;
        f->detach_cuts[i] = fabs(lp - lm) / (2 * delta) > f->noise / delta;
    }
    return 0;
}

/* The first detach (in node order) that the loss depends on and that `leaf` reaches, in
 * the graph as it was before freezing; IR_NONE when no path from leaf is cut. */
static NodeId cutting_detach(const Fd *f, NodeId leaf)
{
    const Graph *g = f->g;
    bool *reach = xcalloc((size_t)g->nnodes + 1, sizeof *reach);
    NodeId found = IR_NONE;
    reach[leaf] = true;
    for (NodeId i = leaf + 1; i < g->nnodes && found == IR_NONE; i++) {
        if (f->detach_src[i] != IR_NONE) reach[i] = reach[f->detach_src[i]];
        else
            for (uint32_t k = 0; k < g->nodes[i].ninputs && !reach[i]; k++) reach[i] = reach[ir_input(g, i, (int)k)];
        if (reach[i] && f->detach_cuts[i]) found = i;
    }
    free(reach);
    return found;
}

static void fd_free(Fd *f)
{
    interp_free(&f->ip);
    ir_graph_free(f->g);
    free(f->on_path);
    free(f->detach_src);
    free(f->detach_cuts);
}

/* The order elements are tried in: element 0 and the last first (boundary bugs), then
 * distinct elements drawn with the seed; tried[0..try_) holds the ones already used. With
 * `every` (small tensors, or a budget that covers the tensor) every element is reached
 * before any repeats; -1 when none is left. */
static int64_t pick_element(uint64_t seed, int32_t k, int try_, int64_t n, const int64_t *tried, bool every)
{
    if (try_ == 0) return 0;
    if (try_ == 1 && n > 1) return n - 1;
    if (every) {
        /* The next untried element after a random start. */
        int64_t e = (int64_t)(kiln_rng_uniform53(seed, 7, (uint64_t)k, (uint64_t)try_) * (double)n);
        for (int64_t step = 0; step < n; step++, e = (e + 1) % n) {
            bool used = false;
            for (int j = 0; j < try_ && !used; j++) used = tried[j] == e;
            if (!used) return e;
        }
        return -1;
    }
    for (uint64_t draw = 0;; draw++) {
        int64_t e = (int64_t)(kiln_rng_uniform53(seed, 7, (uint64_t)k, (uint64_t)try_ * 1024 + draw) * (double)n);
        if (e >= n) e = n - 1;
        bool used = false;
        for (int j = 0; j < try_ && !used; j++) used = tried[j] == e;
        if (!used || draw > 64) return e;
    }
}

static void check_tensor(Fd *f, const GradcheckOptions *opt, int32_t k, NodeId leaf, const double *grad, int64_t n,
                         GradcheckResult *r, StrBuf *err, int *error)
{
    double rtol = opt->tolerance;
    int want = opt->samples < n ? opt->samples : (int)n;
    int budget = 4 * want + 8;
    if (budget > n) budget = (int)n;
    int64_t *tried = xmalloc((size_t)(budget ? budget : 1) * sizeof *tried);
    bool all_noise = true;
    int try_ = 0;
    for (; r->checked < want && try_ < budget; try_++) {
        int64_t e = pick_element(opt->seed, k, try_, n, tried, n <= 64 || n <= budget);
        if (e < 0) break;
        tried[try_] = e;
        double x = f->ip.vals[leaf].data[e];
        /* The largest step (least rounding) whose runs all stay on the smooth piece of the
         * unperturbed point; Richardson's (4 D(h/2) - D(h)) / 3 then cancels the h^2
         * error term. */
        double numeric = 0, h = GC_H0 * fmax(1.0, fabs(x));
        bool found = false;
        for (int level = 0; level < GC_LEVELS && !found; level++, h /= 8) {
            double d1, d2;
            bool s1, s2 = false;
            if (central(f, leaf, e, h, &d1, &s1, err) || (s1 && central(f, leaf, e, h / 2, &d2, &s2, err))) {
                *error = 1;
                break;
            }
            if (s1 && s2) {
                numeric = (4 * d2 - d1) / 3;
                found = true;
            }
        }
        if (*error) break;
        if (!found) {
            r->skipped++;
            continue;
        }
        double noise = f->noise / h, atol = opt->atol > 0 ? opt->atol : noise;
        double diff = fabs(grad[e] - numeric), allowed = atol + rtol * fabs(numeric);
        double ratio = allowed > 0 ? diff / allowed : diff > 0 ? INFINITY : 0;
        r->worst_ratio = fmax(r->worst_ratio, ratio);
        r->max_abs_error = fmax(r->max_abs_error, diff);
        if (fabs(numeric) > atol) r->max_rel_error = fmax(r->max_rel_error, diff / fabs(numeric));
        /* "Identically zero" is about rounding noise, whatever atol the user chose. */
        all_noise = all_noise && fabs(grad[e]) <= noise && fabs(numeric) <= noise;
        r->checked++;
    }
    r->exhausted = r->checked < want && try_ >= n;
    free(tried);
    /* The analytic gradient's noise level: the difference's at the largest step. */
    double zero_level = f->noise / GC_H0;
    if (r->checked == 0) r->verdict = GRADCHECK_UNCHECKED;
    else if (r->worst_ratio > 1) r->verdict = GRADCHECK_FAIL;
    else if (all_noise && r->max_abs_grad <= zero_level) r->verdict = GRADCHECK_ZERO;
    else r->verdict = GRADCHECK_PASS;
}

int gradcheck_run(const Graph *forward, const GradcheckOptions *opt, GradcheckResult **results, int *nresults,
                  StrBuf *err)
{
    *results = NULL;
    *nresults = 0;
    Graph *g = ir_graph_clone(opt->training ? opt->training : forward);
    if (!opt->training) {
        AutodiffOptions ao = {.wrt_inputs = opt->wrt_inputs};
        if (pass_autodiff(g, &ao, err) != 0) {
            ir_graph_free(g);
            return -1;
        }
        pass_simplify(g);
    }
    /* Finite differences need only the loss: they run the forward graph, which is a
     * third of the work of the training graph. Both see the same inputs and params. */
    Fd f;
    memset(&f, 0, sizeof f);
    f.g = ir_graph_clone(forward);
    f.loss = loss_node(f.g);
    Interp ip;
    interp_init(&ip, g);
    interp_init(&f.ip, f.g);
    ip.seed = f.ip.seed = opt->seed;
    for (int i = 0; i < g->nsyms; i++) {
        int64_t v = opt->sym_value < g->syms[i].max ? opt->sym_value : g->syms[i].max;
        interp_set_symbol(&ip, g->syms[i].name, v < 1 ? 1 : v);
        interp_set_symbol(&f.ip, g->syms[i].name, v < 1 ? 1 : v);
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
        interp_set(&f.ip, ir_find_named(f.g, OP_INPUT, ir_node_name(g, i)), v);
        free(v);
    }
    interp_init_params(&ip, opt->seed);
    interp_init_params(&f.ip, opt->seed);
    /* The leaves are found before freezing, while only real inputs are inputs. */
    NodeId *leaves = xmalloc(((size_t)g->noutputs + 1) * sizeof *leaves);
    for (int32_t k = 0; k < g->noutputs; k++) {
        const char *name = ir_str(g, g->outputs[k].name);
        leaves[k] = ir_find_named(f.g, OP_PARAM, name);
        if (leaves[k] == IR_NONE) leaves[k] = ir_find_named(f.g, OP_INPUT, name);
    }
    /* The unperturbed forward run gives the values at which detaches are frozen. */
    double unused;
    if (f.loss == IR_NONE) sb_printf(err, "gradcheck: the model has no loss");
    bool ok = f.loss != IR_NONE && interp_run(&ip) == 0 && run_loss(&f, &unused, NULL, err) == 0;
    if (ok) freeze_detaches(&f);
    if (!ok || fd_prepare(&f, err) || find_cutting_detaches(&f, opt->seed, err)) {
        if (!err->len) sb_printf(err, "%s", ip.err.data ? ip.err.data : "interpreter failed");
        interp_free(&ip);
        fd_free(&f);
        ir_graph_free(g);
        free(leaves);
        return -1;
    }
    int failures = 0, error = 0;
    GradcheckResult *res = xcalloc((size_t)g->noutputs + 1, sizeof *res);
    int nres = 0;
    for (int32_t k = 0; k < g->noutputs && !error; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        NodeId leaf = leaves[k];
        const ITensor *gt = interp_value(&ip, g->outputs[k].node);
        GradcheckResult *r = &res[nres++];
        r->name = xstrdup(ir_str(g, g->outputs[k].name));
        if (leaf == IR_NONE || gt->n != f.ip.vals[leaf].n) {
            sb_printf(err, "gradcheck: gradient '%s' matches no parameter or input of the forward graph", r->name);
            error = 1;
            break;
        }
        r->numel = gt->n;
        for (int64_t e = 0; e < gt->n; e++) r->max_abs_grad = fmax(r->max_abs_grad, fabs(gt->data[e]));
        NodeId cut = cutting_detach(&f, leaf);
        if (cut != IR_NONE) {
            const Node *d = &f.g->nodes[cut];
            StrBuf b;
            sb_init(&b);
            sb_printf(&b, "%s:%u:%u", d->loc.file < f.g->nfiles ? f.g->files[d->loc.file] : "?", (unsigned)d->loc.line,
                      (unsigned)d->loc.col);
            r->detach_at = xstrdup(b.data);
            sb_free(&b);
        }
        check_tensor(&f, opt, k, leaf, gt->data, gt->n, r, err, &error);
        if (r->verdict == GRADCHECK_FAIL) failures++;
    }
    interp_free(&ip);
    fd_free(&f);
    ir_graph_free(g);
    free(leaves);
    if (error) {
        gradcheck_free(res, nres);
        return -1;
    }
    *results = res;
    *nresults = nres;
    return failures;
}

void gradcheck_free(GradcheckResult *results, int n)
{
    for (int i = 0; i < n; i++) {
        free(results[i].name);
        free(results[i].detach_at);
    }
    free(results);
}
