/* kiln_attention.h — fused attention for the C target: out = dropout(softmax(q kᵀ · scale +
 * mask)) v without the [T, S] probabilities in memory, forward and backward, in float32.
 * Header-only, so that the generated model.c compiles it with its own flags
 * (-march=native), as kiln_gemm.h is. The generated code calls it for the attention ops
 * (ir/ops.h) that the attention pass (passes/fuse_attention.c) puts in the graph.
 *
 * The forward is FlashAttention's (Dao 2022, 2023): per (batch, head, tile of 64 queries)
 * the keys are visited in tiles of 64, each tile's scores computed by BLAS (q kᵀ · scale),
 * masked and folded into the rows' running maximum, sum and output (the online softmax),
 * the output's update by BLAS too (P v); it writes the output and each row's log-sum-exp.
 * The backward recomputes each tile of probabilities from that log-sum-exp: first
 * D_t = dO_t · O_t, then per (batch, key/value head) the key tiles in order, each against
 * every tile of queries of the heads that share them (grouped-query attention): dV, dK and
 * dQ from one recomputation (FlashAttention-2's five products), dQ accumulated in that one
 * job. Every element has one writer and each sum runs in a fixed order, so the results do
 * not depend on the number of threads; the parallelism is batch × key/value heads. BLAS is called
 * from inside the OpenMP loops: a program runs it single-threaded (runtime/env.c).
 *
 * Dropout draws the unfused graph's numbers (kiln_rng.h: element ((b·H + h)·T + t)·S + s
 * of the probabilities' stream), so recomputation draws the same and fused and unfused
 * training drop the same positions. A row whose keys are all masked gives NaN, as
 * PyTorch's softmax of a row of -inf does.
 *
 * Layouts: each tensor by strides in elements over (batch, head, row, column), the column
 * stride 1 (BLAS's rows), so q, k and v are read where the projections wrote them (gpt's
 * [B, T, 3C]); a mask's strides may be 0 to broadcast. k and v have kv_heads heads; query
 * head h reads head h / (H / kv_heads). A causal mask keeps key s <= query t (T = S, both
 * from position 0). */
#ifndef KILN_ATTENTION_H
#define KILN_ATTENTION_H

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_attention_desc.h"
#include "kiln_math.h"
#include "kiln_rng.h"

/* Rows (queries) or keys per tile: 64, whose scores stay in cache and whose causal tiles
 * above the diagonal are skipped. One tile for a whole sequence of 128 (fewer, larger BLAS
 * calls) measured slower at gpt's causal shape: B 16, H 4, T 128, D 32 took 1.8 / 2.0-2.2
 * ms forward / backward against 1.4 / 1.6-1.7 in tiles of 64 (bench/attention_kernel.sh). */
static inline int64_t kiln_attn_tile(int64_t n) { return n < 64 ? (n > 0 ? n : 1) : 64; }

/* Whether an attention is worth the threads: a decode step's (one query against the cache)
 * is not; the team's start cost more than its work (gpt's decode at 2 threads: 2778
 * against 4561 tokens/s on one). */
static inline int kiln_attn_parallel(const kiln_attention *a) { return a->B * a->H * a->T * a->S * (a->D + a->DV) >= ((int64_t)1 << 18); }

/* Dropout's factor for probability (b, h, t, s): 0, or 1 / (1 - p). */
static inline float kiln_attn_keep(const kiln_attention *a, int64_t b, int64_t h, int64_t t, int64_t s)
{
    if (a->dropout <= 0) return 1.0f;
    const uint64_t e = (uint64_t)(((b * a->H + h) * a->T + t) * a->S + s);
    return kiln_rng_uniform24(a->seed, a->step, a->stream, e) >= a->dropout ? 1.0f / (1.0f - a->dropout) : 0.0f;
}

/* The mask and dropout of a tile of scores (rows t0.., keys s0..) already scaled: -inf
 * where masked, the additive mask added. */
static inline void kiln_attn_mask_tile(const kiln_attention *a, float *x, int64_t ld, int64_t b, int64_t h, int64_t t0, int64_t nt, int64_t s0, int64_t ns)
{
    if (a->mask == KILN_ATTN_NONE) return;
    for (int64_t i = 0; i < nt; i++)
        for (int64_t j = 0; j < ns; j++) {
            const int64_t t = t0 + i, s = s0 + j;
            float *e = &x[i * ld + j];
            if (a->mask == KILN_ATTN_CAUSAL) {
                if (s > t) *e = -INFINITY;
                continue;
            }
            const int64_t m = b * a->mask_st[0] + h * a->mask_st[1] + t * a->mask_st[2] + s * a->mask_st[3];
            if (a->mask == KILN_ATTN_KEEP && !a->mask_bool[m]) *e = -INFINITY;
            else if (a->mask == KILN_ATTN_DROP && a->mask_bool[m]) *e = -INFINITY;
            else if (a->mask == KILN_ATTN_ADD) *e += a->mask_add[m];
        }
}

