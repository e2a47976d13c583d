/* kiln_cuda_attention.h — fused attention for the CUDA target, in Kiln's dialect
 * (kiln_cuda.h): out = dropout(softmax(q kᵀ · scale + mask)) v without the [T, S]
 * probabilities in memory, forward and backward, in float32. The C target's kernels are
 * kiln_attention.h; both take the same kiln_attention (kiln_attention_desc.h), and the
 * tests hold these to those under the emulator (tests/test_cuda_attention.c).
 *
 * A generated model.cu includes this header where a graph has fused attention and
 * defines one __global__ wrapper per kernel (codegen/cuda_attention.c), so its kernels
 * are model.cu's own: compiled with it by NVRTC, launched by name, run by the emulator.
 *
 * FlashAttention-2's scheme (Dao 2023), with Kiln's rule that every element has one writer
 * and every sum a fixed order (no atomics: the same bits every run):
 *   forward   a block of 4 warps per (batch, head, tile of R queries); the keys and values
 *             in tiles of 32 in shared memory, one key per lane; each warp takes rows of
 *             the tile: its scores (q · k, scaled and masked), their maximum and sum by
 *             shuffles (the online softmax), the probabilities to shared memory; then every
 *             thread updates its (row, column) pairs of the output, held in registers.
 *             Writes the output and each row's log-sum-exp.
 *   backward  two kernels, each recomputing the probabilities from the log-sum-exp:
 *             dK, dV per (batch, key/value head, tile of 32 keys), over every query tile
 *             of the heads that share them (grouped-query attention), accumulated in
 *             registers; dQ per (batch, head, query tile), over the key tiles, as the
 *             forward. D = dO · O is computed per query tile by each (one thread per row).
 *   decode    a few rows (one query per sequence) against a long cache leave most of the
 *             GPU idle at a block per (batch, head): the forward then splits the keys in
 *             ranges of at least 128, one block each, writing each range's running sum,
 *             maximum and output to the step's room for partial results, and a second
 *             kernel combines the ranges in order (FlashDecoding's split; still one writer
 *             per element, the same bits every run).
 * R = 1024 / max(D, DV) rows, at most 64 and a multiple of 4, so that the output's pairs
 * are 8 per thread and the shared memory stays below 48 KiB; head sizes up to
 * KILN_ATTN_MAX_HEAD (128: the attention pass leaves larger heads unfused on this target).
 *
 * Dropout draws the unfused graph's numbers (kiln_rng.h), as the C target does; a row
 * whose keys are all masked gives NaN, as PyTorch's softmax of a row of -inf does. */
#ifndef KILN_CUDA_ATTENTION_H
#define KILN_CUDA_ATTENTION_H

#include "kiln_attention_desc.h"
#include "kiln_cuda.h"
#include "kiln_rng.h"

#define KILN_ATTN_THREADS 128 /* 4 warps */
#define KILN_ATTN_WARPS 4
#define KILN_ATTN_KEYS 32      /* keys per tile: one per lane */
#define KILN_ATTN_PAIRS 8      /* (row, column) pairs of the output (or dQ) per thread */
#define KILN_ATTN_MAX_HEAD 128 /* the largest D and DV */

/* The launch shapes' helpers run on both sides (the host of a GPU program whose kernels
 * NVRTC compiled is plain C++: no __host__ there). */
#if defined(__CUDACC__) || defined(KILN_CUDA_EMU)
#define KILN_ATTN_HD static __host__ __device__ inline
#else
#define KILN_ATTN_HD static inline
#endif

/* Queries per block: R · max(D, DV) <= KILN_ATTN_THREADS · KILN_ATTN_PAIRS. */
KILN_ATTN_HD int kiln_attn_rows(const kiln_attention *a)
{
    const int64_t m = a->D > a->DV ? a->D : a->DV;
    int64_t r = KILN_ATTN_THREADS * KILN_ATTN_PAIRS / (m > 0 ? m : 1);
    r = r > 64 ? 64 : r;
    return (int)(r < KILN_ATTN_WARPS ? KILN_ATTN_WARPS : r / KILN_ATTN_WARPS * KILN_ATTN_WARPS);
}

/* The backward's dK, dV pairs per thread: a tile of 32 keys times max(D, DV) over the
 * block's threads, 8, 16 or 32 (the kernel's template argument). */
