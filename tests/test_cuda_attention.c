/* test_cuda_attention.c — the CUDA target's fused attention (runtime/cuda/kiln_cuda_attention.h,
 * through tests/cuda/attention.cu) under the emulator against the C target's
 * (runtime/kiln_attention.h), the oracle its own tests hold to the textbook: forward (output
 * and log-sum-exp) and backward (dq, dk, dv, an added mask's gradient) for every mask kind,
 * grouped-query heads, dropout, head sizes from 8 to 128 (each register tiling of the
 * kernels), tiles crossed, a decode step's single query, q, k and v read in place from a
 * [B, T, 3, H, D] projection and the output written permuted; rows with every key masked
 * are NaN in both. The two sum in other orders: equal within float rounding. The kernels
 * give the same bits in every thread order of the emulator. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../emu/kemu_runtime.h"
#include "../runtime/kiln_attention.h"
#include "cuda/kernels.h"

typedef struct {
    int64_t B, H, KV, T, S, D, DV;
    int mask;
    float dropout;
    int packed; /* q, k, v in one [B, T, 3, H, D] tensor (D == DV, KV == H); out [B, T, H, D] */
    int masked_batch; /* KEEP: batch 1 keeps no key (its rows NaN) */
} Case;

typedef struct {
    kiln_attention a;
    float *qkv, *q, *k, *v, *mask_add, *out, *lse, *dout;
    uint8_t *mask_bool;
    size_t nq, nk, nv, nout, nlse, nmask, ndmask;
} Problem;

static float uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *random_floats(size_t n, uint64_t *seed)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = uniform(seed);
    return x;
}

static void contiguous(int64_t *st, int64_t heads, int64_t rows, int64_t cols)
{
    st[3] = 1, st[2] = cols, st[1] = rows * cols, st[0] = heads * rows * cols;
}

static Problem make(const Case *c, uint64_t seed)
{
    Problem p;
    memset(&p, 0, sizeof p);
    kiln_attention *a = &p.a;
    a->B = c->B, a->H = c->H, a->kv_heads = c->KV, a->T = c->T, a->S = c->S, a->D = c->D, a->DV = c->DV;
    a->scale = 1.0f / sqrtf((float)c->D);
    a->mask = c->mask;
    if (c->packed) { /* q, k, v where a fused projection wrote them; out permuted back */
        const int64_t C = c->H * c->D, n = c->B * c->T * 3 * C;
        p.qkv = random_floats((size_t)n, &seed);
        const int64_t st[4] = {c->T * 3 * C, c->D, 3 * C, 1};
        memcpy(a->q_st, st, sizeof st), memcpy(a->k_st, st, sizeof st), memcpy(a->v_st, st, sizeof st);
        p.q = p.qkv, p.k = p.qkv + C, p.v = p.qkv + 2 * C;
        p.nq = p.nk = p.nv = (size_t)n;
        const int64_t o[4] = {c->T * C, c->D, C, 1};
        memcpy(a->o_st, o, sizeof o);
    } else {
        p.nq = (size_t)(c->B * c->H * c->T * c->D), p.nk = (size_t)(c->B * c->KV * c->S * c->D), p.nv = (size_t)(c->B * c->KV * c->S * c->DV);
        p.q = random_floats(p.nq, &seed), p.k = random_floats(p.nk, &seed), p.v = random_floats(p.nv, &seed);
        contiguous(a->q_st, c->H, c->T, c->D), contiguous(a->k_st, c->KV, c->S, c->D), contiguous(a->v_st, c->KV, c->S, c->DV);
        contiguous(a->o_st, c->H, c->T, c->DV);
    }
    p.nout = (size_t)(c->B * c->H * c->T * c->DV), p.nlse = (size_t)(c->B * c->H * c->T);
    p.out = calloc(p.nout + 1, sizeof *p.out), p.lse = calloc(p.nlse + 1, sizeof *p.lse);
    p.dout = random_floats(p.nout, &seed);
    if (c->mask == KILN_ATTN_KEEP) { /* padding: [B, 1, 1, S], a few keys of each batch dropped */
        p.nmask = (size_t)(c->B * c->S);
        p.mask_bool = malloc(p.nmask);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t s = 0; s < c->S; s++) p.mask_bool[b * c->S + s] = !(c->masked_batch && b == 1) && (s + b) % 5 != 3;
        const int64_t st[4] = {c->S, 0, 0, 1};
        memcpy(a->mask_st, st, sizeof st);
        a->mask_bool = p.mask_bool;
    } else if (c->mask == KILN_ATTN_DROP) { /* [T, S], broadcast over batch and heads */
        p.nmask = (size_t)(c->T * c->S);
        p.mask_bool = malloc(p.nmask);
        for (size_t i = 0; i < p.nmask; i++) p.mask_bool[i] = i % 7 == 2;
        const int64_t st[4] = {0, 0, c->S, 1};
        memcpy(a->mask_st, st, sizeof st);
        a->mask_bool = p.mask_bool;
    } else if (c->mask == KILN_ATTN_ADD) { /* a learned bias [H, T, S] */
        p.nmask = (size_t)(c->H * c->T * c->S);
        p.mask_add = random_floats(p.nmask, &seed);
        const int64_t st[4] = {0, c->T * c->S, c->S, 1};
        memcpy(a->mask_st, st, sizeof st);
        a->mask_add = p.mask_add;
        p.ndmask = (size_t)(c->B * c->H * c->T * c->S);
    }
    if (c->dropout > 0) a->dropout = c->dropout, a->seed = 1234, a->step = 7, a->stream = 3;
    return p;
}

