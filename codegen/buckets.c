/* buckets.c — the gradient buckets of a distributed training program (kiln build
 * --distributed, docs/distributed.md), planned when its training step is written.
 *
 * Data-parallel training sums every rank's gradients (an all-reduce) before the optimizer.
 * Started as one message after the backward, that sum would add its whole time to the
 * step; started per parameter, it would pay a message's latency hundreds of times. So, as
 * PyTorch DDP does, gradients go in buckets of about 25 MiB, each started as soon as the
 * backward has written all of it. Here the plan is fixed at build time from the fusion plan:
 * the kernel after which each parameter's gradient is final is known, so the generated step
 * calls a hook (KILN_BUCKET_READY) right after the kernel that completes a bucket.
 *
 * A bucket is a contiguous span of the gradient slab, so the all-reduce works in place
 * with no copy. Parameters are laid out in declaration order and the backward produces
 * their gradients roughly in reverse, so buckets are cut from the slab's end towards its
 * start; a bucket is ready when the last of its gradients is (a tied weight such as gpt's
 * wte, whose gradient is finished only by the last kernels, makes its bucket the last). */
#include "kernel.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t offset, count;
    int ready;
    const char *name;
} GradSpan;

static int by_offset_desc(const void *a, const void *b)
{
    const GradSpan *x = a, *y = b;
    return x->offset < y->offset ? 1 : x->offset > y->offset ? -1 : 0;
}

/* The kernel after which output k (a parameter's gradient, value v) is final: the kernel
 * that writes it into the gradient slab, or, for gradients the step copies there after
 * its kernels, the end (nkernels). */
static int ready_kernel(const Cg *c, int32_t k, NodeId v)
{
    NodeId r = fusion_root(c->g, &c->fp, v);
    if (c->mp.kind[r] == MEM_GRAD && c->mp.offset[r] == k && c->fp.kernel_of[r] >= 0) return c->fp.kernel_of[r];
    return c->fp.nkernels;
}

static void add_bucket(Cg *c, int64_t lo, int64_t hi, int ready, const char *first, const char *last)
{
    GROW(c->buckets, c->capbuckets, c->nbuckets + 1);
    c->buckets[c->nbuckets++] = (CgBucket){lo, hi - lo, ready, first, last};
}

static int by_ready(const void *a, const void *b)
{
    const CgBucket *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return x->offset < y->offset ? 1 : x->offset > y->offset ? -1 : 0;
}

void cg_plan_buckets(Cg *c)
{
    const Graph *g = c->g;
    const int64_t cap = c->bucket_bytes / (int64_t)sizeof(float) > 0 ? c->bucket_bytes / (int64_t)sizeof(float) : 1;
    GradSpan *spans = xcalloc((size_t)g->noutputs + 1, sizeof *spans);
    int n = 0;
    int64_t end = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        const Output *out = &g->outputs[k];
        if (out->kind != OUT_GRAD) continue;
        NodeId p = strmap_get(&c->param_named, ir_str(g, out->name), IR_NONE);
        if (p == IR_NONE) continue;
        GradSpan *s = &spans[n++];
        s->offset = c->param_off[p];
        s->count = ir_shape_max_numel(g, &N(c, p)->shape);
        s->ready = ready_kernel(c, k, out->node);
        s->name = ir_str(g, out->name);
        if (s->offset + s->count > end) end = s->offset + s->count;
    }
    qsort(spans, (size_t)n, sizeof *spans, by_offset_desc);
    c->nbuckets = 0;
    /* The bucket being filled is [lo, hi), growing towards the slab's start. */
    int64_t hi = end, lo = end;
    int ready = -1;
    const char *last = NULL, *first = NULL;
    for (int i = 0; i < n; i++) {
        const GradSpan *s = &spans[i];
        while (lo > s->offset) { /* a gap before the next span is taken with it */
            int64_t take = lo - s->offset < cap - (hi - lo) ? lo - s->offset : cap - (hi - lo);
            lo -= take;
            if (s->ready > ready) ready = s->ready;
            if (!last) last = s->name;
            first = s->name;
            if (hi - lo >= cap) {
                add_bucket(c, lo, hi, ready, first, last);
                hi = lo, ready = -1, last = NULL;
            }
        }
    }
    if (hi > lo) add_bucket(c, lo, hi, ready, first, last);
    free(spans);
    qsort(c->buckets, (size_t)c->nbuckets, sizeof *c->buckets, by_ready);
}

/* "fc1.weight .. fc2.bias", or the one parameter a bucket holds (part of). */
static void bucket_names(StrBuf *o, const CgBucket *x)
{
    if (strcmp(x->first, x->last)) sb_printf(o, "%s .. %s", x->first, x->last);
    else sb_puts(o, x->first);
}

void cg_emit_bucket_hooks(Cg *c, int32_t k)
{
    for (int b = 0; b < c->nbuckets; b++)
        if (c->buckets[b].ready == k) {
            sb_printf(c->o, "    KILN_BUCKET_READY(io, %d); /* gradients of ", b);
            bucket_names(c->o, &c->buckets[b]);
            sb_puts(c->o, " final: their all-reduce starts */\n");
        }
}

void cg_emit_bucket_table(Cg *c)
{
    StrBuf *o = c->o;
    sb_printf(o, "/* The gradient buckets of the distributed program (at most %lld bytes each), in the order\n"
                 " * the training step finishes them: offset and floats in the gradient slab, and the\n"
                 " * kernel after which they are final (%d: after the step's copies). */\n"
                 "static const kiln_grad_bucket train_buckets[] = {\n",
              (long long)c->bucket_bytes, c->fp.nkernels);
    for (int b = 0; b < c->nbuckets; b++) {
        const CgBucket *x = &c->buckets[b];
        sb_printf(o, "    {%lld, %lld, %d}, /* ", (long long)x->offset, (long long)x->count, x->ready);
        bucket_names(o, x);
        sb_puts(o, " */\n");
    }
    sb_puts(o, "};\n\n");
}