/* out [B, H, T, DV] and lse [B, H, T] (contiguous); either may be NULL when not wanted. */
static inline void kiln_attention_fwd(const kiln_attention *a, const float *q, const float *k, const float *v, float *out, float *lse)
{
    const int64_t G = a->H / a->kv_heads, QT = kiln_attn_tile(a->T), KT = kiln_attn_tile(a->S), ntiles = (a->T + QT - 1) / QT;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (kiln_attn_parallel(a))
#endif
    for (int64_t job = 0; job < a->B * a->H * ntiles; job++) {
        const int64_t b = job / (a->H * ntiles), h = job / ntiles % a->H, t0 = job % ntiles * QT;
        const int64_t t1 = t0 + QT < a->T ? t0 + QT : a->T, kvh = h / G;
        float *acc = (float *)calloc((size_t)(QT * a->DV + 2 * QT + QT * KT), sizeof *acc);
        if (!acc) abort();
        float *mx = acc + QT * a->DV, *sum = mx + QT, *p = sum + QT;
        for (int64_t i = 0; i < t1 - t0; i++) mx[i] = -INFINITY;
        const int64_t s_end = a->mask == KILN_ATTN_CAUSAL && t1 < a->S ? t1 : a->S; /* keys past the last query: all masked */
        const int64_t nt = t1 - t0;
        for (int64_t s0 = 0; s0 < s_end; s0 += KT) {
            const int64_t s1 = s0 + KT < s_end ? s0 + KT : s_end, ns = s1 - s0;
            /* the tile's scores, q kᵀ · scale, by BLAS (rows of q and k with unit column strides) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)ns, (int)a->D, a->scale, q + b * a->q_st[0] + h * a->q_st[1] + t0 * a->q_st[2],
                        (int)a->q_st[2], k + b * a->k_st[0] + kvh * a->k_st[1] + s0 * a->k_st[2], (int)a->k_st[2], 0.0f, p, (int)KT);
            kiln_attn_mask_tile(a, p, KT, b, h, t0, nt, s0, ns);
            for (int64_t i = 0; i < nt; i++) { /* the online softmax: the rows' maxima, sums and outputs rescaled */
                float *x = p + i * KT, tile_max = -INFINITY;
                for (int64_t j = 0; j < ns; j++) tile_max = x[j] > tile_max ? x[j] : tile_max;
                const float m_new = tile_max > mx[i] ? tile_max : mx[i];
                if (m_new == -INFINITY) { /* nothing kept yet */
                    for (int64_t j = 0; j < ns; j++) x[j] = 0;
                    continue;
                }
                const float rescale = mx[i] == -INFINITY ? 0.0f : kiln_expf(mx[i] - m_new);
                float *o = acc + i * a->DV, lanes[KILN_SUM_LANES] = {0};
                for (int64_t d = 0; d < a->DV; d++) o[d] *= rescale;
                /* exp vectorised (kiln_math.h), a masked key exactly 0; the sum in lanes, key
                 * j in lane j % KILN_SUM_LANES, so that its order (its bits) is the same
                 * whichever compiler vectorises it */
                int64_t j = 0;
                for (; j + KILN_SUM_LANES <= ns; j += KILN_SUM_LANES)
#ifdef _OPENMP
#pragma omp simd
#endif
                    for (int l = 0; l < KILN_SUM_LANES; l++) {
                        const float e = kiln_selectf(x[j + l] == -INFINITY, 0.0f, kiln_expf(x[j + l] - m_new));
                        lanes[l] += e;
                        x[j + l] = e;
                    }
                for (; j < ns; j++) {
                    const float e = kiln_selectf(x[j] == -INFINITY, 0.0f, kiln_expf(x[j] - m_new));
                    lanes[j % KILN_SUM_LANES] += e;
                    x[j] = e;
                }
                sum[i] = sum[i] * rescale + KILN_LANES_SUM(lanes);
                if (a->dropout > 0)
                    for (int64_t s = 0; s < ns; s++) x[s] *= kiln_attn_keep(a, b, h, t0 + i, s0 + s);
                mx[i] = m_new;
            }
            /* acc += P v */
            if (out)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nt, (int)a->DV, (int)ns, 1.0f, p, (int)KT,
                            v + b * a->v_st[0] + kvh * a->v_st[1] + s0 * a->v_st[2], (int)a->v_st[2], 1.0f, acc, (int)a->DV);
        }
        for (int64_t t = t0; t < t1; t++) {
            const int64_t i = t - t0;
            const float inv = 1.0f / sum[i]; /* 0 keys kept: 1/0, and 0 * inf is NaN below */
            if (out) {
                float *orow = out + b * a->o_st[0] + h * a->o_st[1] + t * a->o_st[2];
                for (int64_t d = 0; d < a->DV; d++) orow[d * a->o_st[3]] = sum[i] > 0 ? acc[i * a->DV + d] * inv : NAN;
            }
            if (lse) lse[(b * a->H + h) * a->T + t] = sum[i] > 0 ? mx[i] + logf(sum[i]) : NAN;
        }
        free(acc);
    }
}

