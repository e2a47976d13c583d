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
static const krt_param_span SPANS[2] = {{.offset = 0, .count = 3, .decay = true}, {.offset = 3, .count = 2, .decay = false}};

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

/* The optimizers of issue 20, derived as above (tests/test_rt_optim.c's header), each
 * operation of optim_elem.h rounded to float32:
 *   RMSprop: g = f(g + f(f(wd) * p)) (decay spans); sq = f(f(sq * f(alpha)) + f(f(f(1 - alpha) * g) * g))
 *            centered: ga = f(f(ga * f(alpha)) + f(f(1 - alpha) * g)); avg = f(sqrt(f(sq + f(-ga * ga))))
 *            else avg = f(sqrt(sq)); avg = f(avg + f(eps))
 *            momentum: buf = f(f(buf * f(mom)) + f(g / avg)); p = f(p + f(f(-lr) * buf))
 *            else p = f(p + f(f(f(-lr) * g) / avg))
 *   Adagrad: g as RMSprop; clr = lr / (1 + (t - 1) * lr_decay) in double; sum starts at
 *            f(initial_accumulator_value); sum = f(sum + f(g * g));
 *            p = f(p + f(f(f(-clr) * g) / f(f(sqrt(sum)) + f(eps))))
 *   Lion:    p = f(p * f(1 - lr * wd)) (decay spans); c = f(f(m * f(b1)) + f(f(1 - b1) * g));
 *            p = f(p + f(f(-lr) * sign(c))); m = f(f(m * f(b2)) + f(f(1 - b2) * g))
 *   amsgrad: Adam's, with vmax = max(vmax, v) in place of v in the denominator. */
Test(optim, rmsprop_plain_with_weight_decay)
{
    krt_optim_config c = {.kind = KRT_RMSPROP, .lr = 0.01, .alpha = 0.99, .eps = 1e-8, .weight_decay = 0.01};
    const float want[3][N] = {
        {0.400000095f, -1.1500001f, 1.9000001f, 0.849999964f, -0.399999976f, 9.0f},
        {0.440297097f, -1.20479548f, 1.83546352f, 0.82563144f, -0.323019952f, 9.0f},
        {0.352885574f, -1.20001042f, 1.85477924f, 0.766421497f, -0.329453915f, 9.0f},
    };
    const float sq[N] = {0.000546810159f, 0.000633932243f, 0.0017866561f, 0.00256716018f, 0.00603925018f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.01, 0.01}, want, &s);
    cr_expect(s.m == NULL && s.w == NULL, "no momentum buffer nor grad_avg without momentum and centered");
    expect_floats(s.v, sq, N, "square_avg");
    krt_optim_free(&s);
}

Test(optim, rmsprop_centered_momentum_and_step_lr)
{
    krt_optim_config c = {.kind = KRT_RMSPROP, .lr = 7, .alpha = 0.9, .eps = 1e-6, .weight_decay = 0.1, .momentum = 0.9, .centered = true};
    const float want[3][N] = {
        {0.466667414f, -1.21666706f, 1.96666694f, 0.783333063f, -0.333333135f, 9.0f},
        {0.40821749f, -1.16267812f, 1.85851002f, 0.826850414f, -0.34362337f, 9.0f},
        {0.379934341f, -1.14430749f, 1.83173561f, 0.826711476f, -0.347026378f, 9.0f},
    };
    const float buf[N] = {5.65662718f, -3.67412519f, 5.35488749f, 0.0277884007f, 0.680598974f, 0.0f};
    const float sq[N] = {0.00762301125f, 0.00997969322f, 0.0389430411f, 0.0228600018f, 0.0528999977f, 0.0f};
    const float ga[N] = {0.0359321833f, -0.0354017839f, 0.0892851055f, 0.00660000183f, -0.00850000232f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.02, 0.005}, want, &s);
    expect_floats(s.m, buf, N, "momentum_buffer");
    expect_floats(s.v, sq, N, "square_avg");
    expect_floats(s.w, ga, N, "grad_avg");
    krt_optim_free(&s);
}