KILN_ATTN_HD int kiln_attn_kv_pairs(const kiln_attention *a)
{
    const int64_t m = a->D > a->DV ? a->D : a->DV;
    return m <= 32 ? 8 : m <= 64 ? 16 : 32;
}

#if !defined(__CUDACC_RTC__) /* the launch shapes, for the host */
static inline int64_t kiln_attn_query_tiles(const kiln_attention *a) { return (a->T + kiln_attn_rows(a) - 1) / kiln_attn_rows(a); }
/* Blocks of the forward and of dQ: batch × heads × query tiles; of dK/dV: batch × key/value
 * heads × key tiles. */
static inline unsigned kiln_attention_fwd_blocks(const kiln_attention *a) { return (unsigned)(a->B * a->H * kiln_attn_query_tiles(a)); }
static inline unsigned kiln_attention_dkv_blocks(const kiln_attention *a)
{
    return (unsigned)(a->B * a->kv_heads * ((a->S + KILN_ATTN_KEYS - 1) / KILN_ATTN_KEYS));
}
/* The forward's key ranges: 1, or for few blocks (below 64) against at least 256 keys
 * (a decode step over its cache) enough ranges of at least 128 keys for some 128 blocks,
 * as many as the partial results fit in `room` bytes (the step's partials). */
static inline int kiln_attention_fwd_splits(const kiln_attention *a, size_t room)
{
    const int64_t blocks = a->B * a->H * kiln_attn_query_tiles(a);
    if (blocks <= 0 || blocks >= 64 || a->S < 256 || a->mask == KILN_ATTN_CAUSAL) return 1;
    int64_t splits = (a->S + 127) / 128, want = (128 + blocks - 1) / blocks;
    const int64_t fits = (int64_t)room / ((int64_t)sizeof(float) * a->B * a->H * a->T * (a->DV + 2));
    splits = splits < want ? splits : want;
    splits = splits < fits ? splits : fits;
    return splits < 2 ? 1 : (int)splits;
}
/* The combining kernel's blocks: one thread per element of the output. */
static inline unsigned kiln_attention_combine_blocks(const kiln_attention *a)
{
    const int64_t n = a->B * a->H * a->T * a->DV, blocks = (n + KILN_ATTN_THREADS - 1) / KILN_ATTN_THREADS;
    return (unsigned)(blocks < 65535 ? blocks : 65535);
}
/* Dynamic shared memory of each kernel, in bytes (the carving at the top of each). */
static inline size_t kiln_attention_fwd_smem(const kiln_attention *a)
{
    const int64_t R = kiln_attn_rows(a);
    return sizeof(float) * (size_t)(R * a->D + KILN_ATTN_KEYS * (a->D + 1) + KILN_ATTN_KEYS * a->DV + R * KILN_ATTN_KEYS + 5 * R);
}
static inline size_t kiln_attention_dkv_smem(const kiln_attention *a)
{
    const int64_t R = kiln_attn_rows(a);
    return sizeof(float) * (size_t)(KILN_ATTN_KEYS * (a->D + 1) + KILN_ATTN_KEYS * (a->DV + 1) + R * (a->D + a->DV) + 2 * R + 2 * R * KILN_ATTN_KEYS);
}
static inline size_t kiln_attention_dq_smem(const kiln_attention *a)
{
    const int64_t R = kiln_attn_rows(a);
    return sizeof(float) * (size_t)(KILN_ATTN_KEYS * (a->D + 1) + KILN_ATTN_KEYS * (a->DV + 1) + R * (a->D + a->DV) + 2 * R + R * KILN_ATTN_KEYS);
}
#endif

#if defined(__CUDACC__) || defined(KILN_CUDA_EMU) /* the device code */

/* Dropout's factor for probability (b, h, t, s): 0, or 1 / (1 - p). */
static __device__ inline float kiln_attn_keep_at(const kiln_attention &a, int64_t b, int64_t h, int64_t t, int64_t s)
{
    if (a.dropout <= 0) return 1.0f;
    const uint64_t e = (uint64_t)(((b * a.H + h) * a.T + t) * a.S + s);
    return kiln_rng_uniform24(a.seed, a.step, a.stream, e) >= a.dropout ? 1.0f / (1.0f - a.dropout) : 0.0f;
}

