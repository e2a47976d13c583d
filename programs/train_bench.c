/* train_bench.c — the training program's --bench-steps N (bench/run.sh): N timed training
 * steps and the eval step at batch 1 and at the bound, on random inputs, with the same
 * update as training, printed as one `bench: {...}` JSON line; with --profile, the time
 * of each kernel. Split from train_main.c, whose recipe, errors and update it uses
 * (train_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "kiln_model.h"
#include "kiln_rng.h"
#include "train_internal.h"

/* Median milliseconds of the eval step at batch b: one untimed call, then calls until
 * 0.5 s have passed (at least 3, at most 100). */
static double time_eval(kiln_step_io *io, int bs, int64_t b, int *reps)
{
    double t[100];
    int n = 0;
    if (bs >= 0) io->syms[bs] = b;
    tm_model()->eval_step(io);
    for (double start = kiln_now(); n < 100 && (n < 3 || kiln_now() - start < 0.5); n++) {
        double t0 = kiln_now();
        tm_model()->eval_step(io);
        t[n] = 1e3 * (kiln_now() - t0);
    }
    *reps = n;
    return kiln_median(t, n);
}

/* --profile: each kernel's time in n more steps, after the benchmark's, printed as a table
 * (kiln_print_profile) with the time outside the kernels (clipping, optimizer) as rows of
 * their own. Marks cost one clock read per kernel, so profiled steps are not the timed ones. */
static int profile(kiln_step_io *io, int64_t batch, int64_t n, int64_t accumulate_steps)
{
    int nk = tm_model()->ntrain_kernels > tm_model()->neval_kernels ? tm_model()->ntrain_kernels : tm_model()->neval_kernels;
    double *seconds = calloc((size_t)nk + 1, sizeof *seconds);
    if (!seconds) return tm_die("out of memory");
    kiln_profile prof = {0, seconds};
    const int64_t accumulate = accumulate_steps;
    double other[3] = {0}, total = 0, lr;
    for (int64_t s = 0; s < n; s++) {
        double t0 = kiln_now();
        for (int64_t micro = 0; micro < accumulate; micro++) {
            io->step = (uint64_t)(s * accumulate + micro);
            io->profile = &prof;
            prof.last = kiln_now();
            io->loss_scale = tm_loss_scale();
            tm_model()->train_step(io);
            io->profile = NULL;
            double t = kiln_now();
            other[0] += t - prof.last; /* the gradients' copies after the last kernel */
            tm_accumulate_grads();
            other[2] += kiln_now() - t;
        }
        double t = kiln_now();
        tm_apply_update(s, false, &lr); /* as the training loop without a log */
        double t1 = kiln_now();
        other[1] += t1 - t;
        total += t1 - t0;
    }
    static const char *const extra_rows[] = {"(step outputs)", "(clip, optimizer)", "(accumulation)"};
    char title[96];
    snprintf(title, sizeof title, "training step at batch %lld", (long long)batch);
    kiln_print_profile(title, tm_model()->train_kernels, tm_model()->ntrain_kernels, seconds, extra_rows, other, accumulate > 1 ? 3 : 2, n, total);
    int bs = tm_batch_symbol();
    int64_t sizes[2] = {1, bs >= 0 ? tm_model()->syms[bs].max : batch};
    for (int i = 0; i < 2; i++) {
        memset(seconds, 0, sizeof *seconds * (size_t)nk);
        other[0] = total = 0;
        if (bs >= 0) io->syms[bs] = sizes[i];
        tm_model()->eval_step(io);
        int64_t reps = n * (i == 0 ? 10 : 1);
        for (int64_t r = 0; r < reps; r++) {
            double t0 = kiln_now();
            io->profile = &prof;
            prof.last = t0;
            tm_model()->eval_step(io);
            io->profile = NULL;
            double t1 = kiln_now();
            other[0] += t1 - prof.last;
            total += t1 - t0;
        }
        snprintf(title, sizeof title, "eval step at batch %lld", (long long)sizes[i]);
        kiln_print_profile(title, tm_model()->eval_kernels, tm_model()->neval_kernels, seconds, extra_rows, other, 1, reps, total);
    }
    if (bs >= 0) io->syms[bs] = batch;
    free(seconds);
    return 0;
}

