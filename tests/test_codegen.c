/* test_codegen.c — generated C against the reference interpreter: every model is compiled
 * to C, built with the system compiler, run on the same parameters and inputs as the
 * interpreter, and its loss, metrics and every gradient compared (float32 vs double).
 * The models_bf16/models_fp16 suites do the same after the precision pass: both sides
 * round the half-precision values (the interpreter in double, kiln_half.h in float). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../driver/kiln.h"
#include "../codegen/codegen.h"
#include "../codegen/kernel.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "op_cases.h"
#include "support.h"

typedef struct {
    Graph *train, *eval;
    KilnProgram *p;
    char *text; /* build_file's source */
} Graphs;

/* The precision the models are compiled in (the precision pass); f32 unless a suite sets it. */
static PrecisionOptions precision = {.half = DT_F32};
/* How far the generated code may be from the interpreter: float32 rounding, and with half
 * precision a value on either side of a rounding boundary (float vs double before the
 * rounding) may round one half-precision step apart. */
static double loss_tolerance(void) { return precision.half == DT_F32 ? 1e-4 : 2e-3; }
static double grad_tolerance(void) { return precision.half == DT_F32 ? 2e-3 : 1e-2; }

/* The model compiled as `kiln emit` compiles it, through the library call (driver/kiln.h):
 * the training graph after the pipeline, the eval graph, the generated C. fp16 trains
 * with its loss scale, which the driver sets to 1 (the interpreter's). */
static void build_graphs(const char *path, const char *text, size_t len, Graphs *gs)
{
    KilnOptions opt = {.path = path,
                       .text = text,
                       .len = len,
                       .precision = kiln_precision_name(precision.half),
                       .weight_rounding = precision.stochastic_weights ? "stochastic" : NULL};
    StrBuf err;
    sb_init(&err);
    KilnStatus s = kiln_compile(&opt, &gs->p, &err);
    cr_assert_eq(s, KILN_OK, "%s%s", err.data ? err.data : "", gs->p->diag.out.data ? gs->p->diag.out.data : "");
    gs->train = gs->p->train.graph;
    gs->eval = gs->p->eval.graph;
    gs->text = NULL;
    sb_free(&err);
}

static void free_graphs(Graphs *gs)
{
    kiln_program_free(gs->p);
    free(gs->text);
}