/* The score of query t against key s: q · k scaled, -inf where masked, the added mask added. */
static __device__ inline float kiln_attn_score(const kiln_attention &a, float dot, int64_t b, int64_t h, int64_t t, int64_t s)
{
    float x = dot * a.scale;
    if (a.mask == KILN_ATTN_NONE) return x;
    if (a.mask == KILN_ATTN_CAUSAL) return s > t ? -INFINITY : x;
    const int64_t m = b * a.mask_st[0] + h * a.mask_st[1] + t * a.mask_st[2] + s * a.mask_st[3];
    if (a.mask == KILN_ATTN_KEEP) return a.mask_bool[m] ? x : -INFINITY;
    if (a.mask == KILN_ATTN_DROP) return a.mask_bool[m] ? -INFINITY : x;
    return x + a.mask_add[m];
}

/* rows × cols of a strided tensor (row stride rs, column stride cs) into shared memory with
 * row stride ld, by the whole block. */
static __device__ inline void kiln_attn_load(float *dst, int ld, const float *src, int64_t rs, int64_t cs, int rows, int cols)
{
    for (int i = threadIdx.x; i < rows * cols; i += KILN_ATTN_THREADS) dst[i / cols * ld + i % cols] = src[(i / cols) * rs + (i % cols) * cs];
}

/* D_t = dO_t · O_t of rows t0 .. t0 + nt of head h into delta, and their log-sum-exp into
 * lse_s: one thread per row, the sum in column order (the C target's). */
static __device__ inline void kiln_attn_row_stats(const kiln_attention &a, const float *out, const float *lse, const float *dout, int64_t b, int64_t h,
                                                  int64_t t0, int nt, float *lse_s, float *delta)
{
    const int64_t *do_st = a.do_st[2] ? a.do_st : a.o_st;
    for (int r = threadIdx.x; r < nt; r += KILN_ATTN_THREADS) {
        const int64_t t = t0 + r;
        const float *o = out + b * a.o_st[0] + h * a.o_st[1] + t * a.o_st[2], *g = dout + b * do_st[0] + h * do_st[1] + t * do_st[2];
        float d = 0;
        for (int64_t c = 0; c < a.DV; c++) d += g[c * do_st[3]] * o[c * a.o_st[3]];
        delta[r] = d;
        lse_s[r] = lse[(b * a.H + h) * a.T + t];
    }
}

/* The backward's phase over one tile: for each row r < nt of the query tile (warp w takes
 * rows w, w + 4, ...; lane j key s0 + j < s0 + ns) the probability recomputed from the
 * row's log-sum-exp, times dropout's keep, into p_s (when not NULL), and dS · scale into
 * ds_s; dS itself into dmask (an added mask's gradient, [B, H, T, S]) when not NULL. */
static __device__ inline void kiln_attn_ds_tile(const kiln_attention &a, int64_t b, int64_t h, int64_t t0, int nt, int64_t s0, int ns, const float *q_s,
                                                const float *do_s, const float *k_s, const float *v_s, const float *lse_s, const float *delta,
                                                float *p_s, float *ds_s, float *dmask)
{
    const int D = (int)a.D, DV = (int)a.DV, lane = threadIdx.x % 32;
    for (int r = threadIdx.x / 32; r < nt; r += KILN_ATTN_WARPS) {
        const int64_t t = t0 + r, s = s0 + lane;
        float p = 0, ds = 0;
        if (lane < ns) {
            float dot = 0, dp = 0;
            for (int d = 0; d < D; d++) dot += q_s[r * D + d] * k_s[lane * (D + 1) + d];
            for (int c = 0; c < DV; c++) dp += do_s[r * DV + c] * v_s[lane * (DV + 1) + c];
            const float x = kiln_attn_score(a, dot, b, h, t, s);
            const float pr = x == -INFINITY ? 0.0f : expf(x - lse_s[r]), keep = kiln_attn_keep_at(a, b, h, t, s);
            ds = pr * (dp * keep - delta[r]);
            p = pr * keep;
            if (dmask) dmask[((b * a.H + h) * a.T + t) * a.S + s] = ds;
            ds *= a.scale;
        }
        if (p_s) p_s[r * KILN_ATTN_KEYS + lane] = p;
        ds_s[r * KILN_ATTN_KEYS + lane] = ds;
    }
}

/* The forward: out [B, H, T, DV] by o_st and lse [B, H, T] contiguous (either NULL when
 * not wanted). One block of KILN_ATTN_THREADS per (batch, head, query tile) and key range
 * (splits of them, kiln_attention_fwd_splits; 1: the whole), kiln_attention_fwd_smem(&a)
 * bytes of dynamic shared memory. With splits > 1 each block writes its range's output
 * (not yet divided by the sum), maximum and sum to part, for kiln_attention_combine_block. */
