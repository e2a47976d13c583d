/* test_simplify.c — each rewrite of passes/simplify.c on a small IR text, and that the
 * pass preserves meaning: the interpreter gives the same outputs before and after on the
 * training graphs of the reference models. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "support.h"

#define HEADER "kiln-ir 1\ngraph t mode=train\n"

/* Reads IR text, simplifies it, and returns the printed result without the header. */
static char *simplified(const char *body)
{
    StrBuf text;
    sb_init(&text);
    sb_printf(&text, HEADER "%s", body);
    Diag d;
    diag_init(&d, NULL);
    Graph *g = ir_read(text.data, text.len, "t.ir", &d);
    cr_assert(g, "bad test IR:\n%s", d.out.data);
    pass_simplify(g);
    StrBuf verr, out;
    sb_init(&verr);
    sb_init(&out);
    cr_assert_eq(ir_verify(g, &verr), 0, "%s", verr.data);
    ir_print(g, &out);
    char *body_start = strstr(out.data, "\n%");
    char *r = xstrdup(body_start ? body_start + 1 : out.data);
    sb_free(&out);
    sb_free(&verr);
    sb_free(&text);
    ir_graph_free(g);
    diag_free(&d);
    return r;
}

static void expect_simplified(const char *in, const char *want)
{
    char *got = simplified(in);
    cr_expect_str_eq(got, want, "simplify of\n%s\ngave\n%s\nexpected\n%s", in, got, want);
    free(got);
}

Test(rewrites, add_zero_and_mul_one)
{
    expect_simplified("%0 = input \"x\" : f32[4]\n%1 = const 0.0 : f32[4]\n%2 = add %0, %1 : f32[4]\n"
                      "%3 = const 1.0 : f32[4]\n%4 = mul %3, %2 : f32[4]\n%5 = div %4, %3 : f32[4]\noutput y = %5\n",
                      "%0 = input \"x\" : f32[4]\noutput y = %0\n");
}

Test(rewrites, mul_zero_is_kept_for_ieee)
{
    expect_simplified("%0 = input \"x\" : f32[4]\n%1 = const 0.0 : f32[4]\n%2 = mul %0, %1 : f32[4]\noutput y = %2\n",
                      "%0 = input \"x\" : f32[4]\n%1 = const 0.0 : f32[4]\n%2 = mul %0, %1 : f32[4]\noutput y = %2\n");
}

Test(rewrites, constant_folding)
{
    expect_simplified("%0 = const 2.0 : f32[]\n%1 = reshape %0 : f32[1, 1]\n%2 = expand %1 : f32[3, 4]\n"
                      "%3 = const 3.0 : f32[3, 4]\n%4 = mul %2, %3 : f32[3, 4]\n%5 = sqrt %4 : f32[3, 4]\n"
                      "%6 = cast %5 : i32[3, 4]\noutput y = %6\n",
                      "%0 = const 2.0 : i32[3, 4]\noutput y = %0\n");
}

Test(rewrites, double_negation_and_identity_casts)
{
    expect_simplified("%0 = input \"x\" : f32[4]\n%1 = neg %0 : f32[4]\n%2 = neg %1 : f32[4]\n%3 = cast %2 : f32[4]\n"
                      "%4 = expand %3 : f32[4]\noutput y = %4\n",
                      "%0 = input \"x\" : f32[4]\noutput y = %0\n");
}

Test(rewrites, reshape_chains)
{
    expect_simplified("%0 = input \"x\" : f32[2, 6]\n%1 = reshape %0 : f32[3, 4]\n%2 = reshape %1 : f32[12]\n"
                      "%3 = reshape %2 : f32[2, 6]\n%4 = reshape %0 : f32[4, 3]\n%5 = reshape %4 : f32[12]\n"
                      "output a = %3\noutput b = %5\n",
                      "%0 = input \"x\" : f32[2, 6]\n%1 = reshape %0 : f32[12]\noutput a = %0\noutput b = %1\n");
}