/* Runs 2 warm-up and n timed training steps exactly as the training loop does (train
 * step per micro-batch, accumulation, clipping, schedule, optimizer), then times the eval
 * step at batch 1 and at 256 (or the batch bound when smaller), all on random inputs in
 * their valid ranges made before timing, and prints one machine-readable line. */
int tm_bench(kiln_step_io *io, int64_t batch, int64_t n, int64_t accumulate_steps)
{
    const int64_t warm = 2, accumulate = accumulate_steps;
    int bs = tm_batch_symbol();
    int64_t bmax = bs >= 0 ? tm_model()->syms[bs].max : batch, big = bmax < 256 ? bmax : 256;
    void **in = calloc((size_t)tm_model()->ninputs + 1, sizeof *in);
    double *times = malloc(sizeof(double) * (size_t)n);
    int rc = times && in ? 0 : tm_die("out of memory");
    for (int k = 0; k < tm_model()->ninputs && !rc; k++) {
        const kiln_input *x = &tm_model()->inputs[k];
        int64_t count = bmax;
        for (int d = 1; d < x->rank; d++) count *= x->dims[d];
        int64_t range = x->max_value > 0 ? x->max_value : 256;
        in[k] = malloc((size_t)count * krt_dtype_size(x->dtype) + 1);
        if (!in[k]) {
            rc = tm_die("out of memory");
            break;
        }
        for (int64_t e = 0; e < count; e++) {
            double u = kiln_rng_uniform53(io->seed, 0x62656e6368 /* "bench" */, (uint64_t)k, (uint64_t)e);
            int64_t v = (int64_t)(u * (double)range);
            switch (x->dtype) {
            case KRT_F32: ((float *)in[k])[e] = (float)u; break;
            case KRT_F64: ((double *)in[k])[e] = u; break;
            case KRT_BOOL: ((unsigned char *)in[k])[e] = u < 0.5; break;
            case KRT_U8: ((uint8_t *)in[k])[e] = (uint8_t)v; break;
            case KRT_I32: ((int32_t *)in[k])[e] = (int32_t)v; break;
            case KRT_I64: ((int64_t *)in[k])[e] = v; break;
            default: memset((char *)in[k] + e * (int64_t)krt_dtype_size(x->dtype), 0, krt_dtype_size(x->dtype)); break;
            }
        }
    }
    const void *const *saved_inputs = io->inputs;
    io->inputs = (const void *const *)in;
    for (int64_t s = 0; s < warm + n && !rc; s++) {
        if (s == warm) tm_dist_wait_seconds(); /* the timed steps' wait for the all-reduce, from here */
        double t0 = kiln_now(), loss = 0, lr;
        for (int64_t micro = 0; micro < accumulate; micro++) {
            io->step = (uint64_t)(s * accumulate + micro);
            io->loss_scale = tm_loss_scale();
            tm_model()->train_step(io);
            if (tm_index_failed(io, "benchmark step", s + 1)) rc = 1;
            loss += io->loss;
            tm_accumulate_grads();
        }
        tm_apply_update(s, false, &lr); /* as the training loop without a log */
        if (s >= warm) times[s - warm] = 1e3 * (kiln_now() - t0);
        if (!rc && !isfinite(loss)) rc = tm_die("the loss is %g at benchmark step %lld", loss, (long long)s + 1);
    }
    /* Distributed: the update's wait for the gradients per timed step, and a whole
     * all-reduce alone (the transfer a step would wait for with no overlap). */
    const double wait_ms = 1e3 * tm_dist_wait_seconds() / (double)n;
    const double allreduce_ms = !rc && tm_dist_size() > 1 ? tm_dist_allreduce_ms(io->grads, tm_model()->nparam_floats, 5) : 0;
    if (!rc) {
        double flops = tm_model()->train_gemm_flops ? tm_model()->train_gemm_flops(io->syms) * (double)accumulate : 0;
        double train_rss = kiln_peak_rss_mb(), step_ms = kiln_median(times, n), min_ms = times[0];
        int reps1, repsb;
        double b1 = time_eval(io, bs, 1, &reps1);
        double f1 = tm_model()->eval_gemm_flops ? tm_model()->eval_gemm_flops(io->syms) : 0;
        double bb = time_eval(io, bs, big, &repsb);
        double fb = tm_model()->eval_gemm_flops ? tm_model()->eval_gemm_flops(io->syms) : 0;
        if (bs >= 0) io->syms[bs] = batch;
        printf("bench: {\"model\": \"%s\", \"batch\": %lld, \"accumulate\": %lld, \"sizes\": {", tm_model()->name, (long long)batch,
               (long long)accumulate);
        for (int s = 0; s < tm_model()->nsyms; s++)
            printf("%s\"%s\": %lld", s ? ", " : "", tm_model()->syms[s].name, (long long)io->syms[s]);
        printf("}, \"bounds\": {");
        for (int s = 0; s < tm_model()->nsyms; s++) printf("%s\"%s\": %lld", s ? ", " : "", tm_model()->syms[s].name, (long long)tm_model()->syms[s].max);
        if (tm_dist_size() > 1)
            printf("}, \"ranks\": %d, \"allreduce_wait_ms\": %.4f, \"allreduce_ms\": %.4f, \"gradient_bytes\": %lld", tm_dist_size(), wait_ms,
                   allreduce_ms, (long long)tm_model()->nparam_floats * 4);
        printf("%s\"threads\": %d, \"blas_threads\": %d, \"warmup_steps\": %lld, \"train_steps\": %lld, \"train_step_ms_median\": %.4f, "
               "\"train_step_ms_min\": %.4f, \"gemm_flops_per_step\": %.6g, \"infer_b1_ms\": %.4f, \"infer_b1_repeats\": %d, "
               "\"infer_b1_gemm_flops\": %.6g, \"infer_b256_batch\": %lld, \"infer_b256_ms\": %.4f, \"infer_b256_repeats\": %d, "
               "\"infer_b256_gemm_flops\": %.6g, \"train_rss_mb\": %.1f, \"peak_rss_mb\": %.1f, \"gemms\": [",
               tm_dist_size() > 1 ? ", " : "}, ", krt_threads(), krt_blas_threads(), (long long)warm, (long long)n, step_ms, min_ms, flops, b1, reps1, f1, (long long)big, bb,
               repsb, fb, train_rss, kiln_peak_rss_mb());
        for (int i = 0; i < tm_model()->ntrain_gemms; i++) {
            const kiln_gemm_shape *g = &tm_model()->train_gemms[i];
            printf("%s[%lld, %lld, %lld, %lld, %d, %d, %d]", i ? ", " : "", (long long)g->batch, (long long)g->M, (long long)g->N,
                   (long long)g->K, g->trans_a, g->trans_b, g->count);
        }
        printf("]}\n");
        fflush(stdout);
    }
    if (!rc && tm_bench_profile()) rc = profile(io, batch, n, accumulate_steps);
    io->inputs = saved_inputs;
    for (int k = 0; in && k < tm_model()->ninputs; k++) free(in[k]);
    free(in);
    free(times);
    return rc;
}

/* Whether a periodic action (evaluation, checkpoint) is due after `step`: every `steps`
 * steps, and after every `epochs`-th epoch (epochs_done epochs are complete; the step just
 * taken completed one when epoch_ended). 0 turns a count off; both 0: only at the end. */
