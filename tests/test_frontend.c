/* test_frontend.c — the model language end to end: the reference models compile to the
 * parameter counts and names PyTorch would give; `kiln ir` output matches the golden
 * dumps; the lowered graphs compute what the layers mean (checked by the interpreter
 * against the same maths written out by hand here); print -> read round trips; and the
 * command line's help, version and usage errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../frontend/frontend.h"
#include "support.h"

static Model *compile_text(const char *text, GraphMode mode, Diag *d)
{
    diag_init(d, NULL);
    return frontend_compile(d, "test.kiln", text, strlen(text), mode);
}

static int64_t param_count(const Graph *g, bool trainable)
{
    int64_t n = 0;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_PARAM && (ir_attrs(g, i)[1] != 0) == trainable) n += ir_shape_max_numel(g, &g->nodes[i].shape);
    return n;
}

Test(models, parameter_counts_match_pytorch)
{
    const char *files[] = {"models/mlp.kiln", "models/cnn.kiln", "models/gpt.kiln", "models/gpt2-124m.kiln", "models/llama.kiln"};
    int64_t expect[] = {269322, 421642, 842496, 124439808, 853120};
    for (int i = 0; i < 5; i++) {
        Diag d;
        Model *m = support_compile_file(files[i], MODE_TRAIN, &d);
        cr_expect_eq(param_count(m->graph, true), expect[i], "%s: %lld parameters", files[i],
                     (long long)param_count(m->graph, true));
        frontend_model_free(m);
        diag_free(&d);
    }
}

Test(models, gpt_state_dict_names_and_init)
{
    Diag d;
    Model *m = support_compile_file("models/gpt.kiln", MODE_TRAIN, &d);
    const Graph *g = m->graph;
    NodeId w = ir_find_named(g, OP_PARAM, "h.3.attn.c_proj.weight");
    cr_assert_neq(w, IR_NONE);
    cr_expect_eq(ir_attrs(g, w)[0], INIT_NORMAL);
    cr_expect_float_eq(g->nodes[w].fattr[1], 0.02 / sqrt(8.0), 1e-15);
    NodeId b = ir_find_named(g, OP_PARAM, "h.0.mlp.c_fc.bias");
    cr_assert_neq(b, IR_NONE);
    cr_expect_eq(ir_attrs(g, b)[0], INIT_ZEROS);
    NodeId e = ir_find_named(g, OP_PARAM, "wte.weight");
    cr_expect_eq(ir_attrs(g, e)[0], INIT_NORMAL);
    cr_expect_float_eq(g->nodes[e].fattr[1], 0.02, 1e-15);
    NodeId ln = ir_find_named(g, OP_PARAM, "ln_f.weight");
    cr_expect_eq(ir_attrs(g, ln)[0], INIT_ONES);
    /* The head is tied: there is no separate lm_head parameter. */
    cr_expect_eq(ir_find_named(g, OP_PARAM, "lm_head.weight"), IR_NONE);
    frontend_model_free(m);
    diag_free(&d);
}

/* ---- golden IR dumps ---- */

static void check_golden(const char *model, const char *golden, const char *extra)
{
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "ir %s %s", model, extra);
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s failed:\n%s", args, out.data);
    if (getenv("KILN_UPDATE_GOLDEN")) {
        FILE *f = fopen(support_path(golden), "wb");
        cr_assert(f);
        fwrite(out.data, 1, out.len, f);
        fclose(f);
    }
    size_t len;
    char *want = support_read(golden, &len);
    cr_assert(want, "missing %s (run the tests with KILN_UPDATE_GOLDEN=1 to create it)", golden);
    cr_expect(out.len == len && !memcmp(out.data, want, len),
              "kiln %s differs from %s (rerun with KILN_UPDATE_GOLDEN=1 after checking the change)", args, golden);
    free(want);
    sb_free(&out);
}

