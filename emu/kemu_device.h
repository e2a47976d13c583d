/* kemu_device.h — kernel-side CUDA for the host compiler: what kiln_cuda.h expands the
 * dialect to when KILN_CUDA_EMU is defined. C++17, as CUDA source is C++.
 *
 * Kernels become ordinary functions; the built-in indices read thread-local variables
 * that the scheduler (sched.c) sets for the fiber it runs; __syncthreads, the warp
 * shuffles and shared memory call into the scheduler. Only the dialect is defined here:
 * __shared__, __shfl_*_sync, __syncwarp, __constant__ and <<<>>> are deliberately absent,
 * so code outside the dialect fails to compile under cuda-emu instead of running with
 * semantics the emulator does not have. */
#ifndef KEMU_DEVICE_H
#define KEMU_DEVICE_H

#ifndef __cplusplus
#error "kemu_device.h is C++ (compile model.cu as C++ with -DKILN_CUDA_EMU)"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../runtime/cuda/kiln_cuda_params.h"
#include "kemu_driver.h"
#include "kemu_runtime.h"
#include "kemu_thread.h"

/* Function qualifiers: every function is a host function here. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

/* Built-in indices: values, read-only as on the GPU. Read by value, not through a reference:
 * UBSan null-checks a reference to a thread-local variable with a test of the flags left by
 * an `add x@gottpoff(%rip)` that the linker relaxes into a flagless `lea`, and then reports
 * a null pointer that is not there (GCC 12, binutils 2.40). */
namespace kemu {
inline uint3 thread_idx() { return kemu_thread_idx; }
inline uint3 block_idx() { return kemu_block_idx; }
inline dim3 block_dim() { return kemu_block_dim; }
inline dim3 grid_dim() { return kemu_grid_dim; }
} // namespace kemu
#define threadIdx (kemu::thread_idx())
#define blockIdx (kemu::block_idx())
#define blockDim (kemu::block_dim())
#define gridDim (kemu::grid_dim())
constexpr int warpSize = 32;

#define __syncthreads() kemu_syncthreads(__FILE__, __LINE__)

namespace kemu {

/* A warp exchange of any trivially copyable value of at most 8 bytes (float, int, double,
 * a pair of halves), as __shfl_*_sync accepts. */
template <typename T> inline T shfl(int kind, T v, int arg, const char *file, int line)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "KILN_SHFL_*: the value must be a scalar of at most 8 bytes");
    T out;
    kemu_shfl(kind, &v, &out, sizeof(T), arg, file, line);
    return out;
}

/* Launch: the kernel's arguments are converted to its parameter types once, at launch, as
 * CUDA copies them into the parameter buffer; each thread then calls the kernel with its
 * own copy of them. */
template <typename... P> struct Closure {
    void (*kernel)(P...);
    std::tuple<typename std::decay<P>::type...> args;
};

template <typename... P> void run_closure(void *p)
{
    Closure<P...> *c = static_cast<Closure<P...> *>(p);
    std::apply(c->kernel, c->args);
}

template <typename T> inline bool bad_pointer(const T &v)
{
    if constexpr (std::is_pointer<T>::value && !std::is_function<typename std::remove_pointer<T>::type>::value)
        return kemu_check_kernel_pointer(static_cast<const void *>(v)) != 0;
    else
        return (void)v, false;
}

template <typename Tuple, std::size_t... I> inline int first_bad_pointer(const Tuple &t, std::index_sequence<I...>)
{
    int bad = 0;
    (void)((bad == 0 && bad_pointer(std::get<I>(t)) ? (bad = int(I) + 1) : 0), ..., 0);
    return bad;
}

template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), const char *name, const char *file, int line, dim3 grid, dim3 block,
                   size_t shared_bytes, cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "KILN_LAUNCH: wrong number of kernel arguments");
    Closure<P...> c{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
    int bad = first_bad_pointer(c.args, std::index_sequence_for<P...>{});
    if (bad) {
        char what[160];
        snprintf(what, sizeof what,
                 "argument %d is a pointer to memory from neither cudaMalloc nor cudaMallocHost (a GPU "
                 "cannot read it)",
                 bad);
        kemu_report_launch_error(cudaErrorIllegalAddress, name, file, line, what);
        return;
    }
    kemu_launch(reinterpret_cast<const void *>(kernel), name, file, line, grid, block, shared_bytes, stream,
                &run_closure<P...>, &c);
}

/* ---- the driver API's launches (kemu_driver.h) ---- */

/* The values params[i] point at, as the kernel's parameter types (copied: a buffer's
 * values need not be aligned). */
template <typename... P, std::size_t... I> inline std::tuple<typename std::decay<P>::type...> read_params(void *const *params, std::index_sequence<I...>)
{
    std::tuple<typename std::decay<P>::type...> t;
    (void)params;
    ((void)std::memcpy(&std::get<I>(t), params[I], sizeof(std::get<I>(t))), ...);
    return t;
}

