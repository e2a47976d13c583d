/* device.cu — the GPU as a kiln_device (kiln_model.h), and the context a generated
 * model.cu's steps run in (kiln_cuda_model.h).
 *
 * The training program allocates parameters, gradients, optimizer moments, buffers and the
 * activation arena once, through alloc, after reserve has checked that they fit the GPU's
 * free memory; nothing is allocated during a step. The update after a step runs here:
 * gradient accumulation, the gradient norm and clipping, and the optimizer, whose element
 * updates are optim_elem.h's, the host's own code, compiled with -fmad=false so that each
 * float operation rounds as on the host: the GPU takes the host's steps bit for bit. The
 * norm sums in the host's order too (optim_elem.h): each thread sums one lane of one block
 * of KRT_NORM_BLOCK elements, one thread adds the lanes and then the blocks in order.
 *
 * A step's inputs arrive in host memory; kiln_cuda_input copies each into pinned staging
 * memory and from there to the device on a copy stream, asynchronously, with the step's
 * stream waiting on the copy's event. (A decode step's key/value caches are the exception:
 * they live in device memory, runtime/generate.c's, read and written in place.) There are two sets of staging buffers, used in turn,
 * so that a set is not overwritten while a copy from it may still run.
 *
 * Written in Kiln's CUDA dialect (kiln_cuda.h): nvcc compiles it for --target cuda, the
 * host C++ compiler with -DKILN_CUDA_EMU for --target cuda-emu. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define KILN_CUDA_BY_NAME 1 /* under the emulator too: the launches a GPU program makes */
#include "kiln_cuda_model.h"
#include "optim_elem.h"

#define BLOCK 256
#define GRID_MAX 65535

struct kiln_cuda_context {
    cudaStream_t stream, copy_stream;
    cublasHandle_t blas;
    int ninputs, turn;
    int64_t *input_cap;            /* bytes of each input at the bounds */
    unsigned char **pinned[2];     /* per set, per input */
    void **staged[2];              /* device copies, per set, per input */
    cudaEvent_t copied[2];         /* the set's last copy */
    bool used[2];
    int nchecks;
    int64_t *checks, *checks_host; /* 2 per index check: the first bad position (-1: none), its value */
    int nscalars;
    double *scalars_host;          /* 8 bytes per loss or metric */
    float *loss_scale, *loss_scale_host; /* fp16's loss scale, as the step's backward reads it */
    int64_t nparams, nparts;
    double *norm_parts, *norm_total; /* the gradient norm's block sums and their sum */
    double *norm_host;
    void *partials;                /* KILN_CUDA_PARTIALS_BYTES: the blocks' parts of a loss's total */
    int64_t staging_bytes;         /* device memory of all of the above */
};

/* ---- context ---------------------------------------------------------------------------- */

