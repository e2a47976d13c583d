/* test_precision.c — mixed precision (passes/precision.c): the pass's dtype decisions on
 * mlp, cnn and gpt (which nodes are half precision, where the casts are), the planned
 * arena, tiny GPT trained in bf16 and fp16 against fp32 (losses close, resume bit-exact),
 * and bad precision names and flags. The generated kernels against the interpreter in half
 * precision are test_codegen's models_bf16 and models_fp16 suites. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "../runtime/kiln_half.h"
#include "ckpt_compare.h"
#include "support.h"

static bool is_half(DType t) { return t == DT_BF16 || t == DT_F16; }

/* ---- the conversions of the generated code (kiln_half.h) ---- */

/* fp16: GCC's _Float16 is the reference, for every half and a sweep of floats (every 997th
 * bit pattern: all exponents, subnormal results, the overflow edge and NaNs). */
Test(conversions, fp16_as_float16_does)
{
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 r;
        uint16_t bits = (uint16_t)h;
        memcpy(&r, &bits, 2);
        float want = (float)r, got = kiln_f16_to_f32(bits);
        if (isnan(want)) cr_assert(isnan(got), "%04x", h);
        else cr_assert_eq(kiln_f32_bits(got), kiln_f32_bits(want), "half %04x: %a, not %a", h, got, want);
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f, INFINITY, -0.0f};
    for (uint64_t u = 0; u < (UINT64_C(1) << 32) + 10; u += u < (UINT64_C(1) << 32) ? 997 : 1) {
        float f = u < (UINT64_C(1) << 32) ? kiln_bits_f32((uint32_t)u) : edges[u - (UINT64_C(1) << 32)];
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        uint16_t got = kiln_f32_to_f16(f);
        if (isnan(f)) cr_assert((got & 0x7e00) == 0x7e00, "NaN %08x -> %04x is not a quiet NaN", kiln_f32_bits(f), got);
        else cr_assert_eq(got, want, "%a -> %04x, not %04x", f, got, want);
    }
}

/* The interpreter rounds as the generated code does, bf16 and fp16 alike. */
Test(conversions, interpreter_rounds_as_generated_code)
{
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 7919) {
        float f = kiln_bits_f32((uint32_t)u);
        if (isnan(f)) continue;
        double b = f, h = f;
        interp_normalise(DT_BF16, &b, 1);
        interp_normalise(DT_F16, &h, 1);
        cr_assert_eq(b, (double)kiln_bf16_round(f), "bf16 of %a: %a vs %a", f, b, (double)kiln_bf16_round(f));
        cr_assert_eq(h, (double)kiln_f16_round(f), "fp16 of %a: %a vs %a", f, h, (double)kiln_f16_round(f));
    }
    /* bf16's NaN stays NaN; ties go to even */
    cr_expect(isnan(kiln_bf16_round(NAN)));
    cr_expect_eq(kiln_bf16_round(1.0f + 0x1p-8f), 1.0f);
    cr_expect_eq(kiln_bf16_round(1.0f + 0x3p-8f), 1.0f + 0x1p-6f);
}

static NodeId view_root(const Graph *g, NodeId x)
{
    for (;;) {
        Op op = (Op)g->nodes[x].op;
        if (op != OP_RESHAPE && op != OP_DETACH && op != OP_PERMUTE && op != OP_SLICE && op != OP_EXPAND) return x;
        x = ir_input(g, x, 0);
    }
}

/* The training graph of a model file after the pipeline in the given precision; d is
 * initialised here (support_compile_file), one per model, freed by the caller. */
static Model *compiled(const char *rel, DType half, Diag *d)
{
    Model *m = support_compile_file(rel, MODE_TRAIN, d);
    cr_assert(m, "%s: %s", rel, d->out.data);
    StrBuf err;
    sb_init(&err);
    PrecisionOptions p = {half, false};
    PipelineOptions opt = {.precision = &p};
    cr_assert_eq(pipeline_run_opts(m->graph, NULL, &opt, NULL, &err), 0, "%s", err.data);
    sb_free(&err);
    return m;
}

