/* test_remat.c — activation checkpointing (passes/remat.c): checkpoint(...) regions are
 * recomputed by the backward pass instead of kept, the planned activation memory shrinks,
 * and training gives the same weights as without checkpoint(...), bit for bit, dropout
 * included (its counter-based numbers are drawn again, the same). That holds because every
 * sum of the C target is taken in one order whatever kernel the fusion pass puts it in
 * (codegen/c_loops.c, enum inner_layout): the copies change how the backward pass's
 * kernels are grouped, and sums vectorised by the compiler's choice differed in rounding. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "ckpt_compare.h"
#include "support.h"

/* models/gpt.kiln with `from` replaced by `to` wherever it occurs (each must occur). */
static char *gpt_variant(const char *const *from, const char *const *to, int n)
{
    size_t len;
    char *text = support_read("models/gpt.kiln", &len);
    cr_assert(text);
    for (int k = 0; k < n; k++) {
        StrBuf m;
        sb_init(&m);
        bool found = false;
        const size_t fl = strlen(from[k]);
        for (const char *p = text; *p;) {
            if (!strncmp(p, from[k], fl)) {
                sb_puts(&m, to[k]);
                p += fl;
                found = true;
            } else {
                sb_putc(&m, *p++);
            }
        }
        cr_assert(found, "models/gpt.kiln changed: no '%s'", from[k]);
        free(text);
        text = m.data;
    }
    return text;
}

static const char *const dropout_from[] = {"CausalSelfAttention(C, H)", "MLP(C, 4 * C)"};
static const char *const dropout_to[] = {"CausalSelfAttention(C, H, dropout = 0.1)", "MLP(C, 4 * C, dropout = 0.1)"};
static const char *const ckpt_from[] = {"CausalSelfAttention(C, H)", "MLP(C, 4 * C)", "for block in h { x = block(x) }"};
static const char *const ckpt_to[] = {"CausalSelfAttention(C, H, dropout = 0.1)", "MLP(C, 4 * C, dropout = 0.1)",
                                      "for block in h { x = checkpoint(block(x)) }"};

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* The activation bytes `kiln build --report` plans for the training step. */
static long long train_activations(const char *report)
{
    const char *at = strstr(report, "activations train");
    cr_assert(at, "%s", report);
    return atoll(at + strlen("activations train"));
}

/* The pass itself: every backward read of a value inside a region reads a copy marked
 * recomputed; region outputs and parameters are not copied; the graph verifies. */
Test(remat, backward_reads_of_region_values_read_recomputed_copies)
{
    char *text = gpt_variant(ckpt_from, ckpt_to, 3);
    Diag d;
    diag_init(&d, NULL);
    Model *m = frontend_compile(&d, "gptck.kiln", text, strlen(text), MODE_TRAIN);
    cr_assert(m, "%s", d.out.data);
    StrBuf err;
    sb_init(&err);
    Graph *g = m->graph;
    AutodiffOptions opt = {.wrt_inputs = false};
    cr_assert_eq(pass_autodiff(g, &opt, &err), 0, "%s", err.data);
    pass_simplify(g);
    const int32_t before = g->nnodes;
    RematStats st;
    cr_assert_eq(pass_remat(g, NULL, &st, &err), 0, "%s", err.data);
    cr_expect_eq(st.regions, 4, "one region per block");
    cr_expect_gt(st.recomputed, 40, "%d copies", st.recomputed);
    cr_expect_eq(g->nnodes, before + st.recomputed - st.moved);
    cr_expect_gt(st.moved, 0, "attention's key, only the backward pass reads it, is moved there");
    cr_expect_eq(ir_verify(g, &err), 0, "%s", err.data);
    /* which nodes are forward: the loss and what it reads */
    bool *fwd = calloc((size_t)g->nnodes + 1, 1);
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_GRAD) fwd[g->outputs[k].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--)
        if (fwd[i])
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) fwd[ir_input(g, i, (int)j)] = true;
    int copies = 0, recomputed_in_forward = 0, backward_reads_of_region = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const bool copy = n->flags & NODE_RECOMPUTED;
        copies += copy;
        recomputed_in_forward += copy && fwd[i];
        if (copy) cr_expect(n->ckpt > 0 && n->op != OP_PARAM && n->op != OP_INPUT, "%%%d", i);
        if (fwd[i] || copy) continue;
        /* a backward node reads no region value but the regions' outputs */
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            const Node *xn = &g->nodes[x];
            if (!fwd[x] || xn->ckpt <= 0 || xn->op == OP_PARAM) continue;
            bool output = false; /* read by a forward node of another region or none */
            for (NodeId u = x + 1; u < g->nnodes && !output; u++)
                if (fwd[u] && g->nodes[u].ckpt != xn->ckpt)
                    for (uint32_t q = 0; q < g->nodes[u].ninputs; q++) output |= ir_input(g, u, (int)q) == x;
            for (int32_t k = 0; k < g->noutputs; k++) output |= g->outputs[k].kind != OUT_GRAD && g->outputs[k].node == x;
            backward_reads_of_region += !output;
        }
    }
    cr_expect_eq(copies, st.recomputed);
    cr_expect_eq(recomputed_in_forward, 0, "a copy is read by the forward pass");
    cr_expect_eq(backward_reads_of_region, 0, "the backward pass reads a region's inner value");
    /* the text form says which values are recomputed, and reads back */
    StrBuf txt;
    sb_init(&txt);
    ir_print(g, &txt);
    cr_expect(strstr(txt.data, " recomputed @"), "no 'recomputed' in kiln ir's text");
    free(fwd);
    sb_free(&txt);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
    free(text);
}