Test(optim, adagrad_lr_decay_initial_accumulator)
{
    krt_optim_config c = {.kind = KRT_ADAGRAD, .lr = 0.1, .lr_decay = 0.1, .initial_accumulator_value = 0.1, .eps = 1e-10, .weight_decay = 0.1};
    const float want[3][N] = {
        {0.45714286f, -1.17832863f, 1.91548455f, 0.828446448f, -0.384515435f, 9.0f},
        {0.458255947f, -1.18476129f, 1.86110926f, 0.810950994f, -0.319781899f, 9.0f},
        {0.410361916f, -1.16374516f, 1.85145414f, 0.769284308f, -0.324718148f, 9.0f},
    };
    /* element 5 is in no span: its sum keeps the initial value */
    const float sum[N] = {0.182948589f, 0.220696315f, 0.552380145f, 0.360000014f, 0.712500036f, 0.100000001f};
    krt_optim_state s;
    run3(&c, (double[]){0.1, 0.1, 0.1}, want, &s);
    cr_expect(s.m == NULL && s.w == NULL, "Adagrad keeps only its sum");
    expect_floats(s.v, sum, N, "sum");
    krt_optim_free(&s);
}

Test(optim, lion_decoupled_decay_and_step_lr)
{
    krt_optim_config c = {.kind = KRT_LION, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
    const float want[3][N] = {
        {0.489500016f, -1.23874998f, 1.98800004f, 0.75999999f, -0.310000002f, 9.0f},
        {0.50852102f, -1.25627244f, 1.96402407f, 0.74000001f, -0.289999992f, 9.0f},
        {0.503266752f, -1.25064433f, 1.96804202f, 0.735000014f, -0.294999987f, 9.0f},
    };
    const float m[N] = {0.00248510018f, -0.000475200155f, 0.00441530021f, 6.95998315e-05f, -0.000539500092f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.02, 0.005}, want, &s);
    cr_expect(s.v == NULL && s.w == NULL, "Lion keeps only exp_avg");
    expect_floats(s.m, m, N, "exp_avg");
    krt_optim_free(&s);
}

Test(optim, adam_amsgrad)
{
    /* The second step's gradient of element 0 is nearly 0: exp_avg_sq falls, its maximum
     * stays, and the steps differ from adam_l2_and_bias_correction's from there on. */
    krt_optim_config c = {.kind = KRT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .amsgrad = true};
    const float want[3][N] = {
        {0.49000001f, -1.24000001f, 1.99000001f, 0.75999999f, -0.310000002f, 9.0f},
        {0.483352393f, -1.23391449f, 1.98004234f, 0.764694691f, -0.308570564f, 9.0f},
        {0.47522673f, -1.22725236f, 1.97150314f, 0.763867319f, -0.307876259f, 9.0f},
    };
    const float vmax[N] = {8.41264118e-05f, 0.000121314632f, 0.000460504496f, 0.000259670196f, 0.000611640338f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.01, 0.01}, want, &s);
    expect_floats(s.w, vmax, N, "max_exp_avg_sq");
    krt_optim_free(&s);
}

Test(optim, adamw_amsgrad_keeps_the_maximum)
{
    krt_optim_config c = {.kind = KRT_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.5, .eps = 1e-8, .weight_decay = 0.1, .amsgrad = true};
    const float want[3][N] = {
        {0.489500016f, -1.23874998f, 1.98800004f, 0.75999999f, -0.310000002f, 9.0f},
        {0.486432105f, -1.23657322f, 1.97578883f, 0.764189899f, -0.308611602f, 9.0f},
        {0.480437934f, -1.23469734f, 1.9683342f, 0.763384461f, -0.308015794f, 9.0f},
    };
    const float v[N] = {0.0218750015f, 0.010625001f, 0.0318749994f, 0.0675000027f, 0.122500002f, 0.0f};
    const float vmax[N] = {0.0218750015f, 0.0212500021f, 0.0537500009f, 0.0800000057f, 0.242500007f, 0.0f};
    krt_optim_state s;
    run3(&c, (double[]){0.01, 0.01, 0.01}, want, &s);
    expect_floats(s.v, v, N, "exp_avg_sq");
    expect_floats(s.w, vmax, N, "max_exp_avg_sq");
    krt_optim_free(&s);
}

