/* generate.c — text generation from a language model: the sampler, shared by the
 * training program's samples and the inference program's --generate, and the loop that
 * feeds each drawn token back, either incrementally through the model's decode step
 * (frontend/decode.c: the new token against cached keys and values, O(T) per token) or by
 * recomputing the forward over the whole window for each token (the predict step: the
 * reference the decode step is tested against, and the path of models without a decode
 * step). Both draw the same random numbers, so equal logits give equal text.
 * docs/inference.md#generation. */
#include "kiln_model.h"
#include "kiln_rng.h"
#include "rt_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLE_STREAM 0x73616d706c65 /* "sample" */

static int by_logit_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int64_t kiln_sample_token(const float *logits, int64_t V, double temperature, int64_t top_k, double top_p, double u, float *scratch)
{
    float *row = scratch, *sorted = scratch + V;
    if (temperature <= 0) { /* greedy: the first largest */
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return best;
    }
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++) {
        row[v] = (float)(logits[v] / temperature);
        if (row[v] > mx) mx = row[v];
    }
    /* The k-th largest logit: everything below it is dropped. */
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float lo = -INFINITY;
        for (int64_t k = 0; k < top_k; k++) {
            float best = -INFINITY;
            for (int64_t v = 0; v < V; v++)
                if (row[v] > best && (k == 0 || row[v] < lo)) best = row[v];
            lo = best;
        }
        cut = lo;
    }
    double total = 0;
    for (int64_t v = 0; v < V; v++) total += row[v] >= cut ? exp((double)(row[v] - mx)) : 0;
    if (top_p < 1) {
        /* Nucleus: the likeliest tokens whose probabilities first reach top_p; the cut is
         * the last one's logit (ties with it stay). */
        int64_t n = 0;
        for (int64_t v = 0; v < V; v++)
            if (row[v] >= cut) sorted[n++] = row[v];
        qsort(sorted, (size_t)n, sizeof *sorted, by_logit_desc);
        double acc = 0;
        for (int64_t i = 0; i < n; i++) {
            acc += exp((double)(sorted[i] - mx));
            if (acc >= top_p * total) {
                cut = sorted[i];
                break;
            }
        }
        total = 0;
        for (int64_t v = 0; v < V; v++) total += row[v] >= cut ? exp((double)(row[v] - mx)) : 0;
    }
    double target = u * total, acc = 0;
    int64_t pick = 0;
    for (int64_t v = 0; v < V; v++) {
        if (row[v] < cut) continue;
        acc += exp((double)(row[v] - mx));
        pick = v;
        if (acc >= target) break;
    }
    return pick;
}

double kiln_sample_uniform(uint64_t seed, uint64_t step, uint64_t t) { return kiln_rng_uniform53(seed, SAMPLE_STREAM, step, t); }

/* ---- the generation loop ---- */

typedef struct {
    const kiln_model *m;
    const kiln_device *dev; /* NULL: the host */
    void *dev_ctx;
    kiln_step_io io;
    int64_t *syms;
    const void **inputs;
    void **outputs;
    unsigned char *arena;
    void *tokens;      /* the step's token input, [1, T] */
    int tsym, bsym;    /* the sequence and batch symbols */
    int kvsym;         /* decode: the cache length */
    int64_t past;      /* decode: the input decode.past */
    float **cache;     /* decode: per decode input, its cache (NULL for decode.past) */
    int64_t *row_floats; /* decode: floats per cached position of each */
    int logits_out;    /* index of the logits among the step's outputs */
    float *logits;     /* [T, V] */
} Gen;

static int sym_named(const kiln_symbol *s, int n, const char *name)
{
    for (int k = 0; k < n; k++)
        if (!strcmp(s[k].name, name)) return k;
    return -1;
}

/* The arena and the caches: host memory, or the device's (zeroed either way). */
static void *gen_alloc(Gen *g, int64_t bytes)
{
    return g->dev ? g->dev->alloc(g->dev_ctx, bytes) : calloc((size_t)bytes, 1);
}

static void gen_release(Gen *g, void *p)
{
    if (!p) return;
    if (g->dev) g->dev->release(g->dev_ctx, p);
    else free(p);
}