static const char *const plain_from[] = {"for block in h { x = block(x) }"};
static const char *const plain_to[] = {"for block in h { x = checkpoint(block(x)) }"};


/* Trains `a` and `b` (model texts) 6 steps each in dir: their planned training activations
 * and whether the final checkpoints hold the same bits; the logs' losses agree within tol. */
static bool train_pair(const char *dir, const char *a, const char *b, long long act[2], double tol)
{
    char path[2][300], args[1024];
    StrBuf out;
    sb_init(&out);
    for (int v = 0; v < 2; v++) {
        snprintf(path[v], sizeof path[v], "%s/m%d.kiln", dir, v);
        write_file(path[v], v ? b : a);
        snprintf(args, sizeof args, "build %s --bound T=64 --report -o %s/prog%d", path[v], dir, v);
        sb_free(&out); /* support_run_kiln appends */
        sb_init(&out);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
        act[v] = train_activations(out.data);
        /* the report says what checkpoint(...) saves and costs, only where something is recomputed */
        const char *plain = strstr(out.data, "without remat");
        cr_expect(v ? plain && strstr(plain, "values recomputed") && strstr(plain, "matrix products again, +") : !plain, "%s", out.data);
        snprintf(args, sizeof args, "rm -rf ck%d log%d && ./prog%d --steps 6 --batch 4 --eval-batches 1 --sample-tokens 0 --checkpoint-dir ck%d --log log%d",
                 v, v, v, v, v);
        cr_assert_eq(support_run_in(dir, args, &out), 0, "%s", out.data);
    }
    double x[16], y[16];
    snprintf(path[0], sizeof path[0], "%s/log0", dir);
    snprintf(path[1], sizeof path[1], "%s/log1", dir);
    int n = support_log_losses(path[0], x, 16), m = support_log_losses(path[1], y, 16);
    cr_expect_eq(n, 6);
    cr_expect_eq(m, 6);
    for (int i = 0; i < n && i < m; i++)
        cr_expect(fabs(x[i] - y[i]) <= tol * fabs(x[i]), "step %d: loss %.9g without checkpoint(...), %.9g with", i + 1, x[i], y[i]);
    bool same = true;
    static const char *const files[] = {"model.safetensors", "train_state.safetensors"};
    for (int f = 0; f < 2; f++) {
        char p0[512], p1[512], f0[1000], f1[1000];
        int64_t step;
        krt_error err;
        snprintf(p0, sizeof p0, "%s/ck0", dir);
        snprintf(p1, sizeof p1, "%s/ck1", dir);
        cr_assert_eq(krt_ckpt_find(p0, f0, sizeof f0, &step, NULL, &err), KRT_OK, "%s", err.msg);
        cr_assert_eq(krt_ckpt_find(p1, f1, sizeof f1, &step, NULL, &err), KRT_OK, "%s", err.msg);
        char *x0 = malloc(1100), *y0 = malloc(1100); /* on the heap: the message's room is not the paths' */
        snprintf(x0, 1100, "%s/%s", f0, files[f]);
        snprintf(y0, 1100, "%s/%s", f1, files[f]);
        const char *why = ckpt_tensor_difference(x0, y0); /* the models differ: so do their hashes */
        if (why) printf("%s: %s\n", files[f], why);
        same &= why == NULL;
        free(x0);
        free(y0);
    }
    sb_free(&out);
    return same;
}

