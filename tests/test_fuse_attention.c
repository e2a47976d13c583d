/* test_fuse_attention.c — the attention pass (passes/fuse_attention.c) and the fused
 * attention ops (ir/ops.h) against their oracles:
 *   - every variant test_attention.c recognises is fused into one attention op with its
 *     mask kind, scale and dropout, and what is not attention stays unfused;
 *   - the interpreter's fused graph (forward and every gradient autodiff builds from
 *     attention_grad) equals the unfused graph's, in double, for every mask kind, dropout
 *     (the same random numbers), grouped-query heads (llama) and the models;
 *   - the fused gradients pass finite differences (gradcheck) for every mask kind and
 *     dropout;
 *   - the text form round-trips the new ops and the verifier refuses malformed ones;
 *   - the generated C program computes what the interpreter does, and trains gpt and llama
 *     to the same losses fused and unfused (test_codegen's and the bench's programs are
 *     not shared: two small builds here).
 * The C kernel itself is tested against a textbook attention in test_rt_attention.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/attention.h"
#include "../passes/passes.h"
#include "support.h"

/* A model whose forward is body, over q, k, v [B, 4, T, 8] (each through a Linear, so that
 * all three need gradients) and a [T, T] mask input, with a sum of squares as its loss. */
static Model *compile_body(const char *body)
{
    StrBuf text;
    sb_init(&text);
    sb_printf(&text,
              "model t\n"
              "dim T <= 16\n"
              "w = Linear(8, 8)\n"
              "forward(q: f32[B, 4, T, 8], k: f32[B, 4, T, 8], v: f32[B, 4, T, 8], mask: f32[T, T]) -> y {\n"
              "    q = w(q)\n"
              "    k = w(k)\n"
              "    v = w(v)\n"
              "%s\n"
              "}\n"
              "loss(y) = mean(y * y)\n",
              body);
    Diag d;
    diag_init(&d, NULL);
    Model *model = frontend_compile(&d, "t.kiln", text.data, text.len, MODE_TRAIN);
    cr_assert(model, "%s\n%s", text.data, d.out.data ? d.out.data : "");
    diag_free(&d);
    sb_free(&text);
    return model;
}

/* The graph through the pipeline up to `after`, fused or not. */
static Graph *run_to(const Graph *lowered, const char *after, bool fused)
{
    Graph *g = ir_graph_clone(lowered);
    StrBuf err;
    sb_init(&err);
    PipelineOptions opt = {.unfused_attention = !fused};
    cr_assert_eq(pipeline_run_opts(g, after, &opt, NULL, &err), 0, "%s", err.data);
    sb_free(&err);
    return g;
}

