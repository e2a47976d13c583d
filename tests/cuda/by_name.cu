// by_name.cu — kernels launched as a generated model.cu launches them under the emulator
// (KILN_CUDA_BY_NAME): found by name in the file's module table (KILN_CUDA_MODULE) and
// launched through the driver API, the arguments converted to the parameters' types. The
// table here lacks one kernel on purpose, to check what a launch of it says.
// KILN_CUDA_ON_ERROR counts the launches' reports instead of exiting.
#define KILN_CUDA_BY_NAME 1
static int kt_bn_reports;
#define KILN_CUDA_ON_ERROR() (void)(kt_bn_reports++)
#include "kiln_cuda.h"

#include "kernels.h"

// y[i] = x[i] * s for i < n: an int64_t count, a double scale (the launch passes an int and
// a float: converted to the parameters' types, as CUDA converts them).
__global__ void kt_bn_scale(int64_t n, double s, const float *x, float *y)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = (float)(x[i] * s);
}

// Not in the module table below.
__global__ void kt_bn_missing(float *y) { y[threadIdx.x] = 0; }

#define KT_BN_KERNELS(X) X(kt_bn_scale)
KILN_CUDA_MODULE(KT_BN_KERNELS);

extern "C" int kt_by_name(const float *x, int n, float scale, int block, float *y)
{
    kt_bn_reports = 0;
    float *dx, *dy;
    cudaMalloc(&dx, sizeof(float) * (size_t)n);
    cudaMalloc(&dy, sizeof(float) * (size_t)n);
    cudaMemcpy(dx, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    KILN_LAUNCH_AT("by_name.cu: scale", kt_bn_scale, (n + block - 1) / block, block, 0, nullptr, n, scale, dx, dy);
    cudaMemcpy(y, dy, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dy);
    return kt_bn_reports;
}

extern "C" int kt_by_name_missing(void)
{
    kt_bn_reports = 0;
    float *dy;
    cudaMalloc(&dy, 64 * sizeof(float));
    KILN_LAUNCH_AT("by_name.cu: missing", kt_bn_missing, 1, 32, 0, nullptr, dy);
    cudaFree(dy);
    return kt_bn_reports;
}
