/* test_parity.c — issue 20's functions, modules and losses against PyTorch itself.
 *
 * Each case below is a small model; Kiln computes, in its reference interpreter (whose
 * every kernel the generated C is checked against by test_codegen.c), the forward output y,
 * the loss sum(y * y / 2 + y) (or the case's own loss), the gradients of every trainable
 * parameter and float input, the buffers' updates, and the loss after one SGD step
 * (lr = 0.1) on the parameters. The values, the weights under their state_dict names and the
 * inputs go to a JSON file that tests/parity/torch_parity.py reads: it builds the same
 * module with torch.nn / torch.nn.functional, loads the weights with
 * load_state_dict(strict = True) (so the parameter names and layouts are PyTorch's), and
 * compares everything in float32 within a relative 1e-5 (of each tensor's largest
 * element). Without PyTorch (Debian's python3-torch) the test is skipped with a message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "support.h"

typedef struct {
    const char *name;    /* the key of its reference in torch_parity.py */
    const char *members; /* module members, or "" */
    const char *inputs;  /* forward inputs */
    const char *body;    /* statements assigning y */
    bool cubic;          /* loss sum(y^3 / 3 + y^2 + y), not sum(y^2 / 2 + y): a normalisation's input
                            gradient of the latter is zero up to rounding (it is linear in y) */
} ParityCase;