static __device__ void kiln_attention_fwd_block(const kiln_attention &a, const float *q, const float *k, const float *v, float *out, float *lse,
                                                float *part, int splits)
{
    KILN_SHARED_DYNAMIC(float, smem);
    const int R = kiln_attn_rows(&a), D = (int)a.D, DV = (int)a.DV, KP = D + 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t ntiles = (a.T + R - 1) / R, job = blockIdx.x / splits, split = blockIdx.x % splits;
    const int64_t b = job / (a.H * ntiles), h = job / ntiles % a.H, t0 = job % ntiles * R, kvh = h / (a.H / a.kv_heads);
    const int nt = (int)(a.T - t0 < R ? a.T - t0 : R);
    /* q's tile, a tile of keys (rows padded: lane j reads row j), of values, the tile's
     * probabilities, and per row its maximum and sum (two copies: this tile's read while
     * the next are written) and the rescale of its output */
    float *q_s = smem, *k_s = q_s + R * D, *v_s = k_s + KILN_ATTN_KEYS * KP, *p_s = v_s + KILN_ATTN_KEYS * DV;
    float *m_s = p_s + R * KILN_ATTN_KEYS, *l_s = m_s + 2 * R, *r_s = l_s + 2 * R;
    kiln_attn_load(q_s, D, q + b * a.q_st[0] + h * a.q_st[1] + t0 * a.q_st[2], a.q_st[2], a.q_st[3], nt, D);
    for (int i = tid; i < 2 * R; i += KILN_ATTN_THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
    float acc[KILN_ATTN_PAIRS];
    KILN_UNROLL
    for (int i = 0; i < KILN_ATTN_PAIRS; i++) acc[i] = 0;
    int64_t s_end = a.mask == KILN_ATTN_CAUSAL && t0 + nt < a.S ? t0 + nt : a.S; /* keys past the last query: all masked */
    /* this block's range of keys: tiles of 32 in the split's share */
    const int64_t share = ((a.S + splits - 1) / splits + KILN_ATTN_KEYS - 1) / KILN_ATTN_KEYS * KILN_ATTN_KEYS, s_begin = split * share;
    s_end = s_begin + share < s_end ? s_begin + share : s_end;
    int cur = 0;
    for (int64_t s0 = s_begin; s0 < s_end; s0 += KILN_ATTN_KEYS, cur ^= 1) {
        const int ns = (int)(s_end - s0 < KILN_ATTN_KEYS ? s_end - s0 : KILN_ATTN_KEYS);
        __syncthreads(); /* the last tile's readers are done */
        kiln_attn_load(k_s, KP, k + b * a.k_st[0] + kvh * a.k_st[1] + s0 * a.k_st[2], a.k_st[2], a.k_st[3], ns, D);
        kiln_attn_load(v_s, DV, v + b * a.v_st[0] + kvh * a.v_st[1] + s0 * a.v_st[2], a.v_st[2], a.v_st[3], ns, DV);
        __syncthreads();
        for (int r = warp; r < nt; r += KILN_ATTN_WARPS) { /* the online softmax of row r, lane j key s0 + j */
            const int64_t t = t0 + r, s = s0 + lane;
            float x = -INFINITY;
            if (lane < ns) {
                float dot = 0;
                for (int d = 0; d < D; d++) dot += q_s[r * D + d] * k_s[lane * KP + d];
                x = kiln_attn_score(a, dot, b, h, t, s);
            }
            float tile_max = x;
            for (int o = 16; o > 0; o /= 2) tile_max = fmaxf(tile_max, KILN_SHFL_XOR(tile_max, o));
            const float m_old = m_s[cur * R + r], m_new = fmaxf(tile_max, m_old);
            float e = 0, rescale = 1;
            if (m_new != -INFINITY) { /* else nothing kept yet */
                rescale = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                e = x == -INFINITY ? 0.0f : expf(x - m_new);
            }
            float sum = e; /* the butterfly leaves every lane the same bits */
            for (int o = 16; o > 0; o /= 2) sum += KILN_SHFL_XOR(sum, o);
            if (lane == 0) {
                m_s[(cur ^ 1) * R + r] = m_new;
                l_s[(cur ^ 1) * R + r] = l_s[cur * R + r] * rescale + sum;
                r_s[r] = rescale;
            }
            p_s[r * KILN_ATTN_KEYS + lane] = lane < ns ? e * kiln_attn_keep_at(a, b, h, t, s) : 0.0f;
        }
        __syncthreads();
        KILN_UNROLL
        for (int i = 0; i < KILN_ATTN_PAIRS; i++) { /* the output's pairs: o = o · rescale + P v */
            const int idx = tid + i * KILN_ATTN_THREADS, row = idx / DV, d = idx % DV;
            if (row >= nt) continue;
            float o = acc[i] * r_s[row];
            for (int j = 0; j < ns; j++) o += p_s[row * KILN_ATTN_KEYS + j] * v_s[j * DV + d];
            acc[i] = o;
        }
    }
    __syncthreads(); /* the rows' last sums (or, with no keys, their start) */
    if (splits > 1) { /* this range's part: [B, H, T, splits] rows of DV outputs, then the maxima and sums */
        const int64_t rows = a.B * a.H * a.T * splits, first = ((b * a.H + h) * a.T + t0) * splits + split;
        KILN_UNROLL
        for (int i = 0; i < KILN_ATTN_PAIRS; i++) {
            const int idx = tid + i * KILN_ATTN_THREADS, row = idx / DV, d = idx % DV;
            if (row < nt) part[(first + (int64_t)row * splits) * DV + d] = acc[i];
        }
        for (int r = tid; r < nt; r += KILN_ATTN_THREADS) {
            part[rows * DV + first + (int64_t)r * splits] = m_s[cur * R + r];
            part[rows * (DV + 1) + first + (int64_t)r * splits] = l_s[cur * R + r];
        }
        return;
    }
    KILN_UNROLL
    for (int i = 0; i < KILN_ATTN_PAIRS && out; i++) {
        const int idx = tid + i * KILN_ATTN_THREADS, row = idx / DV, d = idx % DV;
        if (row >= nt) continue;
        const float l = l_s[cur * R + row];
        out[b * a.o_st[0] + h * a.o_st[1] + (t0 + row) * a.o_st[2] + d * a.o_st[3]] = l > 0 ? acc[i] * (1.0f / l) : NAN;
    }
    for (int r = tid; r < nt && lse; r += KILN_ATTN_THREADS) {
        const float l = l_s[cur * R + r];
        lse[(b * a.H + h) * a.T + t0 + r] = l > 0 ? m_s[cur * R + r] + logf(l) : NAN;
    }
}

/* The forward's key ranges combined (splits > 1): each element of out (and lse, where
 * not NULL) by one thread, the ranges in order, grid-stride over B·H·T·DV. */
static __device__ void kiln_attention_combine_block(const kiln_attention &a, const float *part, int splits, float *out, float *lse)
{
    const int64_t DV = a.DV, n = a.B * a.H * a.T * DV, rows = a.B * a.H * a.T * splits;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / DV, d = i % DV, t = row % a.T, h = row / a.T % a.H, b = row / (a.T * a.H);
        const float *m = part + rows * DV + row * splits, *l = part + rows * (DV + 1) + row * splits;
        float M = -INFINITY;
        for (int j = 0; j < splits; j++) M = fmaxf(M, m[j]);
        float L = 0, o = 0;
        for (int j = 0; j < splits && M != -INFINITY; j++) {
            const float w = m[j] == -INFINITY ? 0.0f : expf(m[j] - M);
            L += l[j] * w;
            o += part[(row * splits + j) * DV + d] * w;
        }
        if (out) out[b * a.o_st[0] + h * a.o_st[1] + t * a.o_st[2] + d * a.o_st[3]] = L > 0 ? o * (1.0f / L) : NAN;
        if (lse && d == 0) lse[row] = L > 0 ? M + logf(L) : NAN;
    }
}

