// kernels.cu — test kernels written in Kiln's CUDA dialect (runtime/cuda/kiln_cuda.h), the
// shapes the CUDA target will generate: block reductions with shared memory and warp
// shuffles, a softmax with one block per row, a grid-stride elementwise kernel, a tiled
// transpose (2-D blocks, a 2-D shared array), atomics on global and shared memory, dynamic
// shared memory, and a kernel with an optional missing barrier for the order modes.
// tests/test_cuda_emu.c runs them under the emulator; tests/test_cuda_emu_nvcc.c compiles
// this file with nvcc for sm_80 and sm_90 and fails on ptxas spills. Each kernel's comment
// gives its launch shape and what one thread does.
#include "kiln_cuda.h"

#include "kernels.h"

#include <math.h>

// The sum of v over the warp, in lane 0 (other lanes hold partial sums).
static __device__ __forceinline__ float kt_warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset /= 2) v += KILN_SHFL_DOWN(v, offset);
    return v;
}

// The sum or the maximum of v over the warp, in every lane (butterfly exchange).
template <bool MAX> static __device__ __forceinline__ float kt_warp_all(float v)
{
    for (int mask = 16; mask > 0; mask /= 2) {
        float o = KILN_SHFL_XOR(v, mask);
        v = MAX ? fmaxf(v, o) : v + o;
    }
    return v;
}

// The sum or maximum of v over the block, in every thread; red holds one value per warp.
// The first barrier keeps a previous call's readers of red from seeing this call's writes.
template <bool MAX> static __device__ float kt_block_all(float v, float *red)
{
    int lane = threadIdx.x % KILN_WARP_SIZE, warp = threadIdx.x / KILN_WARP_SIZE;
    int nwarps = blockDim.x / KILN_WARP_SIZE;
    v = kt_warp_all<MAX>(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nwarps ? red[lane] : (MAX ? -INFINITY : 0.0f);
    return kt_warp_all<MAX>(v);
}

// Launch: 1-D grid, blockDim.x a multiple of 32. A thread sums its grid-stride share of x;
// warps reduce with shuffles, warp 0 reduces the per-warp sums from shared memory;
// partial[blockIdx.x] = the block's sum.
static __global__ void kt_block_sum(const float *x, int n, float *partial)
{
    KILN_SHARED(float, warp_sums, [32]);
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += x[i];
    v = kt_warp_sum(v);
    int lane = threadIdx.x % KILN_WARP_SIZE, warp = threadIdx.x / KILN_WARP_SIZE;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / KILN_WARP_SIZE) ? warp_sums[lane] : 0.0f;
        v = kt_warp_sum(v);
        if (lane == 0) partial[blockIdx.x] = v;
    }
}

// Launch: one block per row, blockDim.x a multiple of 32. y[row] = softmax(x[row]): the
// block finds the row's maximum, then the sum of exponentials, then writes.
static __global__ void kt_softmax_rows(const float *x, float *y, int cols)
{
    KILN_SHARED(float, red, [32]);
    const float *xr = x + (size_t)blockIdx.x * cols;
    float *yr = y + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = kt_block_all<true>(m, red);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
    s = kt_block_all<false>(s, red);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

// Launch: any 1-D grid and block. y[i] = a x[i] + tanh(x[i]) for the thread's grid-stride
// share of i.
static __global__ void kt_axpy_tanh_kernel(const float *x, int n, float a, float *y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + tanhf(x[i]);
}

// Launch: grid (ceil(cols/32), ceil(rows/32)), block (32, 8). A block moves one 32x32 tile
// of x (rows x cols) to y (cols x rows): each thread reads 4 elements of a tile column into
// shared memory, then writes 4 of the transposed tile. The 33rd column keeps the threads of
// a warp on different banks when they read a tile column.
static __global__ void kt_transpose_kernel(const float *x, float *y, int rows, int cols)
{
    KILN_SHARED(float, tile, [32][33]);
    int c = blockIdx.x * 32 + threadIdx.x;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int r = blockIdx.y * 32 + j;
        if (r < rows && c < cols) tile[j][threadIdx.x] = x[(size_t)r * cols + c];
    }
    __syncthreads();
    int yc = blockIdx.y * 32 + threadIdx.x;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int yr = blockIdx.x * 32 + j;
        if (yr < cols && yc < rows) y[(size_t)yr * rows + yc] = tile[threadIdx.x][j];
    }
}

