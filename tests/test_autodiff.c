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
#include "support.h"

/* Compiles a model and checks the gradients of its parameters and float inputs. */
static void check_model_text(const char *what, const char *text, int64_t size)
{
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "grad.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s does not compile:\n%s", what, d.out.data);
    GradcheckOptions o = {.seed = 3, .tolerance = 1e-6, .samples = 6, .sym_value = size, .wrt_inputs = true};
    GradcheckResult *res;
    int n;
    StrBuf err;
    sb_init(&err);
    int fails = gradcheck_run(m->graph, &o, &res, &n, &err);
    cr_assert_geq(fails, 0, "%s: %s", what, err.data);
    cr_expect_gt(n, 0, "%s: nothing was checked", what);
    for (int i = 0; i < n; i++) {
        cr_expect_leq(res[i].max_rel_error, 1e-6, "%s: gradient of %s has relative error %g", what, res[i].name,
                      res[i].max_rel_error);
        cr_expect_gt(res[i].checked, 0, "%s: no element of %s could be checked", what, res[i].name);
    }
    gradcheck_free(res, n);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

typedef struct {
    const char *name;
    const char *inputs; /* forward inputs */
    const char *body;   /* statements assigning y */
} OpCase;

/* Each case differentiates loss = sum(y * y / 2 + y) w.r.t. the inputs (and parameters). */
static const OpCase op_cases[] = {
    {"neg", "x: f32[3, 4]", "y = -x"},
    {"abs", "x: f32[3, 4]", "y = abs(x)"},
    {"exp", "x: f32[3, 4]", "y = exp(x)"},
    {"log", "x: f32[3, 4]", "y = log(exp(x) + 1)"},
    {"sqrt", "x: f32[3, 4]", "y = sqrt(x * x + 0.5)"},
    {"tanh", "x: f32[3, 4]", "y = tanh(x)"},
    {"sigmoid", "x: f32[3, 4]", "y = sigmoid(x)"},
    {"relu", "x: f32[3, 4]", "y = relu(x)"},
    {"cast", "x: f64[3, 4]", "y = f32(x) * 2"},
    {"add_broadcast", "x: f32[3, 4], z: f32[4]", "y = x + z"},
    {"sub_size1", "x: f32[3, 1], z: f32[1, 4]", "y = x - z"},
    {"mul_broadcast", "x: f32[2, 3, 4], z: f32[3, 1]", "y = x * z"},
    {"div", "x: f32[3, 4], z: f32[3, 4]", "y = x / (exp(z) + 0.5)"},
    {"div_scalar_left", "x: f32[3, 4]", "y = 2 / (x * x + 1)"},
    {"maximum", "x: f32[3, 4], z: f32[4]", "y = maximum(x, z)"},
    {"minimum", "x: f32[3, 4], z: f32[3, 4]", "y = minimum(x, z)"},
    {"pow", "x: f32[3, 4], z: f32[3, 4]", "y = pow(exp(x), z)"},
    {"pow_operator", "x: f32[3, 4]", "y = x ** 3"},
    {"where", "x: f32[3, 4], z: f32[3, 4]", "y = where(x > z, x * 2, z * 3)"},
    {"sum_axis", "x: f32[2, 3, 4]", "y = sum(x, axis = 1)"},
    {"sum_axes_keepdim", "x: f32[2, 3, 4]", "y = sum(x, axis = [0, 2], keepdim = true) * x"},
    {"mean_all", "x: f32[2, 3, 4]", "y = mean(x * x)"},
    {"max_axis", "x: f32[2, 3, 4]", "y = max(x, axis = -1)"},
    {"min_all", "x: f32[3, 4]", "y = min(x)"},
    {"var", "x: f32[3, 5]", "y = var(x, axis = 1)"},
    {"reshape", "x: f32[2, 6]", "y = reshape(x, 3, 4) * reshape(x, [3, -1])"},
    {"flatten", "x: f32[2, 3, 2]", "y = flatten(x)"},
    {"transpose", "x: f32[2, 3, 4]", "y = transpose(x, 0, 2)"},
    {"permute", "x: f32[2, 3, 4, 1]", "y = permute(x, 3, 1, 0, 2)"},
    {"unsqueeze_squeeze", "x: f32[3, 4]", "y = squeeze(unsqueeze(x, 1) * 2)"},
    {"slice", "x: f32[5, 7]", "y = x[1:4, 2:7:2]"},
    {"slice_index", "x: f32[5, 7]", "y = x[2, 1:6] + x[:, 6]"},
    {"split", "x: f32[3, 6]", "a, b = split(x, [2, 4], axis = 1)\n y = sum(a, axis = 1) * sum(b, axis = 1)"},
    {"chunk_concat", "x: f32[4, 6]", "a, b, c = chunk(x, 3)\n y = concat(c, a, b * 2, axis = 1)"},
    {"softmax", "x: f32[3, 5]", "y = softmax(x) * x"},
    {"log_softmax", "x: f32[3, 5]", "y = log_softmax(x, axis = 0)"},
    {"logsumexp", "x: f32[3, 5]", "y = logsumexp(x)"},
    {"gelu", "x: f32[3, 4]", "y = gelu(x)"},
    {"clamp", "x: f32[3, 4]", "y = clamp(x, -0.5, 0.7)"},
    {"matmul", "x: f32[3, 4], z: f32[4, 5]", "y = x @ z"},
    {"matmul_batched", "x: f32[2, 3, 4], z: f32[2, 4, 5]", "y = x @ z"},
    {"matmul_broadcast", "x: f32[2, 3, 4], z: f32[4, 5]", "y = x @ z"},
    {"matmul_batch_broadcast", "x: f32[3, 4], z: f32[2, 4, 5]", "y = x @ z"},
    {"matmul_vector", "x: f32[4], z: f32[4, 5]", "y = x @ z"},
    {"cross_entropy", "x: f32[4, 5], t: i64[4]", "y = cross_entropy(x, t)"},
    {"cross_entropy_3d", "x: f32[2, 3, 5], t: i32[2, 3]", "y = cross_entropy(x, t)"},
    {"mse", "x: f32[3, 4], z: f32[3, 4]", "y = mse(x, z)"},
    {"one_hot", "x: f32[4, 5], t: i64[4]", "y = x * one_hot(t, 5)"},
    {"symbolic_batch", "x: f32[B, 4]", "y = x * mean(x)"},
};

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
    snprintf(text, sizeof text,
             "model t\nforward(%s) -> y {\n %s\n}\nloss(y) = sum(y * y / 2 + y)\ntrain { batch = 3 }\n", c->inputs, c->body);
    check_model_text(c->name, text, 3);
}