/* build_graphs of a model file of the source tree. */
static void build_file(const char *rel, Graphs *gs)
{
    size_t len;
    char *text = support_read(rel, &len);
    cr_assert(text, "cannot read %s", rel);
    build_graphs(rel, text, len, gs);
    gs->text = text;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Runs a compiler command line; fails the test with its output unless it succeeds. */
static void compile_ok(const char *cmd, const char *what)
{
    StrBuf log;
    sb_init(&log);
    int rc = support_run(cmd, &log);
    cr_assert_eq(rc, 0, "%s:\n%.4000s", what, log.data ? log.data : "");
    sb_free(&log);
}

static void build_driver(const char *dir, const Graphs *gs)
{
    char path[512], cmd[4096];
    snprintf(path, sizeof path, "%s/model.c", dir);
    write_file(path, gs->p->code.data, gs->p->code.len);
    snprintf(cmd, sizeof cmd,
             "%s %s -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -I%s/runtime %s/model.c "
             "%s/tests/codegen_driver.c -o %s/driver %s %s -lprotobuf-c -lz -lm -lpthread",
             KILN_CC, KILN_GENERATED_CFLAGS, KILN_SOURCE_DIR, dir, KILN_SOURCE_DIR, dir, KILN_RT_LIB, KILN_OPENBLAS);
    compile_ok(cmd, "the generated C does not compile");
}

static int64_t numel_at(const Graph *g, const Shape *s, const int64_t *symvals)
{
    int64_t n = 1;
    for (int k = 0; k < s->rank; k++) n *= ir_dim_eval(s->d[k], symvals);
    return n;
}

static void put_elem(StrBuf *b, DType t, double v)
{
    switch (t) {
    case DT_F32: { float f = (float)v; sb_putn(b, (char *)&f, 4); break; }
    case DT_F64: sb_putn(b, (char *)&v, 8); break;
    case DT_I32: { int32_t x = (int32_t)v; sb_putn(b, (char *)&x, 4); break; }
    case DT_I64: { int64_t x = (int64_t)v; sb_putn(b, (char *)&x, 8); break; }
    default: { uint8_t x = (uint8_t)v; sb_putn(b, (char *)&x, 1); break; }
    }
}

/* Runs the generated code and the interpreter on the same data; compares. */
static void compare(const char *name, const char *path, const char *text, size_t len, int64_t symval)
{
    Graphs gs;
    build_graphs(path, text, len, &gs);
    char dir[] = "/tmp/kiln-codegen-XXXXXX";
    cr_assert(mkdtemp(dir));
    build_driver(dir, &gs);
    Graph *g = gs.train;
    Interp ip;
    interp_init(&ip, g);
    for (int s = 0; s < g->nsyms; s++) interp_set_symbol(&ip, g->syms[s].name, symval < g->syms[s].max ? symval : g->syms[s].max);
    StrBuf in;
    sb_init(&in);
    int64_t nsyms = g->nsyms;
    sb_putn(&in, (char *)&nsyms, 8);
    for (int s = 0; s < g->nsyms; s++) sb_putn(&in, (char *)&ip.symvals[s], 8);
    /* Inputs: small integers valid as labels and tokens, or smooth floats. */
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_INPUT) continue;
        int64_t cnt = numel_at(g, &n->shape, ip.symvals);
        double *v = malloc(sizeof(double) * (size_t)(cnt ? cnt : 1));
        int64_t range = ir_index_range(g, i);
        if (range <= 0 || range > 10) range = 10;
        for (int64_t e = 0; e < cnt; e++)
            v[e] = ir_dtype_is_float((DType)n->dtype) ? sin((double)e * 0.37 + i) : (double)((e * 7 + i) % range);
        for (int64_t e = 0; e < cnt; e++) put_elem(&in, (DType)n->dtype, v[e]);
        interp_set(&ip, i, v);
        free(v);
    }
    /* Parameters: PyTorch-style init in double, rounded to float for both sides. */
    interp_init_params(&ip, 11);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM || !ir_attrs(g, i)[1]) continue;
        ITensor *t = &ip.vals[i];
        for (int64_t e = 0; e < t->n; e++) {
            t->data[e] = (double)(float)t->data[e];
            put_elem(&in, DT_F32, t->data[e]);
        }
    }
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM || ir_attrs(g, i)[1]) continue;
        ITensor *t = &ip.vals[i];
        size_t before = in.len;
        for (int64_t e = 0; e < t->n; e++) put_elem(&in, (DType)n->dtype, t->data[e]);
        while ((in.len - before) % 8) sb_putc(&in, 0);
    }
    char inpath[600], outpath[600], cmd[1400];
    snprintf(inpath, sizeof inpath, "%s/in.bin", dir);
    snprintf(outpath, sizeof outpath, "%s/out.bin", dir);
    write_file(inpath, in.data, in.len);
    snprintf(cmd, sizeof cmd, "%s/driver %s %s", dir, inpath, outpath);
    cr_assert_eq(system(cmd), 0, "%s: the generated program failed", name);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    size_t olen;
    StrBuf e2;
    sb_init(&e2);
    char *out = util_read_file(outpath, &olen, &e2);
    cr_assert(out);
    const char *p = out;
    double loss;
    memcpy(&loss, p, 8);
    p += 8;
    /* Compare loss, metrics, then each gradient relative to its largest element. */
    int nmet = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        const Output *o = &g->outputs[k];
        if (o->kind == OUT_LOSS) {
            double want = interp_value(&ip, o->node)->data[0];
            if (isnan(want)) cr_expect(isnan(loss), "%s: loss %.9g, but NaN in the interpreter", name, loss);
            else cr_expect(fabs(loss - want) <= loss_tolerance() * fmax(1, fabs(want)), "%s: loss %.9g vs interpreter %.9g", name, loss, want);
        }
        if (o->kind == OUT_METRIC) nmet++;
    }
    int m = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        const Output *o = &g->outputs[k];
        if (o->kind != OUT_METRIC) continue;
        double got;
        memcpy(&got, p + 8 * m++, 8);
        double want = interp_value(&ip, o->node)->data[0];
        cr_expect(fabs(got - want) <= loss_tolerance() * fmax(1, fabs(want)), "%s: metric %s %.9g vs %.9g", name, ir_str(g, o->name), got, want);
    }
    p += 8 * nmet;
    const float *grads = (const float *)p;
    int64_t goff = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM || !ir_attrs(g, i)[1]) continue;
        NodeId gn = IR_NONE;
        for (int32_t k = 0; k < g->noutputs; k++)
            if (g->outputs[k].kind == OUT_GRAD && !strcmp(ir_str(g, g->outputs[k].name), ir_node_name(g, i))) gn = g->outputs[k].node;
        const ITensor *want = interp_value(&ip, gn);
        double scale = 0, worst = 0;
        for (int64_t e = 0; e < want->n; e++) scale = fmax(scale, fabs(want->data[e]));
        for (int64_t e = 0; e < want->n; e++) worst = fmax(worst, fabs((double)grads[goff + e] - want->data[e]));
        if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "%s: gradient of %s: largest %g, differs by %g\n", name, ir_node_name(g, i), scale, worst);
        cr_expect(worst <= grad_tolerance() * fmax(scale, 1e-6), "%s: gradient of %s differs by %g (largest %g)", name, ir_node_name(g, i), worst,
                  scale);
        goff += want->n;
    }
    free(out);
    sb_free(&e2);
    sb_free(&in);
    interp_free(&ip);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)system(cmd);
    free_graphs(&gs);
}