Test(golden, mlp_ir) { check_golden("models/mlp.kiln", "tests/golden/mlp.ir", ""); }
Test(golden, cnn_ir) { check_golden("models/cnn.kiln", "tests/golden/cnn.ir", ""); }
Test(golden, gpt_ir) { check_golden("models/gpt.kiln", "tests/golden/gpt.ir", ""); }
Test(golden, mlp_eval_ir) { check_golden("models/mlp.kiln", "tests/golden/mlp.eval.ir", "--mode eval"); }
Test(golden, mlp_after_autodiff) { check_golden("models/mlp.kiln", "tests/golden/mlp.autodiff.ir", "--after autodiff"); }
Test(golden, mlp_after_simplify) { check_golden("models/mlp.kiln", "tests/golden/mlp.simplify.ir", "--after simplify"); }

Test(roundtrip, reference_models_print_read_print)
{
    const char *files[] = {"models/mlp.kiln", "models/cnn.kiln", "models/gpt.kiln"};
    for (int i = 0; i < 3; i++)
        for (int mode = 0; mode < 2; mode++) {
            Diag d;
            Model *m = support_compile_file(files[i], (GraphMode)mode, &d);
            StrBuf a, b;
            sb_init(&a);
            sb_init(&b);
            ir_print(m->graph, &a);
            Diag d2;
            diag_init(&d2, NULL);
            Graph *g = ir_read(a.data, a.len, "roundtrip.ir", &d2);
            cr_assert(g, "%s does not read back:\n%s", files[i], d2.out.data);
            ir_print(g, &b);
            cr_expect(a.len == b.len && !memcmp(a.data, b.data, a.len), "%s: print/read/print differs", files[i]);
            ir_graph_free(g);
            sb_free(&a);
            sb_free(&b);
            diag_free(&d2);
            frontend_model_free(m);
            diag_free(&d);
        }
}

/* ---- semantics: the interpreter on lowered graphs vs the maths written out ---- */

static NodeId output(const Graph *g, const char *name)
{
    for (int32_t i = 0; i < g->noutputs; i++)
        if (!strcmp(ir_str(g, g->outputs[i].name), name)) return g->outputs[i].node;
    cr_assert_fail("no output %s", name);
    return IR_NONE;
}

static const double *param(Interp *ip, const char *name)
{
    NodeId p = ir_find_named(ip->g, OP_PARAM, name);
    cr_assert_neq(p, IR_NONE, "no param %s", name);
    return interp_value(ip, p)->data;
}

Test(semantics, mlp_forward_loss_and_accuracy_by_hand)
{
    Diag d;
    Model *m = support_compile_file("models/mlp.kiln", MODE_TRAIN, &d);
    Graph *g = m->graph;
    Interp ip;
    interp_init(&ip, g);
    cr_assert_eq(interp_set_symbol(&ip, "B", 3), 0);
    double image[3 * 784], label[3] = {7, 0, 9};
    for (int i = 0; i < 3 * 784; i++) image[i] = (i * 37) % 256;
    interp_set(&ip, ir_find_named(g, OP_INPUT, "image"), image);
    interp_set(&ip, ir_find_named(g, OP_INPUT, "label"), label);
    interp_init_params(&ip, 1);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    const double *w1 = param(&ip, "fc1.weight"), *b1 = param(&ip, "fc1.bias");
    const double *w2 = param(&ip, "fc2.weight"), *b2 = param(&ip, "fc2.bias");
    const double *w3 = param(&ip, "fc3.weight"), *b3 = param(&ip, "fc3.bias");
    const double *logits = interp_value(&ip, output(g, "logits"))->data;
    double loss = 0, correct = 0;
    for (int n = 0; n < 3; n++) {
        double h1[256], h2[256], z[10];
        for (int o = 0; o < 256; o++) {
            double s = b1[o];
            for (int i = 0; i < 784; i++) s += w1[o * 784 + i] * image[n * 784 + i] / 255.0;
            h1[o] = s > 0 ? s : 0;
        }
        for (int o = 0; o < 256; o++) {
            double s = b2[o];
            for (int i = 0; i < 256; i++) s += w2[o * 256 + i] * h1[i];
            h2[o] = s > 0 ? s : 0;
        }
        double mx = -INFINITY, se = 0;
        int best = 0;
        for (int o = 0; o < 10; o++) {
            double s = b3[o];
            for (int i = 0; i < 256; i++) s += w3[o * 256 + i] * h2[i];
            z[o] = s;
            cr_expect_float_eq(logits[n * 10 + o], s, 1e-12);
            if (s > mx) mx = s, best = o;
        }
        for (int o = 0; o < 10; o++) se += exp(z[o] - mx);
        loss += log(se) + mx - z[(int)label[n]];
        correct += best == (int)label[n];
    }
    cr_expect_float_eq(interp_value(&ip, output(g, "loss"))->data[0], loss / 3, 1e-12);
    cr_expect_float_eq(interp_value(&ip, output(g, "accuracy"))->data[0], correct / 3, 1e-12);
    interp_free(&ip);
    frontend_model_free(m);
    diag_free(&d);
}

