/* test_autodiff.c — gradients of every differentiable primitive op, every built-in module
 * and function, and the three reference models, checked against central finite
 * differences (passes/gradcheck.c) in double precision; the documented choices at
 * non-differentiable points; and that an op without a rule is an error, never zero. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "op_cases.h"
#include "support.h"

/* Compiles a model and checks the gradients of its parameters and float inputs, at a seed
 * and with up to `samples` elements of every tensor. */
static void check_model_text_at(const char *what, const char *text, int64_t size, uint64_t seed, int samples)
{
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "grad.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s does not compile:\n%s", what, d.out.data);
    GradcheckOptions o = {.seed = seed, .tolerance = 1e-6, .samples = samples, .sym_value = size, .wrt_inputs = true};
    GradcheckResult *res;
    int n;
    StrBuf err;
    sb_init(&err);
    int fails = gradcheck_run(m->graph, &o, &res, &n, &err);
    cr_assert_geq(fails, 0, "%s: %s", what, err.data);
    cr_expect_gt(n, 0, "%s: nothing was checked", what);
    for (int i = 0; i < n; i++) {
        cr_expect_neq(res[i].verdict, GRADCHECK_FAIL, "%s (seed %llu): gradient of %s fails (relative error %g, %g of the allowed)",
                      what, (unsigned long long)seed, res[i].name, res[i].max_rel_error, res[i].worst_ratio);
        cr_expect_gt(res[i].checked, 0, "%s: no element of %s could be checked", what, res[i].name);
    }
    gradcheck_free(res, n);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

/* Six elements of every tensor; two in the sanitizer build, whose verdict is on memory: the
 * same code runs for each element (support.h, SUPPORT_REPEAT_RUNS). */
static void check_model_text(const char *what, const char *text, int64_t size)
{
    check_model_text_at(what, text, size, 3, SUPPORT_REPEAT_RUNS ? 6 : 2);
}

/* Issue 20's functions, modules and losses: every element of every tensor, at four seeds. */
static const char *const layer_cases[] = {
    "gelu", "gelu_tanh", "erf", "sin_cos", "silu", "leaky_relu", "elu", "softplus", "mish", "hardswish", "floor_divide",
    "int_floor_divide", "zeros_ones_full", "like", "tril_triu", "masked_fill", "expand", "flip", "stack", "stack_last", "methods",
    "sdpa", "cumsum", "rotary", "gather_dim", "functional_layers", "functional_pools", "einsum", "interpolate", "topk", "std",
    "cross_entropy_options", "cross_entropy_axis1", "nll_loss", "class_weights", "kl_div", "regression_losses", "bce_with_logits",
    "Sequential", "activation_modules", "Flatten", "Conv1d", "Conv1d_stride_dilation_nobias", "Conv2d_tuples", "Conv2d_groups_same",
    "Conv2d_depthwise_same_even", "Conv1d_groups_valid", "LayerNorm_dims", "MultiheadAttention", "MultiheadAttention_seq_first",
    "LSTM", "GRU", "LSTM_bidirectional", "GRU_bidirectional", "ConvTranspose2d", "ConvTranspose2d_dilation_nobias", "MaxPool2d_options", "AvgPool2d_options", "Upsample",
    "EmbeddingBag", "Embedding_padding_idx", "EmbeddingBag_padding_idx", "BatchNorm1d", "BatchNorm1d_3d", "GroupNorm", "RMSNorm", "RMSNorm_eps", "AdaptiveAvgPool2d_1",
    "AdaptiveAvgPool2d_divisible",
};
#define NLAYER_CASES (sizeof layer_cases / sizeof layer_cases[0])
static int layer_index[NLAYER_CASES];

ParameterizedTestParameters(layers, every_element_at_four_seeds)
{
    for (size_t i = 0; i < NLAYER_CASES; i++) layer_index[i] = (int)i;
    return cr_make_param_array(int, layer_index, NLAYER_CASES);
}

ParameterizedTest(int *ci, layers, every_element_at_four_seeds)
{
    const char *name = layer_cases[*ci];
    char text[2048];
    text[0] = 0;
    for (size_t i = 0; i < sizeof op_cases / sizeof op_cases[0]; i++)
        if (!strcmp(op_cases[i].name, name)) op_case_text(text, sizeof text, &op_cases[i]);
    for (size_t i = 0; i < sizeof module_cases / sizeof module_cases[0]; i++)
        if (!strcmp(module_cases[i].name, name)) module_case_text(text, sizeof text, &module_cases[i]);
    cr_assert(text[0], "no op or module case named %s", name);
    static const uint64_t seeds[] = {1, 2, 7, 42};
    for (int s = 0; s < (SUPPORT_REPEAT_RUNS ? 4 : 1); s++) check_model_text_at(name, text, 3, seeds[s], 1 << 20); /* support.h */
}

/* Parameters are indices: Criterion's workers do not share the parent's pointers. */
#define NOPS (sizeof op_cases / sizeof op_cases[0])
static int op_index[NOPS];

ParameterizedTestParameters(ops, gradients)
{
    for (size_t i = 0; i < NOPS; i++) op_index[i] = (int)i;
    return cr_make_param_array(int, op_index, NOPS);
}

ParameterizedTest(int *ci, ops, gradients)
{
    const OpCase *c = &op_cases[*ci];
    char text[2048];
    op_case_text(text, sizeof text, c);
    check_model_text(c->name, text, 3);
}