static int count_op(const Graph *g, Op op)
{
    int n = 0;
    for (NodeId i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* Runs g in the interpreter at B = 2, T = 5 with the same parameters, inputs and random
 * numbers every time: q, k, v normal-ish, the mask +1 where (i + j) % 3 == 0 and -1
 * elsewhere (so that `mask > 0` keeps, and masked_fill drops, some but never all of a
 * row's keys). */
static void run_graph(Interp *ip, const Graph *g)
{
    interp_init(ip, g);
    cr_assert_eq(interp_set_symbol(ip, "B", 2), 0);
    cr_assert_eq(interp_set_symbol(ip, "T", 5), 0);
    ip->seed = 7;
    ip->step = 3;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_INPUT) continue;
        int64_t count = 1;
        for (int a = 0; a < g->nodes[i].shape.rank; a++) count *= ir_dim_eval(g->nodes[i].shape.d[a], ip->symvals);
        double *x = xmalloc((size_t)count * sizeof *x);
        const bool mask = !strcmp(ir_node_name(g, i), "mask");
        for (int64_t e = 0; e < count; e++) {
            if (mask) x[e] = ((e / 5 + e % 5) % 3 == 0) ? 1.0 : -1.0;
            else x[e] = sin(0.7 * (double)e + 0.3 * (double)i) * 1.5;
        }
        interp_set(ip, i, x);
        free(x);
    }
    interp_init_params(ip, 11);
    cr_assert_eq(interp_run(ip), 0, "%s", ip->err.data);
}

/* The largest relative difference between the two graphs' outputs of the same name. */
static double compare_outputs(const Graph *a, Interp *ia, const Graph *b, Interp *ib, int *compared)
{
    double worst = 0;
    *compared = 0;
    for (int32_t k = 0; k < a->noutputs; k++) {
        const char *name = ir_str(a, a->outputs[k].name);
        int32_t m = -1;
        for (int32_t j = 0; j < b->noutputs; j++)
            if (!strcmp(ir_str(b, b->outputs[j].name), name) && b->outputs[j].kind == a->outputs[k].kind) m = j;
        cr_assert_geq(m, 0, "output %s missing", name);
        const ITensor *x = interp_value(ia, a->outputs[k].node), *y = interp_value(ib, b->outputs[m].node);
        cr_assert_eq(x->n, y->n, "output %s: %lld vs %lld elements", name, (long long)x->n, (long long)y->n);
        for (int64_t e = 0; e < x->n; e++) {
            cr_assert(!isnan(x->data[e]) && !isnan(y->data[e]), "output %s[%lld] is NaN", name, (long long)e);
            const double d = fabs(x->data[e] - y->data[e]) / fmax(1e-6, fabs(x->data[e]));
            worst = fmax(worst, d);
        }
        ++*compared;
    }
    return worst;
}

/* Fused and unfused training graphs of body give the same loss and gradients. */
static void expect_same(const char *body, AttnMask mask, double dropout, bool needs_mask_grad)
{
    Model *m = compile_body(body);
    Graph *fused = run_to(m->graph, "simplify", true), *plain = run_to(m->graph, "simplify", false);
    cr_assert_eq(count_op(fused, OP_ATTENTION), 1, "not fused:\n%s", body);
    cr_assert_eq(count_op(plain, OP_ATTENTION), 0);
    cr_expect_eq(count_op(fused, OP_ATTENTION_GRAD), 3 + needs_mask_grad, "dq, dk, dv%s:\n%s", needs_mask_grad ? ", dmask" : "", body);
    for (NodeId i = 0; i < fused->nnodes; i++)
        if (fused->nodes[i].op == OP_ATTENTION) {
            cr_expect_eq(ir_attrs(fused, i)[0], mask, "mask kind %lld:\n%s", (long long)ir_attrs(fused, i)[0], body);
            cr_expect(fabs(fused->nodes[i].fattr[1] - dropout) < 1e-12, "dropout %g:\n%s", fused->nodes[i].fattr[1], body);
        }
    /* no [.., T, T] value is left in the fused graph */
    for (NodeId i = 0; i < fused->nnodes; i++) {
        const Shape *s = &fused->nodes[i].shape;
        const bool tt = s->rank == 4 && s->d[2].nsym == 1 && s->d[3].nsym == 1 && s->d[2].sym[0] == s->d[3].sym[0] &&
                        ir_find_symbol(fused, "T") == s->d[2].sym[0] && fused->nodes[i].op != OP_EXPAND && fused->nodes[i].op != OP_INPUT;
        cr_expect(!tt || mask == ATTN_MASK_ADD || mask == ATTN_MASK_KEEP || mask == ATTN_MASK_DROP, "%%%d %s is T x T:\n%s", i,
                  ir_op_info[fused->nodes[i].op].name, body);
    }
    Interp a, b;
    run_graph(&a, fused);
    run_graph(&b, plain);
    int n;
    const double worst = compare_outputs(fused, &a, plain, &b, &n);
    cr_expect_gt(n, 2, "%d outputs compared", n);
    cr_expect_lt(worst, 1e-10, "fused and unfused differ by %g (relative):\n%s", worst, body);
    interp_free(&a);
    interp_free(&b);
    ir_graph_free(fused);
    ir_graph_free(plain);
    frontend_model_free(m);
}

static const struct {
    const char *body;
    AttnMask mask;
    double dropout;
    bool mask_grad; /* an added mask computed from what needs a gradient */
} variants[] = {
    {"    y = scaled_dot_product_attention(q, k, v)", ATTN_MASK_NONE, 0, false},
    {"    y = scaled_dot_product_attention(q, k, v, is_causal = true)", ATTN_MASK_CAUSAL, 0, false},
    {"    y = scaled_dot_product_attention(q, k, v, attn_mask = mask)", ATTN_MASK_ADD, 0, false},
    /* an added mask that needs a gradient (a function of q and v) */
    {"    s = q @ k.transpose(-2, -1) * 0.125\n    y = softmax(s + (q @ v.transpose(-2, -1)), dim = -1) @ v", ATTN_MASK_ADD, 0, true},
    {"    y = scaled_dot_product_attention(q, k, v, attn_mask = mask > 0)", ATTN_MASK_KEEP, 0, false},
    {"    y = scaled_dot_product_attention(q, k, v, scale = 0.5, dropout_p = 0.25)", ATTN_MASK_NONE, 0.25, false},
    {"    y = scaled_dot_product_attention(q, k, v, is_causal = true, dropout_p = 0.5)", ATTN_MASK_CAUSAL, 0.5, false},
    {"    y = softmax(q @ k.transpose(-2, -1) / 4, dim = -1) @ v", ATTN_MASK_NONE, 0, false},
    {"    y = softmax((q * 0.5) @ k.transpose(-2, -1), dim = -1) @ v", ATTN_MASK_NONE, 0, false},
    {"    s = q @ k.transpose(-2, -1) * 0.125\n    y = softmax(s + mask, dim = -1) @ v", ATTN_MASK_ADD, 0, false},
    {"    t = q.shape[2]\n    i = arange(t)\n    s = masked_fill(q @ k.transpose(-2, -1) * 0.125, i.unsqueeze(0) > i.unsqueeze(1), -inf)\n"
     "    y = softmax(s, dim = -1) @ v",
     ATTN_MASK_CAUSAL, 0, false},
    {"    s = masked_fill(q @ k.transpose(-2, -1) * 0.125, mask > 0, -inf)\n    y = softmax(s, dim = -1) @ v", ATTN_MASK_DROP, 0, false},
    /* kᵀ's transpose merged with the heads' (k given as [B, T, 4, 8]) */
    {"    kk = k.transpose(1, 2)\n    y = softmax(q @ kk.transpose(1, 2).transpose(-2, -1) * 0.25, dim = -1) @ v", ATTN_MASK_NONE, 0, false},
};

Test(fuse_attention, every_variant_equals_the_unfused_graph)
{
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++)
        expect_same(variants[i].body, variants[i].mask, variants[i].dropout, variants[i].mask_grad);
}

