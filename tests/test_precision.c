/* test_precision.c — mixed precision (passes/precision.c): the pass's dtype decisions on
 * mlp, cnn and gpt (which nodes are half precision, where the casts are), the planned
 * arena, tiny GPT trained in bf16 and fp16 against fp32 (losses close, resume bit-exact),
 * and bad precision names and flags; the C target's product of half-precision operands
 * (kiln_gemm.h) against a double-precision reference. The generated kernels against the interpreter in half
 * precision are test_codegen's models_bf16 and models_fp16 suites. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "../runtime/kiln_gemm.h"
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

/* Stochastic rounding (round_stochastic, weight_rounding = stochastic): the generated code's
 * bit arithmetic (kiln_half.h) against the interpreter's arithmetic in double, over a sweep
 * of floats (every exponent, subnormals, the overflow edge, NaN and inf) and random bits;
 * and every one of the 2^16 random values once gives the value itself on average, exactly,
 * from the two bf16 neighbours only. */
Test(conversions, stochastic_rounding_as_the_interpreter_and_unbiased)
{
    uint64_t state = 12345;
    for (uint64_t b = 0; b < (UINT64_C(1) << 32); b += 4999) {
        state = state * 6364136223846793005u + 1442695040888963407u;
        const float f = kiln_bits_f32((uint32_t)b), u = (float)(state >> 40) * (1.0f / 16777216.0f);
        const float got = kiln_bf16_round_stochastic(f, u);
        const double want = interp_round_stochastic(f, u);
        if (isnan(f)) {
            cr_assert(isnan(got) && (kiln_f32_bits(got) & 0xffffu) == 0, "NaN %08x -> %08x", (uint32_t)b, kiln_f32_bits(got));
            continue;
        }
        cr_assert_eq((double)got, want, "%a with u = %a: %a, the interpreter %a", f, u, got, want);
        cr_assert_eq(kiln_f32_bits(got) & 0xffffu, 0u, "%a -> %a is not a bf16 value", f, got);
        const float lo = kiln_bits_f32(kiln_f32_bits(f) & 0xffff0000u), hi = kiln_bits_f32((kiln_f32_bits(f) & 0xffff0000u) + 0x10000u);
        cr_assert(got == lo || got == hi, "%a -> %a, not %a or %a", f, got, lo, hi);
    }
    const float values[] = {1.0f + 0x1p-20f, -3.14159265f, 0x1.fffffep-127f, 1e-40f, 65504.123f, -7.0f, 0x1.fdfffep127f};
    for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
        double sum = 0;
        for (uint32_t r = 0; r < 65536; r++) sum += kiln_bf16_round_stochastic(values[v], (float)r / 65536.0f);
        cr_expect_eq(sum / 65536.0, (double)values[v], "%a averages %a", values[v], sum / 65536.0);
    }
    cr_expect_eq(kiln_bf16_round_stochastic(1.5f, 0.999999f), 1.5f, "a bf16 value must not move");
    cr_expect(isinf(kiln_bf16_round_stochastic(kiln_bits_f32(0x7f7fffffu), 0.99f)), "past the largest bf16: inf");
    cr_expect(isinf(kiln_bf16_round_stochastic(-INFINITY, 0.5f)) && kiln_bf16_round_stochastic(-INFINITY, 0.5f) < 0, "-inf stays");
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

/* ---- the C target's product of half-precision operands (kiln_gemm.h) ---- */

/* Deterministic values in [-2, 2), rounded to the half type. */
static void fill_half(uint16_t *x, size_t n, bool bf16, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float v = (float)(seed >> 8) / 16777216.0f * 4.0f - 2.0f;
        x[i] = bf16 ? kiln_f32_to_bf16(v) : kiln_f32_to_f16(v);
    }
}

static double widened(const uint16_t *x, size_t i, bool bf16) { return bf16 ? kiln_bf16_to_f32(x[i]) : kiln_f16_to_f32(x[i]); }

/* C = op(A) op(B) + beta C through kiln_bf16gemm / kiln_f16gemm, against the sum in double
 * of the widened values: within float's accumulation error (a few ulps of the sum of |terms|,
 * K of them), for shapes that cross every panel edge (KC 256, MC 256, NC 1024), matrix-vector
 * shapes (BLAS's gemv path), leading dimensions wider than the matrix, and an empty K. */
