// misuse.cu — kernels and launches that break the dialect's run-time rules, each in one
// way, so that tests/test_cuda_emu.c can check the emulator reports it (what, where, which
// threads). They are valid CUDA as far as the compiler can tell (tests/test_cuda_emu_nvcc.c
// compiles this file too); on a GPU they hang, give undefined results or fail at launch.
// KILN_CUDA_ON_ERROR counts KILN_LAUNCH's reports instead of exiting, so the entry points
// can return the launch's error.
static int kt_reports;
#define KILN_CUDA_ON_ERROR() (void)(kt_reports++)
#include "kiln_cuda.h"

#include "kernels.h"

#include <stdlib.h>

// Launch: 64 threads. Threads 32-63 return before the barrier the others wait at.
static __global__ void kt_barrier_exit(float *out)
{
    if (threadIdx.x >= 32) return;
    out[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] += 1.0f;
}

// Launch: 64 threads. Odd and even threads wait at two different barriers.
static __global__ void kt_barrier_sites(float *out)
{
    if (threadIdx.x % 2) {
        out[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        out[threadIdx.x] = 2.0f;
        __syncthreads();
    }
}

// Launch: 32 threads. Lanes 0-15 shuffle, lanes 16-31 do not.
static __global__ void kt_shfl_partial(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v = KILN_SHFL_DOWN(v, 1);
    out[threadIdx.x] = v;
}

// Launch: 32 threads. Even lanes shuffle at one line, odd lanes at another.
static __global__ void kt_shfl_sites(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x % 2)
        v = KILN_SHFL_DOWN(v, 1);
    else
        v = KILN_SHFL_UP(v, 1);
    out[threadIdx.x] = v;
}

// Launch: 48 threads, so the second warp has 16 lanes; all of them shuffle.
static __global__ void kt_shfl_small_block(float *out)
{
    out[threadIdx.x] = KILN_SHFL_XOR((float)threadIdx.x, 1);
}

// Launch: 32 threads, 16 KiB of dynamic shared memory: with the 40 KiB array, 56 KiB, over
// the 48 KiB a block gets without opting in.
static __global__ void kt_shared_limit(float *out)
{
    KILN_SHARED(float, big, [10240]);
    KILN_SHARED_DYNAMIC(float, dyn);
    big[threadIdx.x] = (float)threadIdx.x;
    dyn[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = big[31 - threadIdx.x] + dyn[threadIdx.x];
}

// Launch: 33 threads. The array has 32 floats; thread 32 writes past it.
static __global__ void kt_shared_overflow(float *out)
{
    KILN_SHARED(float, s, [32]);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x % 32];
}

// Launch: 33 threads, 32 floats of dynamic shared memory; thread 32 writes past them.
static __global__ void kt_dynamic_overflow(float *out)
{
    KILN_SHARED_DYNAMIC(float, s);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x % 32];
}

// Launch: 1024 threads and the given dynamic shared memory; a block sums a column of it.
static __global__ void kt_dynamic_shared(float *out, int floats)
{
    KILN_SHARED_DYNAMIC(float, s);
    for (int i = threadIdx.x; i < floats; i += blockDim.x) s[i] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int i = 0; i < floats; i++) sum += s[i];
        out[0] = sum;
    }
}

// Any launch: writes its thread index.
static __global__ void kt_write_index(float *out) { out[blockIdx.x * blockDim.x + threadIdx.x] = (float)threadIdx.x; }

namespace {
// A device buffer of n floats for the duration of one entry point.
struct Out {
    float *p = nullptr;
    explicit Out(size_t n) { (void)cudaMalloc(&p, n * sizeof(float)); }
    ~Out()
    {
        if (p) cudaFree(p);
    }
};
} // namespace

// The launch's error: cudaGetLastError right after KILN_LAUNCH (which has already taken it
// to print its report) would say nothing, so ask for the sticky state with a synchronise,
// or the launch error that KILN_LAUNCH reported.
static int launch_result(int reports_before)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return (int)e;
    return kt_reports > reports_before ? -1 : 0;
}

extern "C" int kt_misuse_reports(void) { return kt_reports; }

extern "C" int kt_misuse_barrier_exit(void)
{
    Out out(64);
    int before = kt_reports;
    KILN_LAUNCH(kt_barrier_exit, 1, 64, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_barrier_sites(void)
{
    Out out(64);
    int before = kt_reports;
    KILN_LAUNCH(kt_barrier_sites, 1, 64, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_shfl_partial(void)
{
    Out out(32);
    int before = kt_reports;
    KILN_LAUNCH(kt_shfl_partial, 1, 32, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_shfl_sites(void)
{
    Out out(32);
    int before = kt_reports;
    KILN_LAUNCH(kt_shfl_sites, 1, 32, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_shfl_small_block(void)
{
    Out out(48);
    int before = kt_reports;
    KILN_LAUNCH(kt_shfl_small_block, 1, 48, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_shared_limit(void)
{
    Out out(32);
    int before = kt_reports;
    KILN_LAUNCH(kt_shared_limit, 1, 32, 16384, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_shared_overflow(void)
{
    Out out(33);
    int before = kt_reports;
    KILN_LAUNCH(kt_shared_overflow, 1, 33, 0, 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_dynamic_overflow(void)
{
    Out out(33);
    int before = kt_reports;
    KILN_LAUNCH(kt_dynamic_overflow, 1, 33, 32 * sizeof(float), 0, out.p);
    return launch_result(before);
}

extern "C" int kt_misuse_block_too_large(void)
{
    Out out(2048);
    int before = kt_reports;
    KILN_LAUNCH(kt_write_index, 1, 2048, 0, 0, out.p);
    // A configuration error is not sticky: the launch reported it, nothing else failed.
    return kt_reports > before ? (int)cudaErrorInvalidConfiguration : (int)cudaDeviceSynchronize();
}

extern "C" int kt_misuse_dynamic_too_large(void)
{
    Out out(1);
    int before = kt_reports;
    KILN_LAUNCH(kt_dynamic_shared, 1, 1024, 65536, 0, out.p, 16384);
    return kt_reports > before ? (int)cudaErrorInvalidValue : (int)cudaDeviceSynchronize();
}

extern "C" int kt_misuse_host_pointer(void)
{
    float *host = static_cast<float *>(calloc(32, sizeof(float)));
    int before = kt_reports;
    KILN_LAUNCH(kt_write_index, 1, 32, 0, 0, host);
    free(host);
    return launch_result(before);
}

// Not a misuse: above 48 KiB after opting in, as on the GPU. Returns 0 when the sum of the
// 16384 ones comes back.
extern "C" int kt_opt_in_shared(void)
{
    Out out(1);
    int before = kt_reports;
    cudaError_t e = cudaFuncSetAttribute(kt_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    if (e != cudaSuccess) return (int)e;
    KILN_LAUNCH(kt_dynamic_shared, 1, 1024, 65536, 0, out.p, 16384);
    int r = launch_result(before);
    if (r != 0) return r;
    float sum = 0.0f;
    e = cudaMemcpy(&sum, out.p, sizeof sum, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return (int)e;
    return sum == 16384.0f ? 0 : -2;
}
