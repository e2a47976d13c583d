/* test_driver.c — the compiler as a library (driver/kiln.h) without the command line:
 * kiln_compile builds each program kind from source text, plans every graph once (the
 * --time-passes table counts them), keeps no state between calls, refuses bad input with
 * an error instead of a crash, and `kiln build --time-passes` prints the same table. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../driver/kiln.h"
#include "support.h"

/* Compiles a model file of the source tree (path relative to it) through kiln_compile;
 * fails the test unless it gives `want`. */
static KilnProgram *compile_file(const char *relpath, KilnOptions opt, KilnStatus want)
{
    size_t len;
    char *text = support_read(relpath, &len);
    cr_assert(text, "cannot read %s", relpath);
    opt.path = relpath;
    opt.text = text;
    opt.len = len;
    KilnProgram *p;
    StrBuf err;
    sb_init(&err);
    KilnStatus s = kiln_compile(&opt, &p, &err);
    cr_assert_eq(s, want, "%s: status %d, want %d: %s%s", relpath, s, want, err.data ? err.data : "",
                 p->diag.out.data ? p->diag.out.data : "");
    cr_assert(p);
    sb_free(&err);
    free(text);
    return p;
}

/* How many rows of a --time-passes table name this pass and graph. */
static int rows(const StrBuf *timing, const char *pass, const char *graph)
{
    int n = 0;
    char want[64];
    snprintf(want, sizeof want, "%-10s %-8s ", pass, graph);
    for (const char *at = timing->data; at && *at;) {
        if (!strncmp(at, want, strlen(want))) n++;
        at = strchr(at, '\n');
        if (at) at++;
    }
    return n;
}

static void expect_planned_once(const KilnProgram *p, const char *graph)
{
    cr_expect_eq(rows(&p->timing, "fusion", graph), 1, "fusion of %s: %d rows\n%s", graph, rows(&p->timing, "fusion", graph), p->timing.data);
    cr_expect_eq(rows(&p->timing, "memplan", graph), 1, "memplan of %s: %d rows\n%s", graph, rows(&p->timing, "memplan", graph),
                 p->timing.data);
}

/* gpt's training program: train, eval and decode graphs, each planned once, and the code
 * reads those plans (the arenas it declares are theirs). */
Test(driver, training_program_plans_each_graph_once, .timeout = 120)
{
    KilnProgram *p = compile_file("models/gpt.kiln", (KilnOptions){.time_passes = true}, KILN_OK);
    cr_assert_str_eq(p->code_name, "model.c");
    cr_assert(p->code.len > 10000);
    cr_assert(p->train.graph && p->train.plan.placed && p->eval.plan.placed && p->decode.plan.placed);
    cr_expect_null(p->predict.graph);
    expect_planned_once(p, "train");
    expect_planned_once(p, "eval");
    expect_planned_once(p, "decode");
    cr_expect_eq(rows(&p->timing, "autodiff", "train"), 1);
    cr_expect_eq(rows(&p->timing, "autodiff", "eval"), 0, "the eval graph is not differentiated");
    cr_expect_eq(rows(&p->timing, "lower", "train"), 1);
    cr_expect_eq(rows(&p->timing, "lower", "eval"), 1);
    cr_expect_null(strstr(p->timing.data, "candidate"), "no budget, no search:\n%s", p->timing.data);
    char arena[64];
    snprintf(arena, sizeof arena, ".train_arena_bytes = %lld", (long long)p->train.plan.mem.arena_bytes);
    cr_expect(strstr(p->code.data, arena), "model.c does not declare the plan's arena (%s)", arena);
    snprintf(arena, sizeof arena, ".eval_arena_bytes = %lld", (long long)p->eval.plan.mem.arena_bytes);
    cr_expect(strstr(p->code.data, arena), "model.c does not declare the plan's arena (%s)", arena);
    kiln_program_free(p);
}

/* Options travel in the struct: a build in between with other options changes nothing of
 * the next one (the CLI's globals did once). */
Test(driver, builds_in_one_process_are_independent, .timeout = 120)
{
    KilnProgram *a = compile_file("models/gpt.kiln", (KilnOptions){0}, KILN_OK);
    const char *bounds[] = {"T=32"};
    KilnProgram *b = compile_file("models/gpt.kiln",
                                  (KilnOptions){.precision = "bf16", .bounds = bounds, .nbounds = 1, .memory_budget = 80 << 20,
                                                .target = KILN_TARGET_CUDA},
                                  KILN_OK);
    KilnProgram *c = compile_file("models/gpt.kiln", (KilnOptions){0}, KILN_OK);
    cr_assert_str_eq(b->code_name, "model.cu");
    cr_expect_eq(b->precision.half, DT_BF16);
    cr_expect_eq(a->code.len, c->code.len);
    cr_expect(!strcmp(a->code.data, c->code.data), "the same build twice gave different code");
    cr_expect_eq(c->precision.half, DT_F32);
    kiln_program_free(a);
    kiln_program_free(b);
    kiln_program_free(c);
}