/* The backward's dK and dV (either NULL when not wanted; dk_st, dv_st, or k's and v's when
 * 0) and an added mask's gradient dmask (contiguous [B, H, T, S], or NULL). One block of
 * KILN_ATTN_THREADS per (batch, key/value head, tile of 32 keys), kiln_attention_dkv_smem(&a)
 * bytes of dynamic shared memory; PK = kiln_attn_kv_pairs(&a). */
template <int PK>
static __device__ void kiln_attention_dkv_block(const kiln_attention &a, const float *q, const float *k, const float *v, const float *out, const float *lse,
                                                const float *dout, float *dk, float *dv, float *dmask)
{
    KILN_SHARED_DYNAMIC(float, smem);
    const int R = kiln_attn_rows(&a), D = (int)a.D, DV = (int)a.DV, tid = threadIdx.x;
    const int64_t ktiles = (a.S + KILN_ATTN_KEYS - 1) / KILN_ATTN_KEYS, job = blockIdx.x, G = a.H / a.kv_heads;
    const int64_t b = job / (a.kv_heads * ktiles), kvh = job / ktiles % a.kv_heads, s0 = job % ktiles * KILN_ATTN_KEYS;
    const int ns = (int)(a.S - s0 < KILN_ATTN_KEYS ? a.S - s0 : KILN_ATTN_KEYS);
    float *k_s = smem, *v_s = k_s + KILN_ATTN_KEYS * (D + 1), *q_s = v_s + KILN_ATTN_KEYS * (DV + 1), *do_s = q_s + R * D;
    float *lse_s = do_s + R * DV, *delta = lse_s + R, *p_s = delta + R, *ds_s = p_s + R * KILN_ATTN_KEYS;
    const int64_t *do_st = a.do_st[2] ? a.do_st : a.o_st;
    kiln_attn_load(k_s, D + 1, k + b * a.k_st[0] + kvh * a.k_st[1] + s0 * a.k_st[2], a.k_st[2], a.k_st[3], ns, D);
    kiln_attn_load(v_s, DV + 1, v + b * a.v_st[0] + kvh * a.v_st[1] + s0 * a.v_st[2], a.v_st[2], a.v_st[3], ns, DV);
    float acc_k[PK], acc_v[PK];
    KILN_UNROLL
    for (int i = 0; i < PK; i++) acc_k[i] = acc_v[i] = 0;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
        for (int64_t t0 = a.mask == KILN_ATTN_CAUSAL ? s0 / R * R : 0; t0 < a.T; t0 += R) { /* causal: queries before s0 see none of these keys */
            const int nt = (int)(a.T - t0 < R ? a.T - t0 : R);
            __syncthreads(); /* the last tile's readers are done (the first time: k_s, v_s loaded) */
            kiln_attn_load(q_s, D, q + b * a.q_st[0] + h * a.q_st[1] + t0 * a.q_st[2], a.q_st[2], a.q_st[3], nt, D);
            kiln_attn_load(do_s, DV, dout + b * do_st[0] + h * do_st[1] + t0 * do_st[2], do_st[2], do_st[3], nt, DV);
            kiln_attn_row_stats(a, out, lse, dout, b, h, t0, nt, lse_s, delta);
            __syncthreads();
            kiln_attn_ds_tile(a, b, h, t0, nt, s0, ns, q_s, do_s, k_s, v_s, lse_s, delta, p_s, ds_s, dmask);
            __syncthreads();
            /* dV += (P ∘ keep)ᵀ dO, dK += dSᵀ q: thread pairs (key j, column c) */
            KILN_UNROLL
            for (int i = 0; i < PK; i++) {
                const int idx = tid + i * KILN_ATTN_THREADS, j = idx / DV, c = idx % DV;
                if (j >= ns || !dv) continue;
                float x = acc_v[i];
                for (int r = 0; r < nt; r++) x += p_s[r * KILN_ATTN_KEYS + j] * do_s[r * DV + c];
                acc_v[i] = x;
            }
            KILN_UNROLL
            for (int i = 0; i < PK; i++) {
                const int idx = tid + i * KILN_ATTN_THREADS, j = idx / D, c = idx % D;
                if (j >= ns || !dk) continue;
                float x = acc_k[i];
                for (int r = 0; r < nt; r++) x += ds_s[r * KILN_ATTN_KEYS + j] * q_s[r * D + c];
                acc_k[i] = x;
            }
        }
    const int64_t *dk_st = a.dk_st[2] ? a.dk_st : a.k_st, *dv_st = a.dv_st[2] ? a.dv_st : a.v_st;
    KILN_UNROLL
    for (int i = 0; i < PK; i++) {
        const int idx = tid + i * KILN_ATTN_THREADS, jv = idx / DV, cv = idx % DV, jk = idx / D, ck = idx % D;
        if (dv && jv < ns) dv[b * dv_st[0] + kvh * dv_st[1] + (s0 + jv) * dv_st[2] + cv * dv_st[3]] = acc_v[i];
        if (dk && jk < ns) dk[b * dk_st[0] + kvh * dk_st[1] + (s0 + jk) * dk_st[2] + ck * dk_st[3]] = acc_k[i];
    }
}

