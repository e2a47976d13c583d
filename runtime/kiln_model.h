/* kiln_model.h — the interface between a generated model (codegen/c.c writes model.c) and
 * the programs that run it (the training executable, tests). A generated model exports
 * one `kiln_model` describing its parameters, inputs and outputs, and the functions that
 * initialise parameters and run a training or evaluation step. All memory is given by the
 * caller, sized from the numbers in the description: the steps never allocate. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln_recipe.h"
#include "kiln_rt.h"

#ifdef __cplusplus
extern "C" { /* model.cu, the CUDA target's model, is C++ */
#endif

typedef enum { KILN_INIT_ZEROS, KILN_INIT_ONES, KILN_INIT_CONSTANT, KILN_INIT_UNIFORM, KILN_INIT_NORMAL } kiln_init_kind;

typedef struct {
    const char *name; /* PyTorch state_dict key */
    krt_dtype dtype;
    int rank;
    int64_t dims[KRT_MAX_RANK];
    int64_t count;
    int64_t offset;   /* in elements: trainable f32 params in the parameter slab, buffers in
                         the buffer area (bytes) */
    kiln_init_kind init;
    double init_a, init_b;
    bool trainable;
    bool decay;       /* weight decay applies by default (rank >= 2) */
    int64_t zero_from, zero_to; /* elements [zero_from, zero_to) start at zero whatever the init
                                   (Embedding's padding_idx row); equal: none */
} kiln_param;

typedef struct {
    const char *name;
    krt_dtype dtype;
    int rank;
    int64_t dims[KRT_MAX_RANK]; /* at the symbols' bounds */
    int sym[KRT_MAX_RANK];      /* index of the symbol a dim is (-1: a fixed number) */
    int64_t max_value;          /* integer inputs: valid values are [0, max_value); 0 = any */
} kiln_input;

typedef struct {
    const char *name;
    int64_t max;
} kiln_symbol;

/* Buffers a step reads and writes. */
typedef struct kiln_step_io {
    float *params;        /* trainable parameters, `nparam_floats` floats */
    float *grads;         /* gradients, same layout (train step only) */
    unsigned char *buffers; /* non-trained state (batch-norm statistics), `buffer_bytes` */
    const void *const *inputs; /* one per input, batch-major, at the current sizes */
    int64_t *syms;        /* current value of every symbol (B, T, ...): nsyms */
    unsigned char *arena; /* activations, `arena_bytes` */
    uint64_t seed, step;  /* for dropout's counter-based random numbers */
    /* The loss scale of fp16 training (docs/precision.md): a model built with loss scaling
     * seeds its backward pass with it, so its gradients come out multiplied by it; other
     * models do not read it. Host memory: the C target only. */
    float loss_scale;
    double loss;          /* out */
    double *metrics;      /* out, in the order of metric_names: nmetrics */
    void **outputs;       /* out: noutputs (or NULL): forward outputs copied to the non-NULL ones */
    struct kiln_profile *profile; /* NULL, or where each kernel's time is added up */
    /* out: NULL, or the index check that failed (the step stopped right after it: its
     * outputs are not valid) and the value found */
    const struct kiln_index_check *index_error;
    int64_t index_value;
    /* The device's context (kiln_device's open): on the CUDA target its streams, cuBLAS
     * handle and staging memory, and then params, grads, buffers and arena are device
     * memory while inputs and outputs stay host memory; NULL on the host. */
    void *device;
    /* Distributed programs (kiln build --distributed) only, else NULL: called by the
     * training step after the kernel that finishes the gradients of bucket b of the
     * model's `buckets`, so that their all-reduce starts while the backward goes on. */
    void (*bucket_ready)(struct kiln_step_io *io, int b);
} kiln_step_io;

/* A step's call of the gradient bucket hook: one predictable branch when not distributed. */
#define KILN_BUCKET_READY(io, b) ((io)->bucket_ready ? (io)->bucket_ready((io), (b)) : (void)0)