/* Forward of gpt.kiln at T = 5: causal (a later token never changes earlier logits) and
 * the loss of a freshly initialised model is close to log(256). */
Test(semantics, gpt_is_causal_and_starts_near_uniform)
{
    Diag d;
    Model *m = support_compile_file("models/gpt.kiln", MODE_TRAIN, &d);
    Graph *g = m->graph;
    double idx[2 * 5], tgt[2 * 5];
    for (int i = 0; i < 10; i++) idx[i] = (i * 71) % 256, tgt[i] = (i * 13) % 256;
    double *first = NULL;
    for (int run = 0; run < 2; run++) {
        Interp ip;
        interp_init(&ip, g);
        cr_assert_eq(interp_set_symbol(&ip, "B", 2), 0);
        cr_assert_eq(interp_set_symbol(&ip, "T", 5), 0);
        if (run == 1) idx[4] = 200, idx[9] = 3; /* change the last token of each row */
        interp_set(&ip, ir_find_named(g, OP_INPUT, "idx"), idx);
        interp_set(&ip, ir_find_named(g, OP_INPUT, "targets"), tgt);
        interp_init_params(&ip, 42);
        cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
        const ITensor *lg = interp_value(&ip, output(g, "logits"));
        cr_assert_eq(lg->n, 2 * 5 * 256);
        if (run == 0) {
            first = malloc(sizeof(double) * (size_t)lg->n);
            memcpy(first, lg->data, sizeof(double) * (size_t)lg->n);
            double loss = interp_value(&ip, output(g, "loss"))->data[0];
            cr_expect(fabs(loss - log(256.0)) < 0.3, "initial loss %g, expected near %g", loss, log(256.0));
        } else {
            for (int b = 0; b < 2; b++)
                for (int t = 0; t < 4; t++)
                    for (int v = 0; v < 256; v++) {
                        size_t k = ((size_t)b * 5 + (size_t)t) * 256 + (size_t)v;
                        cr_expect_float_eq(lg->data[k], first[k], 1e-12, "position %d changed", t);
                    }
            size_t k = 4 * 256;
            cr_expect(fabs(lg->data[k] - first[k]) > 1e-9, "the changed token must change its own logits");
        }
        interp_free(&ip);
    }
    free(first);
    frontend_model_free(m);
    diag_free(&d);
}

