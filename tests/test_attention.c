/* test_attention.c — passes/attention.h: attention found however it is written, in the
 * graph the training program runs (after autodiff and simplify):
 *   - the built-ins (scaled_dot_product_attention, causal or with a bool or float mask, and
 *     dropout; CausalSelfAttention in gpt; GQA in llama, 4 query heads over 2), in fp32
 *     and, through mixed precision's casts, bf16 and fp16;
 *   - attention written out of primitives: q @ kᵀ then a constant scale (multiplied or
 *     divided), or the scale on q before the product; a causal mask by masked_fill of
 *     j > i (an iota comparison) or an added float mask; softmax over the last axis;
 *   - and what is not attention declined: a softmax over another axis, something between
 *     the softmax and the product with v, a function of the scores (tanh), a product with
 *     a Linear (a parameter) instead of kᵀ.
 * kiln build --report names them with the bytes of their probabilities (--attention
 * unfused; test_fuse_attention.c tests the pass that fuses them). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/attention.h"
#include "../passes/passes.h"
#include "support.h"

/* The attentions of a model (its forward over q, k, v [B, 4, T, 8], a sum of squares as the
 * loss) in its training graph after the pipeline. */
static int find(const char *forward_body, AttentionMatch **m, Graph **graph)
{
    StrBuf text;
    sb_init(&text);
    sb_printf(&text,
              "model t\n"
              "dim T <= 16\n"
              "w = Linear(8, 8)\n"
              "forward(q: f32[B, 4, T, 8], k: f32[B, 4, T, 8], v: f32[B, 4, T, 8], mask: f32[T, T]) -> y {\n"
              "    q = w(q)\n"
              "%s\n"
              "}\n"
              "loss(y) = mean(y * y)\n",
              forward_body);
    Diag d;
    diag_init(&d, NULL);
    Model *model = frontend_compile(&d, "t.kiln", text.data, text.len, MODE_TRAIN);
    cr_assert(model, "%s\n%s", text.data, d.out.data ? d.out.data : "");
    StrBuf err;
    sb_init(&err);
    PipelineOptions opt = {.unfused_attention = true}; /* the recogniser on the graph as written */
    cr_assert_eq(pipeline_run_opts(model->graph, NULL, &opt, NULL, &err), 0, "%s", err.data);
    *graph = ir_graph_clone(model->graph);
    frontend_model_free(model);
    diag_free(&d);
    sb_free(&err);
    sb_free(&text);
    return attention_find(*graph, m);
}

static void expect_one(const char *body, AttnMask mask, double scale, double dropout)
{
    AttentionMatch *m;
    Graph *g;
    const int n = find(body, &m, &g);
    cr_assert_eq(n, 1, "%d attentions found in:\n%s", n, body);
    cr_expect_eq(m[0].mask, mask, "mask %d, not %d:\n%s", m[0].mask, mask, body);
    cr_expect(fabs(m[0].scale - scale) < 1e-12 * fabs(scale), "scale %.17g, not %.17g:\n%s", m[0].scale, scale, body);
    cr_expect(fabs(m[0].dropout - dropout) < 1e-12, "dropout %g, not %g:\n%s", m[0].dropout, dropout, body);
    cr_expect_eq(m[0].heads, 4);
    cr_expect_eq(m[0].kv_heads, 4);
    cr_expect_eq(g->nodes[m[0].probs].shape.rank, 4);
    free(m);
    ir_graph_free(g);
}

static void expect_none(const char *body)
{
    AttentionMatch *m;
    Graph *g;
    const int n = find(body, &m, &g);
    cr_expect_eq(n, 0, "%d attentions found in what is not attention:\n%s", n, body);
    free(m);
    ir_graph_free(g);
}

Test(attention, the_builtin_in_every_mask)
{
    const double s = 1 / sqrt(8.0);
    expect_one("    y = scaled_dot_product_attention(q, k, v)", ATTN_MASK_NONE, s, 0);
    expect_one("    y = scaled_dot_product_attention(q, k, v, is_causal = true)", ATTN_MASK_CAUSAL, s, 0);
    expect_one("    y = scaled_dot_product_attention(q, k, v, attn_mask = mask)", ATTN_MASK_ADD, s, 0);
    expect_one("    y = scaled_dot_product_attention(q, k, v, attn_mask = mask > 0)", ATTN_MASK_KEEP, s, 0);
    expect_one("    y = scaled_dot_product_attention(q, k, v, scale = 0.5, dropout_p = 0.25)", ATTN_MASK_NONE, 0.5, 0.25);
}

