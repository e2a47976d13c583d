/* test_optim_parity.c — the runtime's optimizers (optim.c) and schedules (sched.c) of issue
 * 20 against PyTorch's own (torch.optim, torch.optim.lr_scheduler).
 *
 * Each optimizer case takes N_STEPS steps on two parameters, a matrix `w` [3, 4] (weight
 * decay applies) and a vector `b` [4] (it does not; in the group cases b is a parameter
 * group of its own lr and weight decay), from fixed starting values and fixed
 * gradients; the parameters after every step, the state after the last, and the case's
 * configuration go to a JSON file that tests/parity/torch_optim.py replays with
 * torch.optim (single-tensor path) and compares within a relative 1e-5. Each schedule case
 * lists krt_schedule_lr's rate for 50 steps, compared with the torch scheduler's within a
 * relative 1e-6. Without PyTorch (Debian's python3-torch) the test is skipped with a message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

#define N_STEPS 5
#define NP 16 /* w: 0-11, b: 12-15 */

typedef struct {
    const char *name, *torch_kind, *torch_args; /* torch_args: the constructor's keyword arguments as JSON */
    krt_optim_config c;
    bool group_b;           /* b is in a parameter group of its own lr and weight_decay (decay applies) */
    double b_lr, b_wd;
} OptimCase;

static const OptimCase optim_cases[] = {
    {"rmsprop", "RMSprop", "{\"alpha\": 0.99, \"eps\": 1e-8, \"momentum\": 0, \"centered\": false}",
     {.kind = KRT_RMSPROP, .lr = 0.01, .alpha = 0.99, .eps = 1e-8, .weight_decay = 0.01}, false, 0, 0},
    {"rmsprop_centered_momentum", "RMSprop", "{\"alpha\": 0.9, \"eps\": 1e-6, \"momentum\": 0.9, \"centered\": true}",
     {.kind = KRT_RMSPROP, .lr = 0.003, .alpha = 0.9, .eps = 1e-6, .momentum = 0.9, .centered = true, .weight_decay = 0.1}, false, 0, 0},
    {"adagrad", "Adagrad", "{\"lr_decay\": 0.05, \"initial_accumulator_value\": 0.1, \"eps\": 1e-10}",
     {.kind = KRT_ADAGRAD, .lr = 0.1, .lr_decay = 0.05, .initial_accumulator_value = 0.1, .eps = 1e-10, .weight_decay = 0.1}, false, 0, 0},
    {"adam_amsgrad", "Adam", "{\"betas\": [0.9, 0.999], \"eps\": 1e-8, \"amsgrad\": true}",
     {.kind = KRT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .amsgrad = true, .weight_decay = 0.1}, false, 0, 0},
    {"adamw_amsgrad", "AdamW", "{\"betas\": [0.9, 0.5], \"eps\": 1e-8, \"amsgrad\": true}",
     {.kind = KRT_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.5, .eps = 1e-8, .amsgrad = true, .weight_decay = 0.1}, false, 0, 0},
    {"lion", "Lion", "{\"betas\": [0.9, 0.99]}", {.kind = KRT_LION, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.5}, false, 0, 0},
    /* parameter groups: b with its own lr and weight decay */
    {"adamw_group", "AdamW", "{\"betas\": [0.9, 0.999], \"eps\": 1e-8}",
     {.kind = KRT_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1}, true, 0.05, 0.3},
    {"rmsprop_group", "RMSprop", "{\"alpha\": 0.99, \"eps\": 1e-8, \"momentum\": 0.5, \"centered\": false}",
     {.kind = KRT_RMSPROP, .lr = 0.01, .alpha = 0.99, .eps = 1e-8, .momentum = 0.5, .weight_decay = 0.01}, true, 0.002, 0.2},
};
#define NOPTIM ((int)(sizeof optim_cases / sizeof optim_cases[0]))

static const char *const pname[2] = {"w", "b"};
static const int64_t poff[2] = {0, 12}, pcount[2] = {12, 4};

static void put_floats(StrBuf *o, const float *v, int64_t n)
{
    sb_putc(o, '[');
    for (int64_t i = 0; i < n; i++) sb_printf(o, "%s%.9g", i ? ", " : "", (double)v[i]);
    sb_putc(o, ']');
}