Test(rewrites, double_transpose)
{
    expect_simplified("%0 = input \"x\" : f32[2, 3, 4]\n%1 = permute %0 perm=[1, 0, 2] : f32[3, 2, 4]\n"
                      "%2 = permute %1 perm=[1, 0, 2] : f32[2, 3, 4]\n%3 = permute %1 perm=[2, 0, 1] : f32[4, 3, 2]\n"
                      "output a = %2\noutput b = %3\n",
                      "%0 = input \"x\" : f32[2, 3, 4]\n%1 = permute %0 perm=[2, 1, 0] : f32[4, 3, 2]\n"
                      "output a = %0\noutput b = %1\n");
}

Test(rewrites, transposed_product_reads_its_operands_transposed)
{
    /* one reader: (a @ b)^T = b^T @ a^T, and a^T^T folds to a */
    expect_simplified("%0 = input \"a\" : f32[2, 3]\n%1 = input \"b\" : f32[4, 3]\n%2 = permute %1 perm=[1, 0] : f32[3, 4]\n"
                      "%3 = matmul %0, %2 : f32[2, 4]\n%4 = permute %3 perm=[1, 0] : f32[4, 2]\noutput y = %4\n",
                      "%0 = input \"a\" : f32[2, 3]\n%1 = input \"b\" : f32[4, 3]\n%2 = permute %0 perm=[1, 0] : f32[3, 2]\n"
                      "%3 = matmul %1, %2 : f32[4, 2]\noutput y = %3\n");
    /* the product is also an output: kept, not computed twice */
    expect_simplified("%0 = input \"a\" : f32[2, 3]\n%1 = input \"b\" : f32[3, 4]\n%2 = matmul %0, %1 : f32[2, 4]\n"
                      "%3 = permute %2 perm=[1, 0] : f32[4, 2]\noutput y = %3\noutput z = %2\n",
                      "%0 = input \"a\" : f32[2, 3]\n%1 = input \"b\" : f32[3, 4]\n%2 = matmul %0, %1 : f32[2, 4]\n"
                      "%3 = permute %2 perm=[1, 0] : f32[4, 2]\noutput y = %3\noutput z = %2\n");
}

Test(rewrites, sum_of_adjacent_pads_is_a_concat)
{
    expect_simplified("%0 = input \"q\" : f32[2, 3]\n%1 = input \"k\" : f32[2, 3]\n%2 = input \"v\" : f32[2, 3]\n"
                      "%3 = pad %0 lo=[0, 0] hi=[0, 6] value=0.0 : f32[2, 9]\n%4 = pad %1 lo=[0, 3] hi=[0, 3] value=0.0 : f32[2, 9]\n"
                      "%5 = pad %2 lo=[0, 6] hi=[0, 0] value=0.0 : f32[2, 9]\n%6 = add %5, %4 : f32[2, 9]\n"
                      "%7 = add %6, %3 : f32[2, 9]\noutput y = %7\n",
                      "%0 = input \"q\" : f32[2, 3]\n%1 = input \"k\" : f32[2, 3]\n%2 = input \"v\" : f32[2, 3]\n"
                      "%3 = concat %0, %1, %2 axis=1 : f32[2, 9]\noutput y = %3\n");
    /* a gap between the ranges, or a non-zero fill: left alone */
    const char *gap = "%0 = input \"q\" : f32[2, 3]\n%1 = input \"k\" : f32[2, 3]\n"
                      "%2 = pad %0 lo=[0, 0] hi=[0, 6] value=0.0 : f32[2, 9]\n%3 = pad %1 lo=[0, 6] hi=[0, 0] value=0.0 : f32[2, 9]\n"
                      "%4 = add %2, %3 : f32[2, 9]\noutput y = %4\n";
    expect_simplified(gap, gap);
    const char *fill = "%0 = input \"q\" : f32[2, 3]\n%1 = input \"k\" : f32[2, 3]\n"
                       "%2 = pad %0 lo=[0, 0] hi=[0, 3] value=1.0 : f32[2, 6]\n%3 = pad %1 lo=[0, 3] hi=[0, 0] value=0.0 : f32[2, 6]\n"
                       "%4 = add %2, %3 : f32[2, 6]\noutput y = %4\n";
    expect_simplified(fill, fill);
}