static void compare_file(const char *rel, int64_t symval)
{
    size_t len;
    char *text = support_read(rel, &len);
    cr_assert(text);
    compare(rel, rel, text, len, symval);
    free(text);
}

/* The step functions declare only the pointers they name: model.c compiles with
 * -Werror=unused-variable (as every driver above does). For llama, which no test above
 * compiles, in f32 and bf16; -fsyntax-only keeps it to a second or two. */
static void no_unused_variables(const char *rel)
{
    Graphs gs;
    build_file(rel, &gs);
    char dir[] = "/tmp/kiln-unused-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[512], cmd[4096], what[600];
    snprintf(path, sizeof path, "%s/model.c", dir);
    write_file(path, gs.p->code.data, gs.p->code.len);
    snprintf(cmd, sizeof cmd, "%s %s -std=c11 -fsyntax-only -Wall -Werror=unused-variable -I%s/runtime %s", KILN_CC,
             KILN_GENERATED_CFLAGS, KILN_SOURCE_DIR, path);
    snprintf(what, sizeof what, "%s: the generated C has unused variables", rel);
    compile_ok(cmd, what);
    support_remove_dir(dir);
    free_graphs(&gs);
}

/* The step cites, before each kernel call, the module it computes, forward or backward, and
 * the line where the module is called (not the anchor op's: block 0's first layer norm is
 * fused with the embeddings' add of line 33), and names values after what they hold.
 * Kernel functions are named after their module and role; one several layers share,
 * after what the layers have in common (their module type), and none by a number. */
Test(readable, gpt_step_cites_layers_and_names_values, .timeout = 120)
{
    Graphs gs;
    build_file("models/gpt.kiln", &gs);
    const StrBuf c = gs.p->code;
    const char *step = strstr(c.data, "static void train_step(");
    cr_assert(step);
    static const char *const want[] = {
        "    // h.0.ln_1 forward \u2014 gpt.kiln:15\n    train_h0_ln_1_fwd(",
        "    // h.3.ln_2 backward \u2014 gpt.kiln:16\n",
        "    // h.2.attn forward \u2014 gpt.kiln:15\n",
        "    // ln_f forward \u2014 gpt.kiln:35\n",
        "    float *h0_ln_1_weight = io->params + ",
        "    float *h0_ln_1_weight_grad = io->grads + ",
        "    float *h0_ln_1_sub = (float *)(io->arena + ",
        "); /* [B, T, 128] */\n",
        "    // h.1.ln_1 forward \u2014 gpt.kiln:15\n    train_LayerNorm_fwd(",
        "    // h.3.mlp backward \u2014 gpt.kiln:16\n    train_MLP_c_proj_weight_grad(",
        "    // h.2.attn backward \u2014 gpt.kiln:15\n    train_CausalSelfAttention_c_attn_bias_grad(",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) cr_expect(strstr(step, want[i]), "no '%s' in train_step", want[i]);
    cr_expect(strstr(c.data, "\nKILN_KERNEL void train_LayerNorm_fwd(const int64_t *s"));
    cr_expect(strstr(c.data, "\nKILN_KERNEL void train_h0_ln_1_fwd(const int64_t *s"));
    /* no provisional name is left: prefix_kN_kind (fused), prefix_ID_op (single) */
    for (const char *q = c.data; (q = strstr(q, "_k")); q++)
        cr_expect(!(q[2] >= '0' && q[2] <= '9' && (q[-1] == 'n' || q[-1] == 'l' || q[-1] == 't' || q[-1] == 'e')),
                  "a numbered kernel: %.40s", q - 8);
    for (const char *q = c.data; (q = strstr(q, "train_")); q++) cr_expect(!(q[6] >= '0' && q[6] <= '9'), "a numbered kernel: %.40s", q);
    const char *end = strstr(step, "\n}\n");
    for (const char *q = step; (q = strstr(q, " v")) && q < end; q++)
        cr_expect(!(q[2] >= '0' && q[2] <= '9'), "an unnamed value: %.60s", q);
    free_graphs(&gs);
}