/* A gradient bucket of a distributed program, planned at build time: `count` floats of the
 * gradient slab from `offset`, final once kernel `ready` of the training step has run
 * (ntrain_kernels: after the step's last copies). Buckets are contiguous spans of the slab
 * listed in the order the step finishes them (the backward's). */
typedef struct {
    int64_t offset, count;
    int ready;
} kiln_grad_bucket;

/* An index computed in the model (an embedding's rows, one_hot's or cross-entropy's
 * classes) must lie in [0, limit): the step checks every one and stops at the first that
 * does not. `what` names the layer ("Embedding 'emb'"), line and col its place in the
 * model file. */
typedef struct kiln_index_check {
    const char *what;
    unsigned line, col;
    int64_t limit;
} kiln_index_check;

/* Per-kernel wall time of the steps run with io->profile set (the program's --profile).
 * The step calls KILN_MARK(io, k) after kernel k: the time since the previous mark (or
 * since the caller set `last`) is added to seconds[k]. A kernel's parallel region has
 * joined when its call returns, so that is the kernel's time on every thread. */
typedef struct kiln_profile {
    double last;
    double *seconds; /* one per kernel of the step (kiln_model's n*_kernels) */
} kiln_profile;

/* The monotonic clock in seconds (the programs' step timings and profiles); the mark adds
 * the time since p->last to seconds[k]. */
double kiln_now(void);
void kiln_profile_mark(kiln_profile *p, int k);

/* One predictable branch per kernel when not profiling. A library (kiln build --lib,
 * compiled with KILN_NO_PROFILE) has no profile and no clock in its run path. */
#ifdef KILN_NO_PROFILE
#define KILN_MARK(io, k) ((void)(io), (void)(k))
#else
#define KILN_MARK(io, k) ((io)->profile ? kiln_profile_mark((io)->profile, (k)) : (void)0)
#endif

/* A kernel of a step, in call order: the function it calls (kernels with the same code
 * share one), what it computes, and the line of the model file it comes from. */
typedef struct {
    const char *function, *what;
    unsigned line;
} kiln_kernel_info;

/* The median of v[0..n) (sorted in place); the process's peak resident memory in MiB;
 * the table of one step's profile (runtime/profile.c): kernels grouped by function, then
 * `nextra` rows of time outside the kernels, each in ms per step over n steps of `total`
 * seconds. */
double kiln_median(double *v, int64_t n);
double kiln_peak_rss_mb(void);
void kiln_print_profile(const char *title, const kiln_kernel_info *info, int nk, const double *seconds, const char *const *extra,
                        const double *extra_seconds, int nextra, int64_t n, double total);

/* One distinct matrix product of a step, at the symbols' bounds: `count` calls of
 * [batch x] (M x K) @ (K x N). Benchmarks time these shapes alone to know the BLAS rate. */
typedef struct {
    int64_t batch, M, N, K;
    bool trans_a, trans_b;
    int count;
} kiln_gemm_shape;

struct kiln_model;

/* Where a model's steps run, and the operations of training that touch its memory. The C
 * target runs on the host (kiln_host_device: memory from calloc, the optimizer of
 * optim.c); the CUDA target's model.cu names the GPU's (runtime/cuda/device.cu). The
 * training program keeps parameters, gradients, buffers, optimizer moments and activations
 * in the device's memory, and host copies of parameters, buffers and moments only to
 * initialise them and for checkpoints (on the host they are the same memory). Every
 * operation gives the host's results: the CUDA device's optimizer and gradient norm
 * perform the same float operations in the same order (optim_elem.h). */