static void check_hgemm(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta)
{
    const int64_t pad = 3, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const int64_t arows = ta ? K : M, brows = tb ? N : K;
    uint16_t *A = calloc((size_t)(arows * lda + 1), 2), *B = calloc((size_t)(brows * ldb + 1), 2);
    float *C = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    cr_assert(A && B && C);
    fill_half(A, (size_t)(arows * lda), bf16, (uint32_t)(M * 7 + K));
    fill_half(B, (size_t)(brows * ldb), bf16, (uint32_t)(N * 13 + K));
    for (int64_t i = 0; i < M * ldc; i++) C[i] = (float)(i % 5) - 2.0f;
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    cr_assert(C0);
    memcpy(C0, C, sizeof(float) * (size_t)(M * ldc));
    (bf16 ? kiln_bf16gemm_beta : kiln_f16gemm_beta)(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, A,
                                                   (int)lda, B, (int)ldb, beta, C, (int)ldc);
    int bad = 0;
    for (int64_t m = 0; m < M && bad < 5; m++)
        for (int64_t n = 0; n < N && bad < 5; n++) {
            double want = beta * (double)C0[m * ldc + n], mag = fabs(want);
            for (int64_t k = 0; k < K; k++) {
                const double a = widened(A, (size_t)(ta ? k * lda + m : m * lda + k), bf16);
                const double b = widened(B, (size_t)(tb ? n * ldb + k : k * ldb + n), bf16);
                want += a * b;
                mag += fabs(a * b);
            }
            const double got = C[m * ldc + n];
            if (fabs(got - want) > 1e-6 * (1 + mag) * (1 + sqrt((double)K))) {
                cr_expect_fail("%s ta %d tb %d M %lld N %lld K %lld beta %g: C[%lld, %lld] = %.9g, want %.9g", bf16 ? "bf16" : "fp16",
                               ta, tb, (long long)M, (long long)N, (long long)K, beta, (long long)m, (long long)n, got, want);
                bad++;
            }
        }
    /* the padding between rows is not written */
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = N; n < ldc; n++) cr_expect_eq(C[m * ldc + n], C0[m * ldc + n], "padding of C written at row %lld", (long long)m);
    free(A);
    free(B);
    free(C);
    free(C0);
}

Test(half_gemm, matches_the_widened_product)
{
    const int64_t shapes[][3] = {{5, 7, 3}, {300, 40, 600}, {17, 1100, 260}, {1, 50, 300}, {40, 1, 300}, {1, 1, 513}, {3, 4, 0}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++)
                check_hgemm(bf16, t & 1, t >> 1 & 1, shapes[s][0], shapes[s][1], shapes[s][2], s % 2 ? 1.0f : 0.0f);
}

static NodeId view_root(const Graph *g, NodeId x)
{
    for (;;) {
        Op op = (Op)g->nodes[x].op;
        if (op != OP_RESHAPE && op != OP_DETACH && op != OP_PERMUTE && op != OP_SLICE && op != OP_EXPAND) return x;
        x = ir_input(g, x, 0);
    }
}

/* Is x (through views) the widening of a half-precision copy? */
static bool rounded(const Graph *g, NodeId x)
{
    const NodeId r = view_root(g, x);
    return g->nodes[r].op == OP_CAST && is_half((DType)g->nodes[ir_input(g, r, 0)].dtype);
}

/* The training graph of a model file after the pipeline in the given precision; d is
 * initialised here (support_compile_file), one per model, freed by the caller. */
static Model *compiled_as(const char *rel, DType half, bool stochastic, GraphMode mode, Diag *d)
{
    Model *m = support_compile_file(rel, mode, d);
    cr_assert(m, "%s: %s", rel, d->out.data);
    StrBuf err;
    sb_init(&err);
    PrecisionOptions p = {.half = half, .stochastic_weights = stochastic};
    PipelineOptions opt = {.precision = &p};
    cr_assert_eq(pipeline_run_opts(m->graph, NULL, &opt, NULL, &err), 0, "%s", err.data);
    sb_free(&err);
    return m;
}

