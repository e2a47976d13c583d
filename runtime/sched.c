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

double krt_schedule_lr(const krt_schedule *s, double base_lr, int64_t step)
{
    if (!s) return base_lr;
    if (step < 0) step = 0;
    int64_t warmup = s->warmup > 0 ? s->warmup : 0;
    if (step < warmup) return base_lr * (double)(step + 1) / (double)warmup;
    switch (s->kind) {
    case KRT_SCHED_CONSTANT: return base_lr;
    case KRT_SCHED_STEP:
        if (s->step_size <= 0) return base_lr;
        return base_lr * pow(s->gamma, (double)((step - warmup) / s->step_size));
    case KRT_SCHED_LINEAR: return base_lr + (s->min_lr - base_lr) * progress(s, step, warmup);
    case KRT_SCHED_COSINE: {
        const double pi = 3.14159265358979323846;
        return s->min_lr + (base_lr - s->min_lr) * 0.5 * (1.0 + cos(pi * progress(s, step, warmup)));
    }
    }
    return base_lr;
}
