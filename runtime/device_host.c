/* device_host.c — the host as a kiln_device (kiln_model.h): where the C target's steps
 * run. Memory is calloc'd host memory, copies are memcpy (none between the same memory,
 * which is how the training program's host copies of parameters alias them here), and the
 * optimizer and gradient norm are optim.c's. The training program is written once against
 * kiln_device; the CUDA target's device (runtime/cuda/device.cu) is the other one. */
#include <stdlib.h>
#include <string.h>

#include "kiln_model.h"

static void *host_open(const struct kiln_model *m, char *err, size_t cap)
{
    (void)m;
    (void)err;
    (void)cap;
    static int context; /* no state: any non-NULL pointer */
    return &context;
}

static int host_reserve(void *ctx, int64_t bytes, char *err, size_t cap)
{
    (void)ctx;
    (void)bytes;
    (void)err;
    (void)cap;
    return 0; /* allocation failures are reported where they happen */
}

static void *host_alloc(void *ctx, int64_t bytes)
{
    (void)ctx;
    return bytes < 0 ? NULL : calloc((size_t)bytes + 64, 1); /* a valid pointer for 0 bytes; vector tails stay inside */
}

static void host_release(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void host_copy(void *ctx, void *dst, const void *src, int64_t bytes)
{
    (void)ctx;
    if (dst != src && bytes > 0) memcpy(dst, src, (size_t)bytes);
}

static void host_zero(void *ctx, void *p, int64_t bytes)
{
    (void)ctx;
    if (bytes > 0) memset(p, 0, (size_t)bytes);
}

static void host_accumulate(void *ctx, float *acc, const float *g, int64_t n, float divisor)
{
    (void)ctx;
    for (int64_t e = 0; e < n; e++) acc[e] += g[e] / divisor;
}

static double host_grad_norm(void *ctx, const float *g, int64_t n)
{
    (void)ctx;
    return krt_grad_norm(g, n);
}

static double host_clip(void *ctx, float *g, int64_t n, double max_norm)
{
    (void)ctx;
    return krt_clip_grad_norm(g, n, max_norm);
}

static double host_unscale_clip(void *ctx, float *g, int64_t n, float inv_scale, double max_norm)
{
    (void)ctx;
    return krt_unscale_clip_grad_norm(g, n, inv_scale, max_norm);
}

static void host_optim_step(void *ctx, const krt_optim_config *c, krt_optim_state *s, double lr, float *params, const float *grads,
                            const krt_param_span *spans, int nspans)
{
    (void)ctx;
    krt_optim_step(c, s, lr, params, grads, spans, nspans);
}

static void host_close(void *ctx) { (void)ctx; }

const kiln_device kiln_host_device = {
    .name = "host",
    .host = true,
    .open = host_open,
    .reserve = host_reserve,
    .alloc = host_alloc,
    .release = host_release,
    .to_device = host_copy,
    .to_host = host_copy,
    .zero = host_zero,
    .accumulate = host_accumulate,
    .grad_norm = host_grad_norm,
    .clip_grad_norm = host_clip,
    .unscale_clip_grad_norm = host_unscale_clip,
    .optim_step = host_optim_step,
    .close = host_close,
};