typedef struct kiln_device {
    const char *name; /* "host", "cuda", "cuda-emu" */
    bool host;        /* its memory is host memory: no copies needed */
    /* Starts the device for the model: its context, or NULL with a message in err (no
     * GPU, no driver). */
    void *(*open)(const struct kiln_model *m, char *err, size_t cap);
    /* Whether `bytes` of memory fit the device's free memory: 0, or -1 with both numbers
     * in err. */
    int (*reserve)(void *ctx, int64_t bytes, char *err, size_t cap);
    void *(*alloc)(void *ctx, int64_t bytes); /* zeroed; NULL when out of memory */
    void (*release)(void *ctx, void *p);
    void (*to_device)(void *ctx, void *dst, const void *src, int64_t bytes);
    void (*to_host)(void *ctx, void *dst, const void *src, int64_t bytes);
    void (*zero)(void *ctx, void *p, int64_t bytes);
    /* acc[i] += g[i] / divisor: one micro-batch's share of accumulated gradients. */
    void (*accumulate)(void *ctx, float *acc, const float *g, int64_t n, float divisor);
    double (*grad_norm)(void *ctx, const float *g, int64_t n);                    /* krt_grad_norm */
    double (*clip_grad_norm)(void *ctx, float *g, int64_t n, double max_norm);    /* krt_clip_grad_norm */
    /* fp16 loss scaling's unscale, norm and clip: krt_unscale_clip_grad_norm */
    double (*unscale_clip_grad_norm)(void *ctx, float *g, int64_t n, float inv_scale, double max_norm);
    /* krt_optim_step, with the state's slabs (s->m, s->v, s->w) in the device's memory. */
    void (*optim_step)(void *ctx, const krt_optim_config *c, krt_optim_state *s, double lr, float *params, const float *grads,
                       const krt_param_span *spans, int nspans);
    void (*close)(void *ctx);
} kiln_device;

extern const kiln_device kiln_host_device;

typedef struct kiln_model {
    const char *name;
    const char *source;   /* the .kiln file it was generated from */
    const char *hash;     /* of the model's graph: checkpoints must match it */
    int nparams;
    const kiln_param *params;
    int64_t nparam_floats;
    int64_t buffer_bytes;
    int ninputs;
    const kiln_input *inputs;
    int nsyms;
    const kiln_symbol *syms;
    int nmetrics;
    const char *const *metric_names;
    int noutputs;
    const char *const *output_names;
    const krt_dtype *output_dtypes;
    int64_t train_arena_bytes, eval_arena_bytes;
    const kiln_recipe *recipe; /* the model file's train section, typed (kiln_recipe.h) */
    /* Forward, loss, metrics and all gradients (grads are overwritten, not accumulated). */
    void (*train_step)(kiln_step_io *io);
    /* Forward, loss and metrics in eval mode (no dropout, running statistics). */
    void (*eval_step)(kiln_step_io *io);
    /* Floating-point operations in matrix products (2*M*N*K each) of one step at the
     * current symbol values, for benchmarks' fraction-of-BLAS-rate figures. */
    double (*train_gemm_flops)(const int64_t *syms);
    double (*eval_gemm_flops)(const int64_t *syms);
    int ntrain_gemms;
    const kiln_gemm_shape *train_gemms;
    int ntrain_kernels, neval_kernels;
    const kiln_kernel_info *train_kernels, *eval_kernels;
    int nindex_checks;          /* the most index checks in one step */
    const kiln_device *device;  /* NULL: the host */
    /* Inference programs (kiln build --infer) only; NULL and 0 in training programs, which
     * have no predict step (and inference programs have no training step: train_step,
     * train_gemm_flops and the train tables are NULL there). */
    /* The forward alone in eval mode: reads only the inputs forward_inputs marks (io->inputs
     * of the others may be NULL), writes io->outputs; no loss, no metrics. */
    void (*predict_step)(kiln_step_io *io);
    double (*predict_gemm_flops)(const int64_t *syms);
    int64_t predict_arena_bytes;
    int npredict_kernels;
    const kiln_kernel_info *predict_kernels;
    const bool *forward_inputs; /* per input: whether the forward reads it (else only the loss and metrics) */
    const kiln_input *outputs;  /* per forward output: name, dtype and shape (dims at the bounds, sym as for inputs) */
    /* A language model's decode step (inference programs; frontend/decode.c): the forward
     * for T new tokens at positions [P, P + T) against each attention's cached keys and
     * values. io->inputs: the model's inputs (the tokens [B, T]), then decode_inputs (P as
     * i64[1], then each cache [KV, B, H, hd] with KV = P + T); io->syms: decode_syms (the
     * model's, then KV); io->outputs: decode_outputs, in the graph's order: the forward's
     * and each cache's new rows [T, B, H, hd] (named as its cache input), which the caller
     * points at row P of the cache. NULL when the
     * model is not a language model, or when decode_unsupported says why it cannot have one. */
    void (*decode_step)(kiln_step_io *io);
    double (*decode_gemm_flops)(const int64_t *syms);
    int64_t decode_arena_bytes;
    int ndecode_kernels;
    const kiln_kernel_info *decode_kernels;
    int ndecode_syms;
    const kiln_symbol *decode_syms;
    int ndecode_inputs;
    const kiln_input *decode_inputs;
    int ndecode_outputs;
    const kiln_input *decode_outputs;
    const char *decode_unsupported;
    /* Distributed training programs (kiln build --distributed): the gradient buckets, in
     * the order the training step calls their hooks; 0 and NULL otherwise. */
    int nbuckets;
    const kiln_grad_bucket *buckets;
} kiln_model;

