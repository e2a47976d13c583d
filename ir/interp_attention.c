/* interp_attention.c — the reference interpreter's attention ops (ops.h), in double
 * precision and the textbook way: each row's scores, its masked softmax, dropout, the
 * product with v; the backward from the probabilities recomputed from the row's
 * log-sum-exp, as the fused kernels do, but with every sum in double. It is the oracle the
 * fused C and CUDA kernels are compared against, and the unfused graph it replaces is the
 * oracle for it (tests/test_fuse_attention.c). */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/rng.h"

typedef struct {
    int64_t N, H, KV, T, S, D, DV; /* N: the batch axes' product */
    double scale, rate;
    int mask;
    uint64_t stream, seed, step;
    const double *q, *k, *v, *m;
} Attn;

/* The masked, scaled scores of row (n, h, t) into s[S]. */
static void row_scores(const Attn *a, int64_t n, int64_t h, int64_t t, double *s)
{
    const int64_t kvh = h / (a->H / a->KV);
    const double *qr = a->q + ((n * a->H + h) * a->T + t) * a->D;
    for (int64_t j = 0; j < a->S; j++) {
        const double *kr = a->k + ((n * a->KV + kvh) * a->S + j) * a->D;
        double dot = 0;
        for (int64_t d = 0; d < a->D; d++) dot += qr[d] * kr[d];
        double x = dot * a->scale;
        const int64_t mi = ((n * a->H + h) * a->T + t) * a->S + j;
        switch (a->mask) {
        case ATTN_MASK_CAUSAL: if (j > t) x = -INFINITY; break;
        case ATTN_MASK_KEEP: if (a->m[mi] == 0) x = -INFINITY; break;
        case ATTN_MASK_DROP: if (a->m[mi] != 0) x = -INFINITY; break;
        case ATTN_MASK_ADD: x += a->m[mi]; break;
        default: break;
        }
        s[j] = x;
    }
}

/* Log-sum-exp of s[S] (NaN when every entry is -inf, as softmax's max shift gives). */
static double logsumexp(const double *s, int64_t S)
{
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; j++) mx = s[j] > mx || isnan(s[j]) ? s[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < S; j++) sum += exp(s[j] - mx);
    return mx + log(sum);
}

/* Dropout's factor of probability (n, h, t, j): 0 or 1 / (1 - rate). */
static double keep(const Attn *a, int64_t n, int64_t h, int64_t t, int64_t j)
{
    if (a->rate <= 0) return 1;
    const uint64_t e = (uint64_t)(((n * a->H + h) * a->T + t) * a->S + j);
    return kiln_rng_uniform24(a->seed, a->step, a->stream, e) >= a->rate ? 1 / (1 - a->rate) : 0;
}