/* The backward's dQ (dq_st, or q's when 0). One block of KILN_ATTN_THREADS per (batch,
 * head, query tile), kiln_attention_dq_smem(&a) bytes of dynamic shared memory. */
static __device__ void kiln_attention_dq_block(const kiln_attention &a, const float *q, const float *k, const float *v, const float *out, const float *lse,
                                               const float *dout, float *dq)
{
    KILN_SHARED_DYNAMIC(float, smem);
    const int R = kiln_attn_rows(&a), D = (int)a.D, DV = (int)a.DV, tid = threadIdx.x;
    const int64_t ntiles = (a.T + R - 1) / R, job = blockIdx.x;
    const int64_t b = job / (a.H * ntiles), h = job / ntiles % a.H, t0 = job % ntiles * R, kvh = h / (a.H / a.kv_heads);
    const int nt = (int)(a.T - t0 < R ? a.T - t0 : R);
    float *k_s = smem, *v_s = k_s + KILN_ATTN_KEYS * (D + 1), *q_s = v_s + KILN_ATTN_KEYS * (DV + 1), *do_s = q_s + R * D;
    float *lse_s = do_s + R * DV, *delta = lse_s + R, *ds_s = delta + R;
    const int64_t *do_st = a.do_st[2] ? a.do_st : a.o_st;
    kiln_attn_load(q_s, D, q + b * a.q_st[0] + h * a.q_st[1] + t0 * a.q_st[2], a.q_st[2], a.q_st[3], nt, D);
    kiln_attn_load(do_s, DV, dout + b * do_st[0] + h * do_st[1] + t0 * do_st[2], do_st[2], do_st[3], nt, DV);
    kiln_attn_row_stats(a, out, lse, dout, b, h, t0, nt, lse_s, delta);
    float acc[KILN_ATTN_PAIRS];
    KILN_UNROLL
    for (int i = 0; i < KILN_ATTN_PAIRS; i++) acc[i] = 0;
    const int64_t s_end = a.mask == KILN_ATTN_CAUSAL && t0 + nt < a.S ? t0 + nt : a.S;
    for (int64_t s0 = 0; s0 < s_end; s0 += KILN_ATTN_KEYS) {
        const int ns = (int)(s_end - s0 < KILN_ATTN_KEYS ? s_end - s0 : KILN_ATTN_KEYS);
        __syncthreads(); /* the last tile's readers are done (the first time: the query tile loaded) */
        kiln_attn_load(k_s, D + 1, k + b * a.k_st[0] + kvh * a.k_st[1] + s0 * a.k_st[2], a.k_st[2], a.k_st[3], ns, D);
        kiln_attn_load(v_s, DV + 1, v + b * a.v_st[0] + kvh * a.v_st[1] + s0 * a.v_st[2], a.v_st[2], a.v_st[3], ns, DV);
        __syncthreads();
        kiln_attn_ds_tile(a, b, h, t0, nt, s0, ns, q_s, do_s, k_s, v_s, lse_s, delta, nullptr, ds_s, nullptr);
        __syncthreads();
        KILN_UNROLL
        for (int i = 0; i < KILN_ATTN_PAIRS; i++) { /* dQ += dS k: thread pairs (row, column) */
            const int idx = tid + i * KILN_ATTN_THREADS, row = idx / D, c = idx % D;
            if (row >= nt) continue;
            float x = acc[i];
            for (int j = 0; j < ns; j++) x += ds_s[row * KILN_ATTN_KEYS + j] * k_s[j * (D + 1) + c];
            acc[i] = x;
        }
    }
    const int64_t *dq_st = a.dq_st[2] ? a.dq_st : a.q_st;
    KILN_UNROLL
    for (int i = 0; i < KILN_ATTN_PAIRS; i++) {
        const int idx = tid + i * KILN_ATTN_THREADS, row = idx / D, c = idx % D;
        if (row < nt) dq[b * dq_st[0] + h * dq_st[1] + (t0 + row) * dq_st[2] + c * dq_st[3]] = acc[i];
    }
}

#endif /* the device code */

#endif