/* Both parameters' slices of a slab: [[w...], [b...]]. */
static void put_params(StrBuf *o, const float *slab)
{
    sb_putc(o, '[');
    for (int k = 0; k < 2; k++) {
        if (k) sb_puts(o, ", ");
        put_floats(o, slab + poff[k], pcount[k]);
    }
    sb_putc(o, ']');
}

static void run_optim_case(StrBuf *o, const OptimCase *oc)
{
    const krt_optim_config *c = &oc->c;
    float p[NP], g[N_STEPS][NP];
    for (int i = 0; i < NP; i++) p[i] = (float)(1.3 * sin(i * 1.37 + 0.5));
    for (int s = 0; s < N_STEPS; s++)
        for (int i = 0; i < NP; i++) /* some gradients shrink from one step to the next, so amsgrad's maximum matters */
            g[s][i] = (float)(0.5 * cos(i * 0.71 + s * 1.9) / (1 + (s % 2) * (i % 3)));
    sb_printf(o, "{\"name\": \"%s\", \"kind\": \"%s\", \"args\": %s, \"params\": [", oc->name, oc->torch_kind, oc->torch_args);
    for (int k = 0; k < 2; k++) {
        double lr = k && oc->group_b ? oc->b_lr : c->lr, wd = k ? (oc->group_b ? oc->b_wd : 0.0) : c->weight_decay;
        sb_printf(o, "%s{\"name\": \"%s\", \"shape\": %s, \"lr\": %.17g, \"weight_decay\": %.17g, \"data\": ", k ? ", " : "", pname[k],
                  k ? "[4]" : "[3, 4]", lr, wd);
        put_floats(o, p + poff[k], pcount[k]);
        sb_putc(o, '}');
    }
    sb_puts(o, "], \"grads\": [");
    for (int s = 0; s < N_STEPS; s++) {
        if (s) sb_puts(o, ", ");
        put_params(o, g[s]);
    }
    krt_optim_state st;
    krt_error err = {0};
    cr_assert_eq(krt_optim_init(&st, c, NP, &err), KRT_OK, "%s: %s", oc->name, err.msg);
    const krt_param_span spans[2] = {{.offset = 0, .count = 12, .decay = true},
                                     {.offset = 12, .count = 4, .decay = oc->group_b, .grouped = oc->group_b, .lr = oc->b_lr, .weight_decay = oc->b_wd}};
    sb_puts(o, "], \"after\": [");
    for (int s = 0; s < N_STEPS; s++) {
        krt_optim_step(c, &st, c->lr, p, g[s], spans, 2);
        if (s) sb_puts(o, ", ");
        put_params(o, p);
    }
    sb_puts(o, "], \"state\": {");
    int n = 0;
    for (int k = 0; k < KRT_OPTIM_SLABS; k++) {
        const char *name = krt_optim_slab_name(c, k);
        if (!name) continue;
        sb_printf(o, "%s\"%s\": ", n++ ? ", " : "", name);
        put_params(o, *krt_optim_slab(&st, k));
    }
    sb_puts(o, "}}");
    krt_optim_free(&st);
}

/* Writes the JSON to a file, runs torch_optim.py on it; skips without PyTorch. */
static void compare_with_torch(const StrBuf *json)
{
    char path[] = "/tmp/kiln-optim-parity-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(f);
    fwrite(json->data, 1, json->len, f);
    fclose(f);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", support_path("tests/parity/torch_optim.py"), path);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    remove(path);
    cr_log_info("%s", out.data);
    if (rc == 77 || rc == 127) {
        sb_free(&out);
        cr_skip_test("%s (Debian's python3-torch): parity with PyTorch not checked",
                     rc == 77 ? "PyTorch is not installed" : "there is no /usr/bin/python3");
    }
    cr_expect_eq(rc, 0, "torch_optim.py exited %d:\n%s", rc, out.data);
    sb_free(&out);
}

Test(optim_parity, optimizers_match_torch_optim, .timeout = 120)
{
    StrBuf o;
    sb_init(&o);
    sb_puts(&o, "{\"optim\": [\n");
    for (int i = 0; i < NOPTIM; i++) {
        if (i) sb_puts(&o, ",\n");
        run_optim_case(&o, &optim_cases[i]);
    }
    sb_puts(&o, "\n]}\n");
    compare_with_torch(&o);
    sb_free(&o);
}