static Model *compiled(const char *rel, DType half, Diag *d) { return compiled_as(rel, half, false, MODE_TRAIN, d); }

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
            cr_expect(n->op == OP_CAST || n->op == OP_UNFOLD || view_root(g, i) != i, "%s: %%%d %s is %s", rel, i, ir_op_info[n->op].name, ir_dtype_name((DType)n->dtype));
            cr_expect_eq(n->dtype, half, "%s: %%%d has another half dtype", rel, i);
            if (n->op == OP_CAST) {
                cr_expect_eq(g->nodes[ir_input(g, i, 0)].dtype, DT_F32, "%s: %%%d narrows a non-f32 value", rel, i);
                narrowed++;
            }
        }
        if (n->op == OP_PARAM) cr_expect_eq(n->dtype, DT_F32, "%s: parameter %s is not an fp32 master", rel, ir_node_name(g, i));
        /* a convolution's windows: unfolded from the image's half copy, never in fp32 */
        if (n->op == OP_UNFOLD) cr_expect_eq(n->dtype, half, "%s: unfold %%%d is %s", rel, i, ir_dtype_name((DType)n->dtype));
        /* reductions (norm statistics, softmax sums, losses) and transcendental functions in f32 */
        if (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX || n->op == OP_EXP || n->op == OP_LOG || n->op == OP_MATMUL)
            cr_expect_eq(n->dtype, DT_F32, "%s: %%%d %s is not f32", rel, i, ir_op_info[n->op].name);
        /* a comparison of floats (max pooling's mask, eq(x, max)) sees both sides rounded the
         * same way, or no element would equal the maximum */
        if (n->op == OP_EQ && ir_dtype_is_float((DType)g->nodes[ir_input(g, i, 0)].dtype))
            cr_expect_eq(rounded(g, ir_input(g, i, 0)), rounded(g, ir_input(g, i, 1)), "%s: eq %%%d compares a rounded value with an unrounded one", rel, i);
        if (n->op != OP_MATMUL) continue;
        /* every operand, parameters included (as autocast): the half-precision copy of an f32
         * value, read through half-precision views; the product accumulates in f32 */
        for (int k = 0; k < 2; k++) {
            NodeId x = ir_input(g, i, k), r = view_root(g, x);
            const Node *rn = &g->nodes[r];
            if (rn->op == OP_UNFOLD) { /* windows unfolded from the image's half copy */
                r = view_root(g, ir_input(g, r, 0));
                rn = &g->nodes[r];
            }
            cr_expect(g->nodes[x].dtype == half && rn->op == OP_CAST && rn->dtype == half && g->nodes[ir_input(g, r, 0)].dtype == DT_F32,
                      "%s: operand %d of matmul %%%d (%%%d %s) is not read in %s", rel, k, i, r, ir_op_info[rn->op].name, ir_dtype_name(half));
            matmul_half += g->nodes[view_root(g, ir_input(g, r, 0))].op == OP_PARAM;
        }
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        cr_expect_eq(g->nodes[g->outputs[k].node].dtype, DT_F32, "%s: output %s is not f32", rel, ir_str(g, g->outputs[k].name));
    cr_expect_gt(matmul_half, 0, "%s: no matrix product reads a parameter's half-precision copy", rel);
    frontend_model_free(m);
    diag_free(&d);
    return narrowed;
}

Test(decisions, mlp) { cr_expect_gt(check_decisions("models/mlp.kiln", DT_BF16), 0); }
Test(decisions, cnn) { cr_expect_gt(check_decisions("models/cnn.kiln", DT_BF16), 0); }
Test(decisions, gpt) { cr_expect_gt(check_decisions("models/gpt.kiln", DT_F16), 0); }

/* weight_rounding = stochastic: every parameter that a product reads is rounded by
 * round_stochastic from its fp32 master, never by a cast, with one noise per parameter (a
 * random_uniform of its shape, a stream of its own) that the forward and the backward
 * copies share, so that they are the same bits; the eval graph rounds to nearest. */
