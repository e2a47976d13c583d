/* test_rt_optim.c — the runtime's optimizers, gradient clipping (optim.c) and learning-rate
 * schedules (sched.c).
 *
 * Optimizer results are compared bit for bit with values derived in Python by performing
 * torch.optim's float32 operations one by one, each rounded to float32 (PyTorch itself is
 * not needed: a double result of one +, -, *, / or sqrt of float32 operands, rounded to
 * float32, is exactly the float32 operation). The derivation, for SGD:
 *     f = lambda x: struct.unpack('f', struct.pack('f', x))[0]
 *     g = f(g + f(f(wd) * p))                                   # decay spans, wd != 0
 *     buf = g if step == 1 else f(f(buf * f(mom)) + f(f(1 - damp) * g))
 *     g = f(g + f(f(mom) * buf)) if nesterov else buf
 *     p = f(p + f(f(-lr) * g))
 * and for Adam/AdamW (step counted from 1, bias terms in double as Python computes them):
 *     p = f(p * f(1 - lr*wd))                                   # AdamW, decay spans
 *     g = f(g + f(f(wd) * p))                                   # Adam, decay spans
 *     w = f(1 - b1); d = f(g - m)
 *     m = f(m + f(w * d)) if abs(w) < 0.5 else f(g - f(d * f(1 - w)))       # lerp_
 *     v = f(f(v * f(b2)) + f(f(f(1 - b2) * g) * g))                         # addcmul_
 *     den = f(f(f(sqrt(v)) / f(sqrt(1 - b2**t))) + f(eps))
 *     p = f(p + f(f(f(-(lr / (1 - b1**t))) * m) / den))                     # addcdiv_
 * and the final parameters were also checked against the textbook double-precision
 * formulas (agreement to 1e-5). Every test uses the same slab: elements 0-2 are one
 * span with weight decay, 3-4 a span without, element 5 is in no span and must stay as
 * it is (its gradient is large so that touching it would show). */
#include <criterion/criterion.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_rt.h"

#define N 6
static const float P0[N] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f, 9.0f};
static const float G[3][N] = {
    {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, 7.0f},
    {-0.05f, 0.15f, 0.25f, 0.1f, -0.6f, 7.0f},
    {0.2f, 0.0f, -0.1f, 0.3f, 0.05f, 7.0f},
};
static const krt_param_span SPANS[2] = {{0, 3, true}, {3, 2, false}};