/* Copies a model's parameters and buffers from a safetensors file by name (PyTorch
 * state_dict keys and layouts; weights.c): every tensor of the model must be there with
 * its dtype and shape, and the file must hold no other tensor. `path` names the file in
 * messages. params: nparam_floats floats; buffers: buffer_bytes. */
krt_status kiln_weights_check(const kiln_param *params, int nparams, const krt_safetensors *st, const char *path, krt_error *err);
krt_status kiln_weights_load(const kiln_model *m, const krt_safetensors *st, const char *path, float *params, unsigned char *buffers,
                             krt_error *err);

/* ---- generation (generate.c; docs/inference.md#generation) ---- */

/* One token drawn from a row of logits: divided by the temperature (0: the first largest,
 * greedy), the top_k largest kept (0: all), then the likeliest whose probabilities first
 * reach top_p (1: all); u, uniform in (0, 1), picks among them in token order. scratch:
 * 2 * V floats. */
int64_t kiln_sample_token(const float *logits, int64_t V, double temperature, int64_t top_k, double top_p, double u, float *scratch);
/* The uniform number of token t of a sample: the counter-based generator's stream
 * "sample", keyed by the seed and the training step (0 in inference programs). */
double kiln_sample_uniform(uint64_t seed, uint64_t step, uint64_t t);

typedef struct {
    const int32_t *prompt;
    int64_t nprompt, tokens, vocab;
    double temperature, top_p;
    int64_t top_k;
    uint64_t seed, step;
    bool full; /* recompute the whole window for each token (also when the model has no decode step) */
    /* Where the steps run: NULL (or the host device) for the C target; a GPU's device and
     * context (params and buffers then in its memory) for --target cuda|cuda-emu, where
     * the arena and the key/value caches are allocated in device memory too. */
    const kiln_device *device;
    void *device_ctx;
} kiln_generate_config;

/* Continues the prompt by c->tokens tokens from model m (inputs[0] its tokens [B, T]),
 * calling emit with each as it is drawn: through the decode step and its key/value cache
 * (batch 1, allocated here at the context's bound) when the model has one, the whole
 * window through the predict step otherwise. The same seed gives the same tokens either
 * way whenever the two give the same logits. */
krt_status kiln_generate(const kiln_model *m, float *params, unsigned char *buffers, const kiln_generate_config *c,
                         void (*emit)(void *ctx, int64_t token), void *ctx, krt_error *err);

#ifdef __cplusplus
}
#endif

#endif
