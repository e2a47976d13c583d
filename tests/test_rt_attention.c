/* test_rt_attention.c — runtime/kiln_attention.h's fused attention against the textbook
 * computation in double (the probabilities in memory), forward (output and log-sum-exp)
 * and backward (dq, dk, dv), for every mask kind, grouped-query heads, dropout, sizes that
 * cross the query and key tiles, different head sizes for v, and q read in place from a
 * [B, T, H, D] layout; the backward against central finite differences of the forward;
 * and the same bits on 1 and 3 threads. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_attention.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { B = 2, H = 4, T = 70, D = 8, DV = 12 };

typedef struct {
    kiln_attention a;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *madd;
    uint8_t *mbool;
} Case;

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void set_up(Case *c, int kv_heads, int mask, float dropout)
{
    memset(c, 0, sizeof *c);
    kiln_attention *a = &c->a;
    a->B = B, a->H = H, a->kv_heads = kv_heads, a->T = T, a->S = T, a->D = D, a->DV = DV;
    /* q in a [B, T, H, D] layout, read in place; k, v, out contiguous [B, heads, T, cols] */
    const int64_t qs[4] = {T * H * D, D, H * D, 1}, ks[4] = {kv_heads * T * D, T * D, D, 1}, vs[4] = {kv_heads * T * DV, T * DV, DV, 1},
                  os[4] = {H * T * DV, T * DV, DV, 1};
    memcpy(a->q_st, qs, sizeof qs), memcpy(a->k_st, ks, sizeof ks), memcpy(a->v_st, vs, sizeof vs), memcpy(a->o_st, os, sizeof os);
    a->scale = 0.35f;
    a->mask = mask;
    a->dropout = dropout;
    a->seed = 7, a->step = 3, a->stream = 11;
    uint64_t s = 42;
    const size_t nq = B * H * T * D, nk = (size_t)B * kv_heads * T * D, nv = (size_t)B * kv_heads * T * DV, no = B * H * T * DV;
    c->q = malloc(nq * sizeof(float)), c->k = malloc(nk * sizeof(float)), c->v = malloc(nv * sizeof(float));
    c->out = malloc(no * sizeof(float)), c->dout = malloc(no * sizeof(float)), c->lse = malloc(B * H * T * sizeof(float));
    c->dq = malloc(nq * sizeof(float)), c->dk = malloc(nk * sizeof(float)), c->dv = malloc(nv * sizeof(float));
    for (size_t i = 0; i < nq; i++) c->q[i] = rnd(&s) * 2;
    for (size_t i = 0; i < nk; i++) c->k[i] = rnd(&s) * 2;
    for (size_t i = 0; i < nv; i++) c->v[i] = rnd(&s);
    for (size_t i = 0; i < no; i++) c->dout[i] = rnd(&s);
    /* a [T, S] mask broadcast over batch and heads; every row keeps its first key */
    c->mbool = malloc(T * T), c->madd = malloc(T * T * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < T; j++) {
            const bool keep = j == 0 || (t * 7 + j * 3) % 5 != 0;
            c->mbool[t * T + j] = mask == KILN_ATTN_DROP ? !keep : keep;
            c->madd[t * T + j] = rnd(&s);
        }
    a->mask_bool = c->mbool, a->mask_add = c->madd;
    const int64_t ms[4] = {0, 0, T, 1};
    memcpy(a->mask_st, ms, sizeof ms);
}

static void tear_down(Case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free(c->dout), free(c->dq), free(c->dk), free(c->dv);
    free(c->mbool), free(c->madd);
}

#define Q(c, b, h, t, d) (c)->q[(b) * (c)->a.q_st[0] + (h) * (c)->a.q_st[1] + (t) * (c)->a.q_st[2] + (d)]
#define K(c, b, h, t, d) (c)->k[(b) * (c)->a.k_st[0] + (h) * (c)->a.k_st[1] + (t) * (c)->a.k_st[2] + (d)]
#define V(c, b, h, t, d) (c)->v[(b) * (c)->a.v_st[0] + (h) * (c)->a.v_st[1] + (t) * (c)->a.v_st[2] + (d)]
#define O(c, arr, b, h, t, d) (arr)[(b) * (c)->a.o_st[0] + (h) * (c)->a.o_st[1] + (t) * (c)->a.o_st[2] + (d)]

