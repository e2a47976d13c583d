/* test_gradcheck.c — kiln gradcheck's verdicts (passes/gradcheck.c): a gradient that is
 * exactly zero is reported as such, not failed; samples near kinks never decide the
 * verdict (strided, padded max pooling after ReLUs passes at every seed); detach is
 * reported and held fixed; and a genuinely wrong gradient, made by corrupting a
 * vector-Jacobian rule in the training graph, still FAILS at every seed. The models are
 * in tests/gradcheck/. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "support.h"

typedef struct {
    Diag d;
    Model *m;
    GradcheckResult *res;
    int n;
    int fails;
} Run;

/* The training graph gradcheck_run would build itself: autodiff, then simplify. */
static Graph *training_graph(const Graph *forward)
{
    Graph *g = ir_graph_clone(forward);
    StrBuf err;
    sb_init(&err);
    AutodiffOptions ao = {.wrt_inputs = false};
    cr_assert_eq(pass_autodiff(g, &ao, &err), 0, "%s", err.data);
    pass_simplify(g);
    sb_free(&err);
    return g;
}

/* Checks model file `rel` at a seed, size and sample count; with corrupt, its training
 * graph is built here and changed by corrupt before the check. */
static void run(Run *r, const char *rel, uint64_t seed, int64_t size, int samples, void (*corrupt)(Graph *))
{
    memset(r, 0, sizeof *r);
    r->m = support_compile_file(rel, MODE_TRAIN, &r->d);
    Graph *train = NULL;
    if (corrupt) {
        train = training_graph(r->m->graph);
        corrupt(train);
    }
    GradcheckOptions o = {.seed = seed, .tolerance = 1e-6, .samples = samples, .sym_value = size, .training = train};
    StrBuf err;
    sb_init(&err);
    r->fails = gradcheck_run(r->m->graph, &o, &r->res, &r->n, &err);
    cr_assert_geq(r->fails, 0, "%s: %s", rel, err.data);
    sb_free(&err);
    if (train) ir_graph_free(train);
}

static void run_free(Run *r)
{
    gradcheck_free(r->res, r->n);
    frontend_model_free(r->m);
    diag_free(&r->d);
}

static const GradcheckResult *result(const Run *r, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->res[i].name, name)) return &r->res[i];
    cr_assert_fail("no result for %s", name);
    return NULL;
}

/* `kiln gradcheck FILE` on a model of tests/gradcheck/; returns its exit status. */
static int run_cli(const char *file, StrBuf *out)
{
    char args[4200];
    snprintf(args, sizeof args, "gradcheck '%s'", support_path(file));
    return support_run_kiln(args, out);
}

static const char *verdict_name(GradcheckVerdict v)
{
    static const char *names[] = {"pass", "FAIL", "zero", "unchecked"};
    return names[v];
}

#define EXPECT_VERDICT(r, name, want, seed)                                                                          \
    do {                                                                                                             \
        const GradcheckResult *res_ = result(r, name);                                                               \
        cr_expect_eq(res_->verdict, want, "seed %d: %s is %s (rel error %g, %g of the allowed), expected %s",       \
                     (int)(seed), name, verdict_name(res_->verdict), res_->max_rel_error, res_->worst_ratio,         \
                     verdict_name(want));                                                                            \
    } while (0)

/* ---- gradients that are exactly zero ---- */

Test(gradcheck, zero_gradient_is_reported_not_failed)
{
    for (uint64_t seed = 0; seed < 3; seed++) {
        Run r;
        run(&r, "tests/gradcheck/zero_grad.kiln", seed, 2, 8, NULL);
        cr_expect_eq(r.fails, 0, "seed %d: %d tensors fail", (int)seed, r.fails);
        EXPECT_VERDICT(&r, "conv.bias", GRADCHECK_ZERO, seed);
        EXPECT_VERDICT(&r, "shift.weight", GRADCHECK_ZERO, seed);
        EXPECT_VERDICT(&r, "shift.bias", GRADCHECK_ZERO, seed);
        EXPECT_VERDICT(&r, "conv.weight", GRADCHECK_PASS, seed);
        EXPECT_VERDICT(&r, "bn.bias", GRADCHECK_PASS, seed);
        EXPECT_VERDICT(&r, "fc.bias", GRADCHECK_PASS, seed);
        run_free(&r);
    }
}

Test(gradcheck, zero_gradient_cli)
{
    StrBuf out;
    sb_init(&out);
    int rc = run_cli("tests/gradcheck/zero_grad.kiln", &out);
    cr_expect_eq(rc, 0, "%s", out.data);
    cr_expect(strstr(out.data, "conv.bias") && strstr(out.data, "gradient identically zero"), "%s", out.data);
    cr_expect(strstr(out.data, "atol + rtol * |numeric|"), "%s", out.data);
    sb_free(&out);
}