Test(semantics, layer_norm_softmax_and_batchnorm)
{
    const char *src =
        "model t\n"
        "ln = LayerNorm(4)\n"
        "bn = BatchNorm2d(2)\n"
        "forward(x: f32[B, 4], y: f32[B, 2, 3, 3]) -> a, s, b {\n"
        "    a = ln(x)\n"
        "    s = softmax(x * 3)\n"
        "    b = bn(y)\n"
        "}\n"
        "train { batch = 2 }\n";
    Diag d;
    Model *m = compile_text(src, MODE_TRAIN, &d);
    cr_assert(m, "%s", d.out.data);
    Graph *g = m->graph;
    Interp ip;
    interp_init(&ip, g);
    double x[8] = {1, 2, 3, 4, -1, 0, 5, 2}, y[36];
    for (int i = 0; i < 36; i++) y[i] = sin(i * 0.7) * 3;
    interp_set(&ip, ir_find_named(g, OP_INPUT, "x"), x);
    interp_set(&ip, ir_find_named(g, OP_INPUT, "y"), y);
    interp_init_params(&ip, 0);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    const double *a = interp_value(&ip, output(g, "a"))->data, *s = interp_value(&ip, output(g, "s"))->data;
    for (int r = 0; r < 2; r++) {
        double mu = 0, var = 0, sum = 0;
        for (int i = 0; i < 4; i++) mu += x[r * 4 + i] / 4;
        for (int i = 0; i < 4; i++) var += (x[r * 4 + i] - mu) * (x[r * 4 + i] - mu) / 4;
        double z = 0;
        for (int i = 0; i < 4; i++) z += exp(3 * x[r * 4 + i]);
        for (int i = 0; i < 4; i++) {
            cr_expect_float_eq(a[r * 4 + i], (x[r * 4 + i] - mu) / sqrt(var + 1e-5), 1e-12);
            cr_expect_float_eq(s[r * 4 + i], exp(3 * x[r * 4 + i]) / z, 1e-12);
            sum += s[r * 4 + i];
        }
        cr_expect_float_eq(sum, 1.0, 1e-12);
    }
    /* Batch norm in train mode: per channel over (N, H, W), biased variance; the running
     * mean update uses momentum 0.1, the running variance the unbiased variance. */
    const double *bo = interp_value(&ip, output(g, "b"))->data;
    for (int c = 0; c < 2; c++) {
        double mu = 0, var = 0;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 9; i++) mu += y[n * 18 + c * 9 + i] / 18;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 9; i++) var += pow(y[n * 18 + c * 9 + i] - mu, 2) / 18;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 9; i++)
                cr_expect_float_eq(bo[n * 18 + c * 9 + i], (y[n * 18 + c * 9 + i] - mu) / sqrt(var + 1e-5), 1e-12);
        NodeId rm = output(g, "bn.running_mean"), rv = output(g, "bn.running_var");
        cr_expect_float_eq(interp_value(&ip, rm)->data[c], 0.1 * mu, 1e-12);
        cr_expect_float_eq(interp_value(&ip, rv)->data[c], 0.9 + 0.1 * var * 18 / 17, 1e-12);
    }
    interp_free(&ip);
    frontend_model_free(m);
    diag_free(&d);
}

Test(semantics, conv_and_pool_by_hand)
{
    const char *src =
        "model t\n"
        "conv = Conv2d(1, 2, 3, padding = 1)\n"
        "pool = MaxPool2d(2)\n"
        "avg = AvgPool2d(2)\n"
        "forward(x: f32[1, 1, 4, 4]) -> c, p, a {\n"
        "    c = conv(x)\n"
        "    p = pool(x)\n"
        "    a = avg(x)\n"
        "}\n";
    Diag d;
    Model *m = compile_text(src, MODE_TRAIN, &d);
    cr_assert(m, "%s", d.out.data);
    Graph *g = m->graph;
    Interp ip;
    interp_init(&ip, g);
    double x[16];
    for (int i = 0; i < 16; i++) x[i] = (i * 5) % 7 - 3;
    interp_set(&ip, ir_find_named(g, OP_INPUT, "x"), x);
    interp_init_params(&ip, 3);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    const double *w = param(&ip, "conv.weight"), *bias = param(&ip, "conv.bias");
    const double *c = interp_value(&ip, output(g, "c"))->data;
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                double s = bias[o];
                for (int di = 0; di < 3; di++)
                    for (int dj = 0; dj < 3; dj++) {
                        int ii = i + di - 1, jj = j + dj - 1;
                        if (ii >= 0 && ii < 4 && jj >= 0 && jj < 4) s += w[o * 9 + di * 3 + dj] * x[ii * 4 + jj];
                    }
                cr_expect_float_eq(c[o * 16 + i * 4 + j], s, 1e-12);
            }
    const double *p = interp_value(&ip, output(g, "p"))->data, *a = interp_value(&ip, output(g, "a"))->data;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            double v[4] = {x[(2 * i) * 4 + 2 * j], x[(2 * i) * 4 + 2 * j + 1], x[(2 * i + 1) * 4 + 2 * j], x[(2 * i + 1) * 4 + 2 * j + 1]};
            double mx = fmax(fmax(v[0], v[1]), fmax(v[2], v[3]));
            cr_expect_float_eq(p[i * 2 + j], mx, 1e-12);
            cr_expect_float_eq(a[i * 2 + j], (v[0] + v[1] + v[2] + v[3]) / 4, 1e-12);
        }
    interp_free(&ip);
    frontend_model_free(m);
    diag_free(&d);
}