int interp_attention(const Graph *g, NodeId id, const ITensor *const *in, int nin, ITensor *o, uint64_t seed, uint64_t step,
                     StrBuf *err)
{
    const Node *nd = &g->nodes[id];
    const int64_t *at = ir_attrs(g, id);
    const bool has_mask = at[0] == ATTN_MASK_KEEP || at[0] == ATTN_MASK_DROP || at[0] == ATTN_MASK_ADD;
    if (at[0] < 0 || at[0] >= ATTN_MASK_COUNT || nin != (has_mask ? 4 : 3) + (nd->op == OP_ATTENTION_GRAD ? 3 : 0) ||
        (nd->op == OP_ATTENTION_GRAD && (at[2] < 0 || at[2] > 3 || (at[2] == 3 && at[0] != ATTN_MASK_ADD)))) {
        sb_puts(err, "operands or attributes do not fit the mask kind");
        return -1;
    }
    const ITensor *q = in[0], *k = in[1], *v = in[2];
    const int r = q->rank;
    if (r < 3 || k->rank != r || v->rank != r || o->rank != r) {
        sb_puts(err, "q, k, v and the result must have one rank >= 3");
        return -1;
    }
    Attn a = {.H = q->dims[r - 3], .KV = k->dims[r - 3], .T = q->dims[r - 2], .S = k->dims[r - 2], .D = q->dims[r - 1],
              .DV = v->dims[r - 1], .scale = nd->fattr[0], .rate = nd->fattr[1], .mask = (int)at[0],
              .stream = (uint64_t)at[1], .seed = seed, .step = step, .q = q->data, .k = k->data, .v = v->data,
              .m = has_mask ? in[3]->data : NULL};
    a.N = a.H && a.T && a.D ? q->n / (a.H * a.T * a.D) : 0;
    if (a.KV < 1 || a.H % a.KV || k->dims[r - 1] != a.D || v->dims[r - 2] != a.S || v->dims[r - 3] != a.KV ||
        (has_mask && in[3]->n != a.N * a.H * a.T * a.S)) {
        sb_puts(err, "q, k, v and mask shapes do not fit [..., H, T, D], [..., KV, S, D], [..., KV, S, DV], [..., H, T, S]");
        return -1;
    }
    if (nd->op != OP_ATTENTION_GRAD && o->n != a.N * a.H * a.T * (nd->op == OP_ATTENTION_LSE ? 1 : a.DV)) {
        sb_puts(err, "the result does not fit the attention's shapes");
        return -1;
    }
    double *s = xmalloc((size_t)(a.S ? a.S : 1) * sizeof *s);
    if (nd->op != OP_ATTENTION_GRAD) {
        for (int64_t n = 0; n < a.N; n++)
            for (int64_t h = 0; h < a.H; h++)
                for (int64_t t = 0; t < a.T; t++) {
                    row_scores(&a, n, h, t, s);
                    const double lse = logsumexp(s, a.S);
                    const int64_t row = (n * a.H + h) * a.T + t;
                    if (nd->op == OP_ATTENTION_LSE) {
                        o->data[row] = lse;
                        continue;
                    }
                    double *out = o->data + row * a.DV;
                    const int64_t kvh = h / (a.H / a.KV);
                    for (int64_t j = 0; j < a.S; j++) {
                        const double p = exp(s[j] - lse) * keep(&a, n, h, t, j);
                        const double *vr = a.v + ((n * a.KV + kvh) * a.S + j) * a.DV;
                        for (int64_t c = 0; c < a.DV; c++) out[c] += p * vr[c];
                    }
                }
        free(s);
        return 0;
    }
    /* attention_grad: dS = P ∘ (keep ∘ (dO vᵀ) - delta), delta = dO · O per row; dq = scale
     * dS k, dk = scale dSᵀ q, dv = (P ∘ keep)ᵀ dO, summed over the query heads that share a
     * key/value head; an added mask's gradient dS */
    const int base = has_mask ? 4 : 3, which = (int)at[2];
    const int64_t rows = a.N * a.H * a.T;
    if (in[base]->n != rows * a.DV || in[base + 1]->n != rows || in[base + 2]->n != rows * a.DV || o->n != in[which]->n) {
        free(s);
        sb_puts(err, "out, lse, dout or the result do not fit the attention's shapes");
        return -1;
    }
    const double *out = in[base]->data, *lse = in[base + 1]->data, *dout = in[base + 2]->data;
    for (int64_t n = 0; n < a.N; n++)
        for (int64_t h = 0; h < a.H; h++)
            for (int64_t t = 0; t < a.T; t++) {
                row_scores(&a, n, h, t, s);
                const int64_t row = (n * a.H + h) * a.T + t, kvh = h / (a.H / a.KV);
                const double *go = dout + row * a.DV, *qr = a.q + row * a.D, *orow = out + row * a.DV;
                double delta = 0;
                for (int64_t c = 0; c < a.DV; c++) delta += go[c] * orow[c];
                for (int64_t j = 0; j < a.S; j++) {
                    const double p = exp(s[j] - lse[row]), kf = keep(&a, n, h, t, j);
                    const int64_t kv_row = (n * a.KV + kvh) * a.S + j;
                    const double *vr = a.v + kv_row * a.DV, *kr = a.k + kv_row * a.D;
                    if (which == 2) {
                        double *dv = o->data + kv_row * a.DV;
                        for (int64_t c = 0; c < a.DV; c++) dv[c] += p * kf * go[c];
                        continue;
                    }
                    double dp = 0;
                    for (int64_t c = 0; c < a.DV; c++) dp += go[c] * vr[c];
                    const double ds = p * (kf * dp - delta) * a.scale;
                    if (which == 3) { /* the added mask's: dS before the scale */
                        o->data[row * a.S + j] += p * (kf * dp - delta);
                    } else if (which == 0) {
                        double *dq = o->data + row * a.D;
                        for (int64_t d = 0; d < a.D; d++) dq[d] += ds * kr[d];
                    } else {
                        double *dk = o->data + kv_row * a.D;
                        for (int64_t d = 0; d < a.D; d++) dk[d] += ds * qr[d];
                    }
                }
            }
    free(s);
    return 0;
}