/* The rules of the pass's header, checked node by node; returns the number of half casts. */
static int check_decisions(const char *rel, DType half)
{
    Diag d;
    Model *m = compiled(rel, half, &d);
    const Graph *g = m->graph;
    int narrowed = 0, matmul_half = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        /* only casts are half precision: nothing computes in 16 bits */
        if (is_half((DType)n->dtype)) {
            cr_expect(n->op == OP_CAST || n->op == OP_RESHAPE, "%s: %%%d %s is %s", rel, i, ir_op_info[n->op].name, ir_dtype_name((DType)n->dtype));
            cr_expect_eq(n->dtype, half, "%s: %%%d has another half dtype", rel, i);
            if (n->op == OP_CAST) {
                cr_expect_eq(g->nodes[ir_input(g, i, 0)].dtype, DT_F32, "%s: %%%d narrows a non-f32 value", rel, i);
                narrowed++;
            }
        }
        if (n->op == OP_PARAM) cr_expect_eq(n->dtype, DT_F32, "%s: parameter %s is not an fp32 master", rel, ir_node_name(g, i));
        /* reductions (norm statistics, softmax sums, losses) and transcendental functions in f32 */
        if (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX || n->op == OP_EXP || n->op == OP_LOG || n->op == OP_MATMUL)
            cr_expect_eq(n->dtype, DT_F32, "%s: %%%d %s is not f32", rel, i, ir_op_info[n->op].name);
        if (n->op != OP_MATMUL) continue;
        /* every operand: a parameter (f32 master) or a widened half-precision copy */
        for (int k = 0; k < 2; k++) {
            NodeId r = view_root(g, ir_input(g, i, k));
            const Node *rn = &g->nodes[r];
            if (rn->op == OP_PARAM) continue;
            cr_expect(rn->op == OP_CAST && rn->dtype == DT_F32 && g->nodes[ir_input(g, r, 0)].dtype == half,
                      "%s: operand %d of matmul %%%d (%%%d %s) is not read in %s", rel, k, i, r, ir_op_info[rn->op].name, ir_dtype_name(half));
            matmul_half++;
        }
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        cr_expect_eq(g->nodes[g->outputs[k].node].dtype, DT_F32, "%s: output %s is not f32", rel, ir_str(g, g->outputs[k].name));
    cr_expect_gt(matmul_half, 0, "%s: no matrix product reads half precision", rel);
    frontend_model_free(m);
    diag_free(&d);
    return narrowed;
}

Test(decisions, mlp) { cr_expect_gt(check_decisions("models/mlp.kiln", DT_BF16), 0); }
Test(decisions, cnn) { cr_expect_gt(check_decisions("models/cnn.kiln", DT_BF16), 0); }
Test(decisions, gpt) { cr_expect_gt(check_decisions("models/gpt.kiln", DT_F16), 0); }

/* fp32 leaves the graph as simplify left it. */
Test(decisions, fp32_changes_nothing)
{
    Diag da, db;
    Model *a = compiled("models/gpt.kiln", DT_F32, &da);
    Model *b = support_compile_file("models/gpt.kiln", MODE_TRAIN, &db);
    StrBuf err, pa, pb;
    sb_init(&err);
    sb_init(&pa);
    sb_init(&pb);
    cr_assert_eq(pipeline_run(b->graph, NULL, NULL, &err), 0, "%s", err.data);
    ir_print(a->graph, &pa);
    ir_print(b->graph, &pb);
    cr_expect_str_eq(pa.data, pb.data);
    sb_free(&err);
    sb_free(&pa);
    sb_free(&pb);
    frontend_model_free(a);
    frontend_model_free(b);
    diag_free(&da);
    diag_free(&db);
}

/* gpt's kept activations are in half precision: the planned training arena shrinks. */
Test(decisions, gpt_arena_shrinks)
{
    Diag da, db;
    Model *a = compiled("models/gpt.kiln", DT_F32, &da), *b = compiled("models/gpt.kiln", DT_BF16, &db);
    int64_t full = codegen_arena_bytes(a->graph), half = codegen_arena_bytes(b->graph);
    cr_expect(half < 0.75 * (double)full, "bf16 arena %lld bytes vs fp32 %lld", (long long)half, (long long)full);
    frontend_model_free(a);
    frontend_model_free(b);
    diag_free(&da);
    diag_free(&db);
}

/* `kiln ir --after precision` shows the casts; a recipe's precision is the default. */
Test(cli, ir_after_precision_shows_casts)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln("ir models/mlp.kiln --after precision --precision bf16", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "= cast ") && strstr(out.data, ": bf16[B, 256]"), "%s", out.data);
    out.len = 0;
    cr_assert_eq(support_run_kiln("ir models/mlp.kiln --after precision", &out), 0, "%s", out.data);
    cr_expect(!strstr(out.data, "bf16"), "fp32 by default:\n%s", out.data);
    sb_free(&out);
}

static void expect_usage_error(const char *args, const char *says)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln(args, &out);
    cr_expect_eq(rc, 2, "kiln %s: exit %d, not 2:\n%s", args, rc, out.data);
    cr_expect(strstr(out.data, says), "kiln %s: no '%s' in:\n%s", args, says, out.data);
    sb_free(&out);
}