static void release(Problem *p)
{
    if (p->qkv) free(p->qkv);
    else free(p->q), free(p->k), free(p->v);
    free(p->out), free(p->lse), free(p->dout), free(p->mask_bool), free(p->mask_add);
}

static KtAttentionArrays arrays(const Problem *p)
{
    KtAttentionArrays x = {.q = p->q, .k = p->k, .v = p->v, .nq = p->nq, .nk = p->nk, .nv = p->nv, .nout = p->nout, .nlse = p->nlse};
    if (p->qkv) { /* the packed tensor: q, k and v are views into one array */
        x.q = x.k = x.v = p->qkv;
        x.k_at = (size_t)(p->k - p->qkv), x.v_at = (size_t)(p->v - p->qkv);
    }
    x.mask = p->mask_bool ? (const void *)p->mask_bool : (const void *)p->mask_add;
    x.mask_bytes = p->mask_bool ? p->nmask : p->nmask * sizeof(float);
    return x;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n)
{
    double worst = 0, largest = 0;
    size_t at = 0, nan_mismatch = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(want[i]) && fabs((double)want[i]) > largest) largest = fabs((double)want[i]);
    /* relative to the element, and to the array's largest below that (sums that cancel) */
    for (size_t i = 0; i < n; i++) {
        if (isnan(want[i]) || isnan(got[i])) {
            nan_mismatch += isnan(want[i]) != isnan(got[i]);
            continue;
        }
        const double e = fabs((double)got[i] - want[i]) / (1e-2 * largest + fabs((double)want[i]) + 1e-30);
        if (e > worst) worst = e, at = i;
    }
    cr_expect_eq(nan_mismatch, 0, "%s: %zu elements NaN in one and not the other", what, nan_mismatch);
    cr_expect(worst < 1e-4, "%s: element %zu is %.9g, the C target's %.9g (relative error %.3g)", what, at, got[at], want[at], worst);
}