/* Replaces a gradient output by a constant of its shape, or scales it. */
static void set_grad(Graph *g, const char *name, double value, bool scale)
{
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD || strcmp(ir_str(g, g->outputs[k].name), name)) continue;
        StrBuf err;
        sb_init(&err);
        IrBuilder b = {.g = g, .err = &err};
        NodeId old = g->outputs[k].node;
        Shape s = g->nodes[old].shape;
        DType t = (DType)g->nodes[old].dtype;
        NodeId v = scale ? ir_b_binary(&b, OP_MUL, old, ir_b_const(&b, value, t)) : ir_b_full(&b, value, t, &s);
        cr_assert_neq(v, IR_NONE, "%s", err.data);
        g->outputs[k].node = v;
        sb_free(&err);
        return;
    }
    cr_assert_fail("no gradient %s", name);
}

static void zero_grad_wrong(Graph *g)
{
    set_grad(g, "conv.bias", 1e-6, false); /* a small gradient where the true one is zero */
    set_grad(g, "fc.bias", 0, false);      /* a zero gradient where the true one is not */
}

Test(gradcheck, wrong_zero_or_nonzero_gradient_fails)
{
    for (uint64_t seed = 0; seed < 3; seed++) {
        Run r;
        run(&r, "tests/gradcheck/zero_grad.kiln", seed, 2, 8, zero_grad_wrong);
        cr_expect_eq(r.fails, 2, "seed %d: %d tensors fail, expected 2", (int)seed, r.fails);
        EXPECT_VERDICT(&r, "conv.bias", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "fc.bias", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "shift.bias", GRADCHECK_ZERO, seed);
        run_free(&r);
    }
}

/* ---- kinks ---- */

/* With a batch of 32 every conv1 weight moves thousands of relu inputs and pooling
 * winners; some lie within any fixed step of a kink. The verdict must hold at every seed. */
Test(gradcheck, pooling_and_relu_pass_at_every_seed, .timeout = 600)
{
    for (uint64_t seed = 0; seed <= (SUPPORT_REPEAT_RUNS ? 5 : 1); seed++) { /* sanitizer build: two (support.h) */
        Run r;
        run(&r, "tests/gradcheck/pool_relu.kiln", seed, 32, 16, NULL);
        cr_expect_eq(r.fails, 0, "seed %d: %d tensors fail", (int)seed, r.fails);
        for (int i = 0; i < r.n; i++) {
            EXPECT_VERDICT(&r, r.res[i].name, GRADCHECK_PASS, seed);
            int64_t want = r.res[i].numel < 16 ? r.res[i].numel : 16;
            cr_expect_eq(r.res[i].checked, want, "seed %d: %s: %lld of %lld elements checked", (int)seed,
                         r.res[i].name, (long long)r.res[i].checked, (long long)want);
        }
        run_free(&r);
    }
}

/* Corrupted vector-Jacobian rules in the training graph. Autodiff's relu rule is
 * where(x > 0, g, 0); with `x != 0` it lets gradient through negative inputs (which
 * matters where a pooling window is all zeros after relu, hence for conv1). Max
 * pooling's rule (reduce_max's with its `first` attribute) is where(first, g, 0), `first`
 * the one-hot mask eq(cand, max(cand)) of the window's first maximum, cand its elements'
 * negated positions where they equal the maximum (a chain ending in `- iota`); with the
 * where's operands swapped it sends the gradient to every element of the window but that
 * one. */
static void corrupt_ops(Graph *g, Op from, Op to, bool float_operands)
{
    int changed = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != from || ir_dtype_is_float((DType)g->nodes[ir_input(g, i, 0)].dtype) != float_operands) continue;
        n->op = (uint16_t)to;
        changed++;
    }
    cr_assert_gt(changed, 0, "nothing to corrupt");
}
static void relu_rule_wrong(Graph *g) { corrupt_ops(g, OP_GT, OP_NE, true); }
static void maxpool_rule_wrong(Graph *g)
{
    NodeId loss = IR_NONE;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_LOSS) loss = g->outputs[k].node;
    int changed = 0;
    for (NodeId i = loss + 1; loss != IR_NONE && i < g->nnodes; i++) { /* the backward pass */
        const NodeId c = g->nodes[i].op == OP_WHERE ? ir_input(g, i, 0) : IR_NONE;
        const NodeId cand = c == IR_NONE || g->nodes[c].op != OP_EQ ? IR_NONE : ir_input(g, c, 0);
        if (cand == IR_NONE || g->nodes[cand].op != OP_SUB || g->nodes[ir_input(g, cand, 1)].op != OP_IOTA) continue;
        NodeId *in = &g->operands[g->nodes[i].inputs];
        const NodeId t = in[1];
        in[1] = in[2];
        in[2] = t;
        changed++;
    }
    cr_assert_gt(changed, 0, "no max pooling gradient to corrupt");
}
static void conv1_slightly_wrong(Graph *g) { set_grad(g, "conv1.weight", 1 + 1e-4, true); }