Test(semantics, dropout_is_identity_in_eval_and_scaled_in_train)
{
    const char *src = "model t\ndrop = Dropout(0.25)\nforward(x: f32[1000]) -> y { y = drop(x) }\n";
    for (int mode = 0; mode < 2; mode++) {
        Diag d;
        Model *m = compile_text(src, (GraphMode)mode, &d);
        cr_assert(m, "%s", d.out.data);
        Interp ip;
        interp_init(&ip, m->graph);
        double x[1000];
        for (int i = 0; i < 1000; i++) x[i] = 1 + i % 3;
        interp_set(&ip, ir_find_named(m->graph, OP_INPUT, "x"), x);
        cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
        const double *y = interp_value(&ip, output(m->graph, "y"))->data;
        int zeros = 0;
        for (int i = 0; i < 1000; i++) {
            if (mode == MODE_EVAL) cr_expect_eq(y[i], x[i]);
            else if (y[i] == 0) zeros++;
            else cr_expect_float_eq(y[i], x[i] / 0.75, 1e-12);
        }
        if (mode == MODE_TRAIN) cr_expect(zeros > 200 && zeros < 300, "%d of 1000 dropped at p = 0.25", zeros);
        interp_free(&ip);
        frontend_model_free(m);
        diag_free(&d);
    }
}

Test(semantics, user_module_repetition_split_and_checkpoint)
{
    const char *src =
        "model t\n"
        "const C = 6\n"
        "module Res(C, scale = 2) {\n"
        "    fc = Linear(C, C, bias = false)\n"
        "    s = Parameter(C, init = constant(0.5))\n"
        "    forward(x) { return x + scale * fc(x) * s }\n"
        "}\n"
        "blocks = [Res(C) for 3]\n"
        "init blocks.*.fc.weight = constant(0.1)\n"
        "forward(x: f32[B, 6]) -> y, q {\n"
        "    for blk in blocks { x = checkpoint(blk(x)) }\n"
        "    q, k = split(x, 3, axis = 1)\n"
        "    y = x\n"
        "}\n"
        "train { batch = 2 }\n";
    Diag d;
    Model *m = compile_text(src, MODE_TRAIN, &d);
    cr_assert(m, "%s", d.out.data);
    Graph *g = m->graph;
    cr_expect_neq(ir_find_named(g, OP_PARAM, "blocks.2.fc.weight"), IR_NONE);
    cr_expect_neq(ir_find_named(g, OP_PARAM, "blocks.1.s"), IR_NONE);
    int regions = 0;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].ckpt > regions) regions = g->nodes[i].ckpt;
    cr_expect_eq(regions, 3);
    Interp ip;
    interp_init(&ip, g);
    double x[12];
    for (int i = 0; i < 12; i++) x[i] = i;
    interp_set(&ip, ir_find_named(g, OP_INPUT, "x"), x);
    interp_init_params(&ip, 0);
    cr_assert_eq(interp_run(&ip), 0, "%s", ip.err.data);
    /* Each block: x + 2 * (0.1 * sum(x)) * 0.5 = x + 0.1 * sum(x) per row. */
    for (int r = 0; r < 2; r++) {
        double v[6];
        for (int i = 0; i < 6; i++) v[i] = x[r * 6 + i];
        for (int blk = 0; blk < 3; blk++) {
            double s = 0;
            for (int i = 0; i < 6; i++) s += v[i];
            for (int i = 0; i < 6; i++) v[i] += 0.1 * s;
        }
        for (int i = 0; i < 6; i++) cr_expect_float_eq(interp_value(&ip, output(g, "y"))->data[r * 6 + i], v[i], 1e-9);
        for (int i = 0; i < 3; i++) cr_expect_float_eq(interp_value(&ip, output(g, "q"))->data[r * 3 + i], v[i], 1e-9);
    }
    interp_free(&ip);
    frontend_model_free(m);
    diag_free(&d);
}