static void say(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

static void *device_alloc(void *ctx, int64_t bytes);
static void device_release(void *ctx, void *p);

static int64_t input_bytes_at_bounds(const kiln_input *in)
{
    int64_t n = 1;
    for (int d = 0; d < in->rank; d++) n *= in->dims[d];
    return n * (int64_t)krt_dtype_size(in->dtype);
}

static void device_close(void *vctx);

static void *device_open(const struct kiln_model *m, char *err, size_t cap)
{
    int count = 0;
    cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || count < 1) {
        if (st != cudaSuccess)
            say(err, cap, "no CUDA GPU can be used: %s (%s). This program was built with --target cuda; --target cuda-emu builds the same "
                          "model.cu to run on the CPU",
                cudaGetErrorString(st), cudaGetErrorName(st));
        else
            say(err, cap, "no CUDA GPU found. This program was built with --target cuda; --target cuda-emu builds the same model.cu to run "
                          "on the CPU");
        cudaGetLastError(); /* not sticky: clear it */
        return NULL;
    }
#if defined(KILN_CUDA_LAUNCH_BY_NAME_)
    /* the kernels for this GPU (modules.cpp): the program's CUBINs, or NVRTC's for a GPU it
     * has none for, which the line before the run says */
    const char *note = NULL, *unloadable = kiln_cuda_modules_load(&note);
    if (unloadable) {
        say(err, cap, "%s", unloadable);
        return NULL;
    }
    if (note) fprintf(stderr, "%s: %s\n", m->name, note);
#endif
    kiln_cuda_context *c = (kiln_cuda_context *)calloc(1, sizeof *c);
    if (!c) {
        say(err, cap, "out of host memory");
        return NULL;
    }
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    KILN_CUBLAS_CHECK(cublasCreate(&c->blas));
    KILN_CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    /* the model's inputs, then a decode step's own (the past position; its caches stay in
     * device memory and are not staged) */
    c->ninputs = m->ninputs + m->ndecode_inputs;
    c->input_cap = (int64_t *)calloc((size_t)c->ninputs + 1, sizeof *c->input_cap);
    for (int s = 0; s < 2; s++) {
        c->pinned[s] = (unsigned char **)calloc((size_t)c->ninputs + 1, sizeof *c->pinned[s]);
        c->staged[s] = (void **)calloc((size_t)c->ninputs + 1, sizeof *c->staged[s]);
        KILN_CUDA_CHECK(cudaEventCreateWithFlags(&c->copied[s], cudaEventDisableTiming));
    }
    c->nchecks = m->nindex_checks > 0 ? m->nindex_checks : 1;
    c->nscalars = 1 + m->nmetrics;
    c->nparams = m->nparam_floats;
    c->nparts = (m->nparam_floats + KRT_NORM_BLOCK - 1) / KRT_NORM_BLOCK;
    if (!c->input_cap || !c->pinned[0] || !c->pinned[1] || !c->staged[0] || !c->staged[1]) {
        device_close(c);
        say(err, cap, "out of host memory");
        return NULL;
    }
    for (int k = 0; k < c->ninputs; k++) {
        const kiln_input *in = k < m->ninputs ? &m->inputs[k] : &m->decode_inputs[k - m->ninputs];
        if (k >= m->ninputs && in->rank > 1) continue; /* a cache */
        c->input_cap[k] = input_bytes_at_bounds(in);
        for (int s = 0; s < 2; s++) {
            KILN_CUDA_CHECK(cudaMallocHost((void **)&c->pinned[s][k], (size_t)c->input_cap[k] + 8));
            KILN_CUDA_CHECK(cudaMalloc(&c->staged[s][k], (size_t)c->input_cap[k] + 8));
            c->staging_bytes += c->input_cap[k] + 8;
        }
    }
    KILN_CUDA_CHECK(cudaMalloc((void **)&c->checks, sizeof(int64_t) * 2 * (size_t)c->nchecks));
    KILN_CUDA_CHECK(cudaMallocHost((void **)&c->checks_host, sizeof(int64_t) * 2 * (size_t)c->nchecks));
    KILN_CUDA_CHECK(cudaMallocHost((void **)&c->scalars_host, sizeof(double) * (size_t)c->nscalars));
    KILN_CUDA_CHECK(cudaMalloc((void **)&c->loss_scale, sizeof(float)));
    KILN_CUDA_CHECK(cudaMallocHost((void **)&c->loss_scale_host, sizeof(float)));
    KILN_CUDA_CHECK(cudaMalloc((void **)&c->norm_parts, sizeof(double) * (size_t)(c->nparts + 1)));
    KILN_CUDA_CHECK(cudaMalloc((void **)&c->norm_total, sizeof(double)));
    KILN_CUDA_CHECK(cudaMallocHost((void **)&c->norm_host, sizeof(double)));
    KILN_CUDA_CHECK(cudaMalloc(&c->partials, KILN_CUDA_PARTIALS_BYTES));
    c->staging_bytes += (int64_t)(sizeof(int64_t) * 2 * (size_t)c->nchecks + sizeof(double) * (size_t)(c->nparts + 2) + sizeof(float)) +
                        KILN_CUDA_PARTIALS_BYTES;
    return c;
}

static void device_close(void *vctx)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (!c) return;
    cudaDeviceSynchronize();
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < c->ninputs; k++) {
            if (c->pinned[s]) cudaFreeHost(c->pinned[s][k]);
            if (c->staged[s]) cudaFree(c->staged[s][k]);
        }
        free(c->pinned[s]);
        free(c->staged[s]);
        cudaEventDestroy(c->copied[s]);
    }
    free(c->input_cap);
    cudaFree(c->checks);
    cudaFreeHost(c->checks_host);
    cudaFreeHost(c->scalars_host);
    cudaFree(c->loss_scale);
    cudaFreeHost(c->loss_scale_host);
    cudaFree(c->norm_parts);
    cudaFree(c->norm_total);
    cudaFree(c->partials);
    cudaFreeHost(c->norm_host);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    free(c);
}