Test(gradcheck, wrong_rules_fail_at_every_seed, .timeout = 600)
{
    for (uint64_t seed = 0; seed <= (SUPPORT_REPEAT_RUNS ? 5 : 1); seed++) { /* sanitizer build: two (support.h) */
        Run r;
        run(&r, "tests/gradcheck/pool_relu.kiln", seed, 8, 8, relu_rule_wrong);
        EXPECT_VERDICT(&r, "conv1.weight", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "fc.bias", GRADCHECK_PASS, seed);
        run_free(&r);
        run(&r, "tests/gradcheck/pool_relu.kiln", seed, 8, 8, maxpool_rule_wrong);
        EXPECT_VERDICT(&r, "conv1.weight", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "conv1.bias", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "fc.weight", GRADCHECK_PASS, seed);
        run_free(&r);
        run(&r, "tests/gradcheck/pool_relu.kiln", seed, 8, 8, conv1_slightly_wrong);
        cr_expect_eq(r.fails, 1, "seed %d: %d tensors fail, expected 1", (int)seed, r.fails);
        EXPECT_VERDICT(&r, "conv1.weight", GRADCHECK_FAIL, seed);
        run_free(&r);
    }
}

/* max(x, dim), min(x, dim), amax, amin, a whole-tensor max() and max pooling's three
 * lowerings pass; sending the first maximum's gradient to the other elements fails. */
Test(gradcheck, extremes_pass_and_a_wrong_first_maximum_fails, .timeout = 300)
{
    for (uint64_t seed = 0; seed < 3; seed++) {
        Run r;
        run(&r, "tests/gradcheck/extremes.kiln", seed, 3, 48, NULL);
        cr_expect_eq(r.fails, 0, "seed %d: %d tensors fail", (int)seed, r.fails);
        for (int i = 0; i < r.n; i++) EXPECT_VERDICT(&r, r.res[i].name, GRADCHECK_PASS, seed);
        run_free(&r);
        run(&r, "tests/gradcheck/extremes.kiln", seed, 3, 48, maxpool_rule_wrong);
        EXPECT_VERDICT(&r, "fc.weight", GRADCHECK_FAIL, seed);
        EXPECT_VERDICT(&r, "gc.weight", GRADCHECK_PASS, seed);
        run_free(&r);
    }
}

/* Every element of ln.bias sits on relu's kink: nothing can be compared, and it says so. */
Test(gradcheck, tensor_entirely_at_kinks_is_not_checked)
{
    Run r;
    run(&r, "tests/gradcheck/all_kinks.kiln", 0, 2, 8, NULL);
    cr_expect_eq(r.fails, 0);
    const GradcheckResult *b = result(&r, "ln.bias");
    cr_expect_eq(b->verdict, GRADCHECK_UNCHECKED, "ln.bias is %s", verdict_name(b->verdict));
    cr_expect_eq(b->checked, 0);
    cr_expect_eq(b->skipped, 3);
    cr_expect(b->exhausted);
    EXPECT_VERDICT(&r, "fc.weight", GRADCHECK_PASS, 0);
    run_free(&r);

    StrBuf out;
    sb_init(&out);
    int rc = run_cli("tests/gradcheck/all_kinks.kiln", &out);
    cr_expect_eq(rc, 0, "%s", out.data);
    cr_expect(strstr(out.data, "not checked") && strstr(out.data, "every element was tried"), "%s", out.data);
    sb_free(&out);
}

/* ---- detach ---- */

Test(gradcheck, detach_is_reported_and_held_fixed)
{
    Run r;
    run(&r, "tests/gradcheck/detach.kiln", 0, 2, 8, NULL);
    cr_expect_eq(r.fails, 0, "%d tensors fail", r.fails);
    EXPECT_VERDICT(&r, "b.weight", GRADCHECK_PASS, 0);
    EXPECT_VERDICT(&r, "c.weight", GRADCHECK_ZERO, 0);
    const char *at[][2] = {{"b.weight", ":11:16"}, {"b.bias", ":11:16"}, {"c.weight", ":11:38"}, {"c.bias", ":11:38"}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        const GradcheckResult *x = result(&r, at[i][0]);
        cr_expect(x->detach_at && strstr(x->detach_at, at[i][1]), "%s: detach at %s, expected %s", at[i][0],
                  x->detach_at ? x->detach_at : "(none)", at[i][1]);
    }
    /* cross_entropy's detached max shift cancels: it cuts nothing. */
    cr_expect_null(result(&r, "a.weight")->detach_at, "a.weight: %s", result(&r, "a.weight")->detach_at);
    cr_expect_null(result(&r, "a.bias")->detach_at);
    run_free(&r);

    StrBuf out;
    sb_init(&out);
    int rc = run_cli("tests/gradcheck/detach.kiln", &out);
    cr_expect_eq(rc, 0, "%s", out.data);
    cr_expect(strstr(out.data, "cut by detach at ") && strstr(out.data, "detach.kiln:11:16"), "%s", out.data);
    sb_free(&out);
}
