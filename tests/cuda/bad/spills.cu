// spills.cu — a kernel that ptxas must spill when held to 16 registers (-maxrregcount=16):
// tests/test_cuda_emu_nvcc.c compiles it so to prove that its check sees spills at all.
// Not a dialect test file; nothing runs it.
#include "kiln_cuda.h"

// Launch: any 1-D shape. 32 accumulators live across the loop, more than 16 registers hold.
__global__ void kt_many_live(const float *x, float *y, int n)
{
    float a[32];
#pragma unroll
    for (int j = 0; j < 32; j++) a[j] = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
#pragma unroll
        for (int j = 0; j < 32; j++) a[j] = a[j] * x[i] + (float)j;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) s += a[j] * (float)(j + 1);
    y[threadIdx.x] = s;
}
