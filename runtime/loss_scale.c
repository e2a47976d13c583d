/* loss_scale.c — fp16's dynamic loss scaling, as torch.cuda.amp.GradScaler updates its
 * scale (kiln_rt.h; docs/precision.md). fp16's smallest normal number is 2^-14: gradients
 * rounded to fp16 at the matrix products' operands would underflow to zero, so the
 * generated step seeds its backward pass with the scale S, and the training program
 * unscales (krt_unscale_clip_grad_norm), skips the steps that overflowed and updates S
 * here. The update is GradScaler's _amp_update_scale_ (growth 2, backoff 0.5) in the same
 * fp32 arithmetic, and the state lives in the checkpoint's metadata so that a resumed run
 * scales exactly as the uninterrupted one. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_recipe.h"
#include "kiln_rt.h"
#include "rt_internal.h"

#define GROWTH 2.0f
#define BACKOFF 0.5f
#define MAX_SCALE KILN_RECIPE_MAX_SCALE /* 2^127: the recipe's bound (kiln_recipe.h) */

static bool scale_ok(double v) { return v > 0 && v <= MAX_SCALE; }

krt_status krt_scaler_init(krt_loss_scaler *s, const char *mode, double init, int64_t growth_interval, krt_error *err)
{
    memset(s, 0, sizeof *s);
    s->dynamic = mode && !strcmp(mode, "dynamic");
    double v = init;
    if (!s->dynamic) {
        char *end = NULL;
        v = mode ? strtod(mode, &end) : 0;
        if (!mode || end == mode || *end) return krt_fail(err, KRT_EINVAL, "loss_scale: '%s' is not dynamic, none or a number", mode ? mode : "");
    }
    if (!scale_ok(v)) return krt_fail(err, KRT_EINVAL, "loss scale %g: must be greater than 0 and at most 2^127", v);
    if (s->dynamic && growth_interval < 1)
        return krt_fail(err, KRT_EINVAL, "loss_scale_growth_interval %lld: must be at least 1", (long long)growth_interval);
    s->scale = (float)v;
    s->growth_interval = growth_interval;
    return KRT_OK;
}

void krt_scaler_describe(const krt_loss_scaler *s, char *buf, size_t cap)
{
    if (s->dynamic)
        snprintf(buf, cap, "fp16 loss scale %g, dynamic (x2 after %lld clean steps)", (double)s->scale, (long long)s->growth_interval);
    else snprintf(buf, cap, "fp16 loss scale %g, static", (double)s->scale);
}

bool krt_scaler_update(krt_loss_scaler *s, bool found_inf)
{
    if (found_inf) {
        s->skipped++;
        if (s->dynamic) {
            s->scale = s->scale * BACKOFF;
            s->growth_tracker = 0;
        }
        return false;
    }
    if (s->dynamic && ++s->growth_tracker == s->growth_interval) {
        const float grown = s->scale * GROWTH;
        if (isfinite(grown)) s->scale = grown; /* as GradScaler: a scale that would overflow stays */
        s->growth_tracker = 0;
    }
    return true;
}

void krt_scaler_meta(const krt_loss_scaler *s, char buf[KRT_SCALER_META][32], krt_st_meta meta[KRT_SCALER_META])
{
    snprintf(buf[0], 32, "%.9g", (double)s->scale); /* 9 digits give a float back exactly */
    snprintf(buf[1], 32, "%lld", (long long)s->growth_tracker);
    snprintf(buf[2], 32, "%lld", (long long)s->skipped);
    static const char *const keys[KRT_SCALER_META] = {"loss_scale", "loss_scale_growth_tracker", "loss_scale_skipped"};
    for (int i = 0; i < KRT_SCALER_META; i++) meta[i] = (krt_st_meta){keys[i], buf[i]};
}

/* A whole number from lo to hi written in decimal digits, or -1. */
static int64_t count_of(const char *v, int64_t lo, int64_t hi)
{
    size_t len = strlen(v);
    if (len < 1 || len > 18 || (v[0] == '0' && len > 1)) return -1;
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        n = n * 10 + (v[i] - '0');
    }
    return n >= lo && n <= hi ? n : -1;
}

krt_status krt_scaler_load(krt_loss_scaler *s, const krt_safetensors *st, const char *path, int64_t steps, krt_error *err)
{
    const char *scale = krt_safetensors_meta(st, "loss_scale"), *tracker = krt_safetensors_meta(st, "loss_scale_growth_tracker"),
               *skipped = krt_safetensors_meta(st, "loss_scale_skipped");
    if (!scale && !tracker && !skipped) return KRT_OK; /* an older checkpoint, or fp32/bf16's: the recipe's start */
    if (!scale || !tracker || !skipped)
        return krt_fail(err, KRT_EFORMAT, "%s: the metadata has %s but not all of loss_scale, loss_scale_growth_tracker and loss_scale_skipped",
                        path, scale ? "loss_scale" : tracker ? "loss_scale_growth_tracker" : "loss_scale_skipped");
    char *end = NULL;
    errno = 0;
    double v = strtod(scale, &end);
    if (end == scale || *end || errno || !scale_ok(v))
        return krt_fail(err, KRT_EFORMAT, "%s: the metadata's 'loss_scale' is \"%.40s\", not a number above 0 and at most 2^127", path, scale);
    const int64_t most = s->dynamic ? s->growth_interval - 1 : 0;
    int64_t t = count_of(tracker, 0, most), k = count_of(skipped, 0, steps);
    if (t < 0)
        return krt_fail(err, KRT_EFORMAT, "%s: the metadata's 'loss_scale_growth_tracker' is \"%.40s\", not a whole number from 0 to %lld%s", path,
                        tracker, (long long)most, s->dynamic ? " (below loss_scale_growth_interval)" : " (a static scale counts nothing)");
    if (k < 0)
        return krt_fail(err, KRT_EFORMAT, "%s: the metadata's 'loss_scale_skipped' is \"%.40s\", not a whole number from 0 to %lld (the steps taken)",
                        path, skipped, (long long)steps);
    if (!s->dynamic && (float)v != s->scale)
        return krt_fail(err, KRT_EFORMAT, "%s: the run scaled the loss by %g, but this program's static loss_scale is %g", path, v, (double)s->scale);
    s->scale = (float)v;
    s->growth_tracker = t;
    s->skipped = k;
    return KRT_OK;
}