/* The tile of dS = P ∘ (dP ∘ keep − D) (not yet times the scale) for rows t0.. and keys s0.., recomputing P
 * from the rows' log-sum-exp: into ds (and P ∘ keep into pk), both [nt, KTILE]. delta_h:
 * D of head h's rows. */
static inline void kiln_attn_ds_tile(const kiln_attention *a, const float *q, const float *k, const float *v, const float *lse, const float *dout,
                                     const float *delta_h, int64_t b, int64_t h, int64_t t0, int64_t nt, int64_t s0, int64_t ns, float *ds, float *pk,
                                     int64_t L)
{
    const int64_t kvh = h / (a->H / a->kv_heads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)ns, (int)a->D, a->scale, q + b * a->q_st[0] + h * a->q_st[1] + t0 * a->q_st[2],
                (int)a->q_st[2], k + b * a->k_st[0] + kvh * a->k_st[1] + s0 * a->k_st[2], (int)a->k_st[2], 0.0f, pk, (int)L);
    kiln_attn_mask_tile(a, pk, L, b, h, t0, nt, s0, ns);
    /* dP = dO vᵀ */
    const int64_t *do_st = a->do_st[2] ? a->do_st : a->o_st;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)ns, (int)a->DV, 1.0f, dout + b * do_st[0] + h * do_st[1] + t0 * do_st[2],
                (int)do_st[2], v + b * a->v_st[0] + kvh * a->v_st[1] + s0 * a->v_st[2], (int)a->v_st[2], 0.0f, ds, (int)L);
    for (int64_t i = 0; i < nt; i++) {
        const float l = lse[(b * a->H + h) * a->T + t0 + i], d = delta_h[t0 + i];
        float *x = pk + i * L, *g = ds + i * L;
        if (a->dropout <= 0) {
#ifdef _OPENMP
#pragma omp simd
#endif
            for (int64_t j = 0; j < ns; j++) { /* exp vectorised (kiln_math.h); a masked key is exactly 0 */
                const float pr = kiln_selectf(x[j] == -INFINITY, 0.0f, kiln_expf(x[j] - l));
                g[j] = pr * (g[j] - d);
                x[j] = pr;
            }
            continue;
        }
        for (int64_t j = 0; j < ns; j++) {
            const float pr = x[j] == -INFINITY ? 0.0f : kiln_expf(x[j] - l), keep = kiln_attn_keep(a, b, h, t0 + i, s0 + j);
            g[j] = pr * (g[j] * keep - d);
            x[j] = pr * keep;
        }
    }
}

/* dq, dk, dv (dq_st, dk_st, dv_st; any may be NULL when not wanted) from dout (do_st), with
 * out and lse [B, H, T] from the forward; dmask (KILN_ATTN_ADD, contiguous [B, H, T, S], NULL
 * when the mask needs no gradient): the added mask's gradient, dS before the scale. */