Test(fuse_attention, what_is_not_attention_stays_unfused)
{
    static const char *const bodies[] = {
        "    y = softmax(q @ k.transpose(-2, -1) * 0.125, dim = -2) @ v",
        "    y = (softmax(q @ k.transpose(-2, -1) * 0.125, dim = -1) * 2) @ v",
        "    y = softmax(tanh(q @ k.transpose(-2, -1)), dim = -1) @ v",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        Model *m = compile_body(bodies[i]);
        Graph *g = run_to(m->graph, "attention", true);
        cr_expect_eq(count_op(g, OP_ATTENTION), 0, "fused what is not attention:\n%s", bodies[i]);
        ir_graph_free(g);
        frontend_model_free(m);
    }
}

/* The fused gradients against finite differences, inputs included. */
Test(fuse_attention, gradients_pass_finite_differences)
{
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        if (!SUPPORT_REPEAT_RUNS && i > 2) break; /* the sanitizer build: the code is the same for every variant */
        Model *m = compile_body(variants[i].body);
        Graph *g = run_to(m->graph, "attention", true);
        cr_assert_eq(count_op(g, OP_ATTENTION), 1);
        GradcheckOptions o = {.seed = 3, .tolerance = 1e-6, .samples = 4, .sym_value = 3, .wrt_inputs = true};
        GradcheckResult *res;
        int n;
        StrBuf err;
        sb_init(&err);
        const int fails = gradcheck_run(g, &o, &res, &n, &err);
        cr_assert_geq(fails, 0, "%s", err.data);
        for (int r = 0; r < n; r++)
            cr_expect_neq(res[r].verdict, GRADCHECK_FAIL, "%s: gradient of %s fails (relative error %g)", variants[i].body, res[r].name,
                          res[r].max_rel_error);
        gradcheck_free(res, n);
        sb_free(&err);
        ir_graph_free(g);
        frontend_model_free(m);
    }
}

/* gpt and llama (4 query heads over 2 key/value heads, rotary embeddings before it): every
 * attention fused, the training graphs equal in the interpreter. */