// Launch: any 1-D grid, bins <= 256. A block counts its grid-stride share of values into a
// shared histogram (atomics on shared memory), then adds it to hist; every thread also
// adds its values to *fsum and *dsum (float and double atomics on global memory).
static __global__ void kt_histogram_kernel(const int *values, int n, int bins, int *hist, float *fsum, double *dsum)
{
    KILN_SHARED(int, local, [256]);
    for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        int v = values[i];
        atomicAdd(&local[v], 1);
        atomicAdd(fsum, (float)v);
        atomicAdd(dsum, (double)v);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        if (local[b]) atomicAdd(&hist[b], local[b]);
}

// Launch: 1-D, one element per thread, blockDim.x floats of dynamic shared memory. A block
// reverses its chunk of x.
static __global__ void kt_block_reverse_kernel(const float *x, float *y)
{
    KILN_SHARED_DYNAMIC(float, s);
    int base = blockIdx.x * blockDim.x;
    s[threadIdx.x] = x[base + threadIdx.x];
    __syncthreads();
    y[base + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Launch: 1-D, one element per thread, blockDim.x <= 1024. y[i] = x[i] - x[i-1] inside the
// block's chunk, through shared memory. With racy, the barrier between the write of s[t]
// and the read of s[t-1] is missing: a data race that forward order happens to hide (thread
// t-1 has always run first) and reverse order exposes.
static __global__ void kt_adjacent_diff_kernel(const float *x, float *y, int racy)
{
    KILN_SHARED(float, s, [1024]);
    int t = threadIdx.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + t;
    s[t] = x[i];
    if (!racy) __syncthreads();
    y[i] = t > 0 ? s[t] - s[t - 1] : s[t];
}

// ---- host entry points ----------------------------------------------------------------

#define KT_TRY(call)                               \
    do {                                           \
        cudaError_t kt_err_ = (call);              \
        if (kt_err_ != cudaSuccess) return (int)kt_err_; \
    } while (0)

// Device memory freed when it goes out of scope, so that early returns do not leak.
namespace {
template <typename T> struct DevBuf {
    T *p = nullptr;
    ~DevBuf()
    {
        if (p) cudaFree(p);
    }
    cudaError_t alloc(size_t n) { return cudaMalloc(&p, n * sizeof(T)); }
};
} // namespace

extern "C" int kt_sum(const float *x, int n, int grid, int block, float *sum)
{
    DevBuf<float> dx, dpart, dsum;
    KT_TRY(dx.alloc((size_t)n));
    KT_TRY(dpart.alloc((size_t)grid));
    KT_TRY(dsum.alloc(1));
    KT_TRY(cudaMemcpy(dx.p, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    KILN_LAUNCH(kt_block_sum, grid, block, 0, 0, dx.p, n, dpart.p);
    KILN_LAUNCH(kt_block_sum, 1, 1024, 0, 0, dpart.p, grid, dsum.p);
    KT_TRY(cudaMemcpy(sum, dsum.p, sizeof(float), cudaMemcpyDeviceToHost));
    return (int)cudaDeviceSynchronize();
}

extern "C" int kt_softmax(const float *x, int rows, int cols, int block, float *y)
{
    DevBuf<float> dx, dy;
    size_t n = (size_t)rows * cols;
    KT_TRY(dx.alloc(n));
    KT_TRY(dy.alloc(n));
    cudaStream_t stream;
    KT_TRY(cudaStreamCreate(&stream));
    KT_TRY(cudaMemcpyAsync(dx.p, x, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    KILN_LAUNCH_AT("tests/cuda/kernels.cu: softmax rows", kt_softmax_rows, rows, block, 0, stream, dx.p, dy.p, cols);
    KT_TRY(cudaMemcpyAsync(y, dy.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    KT_TRY(cudaStreamSynchronize(stream));
    KT_TRY(cudaStreamDestroy(stream));
    return 0;
}

extern "C" int kt_axpy_tanh(const float *x, int n, float a, int grid, int block, float *y)
{
    DevBuf<float> dx, dy;
    KT_TRY(dx.alloc((size_t)n));
    KT_TRY(dy.alloc((size_t)n));
    KT_TRY(cudaMemcpy(dx.p, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    KILN_LAUNCH(kt_axpy_tanh_kernel, grid, block, 0, 0, dx.p, n, a, dy.p);
    KT_TRY(cudaMemcpy(y, dy.p, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int kt_transpose(const float *x, int rows, int cols, float *y)
{
    DevBuf<float> dx, dy;
    size_t n = (size_t)rows * cols;
    KT_TRY(dx.alloc(n));
    KT_TRY(dy.alloc(n));
    KT_TRY(cudaMemcpy(dx.p, x, n * sizeof(float), cudaMemcpyHostToDevice));
    dim3 grid((unsigned)(cols + 31) / 32, (unsigned)(rows + 31) / 32);
    dim3 block(32, 8);
    KILN_LAUNCH(kt_transpose_kernel, grid, block, 0, 0, dx.p, dy.p, rows, cols);
    KT_TRY(cudaMemcpy(y, dy.p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int kt_histogram(const int *values, int n, int bins, int grid, int block, int *hist, float *fsum,
                            double *dsum)
{
    DevBuf<int> dv, dh;
    DevBuf<float> df;
    DevBuf<double> dd;
    KT_TRY(dv.alloc((size_t)n));
    KT_TRY(dh.alloc((size_t)bins));
    KT_TRY(df.alloc(1));
    KT_TRY(dd.alloc(1));
    KT_TRY(cudaMemcpy(dv.p, values, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    KT_TRY(cudaMemset(dh.p, 0, (size_t)bins * sizeof(int)));
    KT_TRY(cudaMemset(df.p, 0, sizeof(float)));
    KT_TRY(cudaMemset(dd.p, 0, sizeof(double)));
    KILN_LAUNCH(kt_histogram_kernel, grid, block, 0, 0, dv.p, n, bins, dh.p, df.p, dd.p);
    KT_TRY(cudaMemcpy(hist, dh.p, (size_t)bins * sizeof(int), cudaMemcpyDeviceToHost));
    KT_TRY(cudaMemcpy(fsum, df.p, sizeof(float), cudaMemcpyDeviceToHost));
    KT_TRY(cudaMemcpy(dsum, dd.p, sizeof(double), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int kt_block_reverse(const float *x, int n, int block, float *y)
{
    DevBuf<float> dx, dy;
    KT_TRY(dx.alloc((size_t)n));
    KT_TRY(dy.alloc((size_t)n));
    KT_TRY(cudaMemcpy(dx.p, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    KILN_LAUNCH(kt_block_reverse_kernel, n / block, block, (size_t)block * sizeof(float), 0, dx.p, dy.p);
    KT_TRY(cudaMemcpy(y, dy.p, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int kt_adjacent_diff(const float *x, int n, int block, int racy, float *y)
{
    DevBuf<float> dx, dy;
    KT_TRY(dx.alloc((size_t)n));
    KT_TRY(dy.alloc((size_t)n));
    KT_TRY(cudaMemcpy(dx.p, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    KILN_LAUNCH(kt_adjacent_diff_kernel, n / block, block, 0, 0, dx.p, dy.p, racy);
    KT_TRY(cudaMemcpy(y, dy.p, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}