static void expect_floats(const float *got, const float *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        cr_expect(got[i] == want[i], "%s[%d]: got %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

/* Runs three steps of config c with learning rates lrs, checking the parameters after
 * each step; leaves the state in *s for further checks. */
static void run3(const krt_optim_config *c, const double lrs[3], const float want[3][N], krt_optim_state *s)
{
    krt_error err = {0};
    cr_assert_eq(krt_optim_init(s, c, N, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(s->step, 0);
    float p[N];
    memcpy(p, P0, sizeof p);
    for (int k = 0; k < 3; k++) {
        krt_optim_step(c, s, lrs[k], p, G[k], SPANS, 2);
        char what[32];
        snprintf(what, sizeof what, "step %d params", k + 1);
        expect_floats(p, want[k], N, what);
    }
    cr_expect_eq(s->step, 3);
}

Test(optim, sgd_plain_with_weight_decay)
{
    krt_optim_config c = {.kind = KRT_SGD, .lr = 0.1, .weight_decay = 0.01};
    const float want[3][N] = {
        {0.489499986f, -1.22874999f, 1.96800005f, 0.790000021f, -0.350000024f, 9.0f},
        {0.494010478f, -1.24252129f, 1.94103205f, 0.780000031f, -0.290000021f, 9.0f},
        {0.473516464f, -1.24127877f, 1.94909108f, 0.75f, -0.295000017f, 9.0f},
    };
    krt_optim_state s;
    run3(&c, (double[]){0.1, 0.1, 0.1}, want, &s);
    krt_optim_free(&s);
    cr_expect(s.m == NULL && s.v == NULL && s.n == 0, "free clears the state");
}

Test(optim, sgd_momentum_dampening)
{
    /* The first step stores the gradient itself (no dampening), as PyTorch's clone does. */
    krt_optim_config c = {.kind = KRT_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
    const float want[3][N] = {
        {0.489499986f, -1.22874999f, 1.96800005f, 0.790000021f, -0.350000024f, 9.0f},
        {0.484109432f, -1.22201908f, 1.91492891f, 0.817000031f, -0.341000021f, 9.0f},
        {0.460822225f, -1.21486151f, 1.87444139f, 0.814300001f, -0.337400019f, 9.0f},
    };
    const float buf[N] = {0.23287192f, -0.0715760365f, 0.404875159f, 0.0270000398f, -0.036000032f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.1, 0.1, 0.1}, want, &s);
    expect_floats(s.m, buf, N, "momentum buffer");
    krt_optim_free(&s);
}

Test(optim, sgd_nesterov)
{
    krt_optim_config c = {.kind = KRT_SGD, .lr = 0.05, .momentum = 0.9, .nesterov = true};
    const float want[3][N] = {
        {0.490500003f, -1.23099995f, 1.97150004f, 0.787999988f, -0.347500026f, 9.0f},
        {0.4912f, -1.23714995f, 1.93560004f, 0.794699967f, -0.310750008f, 9.0f},
        {0.470580012f, -1.23593497f, 1.92404008f, 0.776729941f, -0.309424996f, 9.0f},
    };
    const float buf[N] = {0.236000001f, -0.0269999877f, 0.367999971f, 0.0660000294f, -0.0850000381f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.05, 0.05, 0.05}, want, &s);
    expect_floats(s.m, buf, N, "momentum buffer");
    krt_optim_free(&s);
}

Test(optim, adam_l2_and_bias_correction)
{
    krt_optim_config c = {.kind = KRT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    const float want[3][N] = {
        {0.49000001f, -1.24000001f, 1.99000001f, 0.75999999f, -0.310000002f, 9.0f},
        {0.483349204f, -1.23391449f, 1.98004234f, 0.764694691f, -0.308570564f, 9.0f},
        {0.475223541f, -1.22725236f, 1.97150314f, 0.763867319f, -0.307876259f, 9.0f},
    };
    const float m[N] = {0.0368934944f, -0.0363241434f, 0.0907104239f, 0.0065999981f, -0.00850000419f, 0.0f};
    const float v[N] = {8.41262663e-05f, 0.000121314632f, 0.000460504496f, 0.000259670196f, 0.000611640338f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.01, 0.01}, want, &s);
    expect_floats(s.m, m, N, "exp_avg");
    expect_floats(s.v, v, N, "exp_avg_sq");
    krt_optim_free(&s);
}

Test(optim, adamw_decoupled_decay_and_step_lr)
{
    /* The rate passed to each step (as a schedule would) is used, not c.lr. */
    krt_optim_config c = {.kind = KRT_ADAMW, .lr = 123, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    const float want[3][N] = {
        {0.489500016f, -1.23874998f, 1.98800004f, 0.75999999f, -0.310000002f, 9.0f},
        {0.483194292f, -1.23448598f, 1.96420062f, 0.769389331f, -0.307141095f, 9.0f},
        {0.47966212f, -1.23352349f, 1.96030045f, 0.768975616f, -0.306793958f, 9.0f},
    };
    const float m[N] = {0.0236000028f, -0.00270000054f, 0.0368000008f, 0.0065999981f, -0.00850000419f, 0.0f};
    const float v[N] = {5.24775132e-05f, 6.23975502e-05f, 0.000162257609f, 0.000259670196f, 0.000611640338f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.02, 0.005}, want, &s);
    expect_floats(s.m, m, N, "exp_avg");
    expect_floats(s.v, v, N, "exp_avg_sq");
    krt_optim_free(&s);
}

Test(optim, adam_large_lerp_weight)
{
    /* 1 - beta1 = 0.6 >= 0.5 takes lerp's other formula: end - (end - self) * (1 - w). */
    krt_optim_config c = {.kind = KRT_ADAM, .lr = 0.1, .beta1 = 0.4, .beta2 = 0.99, .eps = 1e-3};
    const float want[3][N] = {
        {0.400990099f, -1.15049756f, 1.90033221f, 0.849750638f, -0.39980042f, 9.0f},
        {0.40992564f, -1.17864239f, 1.8049252f, 0.864432752f, -0.348182559f, 9.0f},
        {0.315930665f, -1.19103169f, 1.79172862f, 0.804457963f, -0.332579851f, 9.0f},
    };
    const float m[N] = {0.117600009f, 0.0168000031f, 0.0287999883f, 0.165600017f, -0.0660000145f, 0.0f};
    const float v[N] = {0.000522760034f, 0.000614790013f, 0.00160084013f, 0.00256716018f, 0.00603925018f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.1, 0.1, 0.1}, want, &s);
    expect_floats(s.m, m, N, "exp_avg");
    expect_floats(s.v, v, N, "exp_avg_sq");
    krt_optim_free(&s);
}

Test(optim, null_spans_mean_the_whole_slab_with_decay)
{
    krt_optim_config c = {.kind = KRT_SGD, .lr = 0.5, .weight_decay = 0.5};
    krt_optim_state s;
    krt_error err;
    cr_assert_eq(krt_optim_init(&s, &c, 2, &err), KRT_OK);
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f};
    krt_optim_step(&c, &s, 0.5, p, g, NULL, 0);
    /* 1 - 0.5*(0.5 + 0.5*1) = 0.5; -2 - 0.5*(0.25 - 1) = -1.625: all exact in float. */
    cr_expect(p[0] == 0.5f && p[1] == -1.625f, "got %g %g", (double)p[0], (double)p[1]);
    krt_optim_free(&s);
}

Test(optim, spans_are_clamped_to_the_slab)
{
    /* Exactly sized allocations: ASan would catch an access outside them. */
    krt_optim_config c = {.kind = KRT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    krt_optim_state s;
    krt_error err;
    cr_assert_eq(krt_optim_init(&s, &c, 5, &err), KRT_OK);
    float *p = malloc(5 * sizeof *p), *g = malloc(5 * sizeof *g);
    for (int i = 0; i < 5; i++) p[i] = 1.0f, g[i] = 1.0f;
    const krt_param_span spans[3] = {{-2, 3, true}, {3, INT64_MAX, false}, {7, 2, true}};
    krt_optim_step(&c, &s, 0.1, p, g, spans, 3);
    /* First Adam step: p - lr * g/|g| (up to eps) for 0 and 3-4; 1-2 untouched. */
    for (int i = 0; i < 5; i++) {
        float want = i == 1 || i == 2 ? 1.0f : 0.9f;
        cr_expect(fabsf(p[i] - want) < 1e-6f, "p[%d] = %.9g", i, (double)p[i]);
    }
    krt_optim_step(&c, &s, 0.1, p, g, (krt_param_span[]){{0, 0, true}, {2, -5, true}}, 2);
    cr_expect_eq(s.step, 2);
    free(p);
    free(g);
    krt_optim_free(&s);
}

Test(optim, init_validates_the_config)
{
    struct {
        krt_optim_config c;
        int64_t n;
        const char *needle;
    } bad[] = {
        {{.kind = KRT_SGD, .lr = -1}, 4, "learning rate"},
        {{.kind = KRT_SGD, .lr = NAN}, 4, "learning rate"},
        {{.kind = KRT_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}, 4, "Nesterov"},
        {{.kind = KRT_SGD, .lr = 0.1, .nesterov = true}, 4, "Nesterov"},
        {{.kind = KRT_SGD, .lr = 0.1, .momentum = -0.5}, 4, "momentum"},
        {{.kind = KRT_ADAM, .lr = 0.1, .beta1 = 1.0, .beta2 = 0.9}, 4, "beta1"},
        {{.kind = KRT_ADAMW, .lr = 0.1, .beta1 = 0.9, .beta2 = -0.1}, 4, "beta2"},
        {{.kind = KRT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.9, .eps = -1}, 4, "eps"},
        {{.kind = KRT_ADAMW, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.9, .weight_decay = -0.1}, 4, "weight_decay"},
        {{.kind = (krt_optim_kind)7, .lr = 0.1}, 4, "unknown kind"},
        {{.kind = KRT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.9}, -3, "negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        krt_optim_state s;
        krt_error err = {0};
        cr_expect_eq(krt_optim_init(&s, &bad[i].c, bad[i].n, &err), KRT_EINVAL, "case %zu accepted", i);
        cr_expect(strstr(err.msg, bad[i].needle), "case %zu: message '%s' lacks '%s'", i, err.msg, bad[i].needle);
        cr_expect(s.m == NULL && s.v == NULL, "case %zu: state allocated", i);
    }
    krt_optim_state s;
    cr_expect_eq(krt_optim_init(NULL, &bad[0].c, 4, NULL), KRT_EINVAL);
    cr_expect_eq(krt_optim_init(&s, NULL, 4, NULL), KRT_EINVAL);
}

Test(optim, init_zeroes_the_state)
{
    krt_optim_config c = {.kind = KRT_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    krt_optim_state s;
    krt_error err;
    cr_assert_eq(krt_optim_init(&s, &c, 1000, &err), KRT_OK);
    cr_assert(s.m && s.v);
    cr_expect_eq(s.n, 1000);
    cr_expect_eq(s.step, 0);
    for (int i = 0; i < 1000; i++) cr_expect(s.m[i] == 0 && s.v[i] == 0);
    krt_optim_free(&s);
    krt_optim_free(NULL);
    /* An empty slab is valid; steps still count. */
    cr_assert_eq(krt_optim_init(&s, &c, 0, &err), KRT_OK);
    krt_optim_step(&c, &s, 1e-3, NULL, NULL, NULL, 0);
    cr_expect_eq(s.step, 1);
    krt_optim_free(&s);
}

Test(optim, grad_norm)
{
    cr_expect_eq(krt_grad_norm((float[]){3, 4}, 2), 5.0);
    cr_expect_eq(krt_grad_norm(NULL, 0), 0.0);
    cr_expect_eq(krt_grad_norm((float[]){1}, 0), 0.0);
    /* Squares overflow float32 but not the double accumulator. */
    double big = krt_grad_norm((float[]){3e30f, 4e30f}, 2);
    cr_expect(fabs(big / 5e30 - 1) < 1e-7, "norm %g", big);
    /* A million small values: a float accumulator would be off by 0.5% here, double
     * accumulation stays within rounding of the exact value. */
    float *g = malloc(1000000 * sizeof *g);
    for (int i = 0; i < 1000000; i++) g[i] = 1e-3f;
    double n = krt_grad_norm(g, 1000000);
    cr_expect(fabs(n - 1000 * (double)1e-3f) < 1e-9, "norm %.17g", n);
    /* Blocks and lanes in a fixed order: the same bits whatever the number of threads. */
    for (int i = 0; i < 1000000; i++) g[i] = (float)((int64_t)i * 7919 % 1000 - 500) * 1e-3f;
    double exact = 0;
    for (int i = 0; i < 1000000; i++) exact += (double)g[i] * (double)g[i];
    int threads = omp_get_max_threads();
    double par = krt_grad_norm(g, 1000000);
    omp_set_num_threads(1);
    double one = krt_grad_norm(g, 1000000);
    omp_set_num_threads(3);
    double three = krt_grad_norm(g, 1000000);
    omp_set_num_threads(threads);
    cr_expect(par == one && one == three, "%.17g %.17g %.17g", par, one, three);
    cr_expect(fabs(par / sqrt(exact) - 1) < 1e-12, "%.17g vs %.17g", par, sqrt(exact));
    free(g);
}

Test(optim, clip_grad_norm)
{
    float g[3] = {3, 0, -4};
    cr_expect_eq(krt_clip_grad_norm(g, 3, 1.0), 5.0);
    float f = (float)(1.0 / (5.0 + 1e-6));
    cr_expect(g[0] == 3 * f && g[1] == 0 && g[2] == -4 * f, "got %.9g %.9g %.9g", (double)g[0], (double)g[1],
              (double)g[2]);
    cr_expect(fabs(krt_grad_norm(g, 3) - 1.0) < 1e-6);

    float h[2] = {3, 4};
    cr_expect_eq(krt_clip_grad_norm(h, 2, 10.0), 5.0);
    cr_expect(h[0] == 3 && h[1] == 4, "a norm below max_norm leaves the gradients alone");
    /* Exactly at max_norm the factor is 5/(5 + 1e-6) < 1: scaled, as in PyTorch. */
    cr_expect_eq(krt_clip_grad_norm(h, 2, 5.0), 5.0);
    cr_expect(h[0] < 3 && h[0] > 2.9999f);

    float bad[2] = {INFINITY, 1};
    cr_expect(isinf(krt_clip_grad_norm(bad, 2, 1.0)));
    cr_expect(isinf(bad[0]) && bad[1] == 1, "a non-finite norm leaves the gradients alone");
    float nan[2] = {NAN, 1};
    cr_expect(isnan(krt_clip_grad_norm(nan, 2, 1.0)));
    cr_expect(nan[1] == 1);
}

/* ---- schedules ---- */

static void expect_lr(const krt_schedule *s, double base, int64_t step, double want)
{
    double got = krt_schedule_lr(s, base, step);
    cr_expect(fabs(got - want) <= 1e-12 * fabs(want) + 1e-15, "kind %d step %lld: got %.17g, want %.17g", (int)s->kind,
              (long long)step, got, want);
}

Test(sched, warmup_then_constant)
{
    krt_schedule s = {.kind = KRT_SCHED_CONSTANT, .warmup = 4};
    expect_lr(&s, 0.1, 0, 0.025);
    expect_lr(&s, 0.1, 1, 0.05);
    expect_lr(&s, 0.1, 2, 0.075);
    expect_lr(&s, 0.1, 3, 0.1);
    expect_lr(&s, 0.1, 4, 0.1);
    expect_lr(&s, 0.1, 1000000, 0.1);
    expect_lr(&s, 0.1, -5, 0.025); /* a negative step counts as 0 */
    s.warmup = 0;
    expect_lr(&s, 0.1, 0, 0.1);
    s.warmup = -3;
    expect_lr(&s, 0.1, 0, 0.1);
    cr_expect_eq(krt_schedule_lr(NULL, 0.3, 5), 0.3);
}

Test(sched, step_decay)
{
    krt_schedule s = {.kind = KRT_SCHED_STEP, .step_size = 10, .gamma = 0.5};
    expect_lr(&s, 0.1, 0, 0.1);
    expect_lr(&s, 0.1, 9, 0.1);
    expect_lr(&s, 0.1, 10, 0.05);
    expect_lr(&s, 0.1, 25, 0.025);
    s.warmup = 4; /* counted from the end of warmup */
    expect_lr(&s, 0.1, 0, 0.025);
    expect_lr(&s, 0.1, 13, 0.1);
    expect_lr(&s, 0.1, 14, 0.05);
    expect_lr(&s, 0.1, 34, 0.0125);
    s.step_size = 0;
    expect_lr(&s, 0.1, 100, 0.1);
}

Test(sched, linear_decay)
{
    krt_schedule s = {.kind = KRT_SCHED_LINEAR, .warmup = 10, .total_steps = 110, .min_lr = 0.0};
    expect_lr(&s, 1.0, 0, 0.1);
    expect_lr(&s, 1.0, 9, 1.0);
    expect_lr(&s, 1.0, 10, 1.0);
    expect_lr(&s, 1.0, 60, 0.5);
    expect_lr(&s, 1.0, 85, 0.25);
    expect_lr(&s, 1.0, 110, 0.0);
    expect_lr(&s, 1.0, 500, 0.0);
    s.min_lr = 0.1;
    expect_lr(&s, 1.0, 60, 0.55);
    expect_lr(&s, 1.0, 1000, 0.1);
    s.total_steps = 5; /* no room to decay: min_lr right after warmup */
    expect_lr(&s, 1.0, 9, 1.0);
    expect_lr(&s, 1.0, 10, 0.1);
}

Test(sched, cosine_decay)
{
    krt_schedule s = {.kind = KRT_SCHED_COSINE, .total_steps = 100};
    expect_lr(&s, 1.0, 0, 1.0);
    expect_lr(&s, 1.0, 25, 0.85355339059327373); /* 0.5 * (1 + cos(pi/4)) */
    expect_lr(&s, 1.0, 50, 0.5);
    expect_lr(&s, 1.0, 75, 0.14644660940672627);
    expect_lr(&s, 1.0, 100, 0.0);
    expect_lr(&s, 1.0, 200, 0.0);
    s = (krt_schedule){.kind = KRT_SCHED_COSINE, .warmup = 20, .total_steps = 120, .min_lr = 0.1};
    expect_lr(&s, 1.0, 0, 0.05);
    expect_lr(&s, 1.0, 19, 1.0);
    expect_lr(&s, 1.0, 20, 1.0);
    expect_lr(&s, 1.0, 70, 0.55);
    expect_lr(&s, 1.0, 120, 0.1);
    expect_lr(&s, 1.0, 121, 0.1);
}