static const ParityCase cases[] = {
    /* functions */
    {"gelu", "", "x: f32[3, 5]", "y = gelu(x)", false},
    {"gelu_tanh", "", "x: f32[3, 5]", "y = gelu(x, approximate = \"tanh\")", false},
    {"silu", "", "x: f32[3, 5]", "y = silu(x)", false},
    {"leaky_relu", "", "x: f32[3, 5]", "y = leaky_relu(x, 0.2)", false},
    {"elu", "", "x: f32[3, 5]", "y = elu(x, alpha = 0.7)", false},
    {"softplus", "", "x: f32[3, 5]", "y = softplus(x * 3, beta = 2, threshold = 3)", false},
    {"mish", "", "x: f32[3, 5]", "y = mish(x)", false},
    {"hardswish", "", "x: f32[3, 5]", "y = hardswish(x * 4) + hardsigmoid(x * 4)", false},
    {"erf_sin_cos", "", "x: f32[3, 5]", "y = erf(x) + sin(x) * cos(x * 2)", false},
    {"floor_divide", "", "x: f32[3, 5]", "y = x * 5 // 2 + (x * 5) % 1.5 + x", false},
    {"tril_triu", "", "x: f32[2, 3, 4]", "y = tril(x, 1) + triu(x, -1) * 2", false},
    {"masked_fill", "", "x: f32[3, 5]", "y = masked_fill(x, x > 0.3, -2.0)", false},
    {"expand_flip_stack", "", "x: f32[3, 1]", "y = stack([expand(x, 2, 3, 4), flip(expand(x, 2, 3, 4), [1, 2])], dim = 1)",
     false},
    {"std", "", "x: f32[3, 5]", "y = std(x, 1, keepdim = true) * x + std(x, unbiased = false)", false},
    {"methods", "", "x: f32[3, 5]",
     "y = x.view(x.shape[0], -1).softmax(-1) * x.reshape(3, 5).transpose(0, 1).mean(1).sum() + x.size(1) + x.float().flip(1)", false},
    {"sdpa", "", "x: f32[2, 3, 4], z: f32[2, 5, 4]",
     "y = scaled_dot_product_attention(x, z, z * 2) + scaled_dot_product_attention(x, x, x, is_causal = true, scale = 0.3)"
     " + scaled_dot_product_attention(x, z, z, attn_mask = tril(ones(3, 5)) > 0)",
     false},
    {"cumsum_gather", "", "x: f32[3, 4], t: i64[3, 2]", "y = cumsum(x, 1) * x + gather(x, 1, t).sum() + cumsum(x, 0)", false},
    {"rotary", "", "x: f32[2, 3, 5, 4]", "y = rotary(x) + rotary(x * 2, base = 100)", false},
    {"functional_layers", "", "x: f32[2, 2, 4, 4], w: f32[3, 4], z: f32[3]",
     "y = linear(x, w, z).sum() + layer_norm(x, [4, 4]) + layer_norm(x, 4, weight = x[0, 0, 0], bias = x[0, 0, 1])"
     " + max_pool2d(x, 2).sum() + avg_pool2d(x, 3, stride = 1, padding = 1)",
     false},
    {"einsum", "", "x: f32[2, 3, 4], z: f32[2, 4, 5]",
     "y = einsum(\"bij,bjk->bik\", x, z) + einsum(\"bij->bi\", x).sum() + einsum(\"bij,bjk\", x, z).sum() * einsum(\"ijk->kji\", x).mean()"
     " + einsum(\"bij, bij -> b\", x, x).sum() + einsum(\"i,j->ij\", x[0, 0], z[0, 0]).sum()",
     false},
    {"interpolate", "", "x: f32[2, 3, 4, 5]",
     "y = interpolate(x, scale_factor = 2).sum() + interpolate(x, size = [3, 7], mode = \"bilinear\")"
     " + interpolate(x, size = [3, 7], mode = \"bilinear\", align_corners = true) + interpolate(x, scale_factor = [0.75, 1.5]).sum()",
     false},
    {"topk", "", "x: f32[3, 5]", "v, i = topk(x, 2)\n w, j = topk(x, 3, dim = 0, largest = false)\n y = v.sum(1) * f32(i[:, 0]) + w.sum(0)[0:3] * f32(j[0, 0:3])",
     false},
    {"functional_pools", "", "x: f32[2, 2, 6, 7]",
     "y = concat(flatten(max_pool2d(x, [3, 2], stride = [2, 1], padding = 1, dilation = [1, 2], ceil_mode = true)),"
     " flatten(avg_pool2d(x, 3, 2, 1, ceil_mode = true, count_include_pad = false)), flatten(avg_pool2d(x, [2, 3])), dim = 1)",
     false},
    /* losses */
    {"cross_entropy_options", "", "x: f32[4, 5], t: i64[4]",
     "y = cross_entropy(x, t, ignore_index = 2, label_smoothing = 0.1) + cross_entropy(x, t, reduction = \"sum\") * 0.1", false},
    {"cross_entropy_axis1", "", "x: f32[2, 4, 3], t: i64[2, 3], w: f32[4], z: f32[2, 4, 3, 2], u: i64[2, 3, 2], c: f32[2, 3, 3], s: i64[2, 3]",
     "y = cross_entropy(x, t, weight = detach(exp(w)), ignore_index = 1, label_smoothing = 0.1) + cross_entropy(z, u, reduction = \"sum\") * 0.1"
     " + nll_loss(log_softmax(x, 1), t, reduction = \"none\") + nll_loss(log_softmax(z, 1), u, weight = detach(exp(w)), ignore_index = 0)"
     " + cross_entropy(c, s, axis = 1) * cross_entropy(c, s, axis = -1, reduction = \"none\")",
     false},
    /* class probabilities as the target (PyTorch >= 1.10) */
    {"cross_entropy_probs", "", "x: f32[4, 5], p: f32[4, 5], w: f32[5], z: f32[2, 5, 3], q: f32[2, 5, 3]",
     "y = cross_entropy(x, softmax(p)) + cross_entropy(x, softmax(p), label_smoothing = 0.2, weight = detach(exp(w)), reduction = \"sum\") * 0.1"
     " + cross_entropy(z, softmax(q, 1), axis = 1, reduction = \"none\") + cross_entropy(z, softmax(q, -1), dim = -1, label_smoothing = 0.1)",
     false},
    {"nll_loss", "", "x: f32[2, 3, 5], t: i64[2, 3]",
     "y = nll_loss(log_softmax(x), t) + nll_loss(x, t, ignore_index = 1, reduction = \"none\")", false},
    {"class_weights", "", "x: f32[4, 5], t: i64[4], w: f32[5]",
     "y = cross_entropy(x, t, weight = detach(exp(w))) + nll_loss(log_softmax(x), t, weight = detach(exp(w)), ignore_index = 1)"
     " + cross_entropy(x, t, weight = detach(exp(w)), label_smoothing = 0.2, reduction = \"sum\")",
     false},
    {"kl_div", "", "x: f32[3, 4], z: f32[3, 4]",
     "y = kl_div(log_softmax(x), softmax(z), reduction = \"batchmean\") + kl_div(log_softmax(x), log_softmax(z), log_target = true)"
     " + kl_div(log_softmax(x), relu(z), reduction = \"none\")",
     false},
    {"regression_losses", "", "x: f32[3, 4], z: f32[3, 4]",
     "y = l1_loss(x, z) + smooth_l1_loss(x * 2, z, beta = 0.5) + huber_loss(x * 2, z, delta = 0.7, reduction = \"sum\")"
     " + smooth_l1_loss(x, z, reduction = \"none\", beta = 0)",
     false},
    {"bce_with_logits", "", "x: f32[3, 4], z: f32[3, 4], w: f32[4]",
     "y = binary_cross_entropy_with_logits(x * 3, sigmoid(z))"
     " + binary_cross_entropy_with_logits(x, sigmoid(z), pos_weight = detach(exp(w)), weight = detach(sigmoid(w)),"
     " reduction = \"none\")",
     false},
    /* modules */
    {"Sequential", "net = Sequential(Linear(6, 8), ReLU(), Linear(8, 3), GELU(), Linear(3, 2, bias = false))", "x: f32[4, 6]",
     "y = net(x)", false},
    {"activation_modules",
     "net = Sequential(Linear(5, 5), SiLU(), Linear(5, 5), Tanh(), Linear(5, 5), Sigmoid(), Linear(5, 5), LeakyReLU(0.1), "
     "Linear(5, 5), ELU(), Linear(5, 5), Softplus(), Linear(5, 5), Mish(), Linear(5, 5), Hardswish(), Linear(5, 5), "
     "GELU(approximate = \"tanh\"), Flatten(), Identity())",
     "x: f32[3, 5]", "y = net(x * 3)", false},
    {"Conv1d", "m = Conv1d(3, 4, 3, stride = 2, padding = 1, dilation = 1)", "x: f32[2, 3, 9]", "y = m(x)", false},
    {"Conv2d_tuples", "m = Conv2d(2, 3, [3, 2], stride = [2, 1], padding = [1, 0], bias = false)", "x: f32[2, 2, 6, 5]", "y = m(x)",
     false},
    {"Conv_groups_padding", "a = Conv2d(4, 6, 3, padding = \"same\", groups = 2)\nb = Conv2d(6, 6, [2, 4], padding = \"same\", groups = 6, dilation = [1, 2])\n"
     "c = Conv1d(4, 2, 3, padding = \"valid\", groups = 2, bias = false)",
     "x: f32[2, 4, 5, 6]", "y = concat(flatten(b(a(x))), flatten(c(x[:, :, 0, :])), dim = 1)", false},
    {"LayerNorm_dims", "m = LayerNorm([3, 4])", "x: f32[2, 3, 4]", "y = m(x)", true},
    {"LSTM", "m = LSTM(3, 4, num_layers = 2)", "x: f32[5, 2, 3]", "o, hc = m(x)\n y = concat(flatten(o), flatten(hc[0]), flatten(hc[1]), dim = 0)",
     false},
    {"GRU", "m = GRU(3, 4, num_layers = 2, batch_first = true)\nn = GRU(3, 2, bias = false)", "x: f32[2, 5, 3]",
     "o, h = m(x)\n p, u = n(x)\n y = o.sum() + (h * h).sum() + p * u.mean()", false},
    {"LSTM_bidirectional", "m = LSTM(3, 4, num_layers = 2, bidirectional = true, batch_first = true)\nn = LSTM(3, 2, bidirectional = true, bias = false)",
     "x: f32[2, 5, 3]",
     "o, hc = m(x)\n p, qc = n(x)\n y = concat(flatten(o, 0), flatten(hc[0], 0), flatten(hc[1], 0), dim = 0).sum() + flatten(p, 0) * flatten(qc[0], 0).sum() + qc[1].mean()",
     false},
    {"GRU_bidirectional", "m = GRU(3, 4, num_layers = 3, bidirectional = true)", "x: f32[5, 2, 3]",
     "o, h = m(x)\n y = o.sum() + (h * h).sum() + concat(flatten(o, 0), flatten(h, 0), dim = 0)", false},
    {"pool_options",
     "a = MaxPool2d([3, 2], stride = [2, 1], padding = 1, dilation = [1, 2], ceil_mode = true)\n"
     "b = AvgPool2d(3, stride = 2, padding = 1, ceil_mode = true, count_include_pad = false)\nc = AvgPool2d([2, 3], ceil_mode = true)\n"
     "d = AvgPool2d(3, stride = 2, padding = 1, ceil_mode = true)",
     "x: f32[2, 2, 6, 7]", "y = concat(flatten(a(x)), flatten(b(x)), flatten(c(x)), flatten(d(x)), dim = 1)", false},
    {"ConvTranspose2d", "m = ConvTranspose2d(2, 3, 3, stride = 2, padding = 1, output_padding = 1)\nn = ConvTranspose2d(3, 2, [2, 3], dilation = 2, bias = false)",
     "x: f32[2, 2, 3, 3]", "y = n(m(x))", false},
    {"Upsample", "a = Upsample(scale_factor = 2)\nb = Upsample(size = [5, 3], mode = \"bilinear\")", "x: f32[1, 2, 3, 4]", "y = a(b(x))", false},
    {"EmbeddingBag", "m = EmbeddingBag(7, 4)\nn = EmbeddingBag(7, 4, mode = \"sum\")\no = EmbeddingBag(7, 4, mode = \"max\")",
     "i: i64[2, 3]", "y = m(i) + n(i) * o(i)", false},
    {"Embedding_padding_idx", "a = Embedding(7, 4, padding_idx = 0)\nb = Embedding(7, 4, padding_idx = -6)\ne = Embedding(5, 4)",
     "i: i64[3, 3]", "y = a(i) + b(i) * e(i) + a(i * 0 + 2)", false},
    {"EmbeddingBag_padding_idx",
     "m = EmbeddingBag(7, 4, padding_idx = 0)\nn = EmbeddingBag(7, 4, mode = \"sum\", padding_idx = 1)\n"
     "o = EmbeddingBag(7, 4, mode = \"max\", padding_idx = 2)",
     "i: i64[3, 3]", "y = m(i) + n(i) * o(i) + m(i * 0) + o(i * 0 + 2) + n(i * 0 + 1)", false},
    {"MultiheadAttention", "m = MultiheadAttention(8, 2, batch_first = true)\nn = MultiheadAttention(8, 4)", "x: f32[2, 3, 8], z: f32[2, 5, 8]",
     "o, w = m(x, z, z)\n p, u = n(x, x, x)\n y = concat(flatten(o * 2 + w.sum()), flatten(p + u.mean()), dim = 1)", false},
    {"BatchNorm1d", "m = BatchNorm1d(4)", "x: f32[5, 4]", "y = m(x)", true},
    {"BatchNorm1d_3d", "m = BatchNorm1d(3, momentum = 0.2)", "x: f32[2, 3, 4]", "y = m(x)", true},
    {"GroupNorm", "m = GroupNorm(2, 4)", "x: f32[2, 4, 3, 2]", "y = m(x)", true},
    {"RMSNorm", "m = RMSNorm(6)", "x: f32[2, 3, 6]", "y = m(x)", true},
    {"AdaptiveAvgPool2d", "m = AdaptiveAvgPool2d(1)\nn = AdaptiveAvgPool2d([2, 3])", "x: f32[2, 3, 4, 6]",
     "y = concat(flatten(m(x)), flatten(n(x)), dim = 1)", false},
    /* tied maxima (issue 34): PyTorch sends the gradient of max pooling, max(x, dim),
     * min(x, dim) and EmbeddingBag's max to the first extreme element, and splits it among
     * ties for amax, amin and a whole-tensor max() or min(). A case named ties_* has its
     * float inputs and weights on a few uint8 levels (tied_value). */
    {"ties_max_pool2d", "", "x: f32[2, 2, 6, 7]",
     "y = concat(flatten(max_pool2d(x, 2)), flatten(max_pool2d(x, 3, stride = 1)), flatten(max_pool2d(x, 2, stride = 1, padding = 1)),"
     " flatten(max_pool2d(x, [3, 2], stride = [2, 1], padding = 1, dilation = [1, 2], ceil_mode = true)), dim = 1)",
     false},
    {"ties_MaxPool2d", "a = MaxPool2d(2)\nb = MaxPool2d(3, stride = 2, padding = 1)\nc = Conv2d(2, 3, 3)", "x: f32[2, 2, 7, 6]",
     "y = concat(flatten(a(x)), flatten(b(x)), flatten(a(relu(c(x)) + 0.5)), dim = 1)", false},
    {"ties_max_min_dim", "", "x: f32[3, 4, 5]",
     "y = concat(flatten(max(x, 1), 0), flatten(min(x, dim = 2, keepdim = true), 0), flatten(x.max(-1), 0),"
     " flatten(x.min(0), 0), flatten(max(x, axis = 0, keepdim = true), 0), dim = 0)",
     false},
    {"ties_amax_amin", "", "x: f32[3, 4, 5]",
     "y = concat(flatten(amax(x, 1), 0), flatten(amin(x, dim = 2, keepdim = true), 0), flatten(x.amax(-1), 0),"
     " flatten(amin(x, axis = [0, 2]), 0), flatten(amax(x, dim = [1, 2], keepdim = true), 0), dim = 0) + max(x) * 2 + min(x) * 3"
     " + amax(x) - amin(x) * 0.5",
     false},
    {"ties_EmbeddingBag_max", "o = EmbeddingBag(7, 4, mode = \"max\")\np = EmbeddingBag(7, 4, mode = \"max\", padding_idx = 2)",
     "i: i64[3, 4]", "y = o(i) + p(i)", false},
};