/* ---- several errors in one file are all reported ---- */

Test(diagnostics, several_errors_are_all_reported)
{
    const char *src =
        "model t\n"
        "fc = Linear(4, 3)\n"
        "forward(x: f32[B, 5]) -> y, z {\n"
        "    y = fc(x)\n"
        "    z = relu(w)\n"
        "}\n"
        "train { batch = 2\n optimiser = SGD() }\n";
    Diag d;
    Model *m = compile_text(src, MODE_TRAIN, &d);
    cr_expect_null(m);
    cr_expect(strstr(d.out.data, "test.kiln:4:9: error: Linear 'fc' expects inputs of shape [..., 4], found [B, 5]"), "%s",
              d.out.data);
    cr_expect(strstr(d.out.data, "test.kiln:5:14: error: unknown name 'w'"), "%s", d.out.data);
    cr_expect_geq(d.nerrors, 2);
    frontend_model_free(m);
    diag_free(&d);
}

/* ---- the command line ---- */

Test(cli, help_version_and_usage_errors)
{
    StrBuf out;
    sb_init(&out);
    cr_expect_eq(support_run_kiln("--help", &out), 0);
    cr_expect(strstr(out.data, "usage: kiln COMMAND"));
    out.len = 0;
    cr_expect_eq(support_run_kiln("--version", &out), 0);
    cr_expect(strstr(out.data, "kiln " KILN_VERSION));
    out.len = 0;
    cr_expect_eq(support_run_kiln("ir --help", &out), 0);
    cr_expect(strstr(out.data, "--dot"));
    out.len = 0;
    cr_expect_eq(support_run_kiln("chekc models/mlp.kiln", &out), 2);
    cr_expect(strstr(out.data, "unknown command 'chekc' (did you mean 'check'?)"), "%s", out.data);
    out.len = 0;
    cr_expect_eq(support_run_kiln("check --frobnicate models/mlp.kiln", &out), 2);
    cr_expect(strstr(out.data, "unknown option '--frobnicate'"), "%s", out.data);
    out.len = 0;
    cr_expect_eq(support_run_kiln("check", &out), 2);
    cr_expect(strstr(out.data, "no model file given"), "%s", out.data);
    out.len = 0;
    cr_expect_eq(support_run_kiln("check /nonexistent/model.kiln", &out), 1);
    cr_expect(strstr(out.data, "/nonexistent/model.kiln: cannot open"), "%s", out.data);
    out.len = 0;
    cr_expect_eq(support_run_kiln("check models/mlp.kiln", &out), 0);
    cr_expect(strstr(out.data, "total: 269,322 parameters"), "%s", out.data);
    /* the memory plan: 269,322 f32 parameters are 1,077,288 bytes, as are their gradients */
    cr_expect(strstr(out.data, "memory at the bounds (bytes):\n  parameters               1077288\n"
                               "  gradients                1077288\n"), "%s", out.data);
    cr_expect(strstr(out.data, "  activations train "), "%s", out.data);
    sb_free(&out);
}