static void check_stochastic(const char *rel)
{
    Diag d;
    Model *m = compiled_as(rel, DT_BF16, true, MODE_TRAIN, &d);
    const Graph *g = m->graph;
    int rounded_params = 0, streams = 0;
    int64_t *stream_of = calloc((size_t)g->nnodes + 1, sizeof *stream_of);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_RANDOM_UNIFORM) {
            for (NodeId j = 0; j < i; j++)
                cr_expect(g->nodes[j].op != OP_RANDOM_UNIFORM || ir_attrs(g, j)[0] != ir_attrs(g, i)[0], "%s: stream %lld twice", rel,
                          (long long)ir_attrs(g, i)[0]);
            streams++;
        }
        if (n->op == OP_CAST && is_half((DType)n->dtype))
            cr_expect_neq(g->nodes[ir_input(g, i, 0)].op, OP_PARAM, "%s: %%%d rounds a parameter to nearest", rel, i);
        if (n->op != OP_ROUND_STOCHASTIC) continue;
        const NodeId w = ir_input(g, i, 0), u = ir_input(g, i, 1);
        cr_expect_eq(g->nodes[w].op, OP_PARAM, "%s: %%%d rounds a non-parameter stochastically", rel, i);
        cr_expect(g->nodes[u].op == OP_RANDOM_UNIFORM && ir_shape_eq(&g->nodes[u].shape, &g->nodes[w].shape), "%s: %%%d's noise", rel, i);
        if (stream_of[w]) cr_expect_eq(stream_of[w], ir_attrs(g, u)[0], "%s: the two copies of %s have different noise", rel, ir_node_name(g, w));
        else rounded_params++;
        stream_of[w] = ir_attrs(g, u)[0];
    }
    cr_expect_gt(rounded_params, 0, "%s: no parameter is rounded stochastically", rel);
    cr_expect_geq(streams, rounded_params, "%s", rel);
    free(stream_of);
    frontend_model_free(m);
    diag_free(&d);
    Model *e = compiled_as(rel, DT_BF16, true, MODE_EVAL, &d);
    for (NodeId i = 0; i < e->graph->nnodes; i++) cr_expect_neq(e->graph->nodes[i].op, OP_ROUND_STOCHASTIC, "%s: the eval graph rounds stochastically", rel);
    frontend_model_free(e);
    diag_free(&d);
}

Test(decisions, stochastic_weights)
{
    check_stochastic("models/mlp.kiln");
    check_stochastic("models/gpt.kiln");
}

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
    int64_t full = memplan_arena_of(a->graph), half = memplan_arena_of(b->graph);
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
    expect_usage_error("gradcheck models/mlp.kiln --precision bf16", "unknown option '--precision'");
    expect_usage_error("emit models/mlp.kiln -o /tmp/kiln-prec-never --infer --precision bf16", "inference programs (--infer, --lib) run in fp32");
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --weight-rounding up", "--weight-rounding must be nearest or stochastic");
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --weight-rounding", "--weight-rounding needs a value");
    expect_usage_error("build models/mlp.kiln -o /tmp/kiln-prec-never --precision fp16 --weight-rounding stochastic",
                       "--weight-rounding stochastic applies to bf16 training only");
    expect_usage_error("ir models/mlp.kiln --weight-rounding stochastic", "precision = fp32 has no half-precision weights");
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

/* Writes dir/tiny.kiln (into path), tiny_gpt with `train_lines` added to its train section,
 * and the repetitive text it trains on (dir/corpus). */