Test(rewrites, common_subexpressions)
{
    expect_simplified("%0 = input \"x\" : f32[4]\n%1 = exp %0 : f32[4]\n%2 = exp %0 : f32[4]\n%3 = add %1, %2 : f32[4]\n"
                      "%4 = exp %0 : f32[4]\n%5 = add %1, %4 : f32[4]\n%6 = mul %3, %5 : f32[4]\noutput y = %6\n",
                      "%0 = input \"x\" : f32[4]\n%1 = exp %0 : f32[4]\n%2 = add %1, %1 : f32[4]\n%3 = mul %2, %2 : f32[4]\n"
                      "output y = %3\n");
}

Test(rewrites, dead_nodes_go_but_inputs_and_params_stay)
{
    expect_simplified("%0 = input \"x\" : f32[4]\n%1 = param \"w\" init=zeros trainable : f32[4]\n%2 = tanh %0 : f32[4]\n"
                      "%3 = sigmoid %0 : f32[4]\noutput y = %3\n",
                      "%0 = input \"x\" : f32[4]\n%1 = param \"w\" init=zeros trainable : f32[4]\n%2 = sigmoid %0 : f32[4]\n"
                      "output y = %2\n");
}

/* Training graphs before and after simplify compute the same outputs. */
static void check_preserved(const char *rel)
{
    Diag d;
    Model *m = support_compile_file(rel, MODE_TRAIN, &d);
    StrBuf err;
    sb_init(&err);
    AutodiffOptions o = {0};
    cr_assert_eq(pass_autodiff(m->graph, &o, &err), 0, "%s", err.data);
    Graph *before = m->graph, *after = ir_graph_clone(before);
    pass_simplify(after);
    cr_expect_lt(after->nnodes, before->nnodes, "%s: simplify removed nothing", rel);
    cr_assert_eq(before->noutputs, after->noutputs);
    Interp ib, ia;
    interp_init(&ib, before);
    interp_init(&ia, after);
    for (int i = 0; i < before->nsyms; i++) {
        int64_t v = before->syms[i].max < 3 ? before->syms[i].max : 3;
        interp_set_symbol(&ib, before->syms[i].name, v);
        interp_set_symbol(&ia, before->syms[i].name, v);
    }
    for (NodeId i = 0; i < before->nnodes; i++) {
        if (before->nodes[i].op != OP_INPUT) continue;
        const ITensor *t = NULL;
        int64_t n = 1;
        for (int k = 0; k < before->nodes[i].shape.rank; k++) n *= ir_dim_eval(before->nodes[i].shape.d[k], ib.symvals);
        (void)t;
        double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t e = 0; e < n; e++) v[e] = (double)((e * 7 + i) % 10); /* valid labels and tokens */
        interp_set(&ib, i, v);
        interp_set(&ia, ir_find_named(after, OP_INPUT, ir_node_name(before, i)), v);
        free(v);
    }
    interp_init_params(&ib, 5);
    interp_init_params(&ia, 5);
    cr_assert_eq(interp_run(&ib), 0, "%s", ib.err.data);
    cr_assert_eq(interp_run(&ia), 0, "%s", ia.err.data);
    for (int32_t k = 0; k < before->noutputs; k++) {
        const ITensor *x = interp_value(&ib, before->outputs[k].node), *y = interp_value(&ia, after->outputs[k].node);
        cr_assert_eq(x->n, y->n);
        for (int64_t e = 0; e < x->n; e++)
            cr_expect(fabs(x->data[e] - y->data[e]) <= 1e-12 * fmax(1, fabs(x->data[e])), "%s: output %s[%lld]: %g vs %g", rel,
                      ir_str(before, before->outputs[k].name), (long long)e, x->data[e], y->data[e]);
    }
    interp_free(&ib);
    interp_free(&ia);
    ir_graph_free(after);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

Test(preserved, mlp) { check_preserved("models/mlp.kiln"); }
Test(preserved, cnn) { check_preserved("models/cnn.kiln"); }
Test(preserved, gpt) { check_preserved("models/gpt.kiln"); }