#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static void case_text(char *buf, size_t n, const ParityCase *c)
{
    snprintf(buf, n, "model t\n%s\nforward(%s) -> y {\n %s\n}\nloss(y) = %s\n", c->members, c->inputs, c->body,
             c->cubic ? "sum(y * y * y / 3 + y * y + y)" : "sum(y * y / 2 + y)");
}

/* Quantized values, as uint8 images give: four levels of k/255 (so maxima tie), and runs of
 * 12 elements of one value (so whole windows are constant). */
static double tied_value(int64_t e, int input)
{
    if (e / 12 % 4 == 1) return (double)(float)(200.0 / 255);
    uint64_t h = (uint64_t)(e + 31 * input) * UINT64_C(2654435761);
    return (double)(float)((double)((h >> 13) % 4) * 60 / 255);
}

static void put_array(StrBuf *o, const double *v, int64_t n)
{
    sb_putc(o, '[');
    for (int64_t i = 0; i < n; i++) sb_printf(o, "%s%.17g", i ? ", " : "", v[i]);
    sb_putc(o, ']');
}

static void put_tensor(StrBuf *o, const char *name, const ITensor *t, const char *dtype, bool trainable)
{
    sb_printf(o, "{\"name\": \"%s\", \"dtype\": \"%s\", \"trainable\": %s, \"shape\": [", name, dtype, trainable ? "true" : "false");
    for (int i = 0; i < t->rank; i++) sb_printf(o, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    sb_puts(o, "], \"data\": ");
    put_array(o, t->data, t->n);
    sb_putc(o, '}');
}

static NodeId output_node(const Graph *g, OutputKind kind, const char *name)
{
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == kind && (!name || !strcmp(ir_str(g, g->outputs[k].name), name))) return g->outputs[k].node;
    return IR_NONE;
}

