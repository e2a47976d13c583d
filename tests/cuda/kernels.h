/* kernels.h — host entry points of the dialect test kernels (kernels.cu, misuse.cu,
 * api_compat.cu), callable from the C tests. Each takes and returns host arrays, does its
 * own device allocation, copies and launches, and returns the first CUDA error (0 when
 * all went well). The same files compile with nvcc, so the same entry points can run on a
 * GPU. */
#ifndef KILN_TESTS_CUDA_KERNELS_H
#define KILN_TESTS_CUDA_KERNELS_H

#include <stddef.h>

#include "../../runtime/kiln_attention_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The emulator's module image of driver_api.cu's kernels (kemu_driver.h): kt_drv_axpy
 * (int n, float a, const float *x, float *y: y = a x + y) and kt_drv_fill<double> (double *y,
 * double v, int n). */
const void *kt_driver_image(void);
/* by_name.cu, as a generated model.cu launches under the emulator (found by name in its
 * module table): y = x * scale with blocks of `block` threads (a block over 1024 threads
 * fails the launch); a kernel missing from the table. Each returns how many launch errors
 * it reported. */
int kt_by_name(const float *x, int n, float scale, int block, float *y);
int kt_by_name_missing(void);

/* Sum of x[0..n) by kt_block_sum: grid blocks of block threads (a multiple of 32), then one
 * block over the partial sums. */
int kt_sum(const float *x, int n, int grid, int block, float *sum);
/* Softmax of each row of x (rows x cols), one block of block threads per row. */
int kt_softmax(const float *x, int rows, int cols, int block, float *y);
/* y[i] = a x[i] + tanhf(x[i]) with a grid-stride loop over grid x block threads. */
int kt_axpy_tanh(const float *x, int n, float a, int grid, int block, float *y);
/* Transpose of x (rows x cols, row-major) through a 32x33 shared tile, 32x8 threads. */
int kt_transpose(const float *x, int rows, int cols, float *y);
/* Histogram of values (each in [0, bins)) with int atomicAdd, and the sum of the values as
 * float and as double with atomicAdd. */
int kt_histogram(const int *values, int n, int bins, int grid, int block, int *hist, float *fsum, double *dsum);
/* Reverses each block's chunk of x through dynamic shared memory (n a multiple of block). */
int kt_block_reverse(const float *x, int n, int block, float *y);
/* y[i] = x[i] - x[i-1] within each block's chunk (y = x[i] at the chunk's start), through
 * shared memory; racy = 1 leaves out the __syncthreads between the write and the read. */
int kt_adjacent_diff(const float *x, int n, int block, int racy, float *y);

/* Misuse: each returns the error of its launch (misuse.cu). */
int kt_misuse_barrier_exit(void);      /* half the block returns before a __syncthreads */
int kt_misuse_barrier_sites(void);     /* odd and even threads at different __syncthreads */
int kt_misuse_shfl_partial(void);      /* half a warp at a shuffle */
int kt_misuse_shfl_sites(void);        /* even and odd lanes at different shuffles */
int kt_misuse_shfl_small_block(void);  /* a shuffle in a 48-thread block */
int kt_misuse_shared_limit(void);      /* 40 KiB static + 16 KiB dynamic shared memory */
int kt_misuse_shared_overflow(void);   /* writes one float past a __shared__ array */
int kt_misuse_dynamic_overflow(void);  /* writes one float past dynamic shared memory */
int kt_misuse_block_too_large(void);   /* 2048 threads */
int kt_misuse_dynamic_too_large(void); /* 64 KiB dynamic without cudaFuncSetAttribute */
int kt_misuse_host_pointer(void);      /* a malloc'd pointer as a kernel argument */
int kt_opt_in_shared(void);            /* 64 KiB dynamic after cudaFuncSetAttribute: fine */
/* How many times KILN_LAUNCH reported a failure (KILN_CUDA_ON_ERROR in misuse.cu). */
int kt_misuse_reports(void);

/* attention.cu: the CUDA target's fused attention (kiln_cuda_attention.h) on host arrays
 * of n floats each (mask_bytes bytes of mask; a's mask pointers are set to its copy).
 * Without dout the forward: out (if want_out; else left as it was) and lse, both read in
 * first so that what the kernel does not write stays. With dout the backward, reading out
 * and lse: dq, dk, dv, dmask where not NULL (read in first too). q, k and v may be views
 * into one array (passed as each of them): k_at and v_at elements into it. */
typedef struct {
    const float *q, *k, *v, *dout;
    const void *mask;
    size_t nq, nk, nv, nout, nlse, ndmask, mask_bytes, k_at, v_at;
    float *out, *lse, *dq, *dk, *dv, *dmask;
    int want_out;
} KtAttentionArrays;
int kt_attention(const kiln_attention *a, const KtAttentionArrays *x);
/* The key ranges kt_attention's forward splits a's keys into (a model.cu step's 64 KiB of
 * partials). */
int kt_attention_splits(const kiln_attention *a);

/* api_compat.cu: a tour of the runtime subset (memory, copies, streams, events, device
 * queries, errors); returns 0 or the line of the first check that failed. */
int kt_api_tour(void);

#ifdef __cplusplus
}
#endif

#endif