static int device_reserve(void *vctx, int64_t bytes, char *err, size_t cap)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    size_t free_bytes = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    const double mib = 1024.0 * 1024.0;
    /* cuBLAS's workspace and the allocator's rounding: a margin rather than a failure in the
     * middle of the first step */
    const int64_t margin = 64ll << 20;
    if ((double)bytes + (double)margin > (double)free_bytes) {
        say(err, cap, "the model needs %.1f MiB more device memory (%.1f MiB of parameters, gradients, optimizer state and activations "
                      "at the batch's bound, and 64 MiB kept for cuBLAS), but the GPU has %.1f MiB free of %.1f MiB (after %.1f MiB of "
                      "input staging): lower --batch or the model's bounds",
            ((double)bytes + (double)margin) / mib, (double)bytes / mib, (double)free_bytes / mib, (double)total / mib,
            (double)c->staging_bytes / mib);
        return -1;
    }
    return 0;
}

static void *device_alloc(void *ctx, int64_t bytes)
{
    (void)ctx;
    void *p = NULL;
    if (bytes < 0) return NULL;
    if (cudaMalloc(&p, (size_t)bytes + 64) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: the caller reports it */
        return NULL;
    }
    KILN_CUDA_CHECK(cudaMemset(p, 0, (size_t)bytes + 64));
    return p;
}

static void device_release(void *ctx, void *p)
{
    (void)ctx;
    if (p) KILN_CUDA_CHECK(cudaFree(p));
}

static void device_to_device(void *vctx, void *dst, const void *src, int64_t bytes)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (bytes <= 0) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, c->stream));
    KILN_CUDA_SYNC(c->stream);
}

static void device_to_host(void *vctx, void *dst, const void *src, int64_t bytes)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (bytes <= 0) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, c->stream));
    KILN_CUDA_SYNC(c->stream);
}

static void device_zero(void *vctx, void *p, int64_t bytes)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (bytes > 0) KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, (size_t)bytes, c->stream));
}

static int grid_for(int64_t n)
{
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    return blocks < 1 ? 1 : blocks > GRID_MAX ? GRID_MAX : (int)blocks;
}

/* ---- the update's kernels ------------------------------------------------------------ */

/* acc += g / divisor. Launch: grid-stride, one element per thread and turn. */
__global__ void __launch_bounds__(BLOCK) kiln_accumulate(float *acc, const float *g, int64_t n, float divisor)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) acc[i] += g[i] / divisor;
}

/* g *= f (clipping). */
__global__ void __launch_bounds__(BLOCK) kiln_scale(float *g, int64_t n, float f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) g[i] = g[i] * f;
}

/* The sum of squares of each block of KRT_NORM_BLOCK gradients, in the host's order. Launch:
 * BLOCK threads hold BLOCK / KRT_NORM_LANES norm blocks; thread t sums lane t % LANES of
 * norm block t / LANES, element by element in order (neighbouring threads read neighbouring
 * floats: whole 32-byte sectors), then the block's first lane thread adds the lanes in order
 * from shared memory. */