Test(fuse_attention, the_models)
{
    static const char *const files[] = {"models/gpt.kiln", "models/llama.kiln"};
    for (size_t f = 0; f < 2; f++) {
        Diag d;
        Model *m = support_compile_file(files[f], MODE_TRAIN, &d);
        Graph *fused = run_to(m->graph, "simplify", true), *plain = run_to(m->graph, "simplify", false);
        cr_expect_eq(count_op(fused, OP_ATTENTION), 4, "%s", files[f]);
        cr_expect_eq(count_op(fused, OP_ATTENTION_GRAD), 12, "%s", files[f]);
        if (f == 1)
            for (NodeId i = 0; i < fused->nnodes; i++)
                if (fused->nodes[i].op == OP_ATTENTION)
                    cr_expect_eq(fused->nodes[ir_input(fused, i, 1)].shape.d[1].k, 2, "llama's k enters with its 2 heads");
        Interp a, b;
        interp_init(&a, fused);
        interp_init(&b, plain);
        for (int s = 0; s < fused->nsyms; s++) {
            interp_set_symbol(&a, fused->syms[s].name, strcmp(fused->syms[s].name, "B") ? 9 : 2);
            interp_set_symbol(&b, fused->syms[s].name, strcmp(fused->syms[s].name, "B") ? 9 : 2);
        }
        for (NodeId i = 0; i < fused->nnodes; i++) {
            if (fused->nodes[i].op != OP_INPUT) continue;
            NodeId j = ir_find_named(plain, OP_INPUT, ir_node_name(fused, i));
            cr_assert_neq(j, IR_NONE);
            int64_t count = 1;
            for (int x = 0; x < fused->nodes[i].shape.rank; x++) count *= ir_dim_eval(fused->nodes[i].shape.d[x], a.symvals);
            double *v = xmalloc((size_t)count * sizeof *v);
            for (int64_t e = 0; e < count; e++) v[e] = (double)((e * 7 + 3) % 50); /* tokens */
            interp_set(&a, i, v);
            interp_set(&b, j, v);
            free(v);
        }
        interp_init_params(&a, 5);
        interp_init_params(&b, 5);
        cr_assert_eq(interp_run(&a), 0, "%s", a.err.data);
        cr_assert_eq(interp_run(&b), 0, "%s", b.err.data);
        int n;
        const double worst = compare_outputs(fused, &a, plain, &b, &n);
        cr_expect_lt(worst, 1e-9, "%s: fused and unfused differ by %g", files[f], worst);
        interp_free(&a);
        interp_free(&b);
        ir_graph_free(fused);
        ir_graph_free(plain);
        frontend_model_free(m);
        diag_free(&d);
    }
}

