/* test_bench.c — the training program's `--bench-steps N` (what bench/run.sh runs): on
 * mlp.kiln it prints exactly one well-formed `bench: {...}` line whose GEMM FLOPs agree with
 * its own shape table, needs no data and writes no checkpoint; bad values are refused with
 * a message naming the flag. Speed is never asserted. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

static char dir[64];

static int run(const char *cmd, StrBuf *out)
{
    char full[4096];
    snprintf(full, sizeof full, "cd %s || exit 99; %s", dir, cmd);
    return support_run(full, out);
}

static void setup(void)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("bench", "models/mlp.kiln", "mlp", dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build failed:\n%s", out.data);
    sb_free(&out);
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(bench, .init = setup, .fini = teardown, .timeout = 300);

/* The number after `"key": ` in line, or NAN when the key is missing. */
static double field(const char *line, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p) return NAN;
    char *end;
    double v = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? NAN : v;
}

Test(bench, prints_one_well_formed_line)
{
    StrBuf out;
    sb_init(&out);
    /* Data paths that do not exist: the benchmark must not read the data. */
    int rc = run("./mlp --bench-steps 2 --data image=/nonexistent --data label=/nonexistent", &out);
    cr_assert_eq(rc, 0, "%s", out.data);
    const char *s = out.data;
    size_t n = strlen(s);
    cr_assert(n > 10 && !strncmp(s, "bench: {", 8) && s[n - 1] == '\n' && s[n - 2] == '}', "not one bench line:\n%s", s);
    cr_assert_eq(strchr(s, '\n'), s + n - 1, "more than one line:\n%s", s);
    /* Brackets balance and strings close. */
    int depth = 0, quotes = 0;
    for (const char *p = s + 7; *p; p++) {
        if (*p == '"') quotes++;
        if (*p == '{' || *p == '[') depth++;
        if (*p == '}' || *p == ']') cr_assert(--depth >= 0, "%s", s);
    }
    cr_expect_eq(depth, 0, "%s", s);
    cr_expect_eq(quotes % 2, 0, "%s", s);
    cr_expect(strstr(s, "\"model\": \"mlp\""), "%s", s);
    cr_expect_eq(field(s, "train_steps"), 2, "%s", s);
    cr_expect_eq(field(s, "batch"), 128, "%s", s);
    cr_expect_eq(field(s, "infer_b256_batch"), 128, "at most the batch bound:\n%s", s);
    const char *positive[] = {"train_step_ms_median", "train_step_ms_min", "infer_b1_ms", "infer_b256_ms", "gemm_flops_per_step",
                              "infer_b1_gemm_flops", "infer_b256_gemm_flops", "train_rss_mb", "peak_rss_mb", "threads"};
    for (size_t i = 0; i < sizeof positive / sizeof *positive; i++)
        cr_expect(field(s, positive[i]) > 0, "%s should be a positive number:\n%s", positive[i], s);
    cr_expect(field(s, "train_step_ms_min") <= field(s, "train_step_ms_median"), "%s", s);
    /* The step's GEMM FLOPs are the sum over its shape table (at the bounds, which the
     * batch is here): [batch, M, N, K, trans_a, trans_b, count]. */
    const char *g = strstr(s, "\"gemms\": [");
    cr_assert(g, "%s", s);
    g += strlen("\"gemms\": [");
    double sum = 0;
    int shapes = 0;
    long long b, m, nn, k, ta, tb, c;
    int used;
    while (sscanf(g, " [%lld, %lld, %lld, %lld, %lld, %lld, %lld]%n", &b, &m, &nn, &k, &ta, &tb, &c, &used) == 7) {
        sum += 2.0 * (double)b * (double)m * (double)nn * (double)k * (double)c;
        shapes++;
        g += used;
        if (*g == ',') g++;
    }
    cr_expect(shapes >= 3, "%s", s);
    double flops = field(s, "gemm_flops_per_step");
    cr_expect(sum > 0 && fabs(sum - flops) <= 1e-5 * flops, "shape table sums to %g FLOPs, the step reports %g:\n%s", sum, flops, s);
    /* Per sample: the three layers' multiply-adds forward and for the weight gradients,
     * and for the input gradients of all but the first layer. */
    cr_expect(fabs(flops - 2.0 * 128 * (3 * (784 * 256 + 256 * 256 + 256 * 10) - 784 * 256)) <= 1e-5 * flops,
              "mlp's step has %g GEMM FLOPs", flops);
    cr_expect(access(strcat(strcpy((char[128]){0}, dir), "/checkpoints"), F_OK) != 0, "the benchmark wrote checkpoints");
    sb_free(&out);
}