__global__ void __launch_bounds__(BLOCK) kiln_norm_blocks(const float *g, int64_t n, double *parts, int64_t nparts)
{
    KILN_SHARED(double, lanes, [BLOCK]);
    const int per = BLOCK / KRT_NORM_LANES;
    const int64_t b = (int64_t)blockIdx.x * per + threadIdx.x / KRT_NORM_LANES;
    const int lane = threadIdx.x % KRT_NORM_LANES;
    double acc = 0;
    if (b < nparts) {
        const int64_t lo = b * KRT_NORM_BLOCK, hi = lo + KRT_NORM_BLOCK < n ? lo + KRT_NORM_BLOCK : n;
        for (int64_t i = lo + lane; i < hi; i += KRT_NORM_LANES) {
            const double x = (double)g[i];
            const double sq = x * x;
            acc = acc + sq;
        }
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    if (lane == 0 && b < nparts) {
        double s = 0;
        for (int j = 0; j < KRT_NORM_LANES; j++) s = s + lanes[threadIdx.x + j];
        parts[b] = s;
    }
}

/* The blocks' sums added in order, by one thread (some thousands of additions). */
__global__ void kiln_norm_total(const double *parts, int64_t nparts, double *total)
{
    if (threadIdx.x != 0) return;
    double s = 0;
    for (int64_t b = 0; b < nparts; b++) s = s + parts[b];
    *total = s;
}

/* torch.optim.SGD over [lo, hi). Launch: grid-stride. */
__global__ void __launch_bounds__(BLOCK) kiln_sgd(krt_sgd_k k, int variant, float *p, const float *g, float *buf, int64_t lo, int64_t hi)
{
    const bool l2 = variant & KRT_SGD_L2, mom = variant & KRT_SGD_MOMENTUM, first = variant & KRT_SGD_FIRST,
               nesterov = variant & KRT_SGD_NESTEROV;
    for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        krt_sgd_elem(&k, l2, mom, first, nesterov, p, g, buf, i);
}

/* torch.optim.Adam / AdamW over [lo, hi). Launch: grid-stride. */
__global__ void __launch_bounds__(BLOCK) kiln_adam(krt_adam_k k, int variant, float *p, const float *g, float *m, float *v, float *vmax,
                                                   int64_t lo, int64_t hi)
{
    const bool decoupled = variant & KRT_ADAM_DECOUPLED, l2 = variant & KRT_ADAM_L2, small_w = variant & KRT_ADAM_SMALL_W,
               amsgrad = variant & KRT_ADAM_AMSGRAD;
    for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        krt_adam_elem(&k, decoupled, l2, small_w, amsgrad, p, g, m, v, vmax, i);
}

/* torch.optim.RMSprop over [lo, hi). Launch: grid-stride. */
__global__ void __launch_bounds__(BLOCK) kiln_rmsprop(krt_rmsprop_k k, int variant, float *p, const float *g, float *sq, float *gavg,
                                                      float *buf, int64_t lo, int64_t hi)
{
    const bool l2 = variant & KRT_RMSPROP_L2, mom = variant & KRT_RMSPROP_MOMENTUM, centered = variant & KRT_RMSPROP_CENTERED;
    for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        krt_rmsprop_elem(&k, l2, mom, centered, p, g, sq, gavg, buf, i);
}

/* torch.optim.Adagrad over [lo, hi). Launch: grid-stride. */
__global__ void __launch_bounds__(BLOCK) kiln_adagrad(krt_adagrad_k k, int variant, float *p, const float *g, float *sum, int64_t lo,
                                                      int64_t hi)
{
    const bool l2 = variant & KRT_DECAY;
    for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        krt_adagrad_elem(&k, l2, p, g, sum, i);
}

/* Lion over [lo, hi). Launch: grid-stride. */
__global__ void __launch_bounds__(BLOCK) kiln_lion(krt_lion_k k, int variant, float *p, const float *g, float *m, int64_t lo, int64_t hi)
{
    const bool decay = variant & KRT_DECAY;
    for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        krt_lion_elem(&k, decay, p, g, m, i);
}

static void device_accumulate(void *vctx, float *acc, const float *g, int64_t n, float divisor)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (n > 0) KILN_LAUNCH_AT("gradient accumulation", kiln_accumulate, grid_for(n), BLOCK, 0, c->stream, acc, g, n, divisor);
}

static double device_grad_norm(void *vctx, const float *g, int64_t n)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (n <= 0) return 0;
    const int64_t nparts = (n + KRT_NORM_BLOCK - 1) / KRT_NORM_BLOCK;
    if (nparts > c->nparts) { /* sized for the model's parameters at open */
        fprintf(stderr, "error: gradient norm of %lld values, more than the %lld parameters the device was opened for\n", (long long)n,
                (long long)c->nparams);
        KILN_CUDA_ON_ERROR();
    }
    const int per = BLOCK / KRT_NORM_LANES;
    KILN_LAUNCH_AT("gradient norm: block sums", kiln_norm_blocks, (int)((nparts + per - 1) / per), BLOCK, 0, c->stream, g, n, c->norm_parts,
                   nparts);
    KILN_LAUNCH_AT("gradient norm: total", kiln_norm_total, 1, 32, 0, c->stream, c->norm_parts, nparts, c->norm_total);
    KILN_CUDA_CHECK(cudaMemcpyAsync(c->norm_host, c->norm_total, sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    KILN_CUDA_SYNC(c->stream);
    return sqrt(*c->norm_host);
}

static double device_clip(void *vctx, float *g, int64_t n, double max_norm)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    double norm = device_grad_norm(vctx, g, n);
    if (n <= 0 || !isfinite(norm)) return norm; /* as krt_clip_grad_norm: the caller sees it */
    double coef = krt_clip_coef(norm, max_norm);
    if (coef < 1.0) KILN_LAUNCH_AT("gradient clipping", kiln_scale, grid_for(n), BLOCK, 0, c->stream, g, n, (float)coef);
    return norm;
}