/* kemu_kernel's launcher for a kernel of parameters P...: the launch path of launch()
 * above, from an array of pointers to the values. */
template <typename... P>
cudaError_t launch_params(const void *kernel, const char *name, void *const *params, dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream)
{
    Closure<P...> c{reinterpret_cast<void (*)(P...)>(const_cast<void *>(kernel)), read_params<P...>(params, std::index_sequence_for<P...>{})};
    int bad = first_bad_pointer(c.args, std::index_sequence_for<P...>{});
    if (bad) {
        char what[160];
        snprintf(what, sizeof what, "argument %d is a pointer to memory from neither cudaMalloc nor cudaMallocHost (a GPU cannot read it)", bad);
        kemu_report_launch_error(cudaErrorIllegalAddress, name, "cuLaunchKernel", 0, what);
        return cudaErrorIllegalAddress;
    }
    return kemu_launch(kernel, name, "cuLaunchKernel", 0, grid, block, shared_bytes, stream, &run_closure<P...>, &c);
}

/* A module's entry for kernel, found by cuModuleGetFunction under name (for a template's
 * instance, as NVRTC's name expression spells it: "sum<float>"). */
template <typename... P> inline kemu_kernel kernel_entry(void (*kernel)(P...), const char *name)
{
    using L = kiln_cuda_params<P...>;
    return kemu_kernel{name, reinterpret_cast<const void *>(kernel), (int)L::n, L::sizes.data(), L::offsets.data(), L::bytes, &launch_params<P...>};
}

} // namespace kemu

/* Static and dynamic shared memory (see KILN_SHARED in kiln_cuda.h). The declaration's
 * site is the address of a static variable of its own: every thread of the block that
 * reaches it gets the same memory, every declaration its own. */
#define KEMU_SHARED(type, name, dims)                                                                              \
    typedef type kemu_shared_type_##name dims;                                                                     \
    static char kemu_shared_site_##name;                                                                           \
    kemu_shared_type_##name &name = *static_cast<kemu_shared_type_##name *>(                                      \
        kemu_shared_static(&kemu_shared_site_##name, sizeof(kemu_shared_type_##name),                              \
                           alignof(kemu_shared_type_##name), #name, __FILE__, __LINE__))
#define KEMU_SHARED_DYNAMIC(type, name) type *name = static_cast<type *>(kemu_shared_dynamic())

/* Atomics. Blocks run one at a time and fibers never preempt each other, so a plain
 * read-modify-write would do; the atomic builtins keep them right should blocks ever run
 * on several host threads, at no cost worth measuring. */
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename F, typename U> inline F kemu_atomic_float_add(F *p, F v)
{
    U *u = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(u, __ATOMIC_RELAXED), want;
    F f;
    do {
        memcpy(&f, &old, sizeof f);
        F sum = f + v;
        memcpy(&want, &sum, sizeof want);
    } while (!__atomic_compare_exchange_n(u, &old, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return f;
}
inline float atomicAdd(float *p, float v) { return kemu_atomic_float_add<float, uint32_t>(p, v); }
inline double atomicAdd(double *p, double v) { return kemu_atomic_float_add<double, uint64_t>(p, v); }
inline int atomicSub(int *p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicSub(unsigned int *p, unsigned int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicExch(unsigned int *p, unsigned int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline float atomicExch(float *p, float v)
{
    float old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
inline int atomicCAS(int *p, int compare, int v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
inline unsigned int atomicCAS(unsigned int *p, unsigned int compare, unsigned int v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long compare, unsigned long long v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
template <typename T> inline T kemu_atomic_max(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
template <typename T> inline T kemu_atomic_min(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
inline int atomicMax(int *p, int v) { return kemu_atomic_max(p, v); }
inline unsigned int atomicMax(unsigned int *p, unsigned int v) { return kemu_atomic_max(p, v); }
inline int atomicMin(int *p, int v) { return kemu_atomic_min(p, v); }
inline unsigned int atomicMin(unsigned int *p, unsigned int v) { return kemu_atomic_min(p, v); }

/* Device math that C's math.h lacks: CUDA's intrinsics, computed exactly (the GPU's fast
 * versions are approximations; kernels compared with the C target use a tolerance). */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
inline int __float_as_int(float x)
{
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
}
inline unsigned int __float_as_uint(float x)
{
    unsigned int i;
    memcpy(&i, &x, sizeof i);
    return i;
}
inline float __int_as_float(int i)
{
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}
inline float __uint_as_float(unsigned int i)
{
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}
template <typename T> inline T __ldg(const T *p) { return *p; }
/* CUDA's integer and floating min/max overloads (same-type arguments only). */
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#endif