Test(fuse_attention, text_form_and_verifier)
{
    Model *m = compile_body("    y = scaled_dot_product_attention(q, k, v, is_causal = true, dropout_p = 0.5)");
    Graph *g = run_to(m->graph, "simplify", true);
    StrBuf t, t2;
    sb_init(&t);
    sb_init(&t2);
    ir_print(g, &t);
    cr_expect(strstr(t.data, "= attention ") && strstr(t.data, "mask=causal") && strstr(t.data, "dropout=0.5") &&
                  strstr(t.data, "= attention_lse ") && strstr(t.data, "grad=k"),
              "%s", t.data);
    Diag d;
    diag_init(&d, NULL);
    Graph *back = ir_read(t.data, t.len, "t.ir", &d);
    cr_assert(back, "%s", d.out.data);
    ir_print(back, &t2);
    cr_expect_str_eq(t.data, t2.data);
    ir_graph_free(back);
    /* malformed: a mask kind, grad and dropout out of range, a mask operand missing */
    static const struct {
        const char *from, *to, *says;
    } bad[] = {
        {"mask=causal", "mask=sideways", "expected a mask kind"},
        {"grad=k", "grad=z", "expected the operand the gradient is of"},
        {"dropout=0.5", "dropout=1.5", "dropout rate is not in [0, 1)"},
        {"mask=causal", "mask=keep", "operands with mask=keep"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        StrBuf e;
        sb_init(&e);
        sb_puts(&e, t.data);
        char *at = strstr(e.data, bad[i].from);
        cr_assert(at);
        StrBuf r;
        sb_init(&r);
        sb_putn(&r, e.data, (size_t)(at - e.data));
        sb_puts(&r, bad[i].to);
        sb_puts(&r, at + strlen(bad[i].from));
        Diag d2;
        diag_init(&d2, NULL);
        Graph *gb = ir_read(r.data, r.len, "bad.ir", &d2);
        StrBuf verr;
        sb_init(&verr);
        if (gb) ir_verify(gb, &verr);
        const char *said = gb ? verr.data : d2.out.data;
        cr_expect(said && strstr(said, bad[i].says), "%s -> %s: %s", bad[i].from, bad[i].to, said ? said : "(accepted)");
        ir_graph_free(gb);
        sb_free(&verr);
        diag_free(&d2);
        sb_free(&r);
        sb_free(&e);
    }
    diag_free(&d);
    sb_free(&t);
    sb_free(&t2);
    ir_graph_free(g);
    frontend_model_free(m);
}

/* kiln check's report of what was fused and saved, the flag, kiln ir --after fusion. */
Test(fuse_attention, kiln_report_and_flag)
{
    char args[1024];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "check %s/models/gpt.kiln", KILN_SOURCE_DIR);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(4 fused: the training activations saved;") && strstr(out.data, "planned with --attention unfused)"), "%s",
              out.data);
    cr_expect(strstr(out.data, "models/gpt.kiln:15 (x4): causal, 4 heads, fused: no f32 [B, 4, T, T] probabilities stored"), "%s", out.data);
    /* an inference program's report names them too */
    char dir[] = "/tmp/kiln-fuse-report-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    snprintf(args, sizeof args, "emit --infer --report %s/models/gpt2-124m.kiln -o %s/out", KILN_SOURCE_DIR, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(12 fused: the bytes of the probabilities not stored)") &&
                  strstr(out.data, "models/gpt2-124m.kiln:16 (x12): causal, 12 heads, fused: no f32 [B, 12, T, T] probabilities stored"),
              "%s", out.data);
    support_remove_dir(dir);
    snprintf(args, sizeof args, "check --attention unfused %s/models/gpt.kiln", KILN_SOURCE_DIR);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(4 found, computed unfused"), "%s", out.data);
    snprintf(args, sizeof args, "check --attention sideways %s/models/gpt.kiln", KILN_SOURCE_DIR);
    cr_expect_eq(support_run_kiln(args, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "--attention must be fused or unfused, not 'sideways'"), "%s", out.data);
    snprintf(args, sizeof args, "ir --after fusion %s/models/llama.kiln", KILN_SOURCE_DIR);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "attention_grad") && strstr(out.data, "= attention "), "%s", out.data);
    /* the kernels' listing: fused, the output written permuted, q read in place */
    cr_expect(strstr(out.data, " attention: fused, no [T, S] tensor; written permuted as %") && strstr(out.data, " attention_grad: fused, the probabilities recomputed"),
              "%s", out.data);
    sb_free(&out);
}

/* The CUDA target fuses as the C target does, with the kernels of
 * runtime/cuda/kiln_cuda_attention.h (their numbers: test_cuda_attention.c, test_cuda_train.c),
 * up to their head size of 128: a larger head stays unfused there, and the report says why. */