/* Forward and backward of case c on both targets, compared. */
static void check(const Case *c)
{
    Problem p = make(c, 42 + (uint64_t)c->T * 31 + (uint64_t)c->D);
    const kiln_attention *a = &p.a;
    /* the C target: forward, then backward from its output */
    float *out_c = calloc(p.nout + 1, sizeof(float)), *lse_c = calloc(p.nlse + 1, sizeof(float));
    kiln_attention_fwd(a, p.q, p.k, p.v, out_c, lse_c);
    /* the CUDA target's forward */
    KtAttentionArrays x = arrays(&p);
    x.out = p.out, x.lse = p.lse, x.want_out = 1;
    cr_assert_eq(kt_attention(a, &x), 0, "the forward's launch failed");
    expect_close("out", p.out, out_c, p.nout);
    expect_close("lse", p.lse, lse_c, p.nlse);
    /* the backward, both from the C target's output and log-sum-exp */
    const size_t nq = p.nq, nk = p.nk, nv = p.nv;
    float *dq_c = calloc(nq + 1, sizeof(float)), *dk_c = calloc(nk + 1, sizeof(float)), *dv_c = calloc(nv + 1, sizeof(float));
    float *dm_c = p.ndmask ? calloc(p.ndmask, sizeof(float)) : NULL;
    float *dq_g = calloc(nq + 1, sizeof(float)), *dk_g = calloc(nk + 1, sizeof(float)), *dv_g = calloc(nv + 1, sizeof(float));
    float *dm_g = p.ndmask ? calloc(p.ndmask, sizeof(float)) : NULL;
    if (c->packed) { /* dq, dk, dv in their own contiguous [B, H, T, D] (the generated code's) */
        contiguous(p.a.dq_st, c->H, c->T, c->D), contiguous(p.a.dk_st, c->KV, c->S, c->D), contiguous(p.a.dv_st, c->KV, c->S, c->DV);
    }
    kiln_attention_bwd(a, p.q, p.k, p.v, out_c, lse_c, p.dout, dq_c, dk_c, dv_c, dm_c);
    KtAttentionArrays y = arrays(&p);
    memcpy(p.out, out_c, p.nout * sizeof(float));
    memcpy(p.lse, lse_c, p.nlse * sizeof(float));
    y.out = p.out, y.lse = p.lse, y.dout = p.dout, y.dq = dq_g, y.dk = dk_g, y.dv = dv_g, y.dmask = dm_g, y.ndmask = p.ndmask;
    cr_assert_eq(kt_attention(a, &y), 0, "the backward's launch failed");
    expect_close("dq", dq_g, dq_c, nq);
    expect_close("dk", dk_g, dk_c, nk);
    expect_close("dv", dv_g, dv_c, nv);
    if (dm_c) expect_close("dmask", dm_g, dm_c, p.ndmask);
    free(out_c), free(lse_c), free(dq_c), free(dk_c), free(dv_c), free(dm_c), free(dq_g), free(dk_g), free(dv_g), free(dm_g);
    release(&p);
}