/* bf16 under a memory budget, with the report's smallest plan: the budget search plans
 * candidates (and says so); every bf16 budget build of gpt once overflowed the heap in the
 * remat pass (a moved value read before it was made). */
Test(driver, bf16_under_a_budget, .timeout = 120)
{
    KilnOptions opt = {.precision = "bf16", .memory_budget = 80 << 20, .report = true, .smallest_plan = true, .time_passes = true};
    KilnProgram *p = compile_file("models/gpt.kiln", opt, KILN_OK);
    cr_expect(strstr(p->report.data, "smallest plan"), "%s", p->report.data);
    cr_expect(strstr(p->report.data, "mixed precision: bf16"), "%s", p->report.data);
    cr_expect(strstr(p->timing.data, "budget search: planned"), "%s", p->timing.data);
    expect_planned_once(p, "train");
    StrBuf err;
    sb_init(&err);
    cr_expect_eq(ir_verify(p->train.graph, &err), 0, "%s", err.data);
    sb_free(&err);
    kiln_program_free(p);
}

/* An inference program: eval, predict and decode planned; the training graph is run
 * through the pipeline for the tables and hash only, not planned. */
Test(driver, inference_program, .timeout = 120)
{
    KilnProgram *p = compile_file("models/gpt.kiln", (KilnOptions){.infer = true, .time_passes = true, .report = true}, KILN_OK);
    cr_expect(p->predict.plan.placed && p->eval.plan.placed && p->decode.plan.placed);
    cr_expect(!p->train.plan.fused, "an inference build planned the training graph");
    expect_planned_once(p, "predict");
    expect_planned_once(p, "eval");
    cr_expect_eq(rows(&p->timing, "fusion", "train"), 0);
    cr_expect(strstr(p->code.data, "predict"), "no predict step");
    cr_expect(strstr(p->report.data, "activations predict"), "%s", p->report.data);
    kiln_program_free(p);
}

/* Bad input: one error, no crash, nothing half made. */
Test(driver, bad_input_is_an_error)
{
    static const char text[] = "model m\nforward(x: f32[B, 4]) -> y\n    y = nosuch(x)\n";
    KilnOptions opt = {.path = "bad.kiln", .text = text, .len = sizeof text - 1};
    KilnProgram *p;
    StrBuf err;
    sb_init(&err);
    cr_expect_eq(kiln_compile(&opt, &p, &err), KILN_ERR_MODEL);
    cr_expect_null(p->model);
    cr_expect_gt(p->diag.nerrors, 0);
    cr_expect_eq(p->code.len, 0);
    kiln_program_free(p);

    KilnOptions missing = {.path = "/nonexistent/model.kiln"};
    err.len = 0;
    cr_expect_eq(kiln_compile(&missing, &p, &err), KILN_ERR_MODEL);
    cr_expect(err.len && strstr(err.data, "/nonexistent/model.kiln"), "%s", err.data ? err.data : "");
    kiln_program_free(p);
    sb_free(&err);

    /* a flag that does not apply: a usage error, the model itself fine */
    p = compile_file("models/mlp.kiln", (KilnOptions){.infer = true, .precision = "bf16"}, KILN_ERR_USAGE);
    cr_expect(p->model);
    kiln_program_free(p);
    const char *bounds[] = {"Q=3"};
    p = compile_file("models/mlp.kiln", (KilnOptions){.bounds = bounds, .nbounds = 1}, KILN_ERR_MODEL);
    kiln_program_free(p);
}

/* The command's table: each pass once per graph, as the library's. */
Test(driver, time_passes_on_the_command_line, .timeout = 120)
{
    char dir[] = "/tmp/kiln-timepasses-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[512];
    snprintf(args, sizeof args, "emit %s --time-passes -o %s/out", support_path("models/gpt.kiln"), dir);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect_eq(rows(&out, "fusion", "train"), 1, "%s", out.data);
    cr_expect_eq(rows(&out, "memplan", "train"), 1, "%s", out.data);
    cr_expect_eq(rows(&out, "fusion", "eval"), 1, "%s", out.data);
    cr_expect_eq(rows(&out, "memplan", "decode"), 1, "%s", out.data);
    cr_expect_eq(rows(&out, "codegen", "all"), 1, "%s", out.data);
    sb_free(&out);
    support_remove_dir(dir);
}