Test(attention, written_out_of_primitives)
{
    expect_one("    y = softmax(q @ k.transpose(-2, -1) * 0.125, dim = -1) @ v", ATTN_MASK_NONE, 0.125, 0);
    expect_one("    y = softmax(q @ k.transpose(-2, -1) / 4, dim = -1) @ v", ATTN_MASK_NONE, 0.25, 0);
    expect_one("    y = softmax((q * 0.5) @ k.transpose(-2, -1), dim = -1) @ v", ATTN_MASK_NONE, 0.5, 0);
    expect_one("    y = softmax(q @ k.transpose(-2, -1), dim = -1) @ v", ATTN_MASK_NONE, 1, 0);
    expect_one("    s = q @ k.transpose(-2, -1) * 0.125\n    y = softmax(s + mask, dim = -1) @ v", ATTN_MASK_ADD, 0.125, 0);
    expect_one("    t = q.shape[2]\n    i = arange(t)\n    s = masked_fill(q @ k.transpose(-2, -1) * 0.125, i.unsqueeze(0) > i.unsqueeze(1), -inf)\n"
               "    y = softmax(s, dim = -1) @ v",
               ATTN_MASK_CAUSAL, 0.125, 0);
    expect_one("    s = masked_fill(q @ k.transpose(-2, -1) * 0.125, mask > 0, -inf)\n    y = softmax(s, dim = -1) @ v", ATTN_MASK_DROP, 0.125, 0);
}

Test(attention, what_is_not_attention_is_declined)
{
    expect_none("    y = softmax(q @ k.transpose(-2, -1) * 0.125, dim = -2) @ v");
    expect_none("    y = (softmax(q @ k.transpose(-2, -1) * 0.125, dim = -1) * 2) @ v");
    expect_none("    y = softmax(tanh(q @ k.transpose(-2, -1)), dim = -1) @ v");
    expect_none("    y = softmax(w(q) * 0.125, dim = -1) @ v.transpose(-2, -1)");
    expect_none("    y = softmax(q, dim = -1) @ v.transpose(-2, -1)");
}

/* The models: gpt's CausalSelfAttention, llama's attention over repeated key/value heads. */
Test(attention, in_the_models)
{
    static const struct {
        const char *file;
        DType half; /* mixed precision: the probabilities in half precision */
        int n;
        int64_t heads, kv_heads;
    } want[] = {{"models/gpt.kiln", DT_F32, 4, 4, 4},
                {"models/gpt.kiln", DT_BF16, 4, 4, 4},
                {"models/llama.kiln", DT_F32, 4, 4, 2},
                {"models/llama.kiln", DT_F16, 4, 4, 2},
                {"models/mlp.kiln", DT_F32, 0, 0, 0}};
    for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
        Diag d;
        Model *model = support_compile_file(want[w].file, MODE_TRAIN, &d);
        StrBuf err;
        sb_init(&err);
        PrecisionOptions prec = {.half = want[w].half};
        PipelineOptions opt = {.precision = &prec, .unfused_attention = true};
        cr_assert_eq(pipeline_run_opts(model->graph, NULL, &opt, NULL, &err), 0, "%s", err.data);
        AttentionMatch *m;
        const int n = attention_find(model->graph, &m);
        cr_expect_eq(n, want[w].n, "%s: %d attentions", want[w].file, n);
        for (int i = 0; i < n; i++) {
            cr_expect_eq(m[i].mask, ATTN_MASK_CAUSAL, "%s", want[w].file);
            cr_expect_eq(m[i].heads, want[w].heads, "%s", want[w].file);
            cr_expect_eq(m[i].kv_heads, want[w].kv_heads, "%s", want[w].file);
            cr_expect_eq(model->graph->nodes[m[i].probs].dtype, want[w].half, "%s", want[w].file);
        }
        free(m);
        sb_free(&err);
        frontend_model_free(model);
        diag_free(&d);
    }
}

Test(attention, the_report_names_them)
{
    char args[1024];
    snprintf(args, sizeof args, "check --attention unfused %s/models/gpt.kiln", KILN_SOURCE_DIR);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "  attention ") && strstr(out.data, "(4 found, computed unfused"), "%s", out.data);
    cr_expect(strstr(out.data, "models/gpt.kiln:15 (x4): causal, 4 heads, probabilities f32 [B, 4, T, T]"), "%s", out.data);
    sb_free(&out);
}