static void gen_free(Gen *g)
{
    if (g->cache)
        for (int k = 0; k < g->m->ndecode_inputs; k++) gen_release(g, g->cache[k]);
    free(g->cache);
    free(g->row_floats);
    free(g->syms);
    free(g->inputs);
    free(g->outputs);
    gen_release(g, g->arena);
    free(g->tokens);
    free(g->logits);
}

static krt_status gen_open(Gen *g, const kiln_model *m, const kiln_generate_config *c, float *params, unsigned char *buffers, bool full,
                           int64_t V, krt_error *err)
{
    memset(g, 0, sizeof *g);
    g->m = m;
    if (c->device && !c->device->host) {
        g->dev = c->device;
        g->dev_ctx = c->device_ctx;
    }
    const char *oom = g->dev ? "out of device memory for generation's activations and key/value caches" : "out of memory";
    const kiln_input *in = &m->inputs[0];
    int64_t Tmax = in->dims[1];
    int nsyms = full ? m->nsyms : m->ndecode_syms;
    int nin = m->ninputs + (full ? 0 : m->ndecode_inputs), nout = full ? m->noutputs : m->ndecode_outputs;
    int64_t arena = full ? m->predict_arena_bytes : m->decode_arena_bytes;
    g->syms = calloc((size_t)nsyms + 1, sizeof *g->syms);
    g->inputs = calloc((size_t)nin + 1, sizeof *g->inputs);
    g->outputs = calloc((size_t)nout + 1, sizeof *g->outputs);
    g->arena = gen_alloc(g, arena + 64);
    g->tokens = calloc((size_t)Tmax + 1, krt_dtype_size(in->dtype));
    g->logits = calloc((size_t)(Tmax * V) + 1, sizeof *g->logits);
    if (!g->arena) return krt_fail(err, KRT_ENOMEM, "%s", oom);
    if (!g->syms || !g->inputs || !g->outputs || !g->tokens || !g->logits) return krt_fail(err, KRT_ENOMEM, "out of memory");
    g->tsym = in->sym[1];
    g->bsym = in->sym[0];
    g->logits_out = 0;
    if (!full) {
        g->kvsym = sym_named(m->decode_syms, m->ndecode_syms, "KV");
        for (int k = 0; k < m->ndecode_outputs; k++)
            if (strncmp(m->decode_outputs[k].name, "decode.", 7)) {
                g->logits_out = k;
                break;
            }
        g->cache = calloc((size_t)m->ndecode_inputs + 1, sizeof *g->cache);
        g->row_floats = calloc((size_t)m->ndecode_inputs + 1, sizeof *g->row_floats);
        if (!g->cache || !g->row_floats) return krt_fail(err, KRT_ENOMEM, "out of memory");
        /* The caches, batch 1: [KV, 1, H, hd] at the context's bound, the part of the
         * program's memory that generation adds. */
        for (int k = 0; k < m->ndecode_inputs; k++) {
            const kiln_input *ci = &m->decode_inputs[k];
            if (!strcmp(ci->name, "decode.past")) {
                g->inputs[m->ninputs + k] = &g->past;
                continue;
            }
            g->row_floats[k] = 1;
            for (int d = 2; d < ci->rank; d++) g->row_floats[k] *= ci->dims[d];
            g->cache[k] = gen_alloc(g, (int64_t)sizeof(float) * (ci->dims[0] * g->row_floats[k] + 1));
            if (!g->cache[k]) return krt_fail(err, KRT_ENOMEM, "%s", oom);
            g->inputs[m->ninputs + k] = g->cache[k];
        }
    }
    g->inputs[0] = g->tokens;
    g->io.params = params;
    g->io.buffers = buffers;
    g->io.inputs = g->inputs;
    g->io.syms = g->syms;
    g->io.arena = g->arena;
    g->io.outputs = g->outputs;
    g->io.device = g->dev_ctx;
    g->outputs[g->logits_out] = g->logits;
    for (int s = 0; s < nsyms; s++) g->syms[s] = full ? m->syms[s].max : m->decode_syms[s].max;
    return KRT_OK;
}