/* One case: its model, weights, inputs and Kiln's values, as a JSON object. */
static void run_case(StrBuf *o, const ParityCase *c)
{
    char text[4096];
    case_text(text, sizeof text, c);
    const bool ties = !strncmp(c->name, "ties_", 5);
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "parity.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s does not compile:\n%s", c->name, d.out.data);
    Graph *g = ir_graph_clone(m->graph);
    StrBuf err;
    sb_init(&err);
    AutodiffOptions ao = {.wrt_inputs = true};
    cr_assert_eq(pass_autodiff(g, &ao, &err), 0, "%s: %s", c->name, err.data);
    Interp ip;
    interp_init(&ip, g);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_INPUT) continue;
        int64_t cnt = 1;
        for (int k = 0; k < n->shape.rank; k++) cnt *= n->shape.d[k].k;
        double *v = malloc(sizeof(double) * (size_t)(cnt ? cnt : 1));
        for (int64_t e = 0; e < cnt; e++)
            v[e] = !ir_dtype_is_float((DType)n->dtype) ? (double)((e * 7 + i) % 3)
                   : ties                              ? tied_value(e, i)
                                                       : (double)(float)(1.3 * sin((double)e * 1.37 + 0.5 * i));
        interp_set(&ip, i, v);
        free(v);
    }
    interp_init_params(&ip, 5);
    /* weights rounded to float32, as PyTorch will hold them */
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_PARAM && ir_dtype_is_float((DType)g->nodes[i].dtype))
            for (int64_t e = 0; e < ip.vals[i].n; e++)
                ip.vals[i].data[e] = (double)(float)(ties ? tied_value(e, i) - 0.4 : ip.vals[i].data[e]);
    cr_assert_eq(interp_run(&ip), 0, "%s: %s", c->name, ip.err.data);
    sb_printf(o, "{\"name\": \"%s\", \"cubic\": %s, \"model\": ", c->name, c->cubic ? "true" : "false");
    sb_putc(o, '"');
    for (const char *p = text; *p; p++) {
        if (*p == '"' || *p == '\\') sb_putc(o, '\\');
        if (*p == '\n') sb_puts(o, "\\n");
        else sb_putc(o, *p);
    }
    sb_puts(o, "\", \"params\": [");
    int np = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_PARAM) continue;
        if (np++) sb_puts(o, ", ");
        put_tensor(o, ir_node_name(g, i), &ip.vals[i], ir_dtype_name((DType)g->nodes[i].dtype), ir_attrs(g, i)[1] != 0);
    }
    sb_puts(o, "], \"inputs\": [");
    int ni = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_INPUT) continue;
        if (ni++) sb_puts(o, ", ");
        put_tensor(o, ir_node_name(g, i), &ip.vals[i], ir_dtype_name((DType)g->nodes[i].dtype), false);
    }
    sb_puts(o, "], \"y\": ");
    NodeId y = output_node(g, OUT_FORWARD, "y");
    put_tensor(o, "y", &ip.vals[y], "f32", false);
    NodeId loss = output_node(g, OUT_LOSS, NULL);
    sb_printf(o, ", \"loss\": %.17g, \"grads\": [", ip.vals[loss].data[0]);
    int ng = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        if (ng++) sb_puts(o, ", ");
        put_tensor(o, ir_str(g, g->outputs[k].name), &ip.vals[g->outputs[k].node], "f32", true);
    }
    sb_puts(o, "], \"updates\": [");
    int nu = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_UPDATE) continue;
        if (nu++) sb_puts(o, ", ");
        const Node *un = &g->nodes[g->outputs[k].node];
        put_tensor(o, ir_str(g, g->outputs[k].name), &ip.vals[g->outputs[k].node], ir_dtype_name((DType)un->dtype), false);
    }
    /* one SGD step (lr = 0.1) on the trainable parameters, then the loss again */
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        NodeId p = ir_find_named(g, OP_PARAM, ir_str(g, g->outputs[k].name));
        if (p == IR_NONE) continue;
        const ITensor *gt = &ip.vals[g->outputs[k].node];
        double *w = malloc(sizeof(double) * (size_t)(gt->n ? gt->n : 1));
        for (int64_t e = 0; e < gt->n; e++) w[e] = (double)(float)(ip.vals[p].data[e] - 0.1 * gt->data[e]);
        interp_set(&ip, p, w);
        free(w);
    }
    cr_assert_eq(interp_run(&ip), 0, "%s: %s", c->name, ip.err.data);
    sb_printf(o, "], \"loss_after_step\": %.17g}", ip.vals[loss].data[0]);
    interp_free(&ip);
    ir_graph_free(g);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

