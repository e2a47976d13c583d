// example.cu — a whole program in Kiln's CUDA dialect, built the way `kiln build --target
// cuda-emu` will build a model.cu (g++ -DKILN_CUDA_EMU -x c++ example.cu -x none
// libkiln_cuda_emu.a -lopenblas) by tests/test_cuda_emu.c, and by nvcc in
// tests/test_cuda_emu_nvcc.c. Its first kernel is the example of docs/cuda.md. Prints three
// values of the result; with the argument "misuse" it then launches a kernel whose barrier
// half the block skips, and KILN_LAUNCH_AT must stop the program with exit status 1.
#include "kiln_cuda.h"

#include <stdio.h>
#include <string.h>

// model.kiln:7 — y = x / max|x| per row. Launch: one block of 256 threads per row.
__global__ void k7_row_scale(const float *x, float *y, int cols)
{
    KILN_SHARED(float, warp_max, [32]);                  // one slot per warp
    const float *xr = x + (size_t)blockIdx.x * cols;
    float m = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, KILN_SHFL_XOR(m, o));  // warp max, all lanes
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();                                     // reached by every thread
    m = warp_max[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) m = fmaxf(m, warp_max[w]);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[(size_t)blockIdx.x * cols + j] = xr[j] / m;
}

// Launch: one block of 64 threads. Threads 32-63 return before the barrier.
__global__ void k9_bad_barrier(float *y)
{
    if (threadIdx.x >= 32) return;
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}

int main(int argc, char **argv)
{
    const int rows = 4, cols = 1000;
    static float h[rows * cols];
    for (int i = 0; i < rows * cols; i++) h[i] = (float)(i % 10) - 4.0f;
    float *x = nullptr, *y = nullptr;
    cudaStream_t stream;
    KILN_CUDA_CHECK(cudaStreamCreate(&stream));
    KILN_CUDA_CHECK(cudaMalloc(&x, sizeof h));
    KILN_CUDA_CHECK(cudaMalloc(&y, sizeof h));
    KILN_CUDA_CHECK(cudaMemcpyAsync(x, h, sizeof h, cudaMemcpyHostToDevice, stream));
    KILN_LAUNCH_AT("model.kiln:7: row_scale", k7_row_scale, rows, 256, 0, stream, x, y, cols);
    KILN_CUDA_CHECK(cudaMemcpyAsync(h, y, sizeof h, cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_SYNC(stream);
    printf("%g %g %g\n", h[0], h[5], h[rows * cols - 1]);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "misuse") == 0)
        KILN_LAUNCH_AT("model.kiln:9: bad_barrier", k9_bad_barrier, 1, 64, 0, stream, y);
    KILN_CUDA_CHECK(cudaFree(x));
    KILN_CUDA_CHECK(cudaFree(y));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
