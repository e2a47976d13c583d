/* sched.c — learning-rate schedules: the learning rate a generated training program
 * passes to krt_optim_step at each optimizer step. A pure function of the step, so that a
 * run resumed from a checkpoint continues with exactly the rates it would have used.
 *
 * Definition, for step s (0-based; a negative step counts as 0), base rate `base`,
 * W = warmup, T = total_steps:
 *   warmup     s < W:  base * (s + 1) / W   (linear; step 0 already trains, at base/W, and
 *                      step W-1 reaches base; warmup <= 0 means no warmup)
 *   then, for s >= W:
 *   CONSTANT   base
 *   STEP       base * gamma^floor((s - W) / step_size)       (step_size <= 0: base)
 *   LINEAR     base + (min_lr - base) * p
 *   COSINE     min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * p))
 *   where p = (s - W) / (T - W) clamped to [0, 1]: base at s = W, min_lr from s = T on
 *   (p = 1 when T <= W: the decay has no room, the rate is min_lr after warmup).
 *   and, with t = s - W (the PyTorch scheduler's last_epoch, stepped once per optimizer
 *   step, as a pure function of t so that a resumed run continues exactly):
 *   EXPONENTIAL      base * gamma^t                                         (ExponentialLR)
 *   POLYNOMIAL       base * (1 - min(t, I) / I)^power, I = total_iters, or T - W when 0
 *                                                                          (PolynomialLR)
 *   COSINE_RESTARTS  eta_min + (base - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2, where
 *                    T_cur, T_i follow t through cycles of T_0, T_0 * T_mult, ...
 *                                                            (CosineAnnealingWarmRestarts)
 *   ONECYCLE (no warmup of its own: its first phase is one) OneCycleLR with max_lr = the
 *                    schedule's max_lr, or base when it is 0 (max_lr not written), and
 *                    total_steps = T: from max_lr / div_factor up to max_lr over the first
 *                    pct_start * T steps, then down to max_lr / div_factor / final_div_factor
 *                    at step T - 1 (three_phase: up, back to the start, then down), by
 *                    cosine or linear annealing; past T - 1 it stays at the last value
 *                    (PyTorch raises an error there).
 * The decay is measured from the end of warmup, as in the usual
 * "linear warmup, then cosine/linear decay" recipes, so it never jumps at s = W.
 * An unknown kind behaves as CONSTANT. */
#include <math.h>

#include "kiln_rt.h"

/* Fraction of the decay phase done at step s. */
static double progress(const krt_schedule *s, int64_t step, int64_t warmup)
{
    if (s->total_steps <= warmup) return 1.0;
    double p = (double)(step - warmup) / (double)(s->total_steps - warmup);
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

static const double PI = 3.14159265358979323846;

/* OneCycleLR's _annealing_cos / _annealing_linear. */
static double anneal(bool linear, double start, double end, double pct)
{
    if (linear) return (end - start) * pct + start;
    double cos_out = cos(PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
}

/* OneCycleLR.get_lr at last_epoch = step. */
static double onecycle(const krt_schedule *s, double max_lr, int64_t step)
{
    const double total = (double)s->total_steps;
    const double initial = max_lr / s->div_factor, min_lr = initial / s->final_div_factor;
    double ends[3], starts[3], stops[3];
    int n;
    if (s->three_phase) {
        n = 3;
        ends[0] = s->pct_start * total - 1, starts[0] = initial, stops[0] = max_lr;
        ends[1] = 2 * s->pct_start * total - 2, starts[1] = max_lr, stops[1] = initial;
        ends[2] = total - 1, starts[2] = initial, stops[2] = min_lr;
    } else {
        n = 2;
        ends[0] = s->pct_start * total - 1, starts[0] = initial, stops[0] = max_lr;
        ends[1] = total - 1, starts[1] = max_lr, stops[1] = min_lr;
    }
    double t = (double)step, start_step = 0;
    if (t > total - 1) t = total - 1 > 0 ? total - 1 : 0;
    for (int i = 0; i < n; i++) {
        if (t <= ends[i] || i == n - 1) {
            double span = ends[i] - start_step;
            double pct = span > 0 ? (t - start_step) / span : 1.0;
            return anneal(s->anneal_linear, starts[i], stops[i], pct);
        }
        start_step = ends[i];
    }
    return min_lr;
}

double krt_schedule_lr(const krt_schedule *s, double base_lr, int64_t step)
{
    if (!s) return base_lr;
    if (step < 0) step = 0;
    if (s->kind == KRT_SCHED_ONECYCLE) return onecycle(s, s->max_lr > 0 ? s->max_lr : base_lr, step);
    int64_t warmup = s->warmup > 0 ? s->warmup : 0;
    if (step < warmup) return base_lr * (double)(step + 1) / (double)warmup;
    switch (s->kind) {
    case KRT_SCHED_CONSTANT: return base_lr;
    case KRT_SCHED_STEP:
        if (s->step_size <= 0) return base_lr;
        return base_lr * pow(s->gamma, (double)((step - warmup) / s->step_size));
    case KRT_SCHED_LINEAR: return base_lr + (s->min_lr - base_lr) * progress(s, step, warmup);
    case KRT_SCHED_COSINE: return s->min_lr + (base_lr - s->min_lr) * 0.5 * (1.0 + cos(PI * progress(s, step, warmup)));
    case KRT_SCHED_ONECYCLE: break; /* above */
    case KRT_SCHED_EXPONENTIAL: return base_lr * pow(s->gamma, (double)(step - warmup));
    case KRT_SCHED_POLYNOMIAL: {
        int64_t iters = s->total_iters > 0 ? s->total_iters : s->total_steps - warmup, t = step - warmup;
        if (iters <= 0) return 0;
        if (t > iters) t = iters;
        return base_lr * pow(1.0 - (double)t / (double)iters, s->power);
    }
    case KRT_SCHED_COSINE_RESTARTS: {
        int64_t t = step - warmup, ti = s->t0 > 0 ? s->t0 : 1, mult = s->t_mult > 1 ? s->t_mult : 1;
        if (mult == 1) t %= ti;
        else
            while (t >= ti) {
                t -= ti;
                if (ti > INT64_MAX / mult) break; /* beyond any step count (T_mult <= 1000) */
                ti *= mult;
            }
        return s->min_lr + (base_lr - s->min_lr) * (1 + cos(PI * (double)t / (double)ti)) / 2;
    }
    }
    return base_lr;
}
