/* sgemm.c — the BLAS rate bench/run.sh measures training steps against: times OpenBLAS's
 * cblas_sgemm (linked as the training programs link it, default threads) on 1024^3 and on
 * the matrix-product shapes a Kiln program lists in its bench line, so a step's GEMM rate
 * can be put as a fraction of what sgemm itself reaches on the same shapes.
 *
 *   sgemm [SHAPE ...]      SHAPE = batch,M,N,K,trans_a,trans_b,count  (a `gemms` entry)
 *
 * Prints one line: sgemm: {"threads": .., "square1024_gflops": .., "shapes": [{"shape":
 * [..], "ms_per_call": .., "gflops": ..}, ..], "flops": .., "ms": .., "gflops": ..} where
 * a call is `batch` products (as Kiln makes them), flops and ms add up count calls of every
 * shape, and gflops = flops / ms: the sgemm rate for the step's own mix of shapes. Times
 * are the best of repeated calls. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

typedef struct {
    long long batch, m, n, k, ta, tb, count;
} Shape;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *filled(size_t n)
{
    float *p = malloc(n * sizeof *p + 64);
    if (!p) {
        fprintf(stderr, "sgemm: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* Milliseconds of one call (batch products), the best of the calls made after one untimed
 * call until 0.3 s have passed (at least 3, at most 200): what the library can do on the
 * shape, the least disturbed by other work on the machine. */
static double time_shape(const Shape *s)
{
    size_t a = (size_t)(s->m * s->k), b = (size_t)(s->k * s->n), c = (size_t)(s->m * s->n);
    float *A = filled(a * (size_t)s->batch), *B = filled(b * (size_t)s->batch), *C = filled(c * (size_t)s->batch);
    int lda = (int)(s->ta ? s->m : s->k), ldb = (int)(s->tb ? s->k : s->n);
    double t[200], start = 0;
    int n = 0;
    for (int rep = -1; rep < 200; rep++) {
        double t0 = now();
        for (long long i = 0; i < s->batch; i++)
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n,
                        (int)s->k, 1.0f, A + i * a, lda, B + i * b, ldb, 0.0f, C + i * c, (int)s->n);
        double t1 = now();
        if (rep < 0) continue;
        if (rep == 0) start = t0;
        t[n++] = 1e3 * (t1 - t0);
        if (n >= 3 && t1 - start > 0.3) break;
    }
    free(A);
    free(B);
    free(C);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[0];
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: sgemm [batch,M,N,K,trans_a,trans_b,count ...]\n");
        return 0;
    }
    Shape sq = {1, 1024, 1024, 1024, 0, 0, 1};
    double sq_ms = time_shape(&sq);
    printf("sgemm: {\"threads\": %d, \"square1024_gflops\": %.2f, \"shapes\": [", openblas_get_num_threads(),
           2.0 * 1024 * 1024 * 1024 / sq_ms / 1e6);
    double flops = 0, ms = 0;
    for (int i = 1; i < argc; i++) {
        Shape s;
        char extra;
        if (sscanf(argv[i], "%lld,%lld,%lld,%lld,%lld,%lld,%lld%c", &s.batch, &s.m, &s.n, &s.k, &s.ta, &s.tb, &s.count, &extra) != 7 ||
            s.batch < 1 || s.m < 1 || s.n < 1 || s.k < 1 || s.count < 1) {
            fprintf(stderr, "\nsgemm: '%s' is not a shape batch,M,N,K,trans_a,trans_b,count\n", argv[i]);
            return 2;
        }
        double t = time_shape(&s), f = 2.0 * (double)s.batch * (double)s.m * (double)s.n * (double)s.k;
        printf("%s{\"shape\": [%lld, %lld, %lld, %lld, %lld, %lld, %lld], \"ms_per_call\": %.4f, \"gflops\": %.2f}", i > 1 ? ", " : "",
               s.batch, s.m, s.n, s.k, s.ta, s.tb, s.count, t, f / t / 1e6);
        flops += f * (double)s.count;
        ms += t * (double)s.count;
    }
    printf("], \"flops\": %.6g, \"ms\": %.4f, \"gflops\": %.2f}\n", flops, ms, ms > 0 ? flops / ms / 1e6 : 0.0);
    return 0;
}
