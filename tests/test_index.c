/* test_index.c — indices computed inside a model (an embedding of a computed value, a
 * computed cross-entropy target or one-hot class) are checked by the training program:
 * one out of range stops it with exit 1 and an error naming the model line, the layer,
 * the value, the range and the step; never a crash or a silently wrong result. In range,
 * the same programs train normally. The data are small .npy files written here. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "support.h"

static char dir[64];

static void teardown(void) { support_remove_dir(dir); }

TestSuite(index_check, .fini = teardown, .timeout = 120);

static void write_npy(const char *name, const char *descr, int64_t rows, int64_t cols, const double *v)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert(support_write_npy(path, descr, rows, cols, v), "cannot write %s", path);
}

static void build(const char *model, const char *name)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("index", model, name, dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build %s failed:\n%s", model, out.data);
    sb_free(&out);
}

/* Runs the program built as `prog` in the test's directory: it must exit with `status`
 * and, when `want` is given, print that line (a suffix of it: the model's path is
 * absolute). */
static void expect_run(const char *prog, int status, const char *want)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cd %s && ./%s --checkpoint-dir ck", dir, prog);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    const char *text = out.data ? out.data : "";
    cr_expect_eq(rc, status, "exit %d:\n%s", rc, text);
    if (want) cr_expect(strstr(text, want), "expected \"%s\" in:\n%s", want, text);
    if (status) cr_expect(!strstr(text, "eval at"), "evaluated after the error:\n%s", text);
    sb_free(&out);
}

/* Four samples of four values each: the embedding's indices. */
static void embedding_data(double bad_train, double bad_eval)
{
    build("tests/index/embedding.kiln", "emb");
    double x[16], ex[16], label[4] = {0, 1, 2, 1};
    for (int i = 0; i < 16; i++) x[i] = ex[i] = i % 8;
    x[9] = bad_train;
    ex[14] = bad_eval;
    write_npy("x.npy", "<f4", 4, 4, x);
    write_npy("label.npy", "<i8", 4, 0, label);
    write_npy("eval_x.npy", "<f4", 4, 4, ex);
    write_npy("eval_label.npy", "<i8", 4, 0, label);
}

Test(index_check, embedding_in_range_trains)
{
    embedding_data(7, 0);
    expect_run("emb", 0, "eval at step 2 (");
}

Test(index_check, embedding_index_too_large_stops_the_program)
{
    embedding_data(1e6, 0);
    expect_run("emb", 1, "tests/index/embedding.kiln:9:25: error: Embedding 'emb': index 1000000 out of range [0, 8) (step 1)\n");
}

Test(index_check, negative_index_stops_the_program)
{
    embedding_data(-3, 0);
    expect_run("emb", 1, "embedding.kiln:9:25: error: Embedding 'emb': index -3 out of range [0, 8) (step 1)\n");
}

Test(index_check, evaluation_checks_its_indices_too)
{
    embedding_data(3, 8);
    expect_run("emb", 1, "embedding.kiln:9:25: error: Embedding 'emb': index 8 out of range [0, 8) (evaluation after step 1)\n");
}

/* x[:, 0] is the one-hot class (3 classes), label * 2 the cross-entropy target. */
static void classes_data(double x0, double label0)
{
    build("tests/index/classes.kiln", "cls");
    double x[16], label[4] = {label0, 1, 0, 1};
    for (int i = 0; i < 16; i++) x[i] = i % 4 == 0 ? 2 : 0.5;
    x[8] = x0;
    write_npy("x.npy", "<f4", 4, 4, x);
    write_npy("label.npy", "<i8", 4, 0, label);
}

Test(index_check, classes_in_range_train)
{
    classes_data(1, 0);
    expect_run("cls", 0, NULL);
}

Test(index_check, one_hot_class_out_of_range)
{
    classes_data(3, 0);
    expect_run("cls", 1, "classes.kiln:8:22: error: one_hot: index 3 out of range [0, 3) (step 1)\n");
}

Test(index_check, cross_entropy_target_out_of_range)
{
    classes_data(1, 2);
    expect_run("cls", 1, "classes.kiln:11:31: error: cross_entropy target: index 4 out of range [0, 3) (step 1)\n");
}

/* The interpreter (kiln gradcheck, every codegen test's oracle) refuses the same indices. */
Test(index_check, interpreter_names_the_check)
{
    Graph *g = ir_graph_new("t");
    Shape s = ir_shape_make(1, (Dim[]){ir_dim_const(3)});
    NodeId x = ir_add_node(g, OP_INPUT, DT_I32, &s, NULL, 0, NULL, 0, (Loc){0});
    ir_set_name(g, x, "x");
    int64_t limit = 5;
    NodeId c = ir_add_node(g, OP_CHECK_INDEX, DT_I32, &s, &x, 1, &limit, 1, (Loc){0});
    ir_set_name(g, c, "Embedding 'e'");
    Interp ip;
    interp_init(&ip, g);
    interp_set(&ip, x, (double[]){1, 4, 0});
    cr_expect_eq(interp_run(&ip), 0, "%s", ip.err.data);
    cr_expect_eq(interp_value(&ip, c)->data[1], 4);
    interp_free(&ip);
    interp_init(&ip, g);
    interp_set(&ip, x, (double[]){1, 5, -1});
    cr_expect_eq(interp_run(&ip), -1);
    cr_expect_str_eq(ip.err.data, "check_index at node %1: Embedding 'e': index 5 out of range [0, 5)");
    interp_free(&ip);
    ir_graph_free(g);
}