Test(unused, llama, .timeout = 120) { no_unused_variables("models/llama.kiln"); }
Test(unused, llama_bf16, .timeout = 120) { precision.half = DT_BF16; no_unused_variables("models/llama.kiln"); }

Test(models, mlp, .timeout = 300) { compare_file("models/mlp.kiln", 5); }
Test(models, cnn, .timeout = 300) { compare_file("models/cnn.kiln", 2); }
Test(models, gpt, .timeout = 300) { compare_file("models/gpt.kiln", 3); }
Test(models_bf16, mlp, .timeout = 300) { precision.half = DT_BF16; compare_file("models/mlp.kiln", 5); }
Test(models_bf16, cnn, .timeout = 300) { precision.half = DT_BF16; compare_file("models/cnn.kiln", 2); }
Test(models_bf16, gpt, .timeout = 300) { precision.half = DT_BF16; compare_file("models/gpt.kiln", 3); }
Test(models_bf16, mlp_stochastic_weights, .timeout = 300)
{
    precision.half = DT_BF16;
    precision.stochastic_weights = true;
    compare_file("models/mlp.kiln", 5);
}
Test(models_fp16, mlp, .timeout = 300) { precision.half = DT_F16; compare_file("models/mlp.kiln", 5); }
Test(models_fp16, gpt, .timeout = 300) { precision.half = DT_F16; compare_file("models/gpt.kiln", 3); }
Test(models, llama, .timeout = 300) { compare_file("models/llama.kiln", 3); }

/* The text of the first kernel whose header comment contains title, up to the next kernel. */
static char *kernel_text(const char *code, const char *title)
{
    const char *at = strstr(code, title);
    cr_assert(at, "no kernel \"%s\" in the generated code", title);
    const char *end = strstr(at + 1, "\n/* kernel ");
    size_t n = end ? (size_t)(end - at) : strlen(at);
    char *text = malloc(n + 1);
    memcpy(text, at, n);
    text[n] = 0;
    return text;
}

/* A kernel that cannot reach the parallel threshold even at the model's largest batch has
 * no OpenMP region at all (a region whose if clause is false still enters libgomp, a
 * large part of a small kernel's time at batch 1); one that can keeps it. */
Test(models, small_kernels_do_not_enter_openmp, .timeout = 60)
{
    Graphs gs;
    build_file("models/mlp.kiln", &gs);
    const StrBuf c = gs.p->code;
    char *loss = kernel_text(c.data, "row reductions over float[B, 10], rows reduced over axes 1\n");
    cr_expect_null(strstr(loss, "omp parallel"), "the [B, 10] softmax kernel (1280 elements at B = 128) has a parallel region:\n%s", loss);
    cr_expect(strstr(loss, "omp simd"), "the [B, 10] softmax kernel lost its SIMD loop:\n%s", loss);
    char *input = kernel_text(c.data, "elementwise over float[B, 28, 28]\n");
    cr_expect(strstr(input, "omp parallel"), "the [B, 28, 28] input kernel (100352 elements at B = 128) is serial:\n%s", input);
    free(loss);
    free(input);
    free_graphs(&gs);
}

/* A GEMM kernel has one parallel region, over its tasks: a parallel loop inside a task
 * (an epilogue) would be a nested region when the tasks' region is inactive, and libgomp
 * starts a new team of threads for each, a few hundred microseconds. */