/* ---- schedules ---- */

typedef struct {
    const char *name, *torch_kind, *torch_args; /* torch_args: the scheduler's arguments as JSON */
    krt_schedule s;
} SchedCase;

#define SCHED_STEPS 50

static const SchedCase sched_cases[] = {
    {"onecycle", "onecycle",
     "{\"pct_start\": 0.3, \"anneal_strategy\": \"cos\", \"div_factor\": 25, \"final_div_factor\": 1e4, \"three_phase\": false}",
     {.kind = KRT_SCHED_ONECYCLE, .pct_start = 0.3, .div_factor = 25, .final_div_factor = 1e4, .total_steps = SCHED_STEPS}},
    {"onecycle_three_phase_linear", "onecycle",
     "{\"pct_start\": 0.25, \"anneal_strategy\": \"linear\", \"div_factor\": 10, \"final_div_factor\": 100, \"three_phase\": true}",
     {.kind = KRT_SCHED_ONECYCLE, .pct_start = 0.25, .div_factor = 10, .final_div_factor = 100, .anneal_linear = true,
      .three_phase = true, .total_steps = SCHED_STEPS}},
    /* max_lr given: the peak is 0.4 whatever the optimizer's lr (0.1 here) */
    {"onecycle_max_lr", "onecycle",
     "{\"max_lr\": 0.4, \"pct_start\": 0.3, \"anneal_strategy\": \"cos\", \"div_factor\": 20, \"final_div_factor\": 1e3, \"three_phase\": false}",
     {.kind = KRT_SCHED_ONECYCLE, .max_lr = 0.4, .pct_start = 0.3, .div_factor = 20, .final_div_factor = 1e3, .total_steps = SCHED_STEPS}},
    {"exponential", "exponential", "{\"gamma\": 0.9}", {.kind = KRT_SCHED_EXPONENTIAL, .gamma = 0.9, .total_steps = SCHED_STEPS}},
    {"polynomial_run", "polynomial", "{\"total_iters\": 50, \"power\": 2.0}",
     {.kind = KRT_SCHED_POLYNOMIAL, .power = 2.0, .total_steps = SCHED_STEPS}},
    {"polynomial_30", "polynomial", "{\"total_iters\": 30, \"power\": 1.0}",
     {.kind = KRT_SCHED_POLYNOMIAL, .power = 1.0, .total_iters = 30, .total_steps = SCHED_STEPS}},
    {"cosine_restarts", "cosine_restarts", "{\"T_0\": 10, \"T_mult\": 1, \"eta_min\": 0.0}",
     {.kind = KRT_SCHED_COSINE_RESTARTS, .t0 = 10, .t_mult = 1, .total_steps = SCHED_STEPS}},
    {"cosine_restarts_mult", "cosine_restarts", "{\"T_0\": 3, \"T_mult\": 2, \"eta_min\": 0.001}",
     {.kind = KRT_SCHED_COSINE_RESTARTS, .t0 = 3, .t_mult = 2, .min_lr = 0.001, .total_steps = SCHED_STEPS}},
};
#define NSCHED ((int)(sizeof sched_cases / sizeof sched_cases[0]))

Test(optim_parity, schedules_match_torch_lr_scheduler, .timeout = 120)
{
    StrBuf o;
    sb_init(&o);
    sb_puts(&o, "{\"sched\": [\n");
    for (int i = 0; i < NSCHED; i++) {
        const SchedCase *c = &sched_cases[i];
        const double lr = 0.1;
        sb_printf(&o, "%s{\"name\": \"%s\", \"kind\": \"%s\", \"lr\": %.17g, \"total_steps\": %d, \"args\": %s, \"lrs\": [", i ? ",\n" : "",
                  c->name, c->torch_kind, lr, SCHED_STEPS, c->torch_args);
        for (int s = 0; s < SCHED_STEPS; s++) sb_printf(&o, "%s%.17g", s ? ", " : "", krt_schedule_lr(&c->s, lr, s));
        sb_puts(&o, "]}");
    }
    sb_puts(&o, "\n]}\n");
    compare_with_torch(&o);
    sb_free(&o);
}