Test(parity, functions_modules_and_losses_match_pytorch, .timeout = 300)
{
    StrBuf o;
    sb_init(&o);
    sb_puts(&o, "{\"cases\": [\n");
    for (int i = 0; i < NCASES; i++) {
        if (i) sb_puts(&o, ",\n");
        run_case(&o, &cases[i]);
    }
    sb_puts(&o, "\n]}\n");
    char path[] = "/tmp/kiln-parity-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(f);
    fwrite(o.data, 1, o.len, f);
    fclose(f);
    sb_free(&o);
    /* Debian's PyTorch is a package of the system's Python, not of a virtual environment's */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", support_path("tests/parity/torch_parity.py"), path);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    remove(path);
    cr_log_info("%s", out.data);
    if (rc == 77 || rc == 127) {
        sb_free(&out);
        cr_skip_test("%s (Debian's python3-torch): parity with PyTorch not checked",
                     rc == 77 ? "PyTorch is not installed" : "there is no /usr/bin/python3");
    }
    cr_expect_eq(rc, 0, "torch_parity.py exited %d:\n%s", rc, out.data);
    sb_free(&out);
}

/* models/llama.kiln against bench/reference_llama.py, its PyTorch twin: the same weights
 * (Kiln's initialisation, rounded to float32, loaded with strict=True), a batch of 2 windows
 * of 16 bytes; the loss, every gradient, and the loss after one training step of the
 * model's recipe (clip 1.0, then AdamW lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1
 * on matrices), within a relative 1e-5 in float32 (tests/parity/torch_llama.py). */