static void put_tokens(Gen *g, const int32_t *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        switch (g->m->inputs[0].dtype) {
        case KRT_U8: ((uint8_t *)g->tokens)[i] = (uint8_t)t[i]; break;
        case KRT_I64: ((int64_t *)g->tokens)[i] = t[i]; break;
        default: ((int32_t *)g->tokens)[i] = t[i]; break;
        }
    }
}

static krt_status step_failed(const kiln_step_io *io, krt_error *err)
{
    const kiln_index_check *c = io->index_error;
    return krt_fail(err, KRT_EINVAL, "%u:%u: %s: index %lld out of range [0, %lld) while generating", c->line, c->col, c->what,
                    (long long)io->index_value, (long long)c->limit);
}

/* The logits after tokens[first, first + n), whose positions [0, first) are cached (decode)
 * or dropped (full: the window starts at `first`). */
static krt_status gen_run(Gen *g, bool full, const int32_t *tokens, int64_t past, int64_t n, const float **last, int64_t V,
                          krt_error *err)
{
    const kiln_model *m = g->m;
    put_tokens(g, tokens + past, n);
    g->syms[g->tsym] = n;
    if (g->bsym >= 0) g->syms[g->bsym] = 1;
    if (full) {
        m->predict_step(&g->io);
    } else {
        g->past = past;
        if (g->kvsym >= 0) g->syms[g->kvsym] = past + n; /* none without attention */
        for (int k = 0; k < m->ndecode_outputs; k++) {
            const char *name = m->decode_outputs[k].name;
            if (k == g->logits_out) continue;
            g->outputs[k] = NULL;
            for (int c = 0; c < m->ndecode_inputs; c++)
                if (g->cache[c] && !strcmp(m->decode_inputs[c].name, name)) g->outputs[k] = g->cache[c] + past * g->row_floats[c]; /* row P */
        }
        m->decode_step(&g->io);
    }
    if (g->io.index_error) return step_failed(&g->io, err);
    *last = g->logits + (n - 1) * V;
    return KRT_OK;
}

krt_status kiln_generate(const kiln_model *m, float *params, unsigned char *buffers, const kiln_generate_config *c,
                         void (*emit)(void *ctx, int64_t token), void *ctx, krt_error *err)
{
    const kiln_input *in = &m->inputs[0];
    const int64_t Tmax = in->dims[1], V = c->vocab;
    const bool full = c->full || !m->decode_step;
    if (c->nprompt < 1 || c->nprompt > Tmax)
        return krt_fail(err, KRT_EINVAL, "the prompt has %lld tokens; the model's context takes 1 to %lld", (long long)c->nprompt,
                        (long long)Tmax);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(c->nprompt + c->tokens + 1));
    float *scratch = malloc(sizeof(float) * (size_t)(2 * V + 1));
    Gen g;
    krt_status s = KRT_ENOMEM;
    memset(&g, 0, sizeof g);
    if (!tokens || !scratch) {
        s = krt_fail(err, KRT_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(tokens, c->prompt, sizeof(int32_t) * (size_t)c->nprompt);
    if ((s = gen_open(&g, m, c, params, buffers, full, V, err)) != KRT_OK) goto out;
    int64_t len = c->nprompt, cached = 0; /* decode: positions in the cache */
    for (int64_t t = 0; t < c->tokens; t++) {
        const float *last;
        if (full || len > Tmax) {
            /* The window of the last (at most Tmax) tokens, all of it computed again; past
             * the context the decode graph does the same with nothing cached (the
             * positions of every token change). */
            int64_t window = len < Tmax ? len : Tmax;
            s = gen_run(&g, full, tokens + (len - window), 0, window, &last, V, err);
        } else {
            s = gen_run(&g, false, tokens, cached, len - cached, &last, V, err);
            cached = len;
        }
        if (s != KRT_OK) goto out;
        int64_t pick = kiln_sample_token(last, V, c->temperature, c->top_k, c->top_p, kiln_sample_uniform(c->seed, c->step, (uint64_t)t), scratch);
        tokens[len++] = (int32_t)pick;
        emit(ctx, pick);
    }
    s = KRT_OK;
out:
    gen_free(&g);
    free(tokens);
    free(scratch);
    return s;
}