/* krt_unscale_clip_grad_norm: the gradients times inv_scale (exact for the scaler's powers
 * of two), then the norm and the clip of device_clip; the host's one pass computes the same
 * products and sums them in the same order. */
static double device_unscale_clip(void *vctx, float *g, int64_t n, float inv_scale, double max_norm)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (n <= 0) return 0;
    KILN_LAUNCH_AT("loss scaling: unscale", kiln_scale, grid_for(n), BLOCK, 0, c->stream, g, n, inv_scale);
    return max_norm > 0 ? device_clip(vctx, g, n, max_norm) : device_grad_norm(vctx, g, n);
}

/* krt_optim_step (optim.c), span by span, with the state's moments in device memory. */
static void device_optim_step(void *vctx, const krt_optim_config *oc, krt_optim_state *s, double lr, float *params, const float *grads,
                              const krt_param_span *spans, int nspans)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (!oc || !s) return;
    for (int k = 0; k < KRT_OPTIM_SLABS; k++) /* not initialised for this kind (optim.c's state_fits) */
        if (krt_optim_slab_name(oc, k) && !*krt_optim_slab(s, k)) return;
    const bool first = s->step == 0;
    s->step++;
    krt_param_span whole = {.offset = 0, .count = s->n, .decay = true, .grouped = false, .lr = 0, .weight_decay = 0};
    if (!spans) {
        spans = &whole;
        nspans = 1;
    }
    for (int k = 0; k < nspans; k++) {
        int64_t lo = spans[k].offset < 0 ? 0 : spans[k].offset, hi = spans[k].offset + spans[k].count;
        if (spans[k].count <= 0) continue;
        if (hi > s->n) hi = s->n;
        if (lo >= hi) continue;
        krt_optim_config gc; /* a parameter group's lr and weight_decay */
        const double glr = krt_span_config(oc, &spans[k], lr, &gc);
        switch (oc->kind) {
        case KRT_SGD: {
            krt_sgd_k kk;
            const int variant = krt_sgd_setup(&gc, first, glr, spans[k].decay, &kk);
            KILN_LAUNCH_AT("optimizer: SGD", kiln_sgd, grid_for(hi - lo), BLOCK, 0, c->stream, kk, variant, params, grads, s->m, lo, hi);
            break;
        }
        case KRT_ADAM:
        case KRT_ADAMW: {
            krt_adam_k kk;
            const int variant = krt_adam_setup(&gc, s->step, glr, spans[k].decay, &kk);
            KILN_LAUNCH_AT(oc->kind == KRT_ADAMW ? "optimizer: AdamW" : "optimizer: Adam", kiln_adam, grid_for(hi - lo), BLOCK, 0, c->stream,
                           kk, variant, params, grads, s->m, s->v, s->w, lo, hi);
            break;
        }
        case KRT_RMSPROP: {
            krt_rmsprop_k kk;
            const int variant = krt_rmsprop_setup(&gc, glr, spans[k].decay, &kk);
            KILN_LAUNCH_AT("optimizer: RMSprop", kiln_rmsprop, grid_for(hi - lo), BLOCK, 0, c->stream, kk, variant, params, grads, s->v, s->w,
                           s->m, lo, hi);
            break;
        }
        case KRT_ADAGRAD: {
            krt_adagrad_k kk;
            const int variant = krt_adagrad_setup(&gc, s->step, glr, spans[k].decay, &kk);
            KILN_LAUNCH_AT("optimizer: Adagrad", kiln_adagrad, grid_for(hi - lo), BLOCK, 0, c->stream, kk, variant, params, grads, s->v, lo, hi);
            break;
        }
        case KRT_LION: {
            krt_lion_k kk;
            const int variant = krt_lion_setup(&gc, glr, spans[k].decay, &kk);
            KILN_LAUNCH_AT("optimizer: Lion", kiln_lion, grid_for(hi - lo), BLOCK, 0, c->stream, kk, variant, params, grads, s->m, lo, hi);
            break;
        }
        }
    }
}

/* ---- a step ------------------------------------------------------------------------------ */