Test(cli, bad_precision_flags)
{
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --precision fp8", "--precision must be fp32, bf16 or fp16");
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --precision", "--precision needs a value");
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --precision BF16", "not 'BF16'");
    expect_usage_error("emit models/mlp.kiln -o /tmp/kiln-prec-never --target cuda-emu --precision bf16",
                       "not implemented for the CUDA target yet");
    expect_usage_error("gradcheck models/mlp.kiln --precision bf16", "unknown option '--precision'");
    expect_usage_error("emit models/mlp.kiln -o /tmp/kiln-prec-never --infer --precision bf16", "inference programs (--infer, --lib) run in fp32");
}

/* ---- training: tiny GPT in fp32, bf16 and fp16 ---- */

static char dir[64];

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-prec-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

static const char *tiny_gpt =
    "model tiny\n"
    "const V = 256, block = 16, C = 32\n"
    "dim T <= block\n"
    "wte = Embedding(V, C)\n"
    "wpe = Embedding(block, C)\n"
    "ln = LayerNorm(C)\n"
    "attn = CausalSelfAttention(C, 2)\n"
    "mlp = MLP(C, 4 * C)\n"
    "ln_f = LayerNorm(C)\n"
    "forward(idx: i32[B, T]) -> logits {\n"
    "    x = wte(idx) + wpe(arange(T))\n"
    "    x = x + attn(ln(x))\n"
    "    x = x + mlp(ln(x))\n"
    "    logits = ln_f(x) @ transpose(wte.weight)\n"
    "}\n"
    "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
    "train {\n"
    "    data = text(\"corpus/*.txt\", input = idx, target = targets, val = 0.1)\n"
    "    optimizer = AdamW(lr = 3e-3)\n"
    "    batch = 8\n"
    "    steps = 60\n"
    "    eval = every(steps = 60)\n"
    "}\n";

/* Builds tiny in each precision (tiny-fp32, tiny-bf16, tiny-fp16) on a repetitive text. */
static void build_tiny(void)
{
    StrBuf out;
    sb_init(&out);
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/tiny.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(tiny_gpt, f);
    fclose(f);
    cr_assert_eq(run("mkdir corpus && for i in $(seq 200); do echo 'the quick brown fox jumps over the lazy dog'; done > corpus/a.txt", &out), 0);
    const char *names[] = {"fp32", "bf16", "fp16"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "build %s --precision %s -o %s/tiny-%s", path, names[i], dir, names[i]);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    }
    sb_free(&out);
}

static double eval_loss(const char *prog)
{
    StrBuf out;
    sb_init(&out);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "./%s --checkpoint-dir ck-%s", prog, prog);
    cr_assert_eq(run(cmd, &out), 0, "%s", out.data);
    const char *at = strstr(out.data, "eval at step 60: loss ");
    cr_assert(at, "%s", out.data);
    double v = strtod(at + strlen("eval at step 60: loss "), NULL);
    sb_free(&out);
    return v;
}

Test(train, tiny_gpt_half_precision_close_to_fp32_and_resumes_exactly, .init = setup, .fini = teardown, .timeout = 300)
{
    build_tiny();
    double full = eval_loss("tiny-fp32"), bf16 = eval_loss("tiny-bf16"), fp16 = eval_loss("tiny-fp16");
    cr_expect(full < 2.5, "fp32 did not learn: validation loss %g", full);
    cr_expect(fabs(bf16 - full) < 0.05, "bf16 validation loss %g vs fp32 %g", bf16, full);
    cr_expect(fabs(fp16 - full) < 0.05, "fp16 validation loss %g vs fp32 %g", fp16, full);
    cr_expect(bf16 != full, "bf16 trained exactly as fp32 did: the precision had no effect");
    const char *names[] = {"bf16", "fp16"};
    for (int i = 0; i < 2; i++) {
        StrBuf out;
        sb_init(&out);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./tiny-%s --steps 25 --checkpoint-dir part-%s && ./tiny-%s --resume part-%s --checkpoint-dir part-%s",
                 names[i], names[i], names[i], names[i], names[i]);
        cr_assert_eq(run(cmd, &out), 0, "%s", out.data);
        const char *files[] = {"model", "train_state"};
        for (int f = 0; f < 2; f++) {
            char a[512], b[512];
            snprintf(a, sizeof a, "%s/ck-tiny-%s/step-00000060/%s.safetensors", dir, names[i], files[f]);
            snprintf(b, sizeof b, "%s/part-%s/step-00000060/%s.safetensors", dir, names[i], files[f]);
            const char *why = ckpt_difference(a, b);
            cr_expect(!why, "%s: 60 steps differ from 25 + resume + 35 in %s: %s", names[i], files[f], why);
        }
        sb_free(&out);
    }
}