#define NMODULES (sizeof module_cases / sizeof module_cases[0])
static int module_index[NMODULES];

ParameterizedTestParameters(modules, gradients)
{
    for (size_t i = 0; i < NMODULES; i++) module_index[i] = (int)i;
    return cr_make_param_array(int, module_index, NMODULES);
}

ParameterizedTest(int *ci, modules, gradients)
{
    const ModuleCase *c = &module_cases[*ci];
    char text[2048];
    module_case_text(text, sizeof text, c);
    check_model_text(c->name, text, 3);
}

/* The reference models: every parameter within 1e-6. */
static void check_model_file(const char *rel)
{
    size_t len;
    char *text = support_read(rel, &len);
    cr_assert(text);
    char *z = xstrndup(text, len);
    check_model_text(rel, z, 2);
    free(z);
    free(text);
}

Test(models, mlp_gradcheck) { check_model_file("models/mlp.kiln"); }
Test(models, cnn_gradcheck, .timeout = 300) { check_model_file("models/cnn.kiln"); }
Test(models, gpt_gradcheck, .timeout = 300) { check_model_file("models/gpt.kiln"); }
Test(models, llama_gradcheck, .timeout = 300) { check_model_file("models/llama.kiln"); }

/* ---- the graph autodiff builds ---- */

static Graph *differentiate(const char *text)
{
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "t.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s", d.out.data);
    Graph *g = ir_graph_clone(m->graph);
    StrBuf err;
    sb_init(&err);
    AutodiffOptions o = {.wrt_inputs = false};
    cr_assert_eq(pass_autodiff(g, &o, &err), 0, "%s", err.data);
    StrBuf verr;
    sb_init(&verr);
    cr_assert_eq(ir_verify(g, &verr), 0, "%s", verr.data);
    sb_free(&verr);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
    return g;
}

static NodeId grad_of(const Graph *g, const char *name)
{
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_GRAD && !strcmp(ir_str(g, g->outputs[k].name), name)) return g->outputs[k].node;
    return IR_NONE;
}

Test(autodiff, every_parameter_gets_a_gradient_unused_ones_zero)
{
    Graph *g = differentiate("model t\na = Linear(3, 2)\nunused = Linear(3, 3)\n"
                             "forward(x: f32[4, 3]) -> y { y = a(x) }\nloss(y) = mean(y * y)\n");
    NodeId gu = grad_of(g, "unused.weight");
    cr_assert_neq(gu, IR_NONE);
    cr_expect_eq(g->nodes[gu].op, OP_CONST);
    cr_expect_eq(g->nodes[gu].fattr[0], 0.0);
    cr_expect_neq(grad_of(g, "a.weight"), IR_NONE);
    cr_expect_neq(grad_of(g, "a.bias"), IR_NONE);
    ir_graph_free(g);
}

Test(autodiff, integer_and_buffer_values_get_no_gradient)
{
    Graph *g = differentiate("model t\nbn = BatchNorm2d(2)\nforward(x: f32[2, 2, 2, 2]) -> y { y = bn(x) }\n"
                             "loss(y) = mean(y * y)\n");
    cr_expect_eq(grad_of(g, "bn.running_mean"), IR_NONE);
    cr_expect_eq(grad_of(g, "bn.num_batches_tracked"), IR_NONE);
    cr_expect_neq(grad_of(g, "bn.weight"), IR_NONE);
    ir_graph_free(g);
}

Test(autodiff, needs_a_loss)
{
    Diag d;
    diag_init(&d, NULL);
    const char *text = "model t\na = Linear(3, 2)\nforward(x: f32[4, 3]) -> y { y = a(x) }\n";
    Model *m = frontend_compile(&d, "noloss.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m);
    StrBuf err;
    sb_init(&err);
    AutodiffOptions o = {0};
    cr_expect_eq(pass_autodiff(m->graph, &o, &err), -1);
    cr_expect(strstr(err.data, "no loss"), "%s", err.data);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

/* Documented choices at non-differentiable points, checked exactly. */
static double grad_at(const char *body, double xval, const char *name)
{
    char text[1024];
    snprintf(text, sizeof text, "model t\nforward(x: f32[1]) -> y { %s }\nloss(y) = sum(y)\n", body);
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "t.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s", d.out.data);
    Graph *g = m->graph;
    StrBuf err;
    sb_init(&err);
    AutodiffOptions o = {.wrt_inputs = true};
    cr_assert_eq(pass_autodiff(g, &o, &err), 0, "%s", err.data);
    Interp ip;
    interp_init(&ip, g);
    interp_set(&ip, ir_find_named(g, OP_INPUT, "x"), &xval);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    double v = interp_value(&ip, grad_of(g, name))->data[0];
    interp_free(&ip);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
    return v;
}

Test(autodiff, choices_at_kinks)
{
    cr_expect_eq(grad_at("y = relu(x)", 0.0, "x"), 0.0);            /* relu'(0) = 0 */
    cr_expect_eq(grad_at("y = abs(x)", 0.0, "x"), 0.0);             /* abs'(0) = 0 */
    cr_expect_eq(grad_at("y = maximum(x, x * 0 + 1)", 1.0, "x"), 0.5); /* ties split */
    cr_expect_eq(grad_at("y = max(concat(x, x * 1, axis = 0))", 2.0, "x"), 1.0); /* split among tied maxima, summed */
}