/* gpt with and without checkpoint(...) around every block, and the same with dropout 0.1
 * in attention and MLP: the same losses, the same weights and optimizer state bit for bit,
 * and planned training activations at most 2/3 of those without. */
Test(remat, checkpointed_gpt_trains_bit_identically_in_less_memory, .timeout = 600)
{
    char dir[] = "/tmp/kiln-remat-XXXXXX";
    cr_assert(mkdtemp(dir));
    size_t len;
    char *plain = support_read("models/gpt.kiln", &len), *ckpt = gpt_variant(plain_from, plain_to, 1);
    long long act[2];
    cr_expect(train_pair(dir, plain, ckpt, act, 0), "gpt: the checkpoints with and without checkpoint(...) differ");
    printf("gpt (T 64): planned training activations %lld bytes, %lld with every block checkpointed (%.2fx)\n", act[0], act[1],
           (double)act[1] / (double)act[0]);
    cr_expect_lt(act[1] * 3, act[0] * 2, "%lld bytes with checkpoint(...), %lld without", act[1], act[0]);
    free(plain);
    free(ckpt);
    char *a = gpt_variant(dropout_from, dropout_to, 2), *b = gpt_variant(ckpt_from, ckpt_to, 3);
    cr_expect(train_pair(dir, a, b, act, 0), "gpt with dropout 0.1: the checkpoints with and without checkpoint(...) differ");
    free(a);
    free(b);
    support_remove_dir(dir);
}

/* The total training memory `kiln build --report` plans. */
/* out emptied: support_run_kiln appends to it */
static void fresh(StrBuf *out)
{
    sb_free(out);
    sb_init(out);
}

static long long report_total(const char *report)
{
    const char *at = strstr(report, "  total ");
    cr_assert(at, "%s", report);
    return atoll(at + strlen("  total "));
}

/* --memory-budget halfway between gpt's plan without rematerialisation and with every
 * block checkpointed: met (the report's total within the budget) by checkpointing some of
 * its blocks, and the program trains as without; a budget below the smallest plan is an
 * error with that plan's figure; below the parameters' own memory, an error saying so; a
 * model with no block to checkpoint says that; a size that is not one is a usage error. */