static void write_tiny(char *path, size_t cap, const char *train_lines, StrBuf *out)
{
    snprintf(path, cap, "%s/tiny.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    const char *steps = strstr(tiny_gpt, "    steps = 60\n");
    cr_assert(steps);
    fprintf(f, "%.*s%s%s", (int)(steps - tiny_gpt), tiny_gpt, train_lines, steps);
    fclose(f);
    cr_assert_eq(run("mkdir corpus && for i in $(seq 200); do echo 'the quick brown fox jumps over the lazy dog'; done > corpus/a.txt", out), 0);
}

/* Builds tiny in each precision (tiny-fp32, tiny-bf16, tiny-fp16, and tiny-bf16sr: bf16
 * with the weights rounded stochastically) on a repetitive text. */
static void build_tiny(void)
{
    StrBuf out;
    sb_init(&out);
    char path[256], args[512];
    write_tiny(path, sizeof path, "", &out);
    const char *names[] = {"fp32", "bf16", "fp16", "bf16sr"}, *flags[] = {"fp32", "bf16", "fp16", "bf16 --weight-rounding stochastic"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "build %s --precision %s -o %s/tiny-%s", path, flags[i], dir, names[i]);
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
    const char *at = strstr(out.data, "eval at step 60 (");
    at = at ? strstr(at, "): loss ") : NULL;
    cr_assert(at, "%s", out.data);
    double v = strtod(at + strlen("): loss "), NULL);
    sb_free(&out);
    return v;
}

Test(train, tiny_gpt_half_precision_close_to_fp32_and_resumes_exactly, .init = setup, .fini = teardown, .timeout = 300)
{
    build_tiny();
    double full = eval_loss("tiny-fp32"), bf16 = eval_loss("tiny-bf16"), fp16 = eval_loss("tiny-fp16"), sr = eval_loss("tiny-bf16sr");
    cr_expect(full < 2.5, "fp32 did not learn: validation loss %g", full);
    cr_expect(fabs(bf16 - full) < 0.05, "bf16 validation loss %g vs fp32 %g", bf16, full);
    cr_expect(fabs(fp16 - full) < 0.05, "fp16 validation loss %g vs fp32 %g", fp16, full);
    cr_expect(fabs(sr - full) < 0.05, "bf16 with stochastically rounded weights: validation loss %g vs fp32 %g", sr, full);
    cr_expect(bf16 != full, "bf16 trained exactly as fp32 did: the precision had no effect");
    cr_expect(sr != bf16, "stochastic rounding trained exactly as rounding to nearest did: the flag had no effect");
    const char *names[] = {"bf16", "fp16", "bf16sr"};
    for (int i = 0; i < 3; i++) {
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

/* A recipe's weight_rounding = stochastic needs its precision = bf16. */
Test(cli, stochastic_weight_rounding_needs_bf16, .init = setup, .fini = teardown)
{
    StrBuf out;
    sb_init(&out);
    char path[256], args[512];
    write_tiny(path, sizeof path, "    weight_rounding = stochastic\n", &out);
    snprintf(args, sizeof args, "check %s", path);
    cr_expect_neq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "weight_rounding = stochastic applies to bf16 training only"), "%s", out.data);
    sb_free(&out);
}

/* ---- fp16 loss scaling (runtime/loss_scale.c, docs/precision.md) ---- */

/* GradScaler's update: x0.5 and a skip on inf/NaN, x2 after growth_interval clean steps
 * (the count restarting at each change), a static scale never changing. */
Test(scaler, update_as_gradscaler)
{
    krt_loss_scaler s;
    krt_error err;
    cr_assert_eq(krt_scaler_init(&s, "dynamic", 65536, 3, &err), KRT_OK);
    cr_expect(!krt_scaler_update(&s, true));
    cr_expect_eq(s.scale, 32768.0f);
    cr_expect(krt_scaler_update(&s, false) && krt_scaler_update(&s, false));
    cr_expect_eq(s.scale, 32768.0f);
    cr_expect(!krt_scaler_update(&s, true)); /* the streak restarts */
    for (int i = 0; i < 3; i++) cr_expect(krt_scaler_update(&s, false));
    cr_expect_eq(s.scale, 32768.0f);
    cr_expect_eq(s.growth_tracker, 0);
    cr_expect_eq(s.skipped, 2);
    cr_assert_eq(krt_scaler_init(&s, "0x1p127", 0, 1, &err), KRT_OK); /* a static scale */
    cr_expect(!krt_scaler_update(&s, true) && krt_scaler_update(&s, false));
    cr_expect_eq(s.scale, 0x1p127f);
    cr_expect_neq(krt_scaler_init(&s, "dynamic", 0, 1, &err), KRT_OK);
    cr_expect_neq(krt_scaler_init(&s, "dynamic", 1, 0, &err), KRT_OK);
    cr_expect_neq(krt_scaler_init(&s, "lots", 1, 1, &err), KRT_OK);
}

/* The fused unscale: the norm is krt_grad_norm's of the unscaled gradients, bit for bit,
 * clipping as krt_clip_grad_norm; one inf or NaN anywhere makes it non-finite. */
Test(scaler, unscale_is_the_norm_pass)
{
    enum { N = 70001 };
    float *g = malloc(sizeof(float) * N), *h = malloc(sizeof(float) * N);
    cr_assert(g && h);
    for (int i = 0; i < N; i++) g[i] = (float)((i % 97) - 48) * 0x1p10f, h[i] = g[i] * 0x1p-16f;
    double norm = krt_unscale_clip_grad_norm(g, N, 0x1p-16f, 0);
    cr_expect_eq(norm, krt_grad_norm(h, N));
    cr_expect_eq(memcmp(g, h, sizeof(float) * N), 0);
    for (int i = 0; i < N; i++) g[i] = (float)((i % 97) - 48) * 0x1p10f, h[i] = g[i] * 0x1p-16f;
    double clipped = krt_clip_grad_norm(h, N, 1.0);
    cr_expect_eq(krt_unscale_clip_grad_norm(g, N, 0x1p-16f, 1.0), clipped);
    cr_expect_eq(memcmp(g, h, sizeof(float) * N), 0);
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        g[12345] = bad[k];
        cr_expect(!isfinite(krt_unscale_clip_grad_norm(g, N, 1.0f, 1.0)), "%g", (double)bad[k]);
    }
    g[12345] = 0x1p100f; /* finite, but 2^100 x 2^40 overflows fp32: found as GradScaler finds it */
    cr_expect(!isfinite(krt_unscale_clip_grad_norm(g, N, 0x1p40f, 0)));
    free(g);
    free(h);
}