/* The textbook attention in double: out, lse, and the gradients of sum(out * dout). */
static void reference(const Case *c, double *out, double *lse, double *dq, double *dk, double *dv)
{
    const kiln_attention *a = &c->a;
    const int G = H / (int)a->kv_heads;
    memset(dq, 0, sizeof(double) * B * H * T * D);
    memset(dk, 0, sizeof(double) * B * a->kv_heads * T * D);
    memset(dv, 0, sizeof(double) * B * a->kv_heads * T * DV);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const int kh = h / G;
                double x[T], p[T], keep[T], m = -INFINITY, sum = 0;
                for (int s = 0; s < T; s++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)Q(c, b, h, t, d) * K(c, b, kh, s, d);
                    x[s] = dot * a->scale;
                    if (a->mask == KILN_ATTN_CAUSAL && s > t) x[s] = -INFINITY;
                    if (a->mask == KILN_ATTN_KEEP && !c->mbool[t * T + s]) x[s] = -INFINITY;
                    if (a->mask == KILN_ATTN_DROP && c->mbool[t * T + s]) x[s] = -INFINITY;
                    if (a->mask == KILN_ATTN_ADD) x[s] += c->madd[t * T + s];
                    if (x[s] > m) m = x[s];
                    keep[s] = kiln_attn_keep(a, b, h, t, s);
                }
                for (int s = 0; s < T; s++) sum += exp(x[s] - m);
                lse[(b * H + h) * T + t] = m + log(sum);
                double dp[T], delta = 0;
                for (int s = 0; s < T; s++) p[s] = exp(x[s] - m) / sum;
                for (int e = 0; e < DV; e++) {
                    double o = 0;
                    for (int s = 0; s < T; s++) o += p[s] * keep[s] * V(c, b, kh, s, e);
                    out[((b * H + h) * T + t) * DV + e] = o;
                }
                for (int s = 0; s < T; s++) {
                    dp[s] = 0;
                    for (int e = 0; e < DV; e++) dp[s] += (double)O(c, c->dout, b, h, t, e) * V(c, b, kh, s, e);
                    dp[s] *= keep[s];
                    delta += p[s] * dp[s];
                }
                for (int s = 0; s < T; s++) {
                    const double ds = p[s] * (dp[s] - delta) * a->scale;
                    for (int d = 0; d < D; d++) {
                        dq[((b * H + h) * T + t) * D + d] += ds * K(c, b, kh, s, d);
                        dk[((b * a->kv_heads + kh) * T + s) * D + d] += ds * Q(c, b, h, t, d);
                    }
                    for (int e = 0; e < DV; e++) dv[((b * a->kv_heads + kh) * T + s) * DV + e] += p[s] * keep[s] * O(c, c->dout, b, h, t, e);
                }
            }
}

static void check(int kv_heads, int mask, float dropout)
{
    Case c;
    set_up(&c, kv_heads, mask, dropout);
    kiln_attention_fwd(&c.a, c.q, c.k, c.v, c.out, c.lse);
    kiln_attention_bwd(&c.a, c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq, c.dk, c.dv, NULL);
    double *out = malloc(sizeof(double) * B * H * T * DV), *lse = malloc(sizeof(double) * B * H * T);
    double *dq = malloc(sizeof(double) * B * H * T * D), *dk = malloc(sizeof(double) * B * kv_heads * T * D),
           *dv = malloc(sizeof(double) * B * kv_heads * T * DV);
    reference(&c, out, lse, dq, dk, dv);
    double worst[5] = {0, 0, 0, 0, 0};
#define CMP(slot, got, want) \
    do { \
        const double e_ = fabs((double)(got) - (want)) / (0.05 + fabs(want)); \
        if (!(e_ <= worst[slot])) worst[slot] = isnan(e_) ? INFINITY : e_; \
    } while (0)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                CMP(1, c.lse[(b * H + h) * T + t], lse[(b * H + h) * T + t]);
                for (int e = 0; e < DV; e++) CMP(0, O(&c, c.out, b, h, t, e), out[((b * H + h) * T + t) * DV + e]);
                for (int d = 0; d < D; d++) CMP(2, c.dq[b * c.a.q_st[0] + h * c.a.q_st[1] + t * c.a.q_st[2] + d],
                                              dq[((b * H + h) * T + t) * D + d]);
            }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < kv_heads; h++)
            for (int s = 0; s < T; s++) {
                for (int d = 0; d < D; d++) CMP(3, c.dk[b * c.a.k_st[0] + h * c.a.k_st[1] + s * c.a.k_st[2] + d],
                                              dk[((b * kv_heads + h) * T + s) * D + d]);
                for (int e = 0; e < DV; e++) CMP(4, c.dv[b * c.a.v_st[0] + h * c.a.v_st[1] + s * c.a.v_st[2] + e], dv[((b * kv_heads + h) * T + s) * DV + e]);
            }
    printf("kv_heads %d, mask %d, dropout %g: worst relative error out %.2g, lse %.2g, dq %.2g, dk %.2g, dv %.2g\n", kv_heads, mask, dropout, worst[0],
           worst[1], worst[2], worst[3], worst[4]);
    /* float sums of 70 terms against double: errors of a few 1e-6 relative to values of 0.05 and more */
    for (int i = 0; i < 5; i++) cr_expect_leq(worst[i], 1e-4, "kv_heads %d, mask %d, dropout %g: result %d off by %g", kv_heads, mask, dropout, i, worst[i]);
    free(out), free(lse), free(dq), free(dk), free(dv);
    tear_down(&c);
}