Test(remat, a_memory_budget_is_met_by_checkpointing_blocks, .timeout = 600)
{
    char dir[] = "/tmp/kiln-budget-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "build models/gpt.kiln --bound T=64 --report -o %s/plain", dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    const long long plain = report_total(out.data);
    size_t len;
    char *text = support_read("models/gpt.kiln", &len), *all = gpt_variant(plain_from, plain_to, 1);
    char path[300];
    snprintf(path, sizeof path, "%s/all.kiln", dir);
    write_file(path, all);
    snprintf(args, sizeof args, "emit %s --bound T=64 --report -o %s/all", path, dir); /* the plan only: not run */
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    const long long every = report_total(out.data);
    cr_assert_lt(every, plain, "%lld bytes with every block checkpointed, %lld without:\n%s", every, plain, out.data);
    const long long budget = (plain + every) / 2;
    snprintf(args, sizeof args, "build models/gpt.kiln --bound T=64 --report --memory-budget %lld -o %s/budget", budget, dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    const long long met = report_total(out.data);
    const char *line = strstr(out.data, "memory budget");
    cr_expect(line && strstr(line, " of the model's 4 blocks checkpointed for it"), "%s", out.data);
    /* blocks first: cheap values only when every block is not enough (they cost time) */
    char budget_line[512]; /* the line alone: the smallest plan's, below it, recomputes them */
    snprintf(budget_line, sizeof budget_line, "%.*s", line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    cr_expect(line && !strstr(budget_line, "cheap values"), "%s", out.data);
    const char *why = line ? strchr(line, '(') : NULL;
    printf("gpt (T 64): %lld bytes planned, %lld with every block checkpointed; budget %lld: %lld %.*s\n", plain, every, budget, met,
           why ? (int)(strchr(why, ')') - why + 1) : 0, why ? why : "");
    cr_expect_leq(met, budget, "the plan (%lld bytes) does not fit the budget (%lld)", met, budget);
    /* the train section's memory_budget plans the same, in kiln check and kiln build; the
     * flag overrides it */
    char key[64];
    snprintf(key, sizeof key, "    memory_budget = \"%lld\"\n    clip      = 1.0", budget);
    const char *const clip_from[] = {"    clip      = 1.0"}, *const clip_to[] = {key};
    char *keyed = gpt_variant(clip_from, clip_to, 1);
    snprintf(path, sizeof path, "%s/keyed.kiln", dir);
    write_file(path, keyed);
    free(keyed);
    snprintf(args, sizeof args, "emit %s --bound T=64 --report -o %s/keyed-plan", path, dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect_eq(report_total(out.data), met, "memory_budget = \"%lld\" in the recipe:\n%s", budget, out.data);
    snprintf(args, sizeof args, "emit %s --bound T=64 --report --memory-budget %lld -o %s/keyed-plan", path, plain, dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(none of the model's 4 blocks checkpointed"), "--memory-budget %lld over the recipe's %lld:\n%s", plain, budget,
              out.data);
    /* kiln check plans at the full bounds (T 128), where a budget sized for T 64 cannot be
     * met: it says so as kiln build does */
    snprintf(args, sizeof args, "check %s", path);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    const char *said = strstr(out.data, "(no memory plan: ");
    cr_expect(said && strstr(said, ": error: memory_budget ") && strstr(said, " cannot be met: the smallest plan a budget can reach, "),
              "kiln check of a model with memory_budget:\n%s", out.data);
    snprintf(args, sizeof args, "build %s -o %s/keyed", path, dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, ": error: memory_budget ") && strstr(out.data, " cannot be met: the smallest plan a budget can reach, "), "%s", out.data);
    /* it trains as without, to the same weights */
    snprintf(args, sizeof args, "./plain --steps 3 --batch 4 --eval-batches 1 --sample-tokens 0 --checkpoint-dir ck0 --log log0 && "
                                "./budget --steps 3 --batch 4 --eval-batches 1 --sample-tokens 0 --checkpoint-dir ck1 --log log1");
    cr_assert_eq(support_run_in(dir, args, &out), 0, "%s", out.data);
    double x[8], y[8];
    snprintf(path, sizeof path, "%s/log0", dir);
    int n = support_log_losses(path, x, 8);
    cr_assert_gt(n, 0, "no losses in %s", path);
    snprintf(path, sizeof path, "%s/log1", dir);
    cr_assert_eq(support_log_losses(path, y, 8), n);
    for (int i = 0; i < n; i++) cr_expect_eq(x[i], y[i], "step %d: %.9g, %.9g under the budget", i + 1, x[i], y[i]);
    for (int v = 0; v < 2; v++) {
        char ck[2][400], f[2][1100];
        int64_t step;
        krt_error err;
        for (int k = 0; k < 2; k++) {
            snprintf(ck[k], sizeof ck[k], "%s/ck%d", dir, k);
            cr_assert_eq(krt_ckpt_find(ck[k], f[k], sizeof f[k] - 40, &step, NULL, &err), KRT_OK, "%s", err.msg);
            strcat(f[k], v ? "/train_state.safetensors" : "/model.safetensors");
        }
        const char *diff = ckpt_tensor_difference(f[0], f[1]);
        cr_expect(!diff, "under the budget: %s", diff);
    }
    /* below the smallest plan (and above what recomputing cannot touch): an error with its figure */
    snprintf(args, sizeof args, "build models/gpt.kiln --bound T=64 --memory-budget %lld -o %s/small", every * 3 / 4, dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "models/gpt.kiln: error: --memory-budget ") && strstr(out.data, " cannot be met: the smallest plan a budget can reach, ") &&
                  strstr(out.data, " of training memory"),
              "%s", out.data);
    snprintf(args, sizeof args, "build models/gpt.kiln --bound T=64 --memory-budget 1MiB -o %s/tiny", dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "is not more than the parameters, gradients, optimizer state"), "%s", out.data);
    snprintf(args, sizeof args, "build models/mlp.kiln --memory-budget 5.5MiB -o %s/mlp", dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "no block to checkpoint"), "%s", out.data);
    /* mlp has no block: a budget just under its plan is met by the cheap values alone (the
     * hidden activations recomputed where the backward reads them), to the same weights */
    snprintf(args, sizeof args, "build models/mlp.kiln --memory-budget 5.6MiB --report -o %s/mlp-cheap", dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "(cheap values recomputed; the model has no block to checkpoint)"), "%s", out.data);
    cr_expect_leq(report_total(out.data), 5872025, "%s", out.data);
    snprintf(args, sizeof args, "build models/mlp.kiln -o %s/mlp-plain", dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    fresh(&out);
    cr_assert_eq(support_run_in(dir, "./mlp-plain --steps 3 --batch 32 --limit 256 --eval-batches 1 --checkpoint-dir cm0 && "
                                     "./mlp-cheap --steps 3 --batch 32 --limit 256 --eval-batches 1 --checkpoint-dir cm1",
                                &out),
                 0, "%s", out.data);
    for (int v = 0; v < 2; v++) {
        char ck[2][400], f[2][1100];
        int64_t step;
        krt_error err;
        for (int k = 0; k < 2; k++) {
            snprintf(ck[k], sizeof ck[k], "%s/cm%d", dir, k);
            cr_assert_eq(krt_ckpt_find(ck[k], f[k], sizeof f[k] - 40, &step, NULL, &err), KRT_OK, "%s", err.msg);
            strcat(f[k], v ? "/train_state.safetensors" : "/model.safetensors");
        }
        const char *diff = ckpt_tensor_difference(f[0], f[1]);
        cr_expect(!diff, "mlp with cheap values recomputed: %s", diff);
    }
    snprintf(args, sizeof args, "build models/mlp.kiln --memory-budget 1.5XB -o %s/mlp", dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "--memory-budget: '1.5XB' is not a size"), "%s", out.data);
    free(text);
    free(all);
    sb_free(&out);
    support_remove_dir(dir);
}

