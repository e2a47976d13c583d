/* emu_blas.h — what test_cuda_emu_blas.c (cuBLAS) and test_cuda_emu_lt.c (cuBLASLt) share:
 * random fills, device copies in fp32 or as bf16/fp16 bits, and the naive column-major
 * product in double that both check the emulator against. */
#ifndef KILN_TESTS_EMU_BLAS_H
#define KILN_TESTS_EMU_BLAS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../emu/kemu_cublas.h"
#include "../emu/kemu_runtime.h"
#include "../runtime/kiln_half.h"

static inline void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = -1.0f + 2.0f * (float)(seed >> 8) / 16777216.0f;
    }
}

/* A device copy of n host floats. */
static inline float *to_device(const float *h, size_t n)
{
    float *d = NULL;
    cr_assert_eq(cudaMalloc((void **)&d, n * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static inline void to_host(float *h, const float *d, size_t n)
{
    cr_assert_eq(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
}

static inline const char *type_name(cudaDataType t) { return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : "fp32"; }

/* x rounded to type t (fp32: unchanged), as a float. */
static inline float round_to(cudaDataType t, float x)
{
    return t == CUDA_R_16BF ? kiln_bf16_round(x) : t == CUDA_R_16F ? kiln_f16_round(x) : x;
}

static inline uint16_t half_bits(cudaDataType t, float x) { return t == CUDA_R_16BF ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x); }
static inline float half_value(cudaDataType t, uint16_t h) { return t == CUDA_R_16BF ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h); }

/* A device copy of n host floats stored as type t (fp32, or the bits of bf16/fp16, which
 * must hold each value exactly: round_to first). */
static inline void *to_device_as(cudaDataType t, const float *h, size_t n)
{
    if (t == CUDA_R_32F) return to_device(h, n);
    uint16_t *bits = malloc(n * sizeof *bits), *d = NULL;
    cr_assert(bits);
    for (size_t i = 0; i < n; i++) {
        bits[i] = half_bits(t, h[i]);
        cr_assert(isnan(h[i]) || half_value(t, bits[i]) == h[i], "%s does not hold %.9g", type_name(t), h[i]);
    }
    cr_assert_eq(cudaMalloc((void **)&d, n * sizeof *d), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d, bits, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    free(bits);
    return d;
}

/* op(X)[i, j] of a column-major X with leading dimension ld. */
static inline double at(const float *x, int ld, int trans, int i, int j)
{
    return trans ? x[j + (size_t)i * ld] : x[i + (size_t)j * ld];
}

/* C = alpha op(A) op(B) + beta C in double (beta 0: C is not read). */
static inline void reference(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, double *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
            double c = beta == 0.0f ? 0.0 : beta * C[i + (size_t)j * ldc];
            C[i + (size_t)j * ldc] = alpha * s + c;
        }
}

static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
/* The operand types of the mixed-precision calls. */
static const cudaDataType types[] = {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F};

#endif