Test(models, gemm_kernels_have_one_parallel_region, .timeout = 60)
{
    const char *files[] = {"models/mlp.kiln", "models/gpt.kiln"};
    for (int f = 0; f < 2; f++) {
        Graphs gs;
        build_file(files[f], &gs);
        const StrBuf c = gs.p->code;
        int gemms = 0;
        for (const char *at = strstr(c.data, ": matrix product over "); at; at = strstr(at + 1, ": matrix product over ")) {
            const char *end = strstr(at, "\n}\n"); /* the end of its function */
            int regions = 0;
            for (const char *p = strstr(at, "omp parallel"); p && (!end || p < end); p = strstr(p + 1, "omp parallel")) regions++;
            cr_expect_eq(regions, 1, "%s: a GEMM kernel with %d parallel regions:\n%.*s", files[f], regions,
                         (int)(end ? end - at : (ptrdiff_t)strlen(at)), at);
            gemms++;
        }
        cr_expect(gemms >= 8, "%s: %d GEMM kernels", files[f], gemms);
        free_graphs(&gs);
    }
}

/* Every op and module case: generated C against the interpreter. Parameters are indices:
 * Criterion's workers do not share the parent's pointers. */
#define NOPS (sizeof op_cases / sizeof op_cases[0])
#define NMODULES (sizeof module_cases / sizeof module_cases[0])
static int case_index[NOPS + NMODULES];

ParameterizedTestParameters(cases, generated_c)
{
    for (size_t i = 0; i < NOPS + NMODULES; i++) case_index[i] = (int)i;
    return cr_make_param_array(int, case_index, NOPS + NMODULES);
}

/* A maximum needs no NaN flag over a value that is never NaN (autodiff's negated positions
 * of the first maximum); anything that might be NaN keeps it: an input, inf - inf, 0 * inf. */
Test(codegen, never_nan_is_conservative)
{
    Graph *g = ir_graph_new("t");
    StrBuf err;
    sb_init(&err);
    IrBuilder b = {.g = g, .err = &err};
    Dim d4 = ir_dim_const(4);
    Shape s = ir_shape_make(1, &d4);
    NodeId x = ir_b_input(&b, "x", DT_F32, &s), io = ir_b_iota(&b, &s, 0, DT_F32);
    NodeId zero = ir_b_full(&b, 0.0, DT_F32, &s), low = ir_b_full(&b, -INFINITY, DT_F32, &s), two = ir_b_full(&b, 2.0, DT_F32, &s);
    NodeId cand = ir_b_where(&b, ir_b_binary(&b, OP_EQ, x, x), zero, low);
    NodeId pos = ir_b_binary(&b, OP_SUB, ir_b_binary(&b, OP_MUL, ir_b_binary(&b, OP_SUB, cand, io), two), io);
    cr_assert(!err.len, "%s", err.data);
    cr_expect(cg_never_nan(g, pos, 0));
    cr_expect(cg_never_nan(g, ir_b_unary(&b, OP_NEG, pos), 0));
    cr_expect(cg_never_nan(g, ir_b_cast(&b, ir_b_iota(&b, &s, 0, DT_I64), DT_F32), 0));
    cr_expect(!cg_never_nan(g, x, 0));
    cr_expect(!cg_never_nan(g, ir_b_binary(&b, OP_SUB, x, io), 0));
    cr_expect(!cg_never_nan(g, ir_b_binary(&b, OP_SUB, cand, cand), 0), "inf - inf");
    cr_expect(!cg_never_nan(g, ir_b_binary(&b, OP_MUL, cand, zero), 0), "0 * inf");
    cr_expect(!cg_never_nan(g, ir_b_where(&b, ir_b_binary(&b, OP_EQ, x, x), x, cand), 0));
    cr_expect(!cg_never_nan(g, ir_b_full(&b, NAN, DT_F32, &s), 0));
    sb_free(&err);
    ir_graph_free(g);
}

/* A NaN anywhere in a row makes its maximum NaN (vectorised maxima keep a NaN flag):
 * log of the inputs' negative values. */
Test(cases, max_of_nan_is_nan)
{
    const char *text = "model t\nforward(x: f32[3, 37]) -> y {\n y = max(log(x), axis = 1)\n}\n"
                       "loss(y) = sum(y * y / 2 + y)\ntrain { batch = 3 }\n";
    compare("max_of_nan_is_nan", "case.kiln", text, strlen(text), 3);
}

ParameterizedTest(int *ci, cases, generated_c, .timeout = 120)
{
    char text[2048];
    const char *name;
    if ((size_t)*ci < NOPS) {
        op_case_text(text, sizeof text, &op_cases[*ci]);
        name = op_cases[*ci].name;
    } else {
        module_case_text(text, sizeof text, &module_cases[*ci - NOPS]);
        name = module_cases[*ci - NOPS].name;
    }
    compare(name, "case.kiln", text, strlen(text), 3);
}
