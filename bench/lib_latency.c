/* lib_latency.c — bench/infer.sh's program over mlp's embeddable library (kiln build
 * --lib): batch-1 latency of mlp_run, the figure to set beside PyTorch eager's
 * model(images[i:i+1]) (bench/infer_torch.py latency) and the inference program's.
 *
 *   lib_latency WEIGHTS.safetensors IMAGES.npy THREADS
 *
 * Binds the weights, runs image 0 once untimed, then each image of IMAGES.npy (u8[N, 28,
 * 28]) at batch 1, timing every call; prints `bench: {"images": N, "median_us": ...,
 * "mean_us": ..., "floor_us": ...}` (the mean over the whole loop, as infer_torch.py's).
 * floor_us is the median time of one cblas_sasum over the bound weights (OpenBLAS's
 * vectorised read of every weight byte once, from cache, on one thread): batch 1 is a
 * chain of matrix-vector products that read every weight once, so no fp32 program runs
 * an image in less, whatever its kernels. Denormals are
 * flushed to zero here, before any thread starts, as Kiln's programs do: the library
 * leaves the floating-point environment to its caller (docs/library.md). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xmmintrin.h>
#include <pmmintrin.h>

#include <cblas.h>

#include "mlp.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = size > 0 ? malloc((size_t)size) : NULL;
    *n = b ? fread(b, 1, (size_t)size, f) : 0;
    fclose(f);
    return b;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) return fprintf(stderr, "usage: lib_latency WEIGHTS.safetensors IMAGES.npy THREADS\n"), 2;
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    _Alignas(MLP_ALIGN) static unsigned char weights[MLP_WEIGHTS_BYTES], workspace[MLP_WORKSPACE_BYTES];
    char msg[512];
    size_t nw = 0, ni = 0;
    unsigned char *w = read_all(argv[1], &nw), *npy = read_all(argv[2], &ni);
    if (!w || !npy || ni < 10 || memcmp(npy, "\x93NUMPY", 6)) return fprintf(stderr, "lib_latency: cannot read %s or %s\n", argv[1], argv[2]), 1;
    size_t header = 10 + (size_t)(npy[8] | npy[9] << 8);
    long n = (long)((ni - header) / MLP_IMAGE_SAMPLE_ELEMS);
    const uint8_t *images = npy + header;
    mlp_instance m;
    if (mlp_init(&m, weights, sizeof weights, workspace, sizeof workspace, msg, sizeof msg) || mlp_bind(&m, w, nw, msg, sizeof msg) ||
        mlp_set_threads(&m, atoi(argv[3])))
        return fprintf(stderr, "lib_latency: %s\n", msg), 1;
    free(w);
    float logits[MLP_LOGITS_SAMPLE_ELEMS];
    double *t = malloc(sizeof *t * (size_t)n);
    if (!t || n < 1 || mlp_run(&m, 1, images, logits, msg, sizeof msg)) return fprintf(stderr, "lib_latency: %s\n", msg), 1;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        double s = now();
        if (mlp_run(&m, 1, images + i * MLP_IMAGE_SAMPLE_ELEMS, logits, msg, sizeof msg)) return fprintf(stderr, "lib_latency: %s\n", msg), 1;
        t[i] = now() - s;
    }
    double total = now() - t0;
    qsort(t, (size_t)n, sizeof *t, by_value);
    double median = t[n / 2];
    openblas_set_num_threads(1);
    volatile float sink = 0;
    for (long i = 0; i < n; i++) {
        double s = now();
        sink += cblas_sasum((int)(MLP_WEIGHTS_BYTES / sizeof(float)), (const float *)(const void *)weights, 1);
        t[i] = now() - s;
    }
    (void)sink;
    qsort(t, (size_t)n, sizeof *t, by_value);
    printf("bench: {\"images\": %ld, \"median_us\": %.2f, \"mean_us\": %.2f, \"floor_us\": %.2f}\n", n, 1e6 * median,
           1e6 * total / (double)n, 1e6 * t[n / 2]);
    free(t);
    free(npy);
    return 0;
}