Test(rt_attention, every_mask_gqa_and_dropout_against_the_textbook)
{
    for (int mask = KILN_ATTN_NONE; mask <= KILN_ATTN_ADD; mask++) {
        check(H, mask, 0);
        check(2, mask, 0);
    }
    check(2, KILN_ATTN_CAUSAL, 0.25f);
    check(H, KILN_ATTN_ADD, 0.5f);
}

/* The backward is the forward's gradient: central differences of sum(out * dout) in q, k
 * and v, for a causal GQA case with dropout (its mask fixed by the counter). */
Test(rt_attention, backward_is_the_gradient_of_the_forward)
{
    Case c;
    set_up(&c, 2, KILN_ATTN_CAUSAL, 0.25f);
    kiln_attention_fwd(&c.a, c.q, c.k, c.v, c.out, c.lse);
    kiln_attention_bwd(&c.a, c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq, c.dk, c.dv, NULL);
    float *o2 = malloc(sizeof(float) * B * H * T * DV), *l2 = malloc(sizeof(float) * B * H * T);
    float *const tensors[3] = {c.q, c.k, c.v}, *const grads[3] = {c.dq, c.dk, c.dv};
    const size_t probe[3][3] = {{5, 777, 3001}, {2, 333, 2000}, {7, 555, 3300}};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 3; i++) {
            const size_t at = probe[w][i];
            const float keep = tensors[w][at], hstep = 1e-2f;
            double f[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                tensors[w][at] = keep + (sgn ? hstep : -hstep);
                kiln_attention_fwd(&c.a, c.q, c.k, c.v, o2, l2);
                double sum = 0;
                for (size_t e = 0; e < (size_t)B * H * T * DV; e++) sum += (double)o2[e] * c.dout[e];
                f[sgn] = sum;
            }
            tensors[w][at] = keep;
            const double fd = (f[1] - f[0]) / (2 * hstep), g = grads[w][at];
            cr_expect(fabs(fd - g) <= 2e-3 * (1 + fabs(g)), "tensor %d element %zu: finite difference %.6g, backward %.6g", w, at, fd, g);
        }
    free(o2), free(l2);
    tear_down(&c);
}

/* One writer per element, sums in a fixed order: 1 and 3 threads give the same bits. */
Test(rt_attention, the_same_bits_on_any_number_of_threads)
{
#ifndef _OPENMP
    cr_skip_test("built without OpenMP");
#else
    Case c[2];
    for (int r = 0; r < 2; r++) {
        set_up(&c[r], 2, KILN_ATTN_ADD, 0.25f);
        omp_set_num_threads(r ? 3 : 1);
        kiln_attention_fwd(&c[r].a, c[r].q, c[r].k, c[r].v, c[r].out, c[r].lse);
        kiln_attention_bwd(&c[r].a, c[r].q, c[r].k, c[r].v, c[r].out, c[r].lse, c[r].dout, c[r].dq, c[r].dk, c[r].dv, NULL);
    }
    cr_expect(!memcmp(c[0].out, c[1].out, sizeof(float) * B * H * T * DV));
    cr_expect(!memcmp(c[0].lse, c[1].lse, sizeof(float) * B * H * T));
    cr_expect(!memcmp(c[0].dq, c[1].dq, sizeof(float) * B * H * T * D));
    cr_expect(!memcmp(c[0].dk, c[1].dk, sizeof(float) * B * 2 * T * D));
    cr_expect(!memcmp(c[0].dv, c[1].dv, sizeof(float) * B * 2 * T * DV));
    tear_down(&c[0]);
    tear_down(&c[1]);
#endif
}