kiln_cuda_step kiln_cuda_begin(void *vctx)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    c->turn ^= 1;
    if (c->used[c->turn]) KILN_CUDA_CHECK(cudaEventSynchronize(c->copied[c->turn])); /* its pinned memory is free again */
    kiln_cuda_step s = {c->stream, c->blas, c->partials};
    return s;
}

const void *kiln_cuda_input(void *vctx, int k, const void *host, int64_t bytes)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (k < 0 || k >= c->ninputs || bytes < 0 || bytes > c->input_cap[k]) {
        fprintf(stderr, "error: input %d of %lld bytes does not fit its staging memory (%lld bytes at the bounds)\n", k, (long long)bytes,
                k >= 0 && k < c->ninputs ? (long long)c->input_cap[k] : 0ll);
        KILN_CUDA_ON_ERROR();
    }
    const int s = c->turn;
    if (bytes > 0) {
        memcpy(c->pinned[s][k], host, (size_t)bytes);
        KILN_CUDA_CHECK(cudaMemcpyAsync(c->staged[s][k], c->pinned[s][k], (size_t)bytes, cudaMemcpyHostToDevice, c->copy_stream));
        KILN_CUDA_CHECK(cudaEventRecord(c->copied[s], c->copy_stream));
        KILN_CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->copied[s], 0));
        c->used[s] = true;
    }
    return c->staged[s][k];
}

/* The step waits for the last step's copies (kiln_cuda_finish synchronises), so one pinned
 * float is never overwritten while a copy reads it. */
const float *kiln_cuda_loss_scale(void *vctx, float scale)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    *c->loss_scale_host = scale;
    KILN_CUDA_CHECK(cudaMemcpyAsync(c->loss_scale, c->loss_scale_host, sizeof(float), cudaMemcpyHostToDevice, c->stream));
    return c->loss_scale;
}

cudaStream_t kiln_cuda_stream(void *vctx) { return ((kiln_cuda_context *)vctx)->stream; }

int64_t *kiln_cuda_checks(void *vctx) { return ((kiln_cuda_context *)vctx)->checks; }

void kiln_cuda_read_scalar(void *vctx, int slot, const void *device_value, size_t bytes)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (slot < 0 || slot >= c->nscalars || bytes > sizeof(double)) {
        fprintf(stderr, "error: scalar %d of %zu bytes: the context holds %d of 8 bytes\n", slot, bytes, c->nscalars);
        KILN_CUDA_ON_ERROR();
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(&c->scalars_host[slot], device_value, bytes, cudaMemcpyDeviceToHost, c->stream));
}

void kiln_cuda_finish(void *vctx, kiln_step_io *io, const kiln_index_check *checks, int nchecks)
{
    kiln_cuda_context *c = (kiln_cuda_context *)vctx;
    if (nchecks > c->nchecks) {
        fprintf(stderr, "error: %d index checks, more than the %d the context holds\n", nchecks, c->nchecks);
        KILN_CUDA_ON_ERROR();
    }
    if (nchecks > 0)
        KILN_CUDA_CHECK(cudaMemcpyAsync(c->checks_host, c->checks, sizeof(int64_t) * 2 * (size_t)nchecks, cudaMemcpyDeviceToHost, c->stream));
    KILN_CUDA_SYNC(c->stream);
    io->index_error = NULL;
    for (int i = 0; i < nchecks; i++)
        if (c->checks_host[2 * i] >= 0) {
            io->index_error = &checks[i];
            io->index_value = c->checks_host[2 * i + 1];
            break;
        }
}

const void *kiln_cuda_scalar(void *vctx, int slot) { return &((kiln_cuda_context *)vctx)->scalars_host[slot]; }

extern "C" const kiln_device kiln_cuda_device = {
    KILN_CUDA_EMULATED ? "cuda-emu" : "cuda",
    false,
    device_open,
    device_reserve,
    device_alloc,
    device_release,
    device_to_device,
    device_to_host,
    device_zero,
    device_accumulate,
    device_grad_norm,
    device_clip,
    device_unscale_clip,
    device_optim_step,
    device_close,
};

/* The kernels by name (kiln_cuda.h's KILN_CUDA_MODULE). */
#define KILN_DEVICE_KERNELS(X) \
    X(kiln_accumulate) X(kiln_scale) X(kiln_norm_blocks) X(kiln_norm_total) X(kiln_sgd) X(kiln_adam) X(kiln_rmsprop) X(kiln_adagrad) X(kiln_lion)
KILN_CUDA_MODULE(KILN_DEVICE_KERNELS);
