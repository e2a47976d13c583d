/* attention_kernel.c — runtime/kiln_attention.h's fused attention against the unfused
 * computation the C target runs today (per (batch, head): q kᵀ by sgemm into a [T, S]
 * matrix, the masked softmax, P v by sgemm; the backward from the stored P: dP = dO vᵀ,
 * dS = P ∘ (dP − rowsum(dP ∘ P)), dq = dS k, dk = dSᵀ q, dv = Pᵀ dO), both parallel over
 * OpenMP's threads with single-threaded BLAS, causal, float32. Built and run by
 * bench/attention_kernel.sh; prints seconds (best of REPEAT) and the bytes each keeps
 * between forward and backward. */
#include <cblas.h>
#include <stdio.h>
#include <time.h>

#include "kiln_attention.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int B = argc > 1 ? atoi(argv[1]) : 4, H = argc > 2 ? atoi(argv[2]) : 12, T = argc > 3 ? atoi(argv[3]) : 1024, D = argc > 4 ? atoi(argv[4]) : 64;
    const int repeat = 3;
    kiln_attention a = {.B = B, .H = H, .kv_heads = H, .T = T, .S = T, .D = D, .DV = D, .scale = 1.0f / sqrtf((float)D), .mask = KILN_ATTN_CAUSAL};
    const int64_t st[4] = {(int64_t)H * T * D, (int64_t)T * D, D, 1};
    for (int i = 0; i < 4; i++) a.q_st[i] = a.k_st[i] = a.v_st[i] = a.o_st[i] = st[i];
    const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *g = malloc(n * 4), *dq = malloc(n * 4), *dk = malloc(n * 4),
          *dv = malloc(n * 4), *lse = malloc(rows * 4), *P = malloc((size_t)B * H * T * T * 4);
    if (!q || !k || !v || !o || !g || !dq || !dk || !dv || !lse || !P) return 1;
    for (size_t i = 0; i < n; i++) q[i] = (float)(i % 7) * 0.1f, k[i] = (float)(i % 5) * 0.1f, v[i] = (float)(i % 3) * 0.1f, g[i] = 0.01f;
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        kiln_attention_fwd(&a, q, k, v, o, lse);
        double t1 = now();
        kiln_attention_bwd(&a, q, k, v, o, lse, g, dq, dk, dv, NULL);
        double t2 = now();
#pragma omp parallel for schedule(dynamic, 1)
        for (int bh = 0; bh < B * H; bh++) { /* unfused forward: P stored */
            float *S = P + (size_t)bh * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, a.scale, q + (size_t)bh * T * D, D, k + (size_t)bh * T * D, D, 0, S, T);
            for (int t = 0; t < T; t++) {
                float m = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) m = S[t * T + s] > m ? S[t * T + s] : m;
                for (int s = 0; s < T; s++) sum += S[t * T + s] = s <= t ? expf(S[t * T + s] - m) : 0;
                for (int s = 0; s < T; s++) S[t * T + s] /= sum;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1, S, T, v + (size_t)bh * T * D, D, 0, o + (size_t)bh * T * D, D);
        }
        double t3 = now();
#pragma omp parallel for schedule(dynamic, 1)
        for (int bh = 0; bh < B * H; bh++) { /* unfused backward from P */
            const float *Pm = P + (size_t)bh * T * T, *gb = g + (size_t)bh * T * D;
            float *dP = malloc((size_t)T * T * 4);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1, gb, D, v + (size_t)bh * T * D, D, 0, dP, T);
            for (int t = 0; t < T; t++) {
                float dot = 0;
                for (int s = 0; s < T; s++) dot += dP[t * T + s] * Pm[t * T + s];
                for (int s = 0; s < T; s++) dP[t * T + s] = Pm[t * T + s] * (dP[t * T + s] - dot) * a.scale;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1, dP, T, k + (size_t)bh * T * D, D, 0, dq + (size_t)bh * T * D, D);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1, dP, T, q + (size_t)bh * T * D, D, 0, dk + (size_t)bh * T * D, D);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1, Pm, T, gb, D, 0, dv + (size_t)bh * T * D, D);
            free(dP);
        }
        double t4 = now();
        const double d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
        for (int i = 0; i < 4; i++) best[i] = d[i] < best[i] ? d[i] : best[i];
    }
    printf("B %d, H %d, T %d, D %d, causal: fused forward %.4f s, backward %.4f s, keeps %zu bytes; unfused forward %.4f s, backward %.4f s, "
           "keeps %zu bytes\n",
           B, H, T, D, best[0], best[1], rows * 4, best[2], best[3], (size_t)B * H * T * T * 4);
    return 0;
}