/* A JSONL log's values of one key, per line (NAN where a line has none or null). */
static int log_values(const char *path, const char *key, double *v, int cap)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[1024], pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"loss\": ")) continue; /* training steps only */
        const char *at = strstr(line, pat);
        /* through float: the log's 9 digits give a float back exactly (the scale is one) */
        v[n++] = at && strncmp(at + strlen(pat), "null", 4) ? (double)strtof(at + strlen(pat), NULL) : NAN;
    }
    fclose(f);
    return n;
}

/* fp16 from a scale of 2^40: the first steps overflow and are skipped (weights, moments and
 * the optimizer's step count unchanged, bit for bit), the scale halving each time; then
 * training proceeds, the scale doubling after every 3 clean steps (and backing off when
 * that overflows again); 60 steps equal k + resume + 60 - k across a skip and a growth. */
Test(train, fp16_loss_scaling_skips_backs_off_grows_and_resumes, .init = setup, .fini = teardown, .timeout = 300)
{
    StrBuf out;
    sb_init(&out);
    char path[256], args[512];
    write_tiny(path, sizeof path, "    precision = fp16\n    loss_scale_init = 2 ** 40\n    loss_scale_growth_interval = 3\n    log = \"log.jsonl\"\n",
               &out);
    snprintf(args, sizeof args, "build %s -o %s/tiny-ls", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    out.len = 0;
    cr_assert_eq(run("./tiny-ls --checkpoint-dir full", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "fp16 loss scale 1.09951e+12, dynamic (x2 after 3 clean steps)"), "%s", out.data);
    cr_expect(strstr(out.data, "step 60/60") && strstr(out.data, "  skipped "), "no skipped count in the progress line:\n%s", out.data);
    char logp[128];
    snprintf(logp, sizeof logp, "%s/log.jsonl", dir);
    double scale[64], norm[64], loss[64], skipped[64];
    cr_assert_eq(log_values(logp, "loss_scale", scale, 64), 60);
    log_values(logp, "grad_norm", norm, 64);
    log_values(logp, "loss", loss, 64);
    log_values(logp, "skipped_steps", skipped, 64);
    /* the first steps overflow: skipped, each halving the scale */
    int first_clean = 0;
    while (first_clean < 60 && isnan(norm[first_clean])) first_clean++;
    cr_assert(first_clean >= 2 && first_clean < 30, "%d steps skipped before the first clean one", first_clean);
    for (int i = 0; i < first_clean; i++) {
        cr_expect_eq(scale[i], ldexp(1, 40 - i), "step %d's scale %g", i + 1, scale[i]);
        cr_expect_eq(skipped[i], i + 1);
    }
    /* afterwards: x2 after 3 clean steps in a row, x0.5 after a skip */
    int grew = 0, backed_off = 0, run_len = 0, resume_at = 0;
    for (int i = first_clean; i < 59; i++) {
        bool skip = isnan(norm[i]);
        run_len = skip ? 0 : run_len + 1;
        double want = skip ? scale[i] / 2 : run_len == 3 ? scale[i] * 2 : scale[i];
        if (run_len == 3) run_len = 0;
        cr_expect_eq(scale[i + 1], want, "step %d: scale %g after %g (%s)", i + 2, scale[i + 1], scale[i], skip ? "skipped" : "clean");
        grew += want > scale[i];
        backed_off += skip;
        if (skip && !resume_at && grew) resume_at = i; /* resume right before a skipped step, after a growth */
    }
    cr_expect(grew > 0, "the scale never grew");
    cr_expect(loss[59] < loss[first_clean] - 1, "the loss did not fall: %g at the first clean step, %g at the end", loss[first_clean], loss[59]);
    /* a skipped step changes nothing: steps 1 and 2 hold the same weights and moments */
    cr_assert_eq(run("./tiny-ls --steps 2 --checkpoint-dir two --checkpoint-every 1", &out), 0, "%s", out.data);
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/two/step-00000001/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/two/step-00000002/model.safetensors", dir);
    const char *why = ckpt_tensor_difference(a, b);
    cr_expect(!why, "a skipped step changed the weights: %s", why);
    snprintf(a, sizeof a, "%s/two/step-00000001/train_state.safetensors", dir);
    snprintf(b, sizeof b, "%s/two/step-00000002/train_state.safetensors", dir);
    why = ckpt_tensor_difference(a, b);
    cr_expect(!why, "a skipped step changed the optimizer state: %s", why);
    krt_safetensors *st = NULL;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(b, &st, &err), KRT_OK, "%s", err.msg);
    cr_expect_str_eq(krt_safetensors_meta(st, "optimizer_step"), "0");
    cr_expect_str_eq(krt_safetensors_meta(st, "loss_scale_skipped"), "2");
    cr_expect_str_eq(krt_safetensors_meta(st, "loss_scale"), "2.74877907e+11"); /* 2^38 */
    krt_safetensors_free(st);
    /* resumed across a skipped step and later growth: the same 60th step */
    cr_assert(resume_at > 0, "no skipped step after a growth to resume at");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "./tiny-ls --steps %d --checkpoint-dir part && ./tiny-ls --resume part --checkpoint-dir part", resume_at);
    cr_assert_eq(run(cmd, &out), 0, "%s", out.data);
    const char *files[] = {"model", "train_state"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/full/step-00000060/%s.safetensors", dir, files[i]);
        snprintf(b, sizeof b, "%s/part/step-00000060/%s.safetensors", dir, files[i]);
        why = ckpt_difference(a, b);
        cr_expect(!why, "60 steps differ from %d + resume in %s: %s", resume_at, files[i], why);
    }
    cr_expect(backed_off > 0);
    sb_free(&out);
}

