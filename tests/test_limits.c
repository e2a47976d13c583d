/* test_limits.c — a model that `kiln check` accepts runs, whatever its number of inputs,
 * metrics and symbolic sizes: the training program sizes its tables from the model (it
 * held 16 inputs, 16 metrics and 8 sizes in fixed arrays, and overran them). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static char dir[64];

static void teardown(void) { support_remove_dir(dir); }

TestSuite(limits, .fini = teardown, .timeout = 120);

/* tests/limits/many.kiln: 18 inputs (s1..s9 of [B, D_k] with D_k <= k + 1, x0..x8 of
 * [B, 1]), 17 metrics m_k = k * mean(y), 10 symbolic sizes. */
Test(limits, eighteen_inputs_seventeen_metrics_ten_sizes)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("limits", "tests/limits/many.kiln", "many", dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build failed:\n%s", out.data);
    double v[8 * 10];
    for (int k = 1; k <= 9; k++) {
        for (int i = 0; i < 8 * (k + 1); i++) v[i] = 0.01 * (i % 7) - 0.02;
        char path[128];
        snprintf(path, sizeof path, "%s/s%d.npy", dir, k);
        cr_assert(support_write_npy(path, "<f4", 8, k + 1, v));
    }
    for (int k = 0; k <= 8; k++) {
        for (int i = 0; i < 8; i++) v[i] = 0.1 * k - 0.05 * i;
        char path[128];
        snprintf(path, sizeof path, "%s/x%d.npy", dir, k);
        cr_assert(support_write_npy(path, "<f4", 8, 1, v));
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cd %s && ./many --checkpoint-dir ck --log log.jsonl && cat log.jsonl", dir);
    sb_free(&out);
    rc = support_run(cmd, &out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out.data);
    const char *last = NULL;
    for (const char *p = strstr(out.data, "{\"step\": "); p; p = strstr(p + 1, "{\"step\": ")) last = p;
    cr_assert(last, "no log line:\n%s", out.data);
    const char *m1 = strstr(last, "\"m1\": "), *m16 = strstr(last, "\"m16\": ");
    cr_assert(m1 && m16, "metrics missing from the log:\n%s", out.data);
    double a = strtod(m1 + 6, NULL), b = strtod(m16 + 7, NULL);
    cr_expect(a != 0 && b > 16 * a - 1e-5 * fabs(b) - 1e-12 && b < 16 * a + 1e-5 * fabs(b) + 1e-12, "m1 %g, m16 %g:\n%s", a, b, out.data);
    sb_free(&out);
}