Test(fuse_attention, cuda_target_fuses_heads_up_to_128)
{
    char dir[] = "/tmp/kiln-fuse-cuda-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    char args[1024], path[600];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "emit --target cuda --report %s/models/gpt.kiln -o %s/gpt", KILN_SOURCE_DIR, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(4 fused: the training activations saved;"), "%s", out.data);
    snprintf(path, sizeof path, "%s/gpt/model.cu", dir);
    size_t len;
    StrBuf err;
    sb_init(&err);
    char *cu = util_read_file(path, &len, &err);
    cr_assert(cu, "%s", err.data);
    cr_expect(strstr(cu, "#include \"kiln_cuda_attention.h\"") && strstr(cu, "kiln_attention_fwd_block(a, q, k, v, out, lse, ") &&
                  strstr(cu, "kiln_attention_dkv_block<8>(") && strstr(cu, "kiln_attention_dq_block("),
              "gpt's model.cu does not launch the fused kernels");
    free(cu);
    /* heads of 256 */
    snprintf(path, sizeof path, "%s/big.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("model big\n"
          "dim T <= 16\n"
          "attn = MultiheadAttention(512, 2)\n"
          "head = Linear(512, 4)\n"
          "forward(x: f32[B, T, 512]) -> y {\n"
          "    a, w = attn(x, x, x)\n"
          "    y = head(a)\n"
          "}\n"
          "loss(y, t: i32[B, T]) = cross_entropy(y, t)\n",
          f);
    fclose(f);
    snprintf(args, sizeof args, "emit --target cuda --report %s -o %s/big-cuda", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(1 found, computed unfused (1 with a head size over 128, the CUDA kernels' largest)"), "%s", out.data);
    snprintf(path, sizeof path, "%s/big-cuda/model.cu", dir);
    cu = util_read_file(path, &len, &err);
    cr_assert(cu, "%s", err.data);
    cr_expect(!strstr(cu, "kiln_cuda_attention.h"), "heads of 256 fused on the CUDA target");
    free(cu);
    snprintf(path, sizeof path, "%s/big.kiln", dir);
    snprintf(args, sizeof args, "emit --report %s -o %s/big-c", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(1 fused:"), "the C target takes any head size:\n%s", out.data);
    sb_free(&out);
    sb_free(&err);
    support_remove_dir(dir);
}


/* gpt, gpt with dropout 0.1 on its attention probabilities and llama trained 20 steps
 * fused and unfused (the same seed and data): the same losses to the digits the program
 * logs. With dropout the fused kernel must drop the positions the unfused graph drops
 * (the same counter numbers of the same stream, seed and step). The sanitizer build
 * trains 5 steps. */
Test(fuse_attention, training_agrees_with_the_unfused_program, .timeout = 600)
{
    static const char *const models[] = {"gpt", "gpt-dropout", "llama"};
    char dir[] = "/tmp/kiln-fuse-attention-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    const int steps = SUPPORT_REPEAT_RUNS ? 20 : 5;
    /* gpt with attention dropout: models/gpt.kiln's CausalSelfAttention(C, H) given dropout */
    size_t len;
    char *text = support_read("models/gpt.kiln", &len);
    cr_assert(text);
    const char *at = strstr(text, "CausalSelfAttention(C, H)");
    cr_assert(at, "models/gpt.kiln changed");
    char path[600];
    snprintf(path, sizeof path, "%s/gpt-dropout.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "%.*sCausalSelfAttention(C, H, dropout = 0.1)%s", (int)(at - text), text, at + strlen("CausalSelfAttention(C, H)"));
    fclose(f);
    free(text);
    for (int m = 0; m < 3; m++) {
        char args[1024], model[700];
        StrBuf out;
        sb_init(&out);
        if (m == 1) snprintf(model, sizeof model, "%s", path);
        else snprintf(model, sizeof model, "%s/models/%s.kiln", KILN_SOURCE_DIR, models[m]);
        for (int u = 0; u < 2; u++) {
            snprintf(args, sizeof args, "build %s --bound T=64 %s -o %s/%s-%d", model, u ? "--attention unfused" : "", dir, models[m], u);
            cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
            snprintf(args, sizeof args, "./%s-%d --steps %d --batch 4 --eval-batches 1 --sample-tokens 0 --checkpoint-dir ck-%s-%d --log %s-%d.log",
                     models[m], u, steps, models[m], u, models[m], u);
            cr_assert_eq(support_run_in(dir, args, &out), 0, "%s", out.data);
        }
        double x[32], y[32];
        char log[600];
        snprintf(log, sizeof log, "%s/%s-0.log", dir, models[m]);
        const int n = support_log_losses(log, x, 32);
        snprintf(log, sizeof log, "%s/%s-1.log", dir, models[m]);
        cr_assert_eq(support_log_losses(log, y, 32), n);
        cr_assert_geq(n, steps, "%d losses logged", n);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            worst = fmax(worst, fabs(x[i] - y[i]));
            cr_expect(fabs(x[i] - y[i]) < 5e-5, "%s step %d: fused %.6f, unfused %.6f", models[m], i + 1, x[i], y[i]);
        }
        printf("%s: %d steps fused and unfused, worst loss difference %.2g\n", models[m], n, worst);
        if (m == 0) { /* the bench's FLOPs count the fused kernels' products as the unfused graph's */
            char flops[2][64];
            for (int u = 0; u < 2; u++) {
                snprintf(args, sizeof args, "./%s-%d --bench-steps 1 --batch 4", models[m], u);
                cr_assert_eq(support_run_in(dir, args, &out), 0, "%s", out.data);
                const char *got = strstr(out.data, "\"gemm_flops_per_step\": ");
                cr_assert(got, "%s", out.data);
                snprintf(flops[u], sizeof flops[u], "%.*s", (int)strcspn(got, ","), got);
            }
            cr_expect_str_eq(flops[0], flops[1]);
        }
        sb_free(&out);
    }
    support_remove_dir(dir);
}