/* fp16 builds scale by default (a loss_scale node seeds the backward pass); bf16 does not. */
Test(cli, fp16_seeds_the_backward_pass_with_the_loss_scale)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln("ir models/mlp.kiln --after autodiff --precision fp16", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "= loss_scale : f32[]"), "%s", out.data);
    out.len = 0;
    cr_assert_eq(support_run_kiln("ir models/mlp.kiln --after autodiff --precision bf16", &out), 0, "%s", out.data);
    cr_expect(!strstr(out.data, "loss_scale"), "%s", out.data);
    sb_free(&out);
}

/* cnn in bf16: its max pooling's backward compares the kept (rounded) activations with the
 * maximum, rounded too (a fp32 maximum matched no element, and the first step's gradient was
 * 0/0); the first steps' gradients are finite and the loss follows fp32's. */
Test(train, cnn_bf16_trains_as_fp32, .init = setup, .fini = teardown, .timeout = 300)
{
    StrBuf out;
    sb_init(&out);
    double loss[2] = {0, 0};
    const char *names[] = {"fp32", "bf16"};
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, "build %s/models/cnn.kiln --precision %s -o %s/cnn-%s", KILN_SOURCE_DIR, names[i], dir, names[i]);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
        snprintf(args, sizeof args, "./cnn-%s --steps 6 --batch 32 --eval-batches 1 --checkpoint-dir ck-%s --log log-%s.jsonl",
                 names[i], names[i], names[i]);
        out.len = 0;
        cr_assert_eq(run(args, &out), 0, "%s: %s", names[i], out.data);
        char path[256];
        snprintf(path, sizeof path, "%s/log-%s.jsonl", dir, names[i]);
        double norms[16], losses[16];
        int n = log_values(path, "grad_norm", norms, 16);
        cr_expect_eq(log_values(path, "loss", losses, 16), 6);
        cr_expect_eq(n, 6, "%s: %d steps logged", names[i], n);
        for (int k = 0; k < n; k++) cr_expect(isfinite(norms[k]), "%s: the gradient norm of step %d is not finite", names[i], k + 1);
        loss[i] = losses[5];
    }
    cr_expect(fabs(loss[1] - loss[0]) < 0.1, "cnn's loss after 6 steps: bf16 %g, fp32 %g", loss[1], loss[0]);
    sb_free(&out);
}