static inline void kiln_attention_bwd(const kiln_attention *a, const float *q, const float *k, const float *v, const float *out, const float *lse,
                                      const float *dout, float *dq, float *dk, float *dv, float *dmask)
{
    const int64_t G = a->H / a->kv_heads, L = kiln_attn_tile(a->S), QT = kiln_attn_tile(a->T);
    const int64_t *dq_st = a->dq_st[2] ? a->dq_st : a->q_st, *dk_st = a->dk_st[2] ? a->dk_st : a->k_st, *dv_st = a->dv_st[2] ? a->dv_st : a->v_st;
    /* dK, dV and dQ per (batch, key/value head): its keys' tiles in order, each over every
     * tile of queries of the heads that read them; dQ of those heads accumulates across the
     * key tiles in this one job, so that no element has two writers */
    const int64_t ktiles = (a->S + L - 1) / L, qtiles = (a->T + QT - 1) / QT;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (kiln_attn_parallel(a))
#endif
    for (int64_t job = 0; job < a->B * a->kv_heads; job++) {
        const int64_t b = job / a->kv_heads, kvh = job % a->kv_heads;
        /* a gradient not wanted goes to a tile of scratch */
        const size_t scratch = (size_t)(2 * QT * L + G * a->T) + (dk ? 0 : (size_t)(L * a->D)) + (dv ? 0 : (size_t)(L * a->DV));
        float *ds = (float *)malloc(sizeof(float) * scratch), *pk = ds + QT * L, *delta = pk + QT * L, *spare = delta + G * a->T;
        if (!ds) abort();
        /* D_t = dO_t · O_t of the rows of the heads that read this key/value head */
        const int64_t *do_st = a->do_st[2] ? a->do_st : a->o_st;
        for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
            for (int64_t t = 0; t < a->T; t++) {
                const float *o = out + b * a->o_st[0] + h * a->o_st[1] + t * a->o_st[2], *g = dout + b * do_st[0] + h * do_st[1] + t * do_st[2];
                float d = 0;
                for (int64_t c = 0; c < a->DV; c++) d += g[c * do_st[3]] * o[c * a->o_st[3]];
                delta[(h - kvh * G) * a->T + t] = d;
            }
        if (dq)
            for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
                for (int64_t t = 0; t < a->T; t++) memset(dq + b * dq_st[0] + h * dq_st[1] + t * dq_st[2], 0, sizeof(float) * (size_t)a->D);
        for (int64_t kt = 0; kt < ktiles; kt++) {
            const int64_t s0 = kt * L, ns = s0 + L < a->S ? L : a->S - s0;
            float *dkt = dk ? dk + b * dk_st[0] + kvh * dk_st[1] + s0 * dk_st[2] : spare;
            float *dvt = dv ? dv + b * dv_st[0] + kvh * dv_st[1] + s0 * dv_st[2] : spare + (dk ? 0 : L * a->D);
            const int64_t ldk = dk ? dk_st[2] : a->D, ldv = dv ? dv_st[2] : a->DV;
            const float *kt_rows = k + b * a->k_st[0] + kvh * a->k_st[1] + s0 * a->k_st[2];
            for (int64_t j = 0; j < ns; j++) {
                memset(dkt + j * ldk, 0, sizeof(float) * (size_t)a->D);
                memset(dvt + j * ldv, 0, sizeof(float) * (size_t)a->DV);
            }
            for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
                for (int64_t qt = a->mask == KILN_ATTN_CAUSAL ? s0 / QT : 0; qt < qtiles; qt++) { /* causal: queries before s0 see none of these keys */
                    const int64_t t0 = qt * QT, nt = t0 + QT < a->T ? QT : a->T - t0;
                    kiln_attn_ds_tile(a, q, k, v, lse, dout, delta + (h - kvh * G) * a->T, b, h, t0, nt, s0, ns, ds, pk, L);
                    for (int64_t i = 0; i < nt; i++) { /* the added mask's gradient is dS; q's and k's, dS · scale */
                        float *row = ds + i * L;
                        if (dmask) memcpy(dmask + ((b * a->H + h) * a->T + t0 + i) * a->S + s0, row, sizeof(float) * (size_t)ns);
                        for (int64_t j = 0; j < ns; j++) row[j] *= a->scale;
                    }
                    /* dV += (P ∘ keep)ᵀ dO, dK += dSᵀ q, dQ += dS k */
                    if (dv)
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)ns, (int)a->DV, (int)nt, 1.0f, pk, (int)L,
                                    dout + b * do_st[0] + h * do_st[1] + t0 * do_st[2], (int)do_st[2], 1.0f, dvt, (int)ldv);
                    if (dk)
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)ns, (int)a->D, (int)nt, 1.0f, ds, (int)L,
                                    q + b * a->q_st[0] + h * a->q_st[1] + t0 * a->q_st[2], (int)a->q_st[2], 1.0f, dkt, (int)ldk);
                    if (dq)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nt, (int)a->D, (int)ns, 1.0f, ds, (int)L, kt_rows, (int)a->k_st[2], 1.0f,
                                    dq + b * dq_st[0] + h * dq_st[1] + t0 * dq_st[2], (int)dq_st[2]);
                }
        }
        free(ds);
    }
}

#endif