/* The smallest plan a --memory-budget can reach (every block checkpointed, the cheap values
 * recomputed), in the report without a failing build: a budget of exactly that is met, one
 * byte less is not, and both errors below it give the figure. The report counts its nouns. */
Test(remat, the_report_gives_the_smallest_plan_a_budget_can_reach, .timeout = 120)
{
    char dir[] = "/tmp/kiln-floor-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024], path[300];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "emit models/gpt.kiln --bound T=64 --report -o %s/plain", dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    const char *line = strstr(out.data, "    smallest plan ");
    cr_assert(line, "%s", out.data);
    const char *in = strstr(line, "the least a --memory-budget can reach, ");
    cr_assert(in, "%s", out.data);
    const long long floor = atoll(in + strlen("the least a --memory-budget can reach, "));
    cr_expect(strstr(in, " in total: cheap values recomputed, 4 of the model's 4 blocks checkpointed)\n"), "%s", out.data);
    cr_expect_gt(floor, 0);
    cr_expect_lt(floor, report_total(out.data), "%s", out.data);
    snprintf(args, sizeof args, "emit models/gpt.kiln --bound T=64 --report --memory-budget %lld -o %s/floor", floor, dir);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "a budget of the smallest plan, %lld bytes:\n%s", floor, out.data);
    cr_expect_leq(report_total(out.data), floor, "%s", out.data);
    snprintf(args, sizeof args, "emit models/gpt.kiln --bound T=64 --memory-budget %lld -o %s/under", floor - 1, dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    char want[300];
    snprintf(want, sizeof want, " cannot be met: the smallest plan a budget can reach, cheap values recomputed, 4 of the model's 4 blocks "
                                "checkpointed, needs %lld bytes", floor);
    cr_expect(strstr(out.data, want), "%s", out.data);
    snprintf(args, sizeof args, "emit models/gpt.kiln --bound T=64 --memory-budget 1MiB -o %s/tiny", dir);
    fresh(&out);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    snprintf(want, sizeof want, "recomputing activations cannot help; the smallest plan needs %lld bytes", floor);
    cr_expect(strstr(out.data, want), "%s", out.data);
    /* one value recomputed: "1 value", not "1 values" */
    snprintf(path, sizeof path, "%s/one.kiln", dir);
    write_file(path, "model one\n"
                     "fc1 = Linear(4, 8)\n"
                     "fc2 = Linear(8, 3)\n"
                     "forward(x: f32[B, 4]) -> logits {\n"
                     "    logits = fc2(checkpoint(tanh(fc1(x) + 1)))\n"
                     "}\n"
                     "loss(logits, y: i64[B]) = cross_entropy(logits, y)\n");
    snprintf(args, sizeof args, "check %s", path);
    fresh(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "; 1 value recomputed, "), "%s", out.data);
    cr_expect(strstr(out.data, "(the least a --memory-budget can reach, ") && strstr(out.data, ": the model has no block to checkpoint)"),
              "%s", out.data);
    sb_free(&out);
    support_remove_dir(dir);
}
