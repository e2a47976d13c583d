/* test_rt_optim_omp.c — the optimizers' parallel, vectorised path (spans of at least
 * 65536 elements run as OpenMP loops over all threads) gives the same bits as the serial
 * path that test_rt_optim.c checks against PyTorch's formulas: the same slab is stepped
 * once as large spans and once cut into small spans, for every variant of each update. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_rt.h"

/* Not a multiple of any vector width; the large spans are well above the threshold. */
#define N 300007
#define SMALL 1001

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* Steps config c three times over the same slab and gradients with spans `a` and with
 * spans `b`; everything (parameters and state) must be identical. */
static void compare(const krt_optim_config *c, const krt_param_span *a, int na, const krt_param_span *b, int nb,
                    const char *what)
{
    float *p1 = malloc(N * sizeof(float)), *p2 = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    cr_assert(p1 && p2 && g);
    uint64_t seed = 42;
    for (int i = 0; i < N; i++) p1[i] = p2[i] = rnd(&seed);
    krt_optim_state s1, s2;
    krt_error err;
    cr_assert_eq(krt_optim_init(&s1, c, N, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_optim_init(&s2, c, N, &err), KRT_OK, "%s", err.msg);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < N; i++) g[i] = rnd(&seed) * (i % 7 == 0 ? 1e-3f : 1.0f);
        krt_optim_step(c, &s1, c->lr, p1, g, a, na);
        krt_optim_step(c, &s2, c->lr, p2, g, b, nb);
    }
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++)
        if (memcmp(&p1[i], &p2[i], sizeof(float)) || (s1.m && memcmp(&s1.m[i], &s2.m[i], sizeof(float))) ||
            (s1.v && memcmp(&s1.v[i], &s2.v[i], sizeof(float))))
            bad = i;
    cr_expect(bad < 0, "%s: element %d differs between large and small spans (%.9g vs %.9g)", what, bad,
              bad < 0 ? 0.0 : (double)p1[bad], bad < 0 ? 0.0 : (double)p2[bad]);
    krt_optim_free(&s1);
    krt_optim_free(&s2);
    free(p1);
    free(p2);
    free(g);
}

/* Large spans: [0, 200000) with decay, [200000, N - 3) without; the last 3 elements in
 * none. Small spans: the same ranges cut every SMALL elements. */
static void check(const krt_optim_config *c, const char *what)
{
    const int64_t cut = 200000, end = N - 3;
    krt_param_span large[2] = {{.offset = 0, .count = cut, .decay = true}, {.offset = cut, .count = end - cut, .decay = false}};
    int nsmall = 0;
    krt_param_span *small = malloc(sizeof *small * (size_t)(N / SMALL + 4));
    cr_assert(small);
    for (int64_t lo = 0, hi; lo < end; lo = hi) {
        hi = lo + SMALL;
        if (lo < cut && hi > cut) hi = cut;
        if (hi > end) hi = end;
        small[nsmall++] = (krt_param_span){.offset = lo, .count = hi - lo, .decay = lo < cut};
    }
    compare(c, large, 2, small, nsmall, what);
    free(small);
}

Test(optim_omp, sgd_variants)
{
    check(&(krt_optim_config){.kind = KRT_SGD, .lr = 0.1}, "SGD");
    check(&(krt_optim_config){.kind = KRT_SGD, .lr = 0.1, .weight_decay = 0.01}, "SGD, weight decay");
    check(&(krt_optim_config){.kind = KRT_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
          "SGD, momentum");
    check(&(krt_optim_config){.kind = KRT_SGD, .lr = 0.05, .momentum = 0.9, .nesterov = true}, "SGD, Nesterov");
    check(&(krt_optim_config){.kind = KRT_SGD, .lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.1},
          "SGD, Nesterov, weight decay");
}

Test(optim_omp, adam_variants)
{
    check(&(krt_optim_config){.kind = KRT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}, "Adam");
    check(&(krt_optim_config){.kind = KRT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1},
          "Adam, L2");
    check(&(krt_optim_config){.kind = KRT_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
          "AdamW");
    check(&(krt_optim_config){.kind = KRT_ADAMW, .lr = 0.01, .beta1 = 0.2, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.1},
          "AdamW, lerp weight above 0.5");
}