Test(parity, llama_matches_its_pytorch_twin, .timeout = 300)
{
    Diag d;
    Model *m = support_compile_file("models/llama.kiln", MODE_TRAIN, &d);
    cr_assert(m, "%s", d.out.data);
    Graph *g = ir_graph_clone(m->graph);
    StrBuf err, o;
    sb_init(&err);
    sb_init(&o);
    AutodiffOptions ao = {.wrt_inputs = false};
    cr_assert_eq(pass_autodiff(g, &ao, &err), 0, "%s", err.data);
    Interp ip;
    interp_init(&ip, g);
    enum { NB = 2, NT = 16 };
    cr_assert_eq(interp_set_symbol(&ip, "B", NB), 0);
    cr_assert_eq(interp_set_symbol(&ip, "T", NT), 0);
    /* bytes of a text, the targets the next byte */
    const char *text = "Q: What is a compiler?\nA: A program that writes programs for you, if you ask it nicely.";
    double idx[NB * NT], tgt[NB * NT];
    for (int b = 0; b < NB; b++)
        for (int t = 0; t < NT; t++) {
            idx[b * NT + t] = (unsigned char)text[b * 37 + t];
            tgt[b * NT + t] = (unsigned char)text[b * 37 + t + 1];
        }
    NodeId in_idx = ir_find_named(g, OP_INPUT, "idx"), in_tgt = ir_find_named(g, OP_INPUT, "targets");
    cr_assert(in_idx != IR_NONE && in_tgt != IR_NONE);
    interp_set(&ip, in_idx, idx);
    interp_set(&ip, in_tgt, tgt);
    interp_init_params(&ip, 5);
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_PARAM)
            for (int64_t e = 0; e < ip.vals[i].n; e++) ip.vals[i].data[e] = (double)(float)ip.vals[i].data[e];
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    NodeId loss = output_node(g, OUT_LOSS, NULL);
    double loss0 = ip.vals[loss].data[0];
    sb_puts(&o, "{\"params\": [");
    int np = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_PARAM) continue;
        if (np++) sb_puts(&o, ", ");
        put_tensor(&o, ir_node_name(g, i), &ip.vals[i], "f32", true);
    }
    sb_puts(&o, "], \"inputs\": [");
    put_tensor(&o, "idx", &ip.vals[in_idx], "i64", false);
    sb_puts(&o, ", ");
    put_tensor(&o, "targets", &ip.vals[in_tgt], "i64", false);
    sb_printf(&o, "], \"loss\": %.17g, \"grads\": [", loss0);
    /* the global gradient norm, for clipping as torch.nn.utils.clip_grad_norm_ */
    double norm2 = 0;
    int ng = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        const ITensor *gt = &ip.vals[g->outputs[k].node];
        for (int64_t e = 0; e < gt->n; e++) norm2 += gt->data[e] * gt->data[e];
        if (ng++) sb_puts(&o, ", ");
        put_tensor(&o, ir_str(g, g->outputs[k].name), gt, "f32", true);
    }
    cr_assert_gt(ng, 0);
    double clip = fmin(1.0, 1.0 / (sqrt(norm2) + 1e-6));
    /* AdamW's first step: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected m / (sqrt(v) + eps)
     * = g / (|g| + eps), after decoupled decay p (1 - lr wd) on matrices */
    const double lr = 3e-4, wd = 0.1, eps = 1e-8;
    for (int32_t k = 0; k < g->noutputs; k++) {
        if (g->outputs[k].kind != OUT_GRAD) continue;
        NodeId p = ir_find_named(g, OP_PARAM, ir_str(g, g->outputs[k].name));
        cr_assert_neq(p, IR_NONE);
        const ITensor *gt = &ip.vals[g->outputs[k].node];
        bool decay = g->nodes[p].shape.rank >= 2;
        double *w = malloc(sizeof(double) * (size_t)(gt->n ? gt->n : 1));
        for (int64_t e = 0; e < gt->n; e++) {
            double gr = (double)(float)(gt->data[e] * clip), pv = ip.vals[p].data[e];
            if (decay) pv *= 1 - lr * wd;
            w[e] = (double)(float)(pv - lr * gr / (fabs(gr) + eps));
        }
        interp_set(&ip, p, w);
        free(w);
    }
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    sb_printf(&o, "], \"grad_norm\": %.17g, \"loss_after_step\": %.17g}\n", sqrt(norm2), ip.vals[loss].data[0]);
    interp_free(&ip);
    ir_graph_free(g);
    frontend_model_free(m);
    diag_free(&d);
    sb_free(&err);
    char path[] = "/tmp/kiln-llama-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(f);
    fwrite(o.data, 1, o.len, f);
    fclose(f);
    sb_free(&o);
    char script[600], cmd[1400];
    snprintf(script, sizeof script, "%s", support_path("tests/parity/torch_llama.py")); /* support_path's buffer is reused */
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", script, path, support_path("bench/reference_llama.py"));
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    remove(path);
    cr_log_info("%s", out.data);
    if (rc == 77 || rc == 127) {
        sb_free(&out);
        cr_skip_test("%s (Debian's python3-torch): models/llama.kiln's parity with PyTorch not checked",
                     rc == 77 ? "PyTorch is not installed" : "there is no /usr/bin/python3");
    }
    cr_expect_eq(rc, 0, "torch_llama.py exited %d:\n%s", rc, out.data);
    sb_free(&out);
}