Test(cuda_attention, no_mask_tiles_crossed) { check(&(Case){.B = 2, .H = 3, .KV = 3, .T = 70, .S = 70, .D = 32, .DV = 32}); }
Test(cuda_attention, causal_gpt_shape) { check(&(Case){.B = 2, .H = 4, .KV = 4, .T = 40, .S = 40, .D = 32, .DV = 32, .mask = KILN_ATTN_CAUSAL}); }
Test(cuda_attention, causal_head_64) { check(&(Case){.B = 1, .H = 2, .KV = 2, .T = 67, .S = 67, .D = 64, .DV = 64, .mask = KILN_ATTN_CAUSAL}); }
Test(cuda_attention, causal_head_128) { check(&(Case){.B = 1, .H = 2, .KV = 2, .T = 35, .S = 35, .D = 128, .DV = 128, .mask = KILN_ATTN_CAUSAL}); }
Test(cuda_attention, grouped_query_heads) { check(&(Case){.B = 2, .H = 4, .KV = 2, .T = 37, .S = 37, .D = 16, .DV = 16, .mask = KILN_ATTN_CAUSAL}); }
Test(cuda_attention, padding_mask_and_a_batch_with_no_key) {
    check(&(Case){.B = 3, .H = 2, .KV = 2, .T = 33, .S = 45, .D = 8, .DV = 8, .mask = KILN_ATTN_KEEP, .masked_batch = 1});
}
Test(cuda_attention, masked_fill_mask) { check(&(Case){.B = 2, .H = 2, .KV = 1, .T = 21, .S = 50, .D = 24, .DV = 40, .mask = KILN_ATTN_DROP}); }
Test(cuda_attention, added_mask_and_its_gradient) { check(&(Case){.B = 2, .H = 2, .KV = 2, .T = 19, .S = 34, .D = 16, .DV = 16, .mask = KILN_ATTN_ADD}); }
Test(cuda_attention, dropout) { check(&(Case){.B = 2, .H = 2, .KV = 2, .T = 45, .S = 45, .D = 32, .DV = 32, .mask = KILN_ATTN_CAUSAL, .dropout = 0.2f}); }
Test(cuda_attention, head_sizes_differ_and_not_powers_of_two) { check(&(Case){.B = 1, .H = 2, .KV = 2, .T = 37, .S = 50, .D = 100, .DV = 64}); }
Test(cuda_attention, decode_step_one_query) { check(&(Case){.B = 2, .H = 4, .KV = 2, .T = 1, .S = 77, .D = 32, .DV = 32, .mask = KILN_ATTN_KEEP}); }
/* A decode step against a long cache: the keys split in ranges, combined by a second kernel. */
Test(cuda_attention, decode_step_long_cache_split)
{
    const Case c = {.B = 1, .H = 4, .KV = 2, .T = 1, .S = 1000, .D = 64, .DV = 64, .mask = KILN_ATTN_KEEP};
    Problem p = make(&c, 3);
    cr_expect_gt(kt_attention_splits(&p.a), 1, "not split");
    release(&p);
    check(&c);
    check(&(Case){.B = 2, .H = 2, .KV = 2, .T = 3, .S = 777, .D = 32, .DV = 16, .mask = KILN_ATTN_ADD});
    check(&(Case){.B = 1, .H = 2, .KV = 2, .T = 2, .S = 600, .D = 16, .DV = 16, .dropout = 0.1f});
}

Test(cuda_attention, read_in_place_and_written_permuted) {
    check(&(Case){.B = 2, .H = 4, .KV = 4, .T = 50, .S = 50, .D = 32, .DV = 32, .mask = KILN_ATTN_CAUSAL, .packed = 1});
}

/* The same bits whatever order the emulator runs a block's threads in: no race between
 * the warps' rows, the lanes' shuffles and the pairs' updates. */
Test(cuda_attention, same_bits_in_every_thread_order)
{
    const Case c = {.B = 1, .H = 2, .KV = 1, .T = 45, .S = 45, .D = 32, .DV = 32, .mask = KILN_ATTN_CAUSAL, .dropout = 0.1f};
    const kemu_order orders[] = {KEMU_ORDER_FORWARD, KEMU_ORDER_REVERSE, KEMU_ORDER_SHUFFLE};
    float *first[4] = {0};
    for (int o = 0; o < 3; o++) {
        kemu_set_order(orders[o], 5);
        Problem p = make(&c, 9);
        float *dq = calloc(p.nq, sizeof(float)), *dk = calloc(p.nk, sizeof(float)), *dv = calloc(p.nv, sizeof(float));
        KtAttentionArrays x = arrays(&p);
        x.out = p.out, x.lse = p.lse, x.want_out = 1;
        cr_assert_eq(kt_attention(&p.a, &x), 0);
        KtAttentionArrays y = arrays(&p);
        y.out = p.out, y.lse = p.lse, y.dout = p.dout, y.dq = dq, y.dk = dk, y.dv = dv;
        cr_assert_eq(kt_attention(&p.a, &y), 0);
        float *got[4] = {p.out, dq, dk, dv};
        const size_t n[4] = {p.nout, p.nq, p.nk, p.nv};
        for (int i = 0; i < 4; i++) {
            if (!o) {
                first[i] = malloc(n[i] * sizeof(float));
                memcpy(first[i], got[i], n[i] * sizeof(float));
            } else {
                cr_expect(memcmp(first[i], got[i], n[i] * sizeof(float)) == 0, "order %d: output %d differs from forward order's", o, i);
            }
        }
        free(dq), free(dk), free(dv);
        release(&p);
    }
    for (int i = 0; i < 4; i++) free(first[i]);
    kemu_set_order(KEMU_ORDER_FORWARD, 1);
}