Test(optim, slab_names_are_torch_state_keys)
{
    const struct {
        krt_optim_config c;
        const char *names[KRT_OPTIM_SLABS];
    } cases[] = {
        {{.kind = KRT_SGD}, {NULL, NULL, NULL}},
        {{.kind = KRT_SGD, .momentum = 0.9}, {"exp_avg", NULL, NULL}},
        {{.kind = KRT_ADAM}, {"exp_avg", "exp_avg_sq", NULL}},
        {{.kind = KRT_ADAMW, .amsgrad = true}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
        {{.kind = KRT_RMSPROP}, {NULL, "square_avg", NULL}},
        {{.kind = KRT_RMSPROP, .momentum = 0.5, .centered = true}, {"momentum_buffer", "square_avg", "grad_avg"}},
        {{.kind = KRT_ADAGRAD}, {NULL, "sum", NULL}},
        {{.kind = KRT_LION}, {"exp_avg", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 0; k < KRT_OPTIM_SLABS; k++) {
            const char *got = krt_optim_slab_name(&cases[i].c, k), *want = cases[i].names[k];
            cr_expect(got == want || (got && want && !strcmp(got, want)), "case %zu slab %d: %s, want %s", i, k, got ? got : "(none)",
                      want ? want : "(none)");
        }
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
    const krt_param_span spans[3] = {{.offset = -2, .count = 3, .decay = true}, {.offset = 3, .count = INT64_MAX, .decay = false}, {.offset = 7, .count = 2, .decay = true}};
    krt_optim_step(&c, &s, 0.1, p, g, spans, 3);
    /* First Adam step: p - lr * g/|g| (up to eps) for 0 and 3-4; 1-2 untouched. */
    for (int i = 0; i < 5; i++) {
        float want = i == 1 || i == 2 ? 1.0f : 0.9f;
        cr_expect(fabsf(p[i] - want) < 1e-6f, "p[%d] = %.9g", i, (double)p[i]);
    }
    krt_optim_step(&c, &s, 0.1, p, g, (krt_param_span[]){{.offset = 0, .count = 0, .decay = true}, {.offset = 2, .count = -5, .decay = true}}, 2);
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
        {{.kind = KRT_RMSPROP, .lr = 0.1, .alpha = -0.5}, 4, "alpha"},
        {{.kind = KRT_RMSPROP, .lr = 0.1, .alpha = 0.9, .momentum = -1}, 4, "momentum"},
        {{.kind = KRT_RMSPROP, .lr = 0.1, .alpha = 0.9, .eps = -1}, 4, "eps"},
        {{.kind = KRT_ADAGRAD, .lr = 0.1, .lr_decay = -0.1}, 4, "lr_decay"},
        {{.kind = KRT_ADAGRAD, .lr = 0.1, .initial_accumulator_value = -1}, 4, "initial_accumulator_value"},
        {{.kind = KRT_LION, .lr = 0.1, .beta1 = 1.0, .beta2 = 0.99}, 4, "beta1"},
        {{.kind = KRT_LION, .lr = 0.1, .beta1 = 0.9, .beta2 = -0.1}, 4, "beta2"},
        {{.kind = KRT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.9}, -3, "negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        krt_optim_state s;
        krt_error err = {0};
        cr_expect_eq(krt_optim_init(&s, &bad[i].c, bad[i].n, &err), KRT_EINVAL, "case %zu accepted", i);
        cr_expect(strstr(err.msg, bad[i].needle), "case %zu: message '%s' lacks '%s'", i, err.msg, bad[i].needle);
        cr_expect(s.m == NULL && s.v == NULL && s.w == NULL, "case %zu: state allocated", i);
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

/* Issue 20's schedules (their every step is checked against torch.optim.lr_scheduler by
 * test_optim_parity.c); here the values by hand, warmup, and the ends. */
Test(sched, exponential_after_warmup)
{
    krt_schedule s = {.kind = KRT_SCHED_EXPONENTIAL, .gamma = 0.5};
    expect_lr(&s, 0.8, 0, 0.8);
    expect_lr(&s, 0.8, 1, 0.4);
    expect_lr(&s, 0.8, 3, 0.1);
    s.warmup = 4; /* warmup, then ExponentialLR from its step 0 */
    expect_lr(&s, 0.8, 0, 0.2);
    expect_lr(&s, 0.8, 3, 0.8);
    expect_lr(&s, 0.8, 4, 0.8);
    expect_lr(&s, 0.8, 6, 0.2);
}

Test(sched, polynomial)
{
    krt_schedule s = {.kind = KRT_SCHED_POLYNOMIAL, .power = 2, .total_steps = 10};
    expect_lr(&s, 1.0, 0, 1.0);
    expect_lr(&s, 1.0, 5, 0.25);
    expect_lr(&s, 1.0, 10, 0.0);
    expect_lr(&s, 1.0, 50, 0.0);
    s = (krt_schedule){.kind = KRT_SCHED_POLYNOMIAL, .power = 1, .warmup = 2, .total_steps = 12}; /* over T - W = 10 */
    expect_lr(&s, 1.0, 0, 0.5);
    expect_lr(&s, 1.0, 2, 1.0);
    expect_lr(&s, 1.0, 7, 0.5);
    s.total_iters = 4;
    expect_lr(&s, 1.0, 4, 0.5);
    expect_lr(&s, 1.0, 6, 0.0);
}

Test(sched, cosine_restarts)
{
    krt_schedule s = {.kind = KRT_SCHED_COSINE_RESTARTS, .t0 = 4, .t_mult = 2, .min_lr = 0.0};
    expect_lr(&s, 1.0, 0, 1.0);
    expect_lr(&s, 1.0, 2, 0.5);
    expect_lr(&s, 1.0, 4, 1.0); /* restart; the next cycle is 8 steps */
    expect_lr(&s, 1.0, 8, 0.5);
    expect_lr(&s, 1.0, 12, 1.0);
    s.t_mult = 1;
    s.min_lr = 0.2;
    s.warmup = 2;
    expect_lr(&s, 1.0, 0, 0.5);
    expect_lr(&s, 1.0, 4, 0.6);
    expect_lr(&s, 1.0, 6, 1.0);
}

Test(sched, onecycle)
{
    /* max 1, initial 1/25 = 0.04, final 0.04 / 1e4; 10 steps, pct_start 0.3: up over steps
     * 0..2, down over 2..9 */
    krt_schedule s = {.kind = KRT_SCHED_ONECYCLE, .pct_start = 0.3, .div_factor = 25, .final_div_factor = 1e4, .total_steps = 10};
    expect_lr(&s, 1.0, 0, 0.04);
    expect_lr(&s, 1.0, 1, 0.52);
    expect_lr(&s, 1.0, 2, 1.0);
    expect_lr(&s, 1.0, 9, 4e-6);
    expect_lr(&s, 1.0, 20, 4e-6); /* past the end: the last value */
    s.anneal_linear = true;
    expect_lr(&s, 1.0, 1, 0.52);
    expect_lr(&s, 1.0, 9, 4e-6);
    /* max_lr = 2 peaks at 2 whatever the base rate: initial 2/25, final 0.08 / 1e4 */
    s.anneal_linear = false;
    s.max_lr = 2.0;
    expect_lr(&s, 0.5, 0, 0.08);
    expect_lr(&s, 0.5, 1, 1.04);
    expect_lr(&s, 0.5, 2, 2.0);
    expect_lr(&s, 0.5, 9, 8e-6);
}