static void expect_error(const char *cmd, const char *want)
{
    StrBuf out;
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_expect_eq(rc, 2, "`%s` should exit 2, exit %d:\n%s", cmd, rc, out.data);
    cr_expect(strstr(out.data, want) != NULL, "`%s`: expected a message containing '%s', got:\n%s", cmd, want, out.data);
    cr_expect(!strstr(out.data, "bench: "), "`%s` printed a bench line:\n%s", cmd, out.data);
    sb_free(&out);
}

Test(bench, bad_step_counts_are_refused)
{
    expect_error("./mlp --bench-steps 0", "--bench-steps 0: give a whole number of timed steps, at least 1");
    expect_error("./mlp --bench-steps -3", "--bench-steps -3: give a whole number");
    expect_error("./mlp --bench-steps 2.5", "--bench-steps 2.5: give a whole number");
    expect_error("./mlp --bench-steps x", "--bench-steps: 'x' is not a number");
    expect_error("./mlp --bench-steps", "--bench-steps needs a value");
}

/* --profile: after the bench line, a table per step (training, eval at batch 1 and at the
 * bound) whose rows account for every kernel call and, with the rows outside the kernels,
 * for the step's whole time. */
Test(bench, profile_accounts_for_every_kernel)
{
    StrBuf out;
    sb_init(&out);
    int rc = run("./mlp --bench-steps 2 --profile", &out);
    cr_assert_eq(rc, 0, "%s", out.data);
    cr_assert(!strncmp(out.data, "bench: {", 8), "%s", out.data);
    const char *titles[] = {"profile: training step at batch 128, 2 steps: ", "profile: eval step at batch 1, 20 steps: ",
                            "profile: eval step at batch 128, 2 steps: "};
    for (int t = 0; t < 3; t++) {
        const char *p = strstr(out.data, titles[t]);
        cr_assert(p, "no '%s' table:\n%s", titles[t], out.data);
        double step_ms, kernel_ms;
        int nkernels;
        cr_assert_eq(sscanf(p + strlen(titles[t]), "%lf ms per step, %lf ms in its %d kernels", &step_ms, &kernel_ms, &nkernels), 3, "%s", p);
        cr_expect(nkernels > 5 && kernel_ms > 0 && kernel_ms <= step_ms, "%s", p);
        p = strchr(p, '\n') + 1;
        cr_assert(strstr(p, "ms/step") && strstr(p, "function"), "no column heads:\n%s", p);
        p = strchr(p, '\n') + 1;
        int calls = 0;
        double ms = 0, percent = 0, row_ms, row_percent;
        int row_calls, used;
        char function[64];
        while (sscanf(p, " %lf %lf %d %63s%n", &row_ms, &row_percent, &row_calls, function, &used) == 4) {
            cr_expect(row_ms >= 0 && row_calls >= 1, "%.*s", (int)(strchr(p, '\n') - p), p);
            if (function[0] != '(') {
                cr_expect(!strncmp(function, "train_", 6) || !strncmp(function, "eval_", 5), "%s", function);
                calls += row_calls;
                ms += row_ms;
            }
            percent += row_percent;
            p = strchr(p + used, '\n');
            if (!p) break;
            p++;
        }
        cr_expect_eq(calls, nkernels, "the rows of '%s' count %d kernel calls, the step has %d", titles[t], calls, nkernels);
        cr_expect(fabs(ms - kernel_ms) <= 0.01 + 1e-3 * kernel_ms, "rows %.3f ms, kernels %.3f ms", ms, kernel_ms);
        cr_expect(percent > 97 && percent < 101, "the rows of '%s' add up to %.1f%% of the step", titles[t], percent);
    }
    sb_free(&out);
}

Test(bench, profile_needs_bench_steps) { expect_error("./mlp --profile", "--profile times the steps of a benchmark: give --bench-steps N too"); }