Test(cli, ir_to_file_and_dot)
{
    StrBuf out;
    sb_init(&out);
    char path[] = "/tmp/kiln-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char args[256];
    snprintf(args, sizeof args, "ir models/cnn.kiln --dot -o %s", path);
    cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    StrBuf err;
    sb_init(&err);
    size_t len;
    char *dot = util_read_file(path, &len, &err);
    cr_assert(dot);
    cr_expect(!strncmp(dot, "digraph", 7), "not DOT: %.40s", dot);
    free(dot);
    sb_free(&err);
    /* An unwritable destination is an error of the command line, and nothing is left behind. */
    out.len = 0;
    cr_expect_eq(support_run_kiln("ir models/mlp.kiln -o /nonexistent-dir/out.ir", &out), 2);
    cr_expect(strstr(out.data, "/nonexistent-dir/out.ir: the directory '/nonexistent-dir' does not exist"), "%s", out.data);
    unlink(path);
    sb_free(&out);
}

/* Interning after a clone rebuilds the name index at the right size (it once looped
 * forever when a cloned graph had more than 16 names). */
Test(graph, intern_after_clone)
{
    Graph *g = ir_graph_new("t");
    char name[32];
    uint32_t offs[100];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "name.%d", i);
        offs[i] = ir_intern(g, name);
    }
    Graph *c = ir_graph_clone(g);
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "name.%d", i);
        cr_expect_eq(ir_intern(c, name), offs[i]);
    }
    uint32_t fresh = ir_intern(c, "another");
    cr_expect_str_eq(ir_str(c, fresh), "another");
    ir_graph_free(c);
    ir_graph_free(g);
}

/* Embedding(padding_idx) and EmbeddingBag(padding_idx): that row starts at zero (an init
 * rule included, as the module's own), the others as the init says; the IR text keeps it. */
Test(semantics, padding_idx_row_starts_at_zero)
{
    Diag d;
    Model *m = compile_text(
                       "model t\na = Embedding(5, 3, padding_idx = 1)\nb = Embedding(5, 3, padding_idx = -1)\n"
                       "c = EmbeddingBag(5, 3, padding_idx = 0)\ninit b.weight = uniform(1, 2)\n"
                       "forward(i: i64[2, 2]) -> y {\n y = a(i).sum(1) + b(i).sum(1) + c(i)\n}\nloss(y) = sum(y)\n",
                       MODE_TRAIN, &d);
    cr_assert(m, "%s", d.out.data);
    Interp ip;
    interp_init(&ip, m->graph);
    interp_init_params(&ip, 3);
    static const struct {
        const char *name;
        int row;
    } cases[] = {{"a.weight", 1}, {"b.weight", 4}, {"c.weight", 0}};
    for (int k = 0; k < 3; k++) {
        NodeId p = ir_find_named(m->graph, OP_PARAM, cases[k].name);
        cr_assert_eq(ir_param_zero_row(m->graph, p), cases[k].row);
        const double *w = interp_value(&ip, p)->data;
        for (int r = 0; r < 5; r++)
            for (int e = 0; e < 3; e++) {
                if (r == cases[k].row) cr_expect_eq(w[r * 3 + e], 0.0, "%s[%d, %d] = %g", cases[k].name, r, e, w[r * 3 + e]);
                else cr_expect_neq(w[r * 3 + e], 0.0, "%s[%d, %d]", cases[k].name, r, e);
            }
    }
    StrBuf text;
    sb_init(&text);
    ir_print(m->graph, &text);
    cr_expect(strstr(text.data, "\"b.weight\" init=uniform(1.0, 2.0) trainable zero_row=4"), "%s", text.data);
    Diag rd;
    diag_init(&rd, NULL);
    Graph *back = ir_read(text.data, text.len, "padding.ir", &rd);
    cr_assert(back, "%s", rd.out.data);
    cr_expect_eq(ir_param_zero_row(back, ir_find_named(back, OP_PARAM, "a.weight")), 1);
    ir_graph_free(back);
    diag_free(&rd);
    sb_free(&text);
    interp_free(&ip);
    frontend_model_free(m);
    diag_free(&d);
}