typedef struct {
    const char *name;
    const char *members;
    const char *inputs;
    const char *body;
} ModuleCase;

static const ModuleCase module_cases[] = {
    {"Linear", "m = Linear(4, 3)", "x: f32[B, 4]", "y = m(x)"},
    {"Linear_nobias_3d", "m = Linear(4, 3, bias = false)", "x: f32[2, 3, 4]", "y = m(x)"},
    {"Conv2d", "m = Conv2d(2, 3, 3, padding = 1)", "x: f32[2, 2, 5, 5]", "y = m(x)"},
    {"Conv2d_stride_dilation", "m = Conv2d(1, 2, 2, stride = 2, dilation = 2)", "x: f32[1, 1, 7, 7]", "y = m(x)"},
    {"MaxPool2d", "m = MaxPool2d(2)", "x: f32[2, 2, 4, 4]", "y = m(x)"},
    {"MaxPool2d_pad_stride", "m = MaxPool2d(3, stride = 2, padding = 1)", "x: f32[1, 2, 5, 5]", "y = m(x)"},
    {"AvgPool2d", "m = AvgPool2d(2, padding = 1)", "x: f32[1, 2, 4, 4]", "y = m(x)"},
    {"BatchNorm2d", "m = BatchNorm2d(3)", "x: f32[2, 3, 2, 2]", "y = m(x)"},
    {"LayerNorm", "m = LayerNorm(5)", "x: f32[2, 3, 5]", "y = m(x)"},
    {"Embedding", "m = Embedding(7, 4)", "i: i32[2, 3], x: f32[4]", "y = m(i) * x"},
    {"Dropout", "m = Dropout(0.3)", "x: f32[4, 5]", "y = m(x)"},
    {"MLP", "m = MLP(4, 8)", "x: f32[2, 3, 4]", "y = m(x)"},
    {"CausalSelfAttention", "m = CausalSelfAttention(8, 2)", "x: f32[2, T, 8]", "y = m(x)"},
    {"tied_weights", "e = Embedding(6, 4)", "i: i32[2, 3]", "y = e(i) @ transpose(e.weight)"},
    {"checkpoint", "a = Linear(4, 4)\nb = Linear(4, 4)", "x: f32[2, 4]", "y = checkpoint(b(relu(a(x))))"},
    {"Parameter", "s = Parameter(4, init = normal(0, 1))", "x: f32[3, 4]", "y = x * s"},
};

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
    snprintf(text, sizeof text,
             "model t\ndim T <= 4\n%s\nforward(%s) -> y {\n %s\n}\nloss(y) = sum(y * y / 2 + y)\ntrain { batch = 2 }\n",
             c->members, c->inputs, c->body);
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
