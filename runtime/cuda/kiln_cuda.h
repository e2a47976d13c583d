/* kiln_cuda.h — Kiln's restricted CUDA dialect: the one header a generated model.cu (and
 * the CUDA host runtime) includes.
 *
 * The same source compiles two ways:
 *   nvcc model.cu                               the macros expand to real CUDA
 *   g++ -x c++ -std=c++17 -DKILN_CUDA_EMU ...   the macros expand to Kiln's emulator
 *                                               (emu/, link libkiln_cuda_emu)
 * so CI, which has no GPU, runs the very kernels the GPU will run. That only works for code
 * whose meaning the emulator reproduces, hence the dialect's rules (docs/cuda.md):
 *   - launch only with KILN_LAUNCH / KILN_LAUNCH_AT (never <<<>>>);
 *   - shared memory only through KILN_SHARED / KILN_SHARED_DYNAMIC;
 *   - warp-level exchange only through KILN_SHFL_* (all 32 lanes of the warp, full mask);
 *     no other warp-synchronous code (no __syncwarp, no implicit lockstep);
 *   - every __syncthreads() is reached by every thread of the block;
 *   - no inline PTX, no __constant__, no dynamic parallelism.
 * In cuda-emu the forbidden spellings are left undefined, so breaking a rule is a compile
 * error there; a broken run-time rule (a barrier some threads skip) is reported by the
 * emulator with the kernel, block, threads and line. */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#if defined(__CUDACC_RTC__)
/* NVRTC (kiln build --target cuda): the kernels alone, without the C library's headers;
 * the fixed-width integers as the host's LP64 C library defines them */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef unsigned long uintptr_t;
#define INT64_C(c) c##L
#define UINT64_C(c) c##UL
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fc00000) /* the bits of glibc's NAN */
#define KILN_CUDA_EMULATED 0
#else
#include <stdio.h>
#include <stdlib.h>
#endif

#if defined(__CUDACC_RTC__)
#elif defined(KILN_CUDA_EMU)
#include "../../emu/kemu_cublas.h"
#include "../../emu/kemu_device.h"
#include "../../emu/kemu_driver.h"
#include "../../emu/kemu_runtime.h"
#define KILN_CUDA_EMULATED 1
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define KILN_CUDA_EMULATED 0
#if defined(KILN_CUDA_DRIVER) && !defined(__CUDACC__)
/* The host half of a program whose kernels NVRTC compiled: model.cu's host source
 * (codegen/cuda_device.h), compiled as C++, declares the kernels and launches them by name
 * through the driver API. */
#include <cuda.h>
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __launch_bounds__
#define __launch_bounds__(...)
#endif
#endif

#define KILN_WARP_SIZE 32
#define KILN_FULL_MASK 0xffffffffu

/* ---- the dialect ------------------------------------------------------------------ */

#if defined(KILN_CUDA_EMU)

/* KILN_SHARED(float, tile, [32][33]);  a static __shared__ array (dims may be empty for a
 * scalar). Declare it at the top of the kernel (or of a __device__ function). */
#define KILN_SHARED(type, name, dims) KEMU_SHARED(type, name, dims)
/* KILN_SHARED_DYNAMIC(float, buf);  buf points to the launch's dynamic shared memory
 * (KILN_LAUNCH's shmem_bytes). One region per kernel: every such declaration aliases it. */
#define KILN_SHARED_DYNAMIC(type, name) KEMU_SHARED_DYNAMIC(type, name)
/* Warp shuffles over the whole warp (width 32): the value of lane + offset, lane - offset,
 * lane ^ mask, or of lane src; a lane whose source is outside the warp keeps its own. */
#define KILN_SHFL_DOWN(v, offset) kemu::shfl(KEMU_SHFL_DOWN, (v), (int)(offset), __FILE__, __LINE__)
#define KILN_SHFL_UP(v, offset) kemu::shfl(KEMU_SHFL_UP, (v), (int)(offset), __FILE__, __LINE__)
#define KILN_SHFL_XOR(v, mask) kemu::shfl(KEMU_SHFL_XOR, (v), (int)(mask), __FILE__, __LINE__)
#define KILN_SHFL_IDX(v, src) kemu::shfl(KEMU_SHFL_IDX, (v), (int)(src), __FILE__, __LINE__)
#define KILN_LAUNCH_RAW_(kernel, grid, block, shmem, stream, ...) \
    kemu::launch(kernel, #kernel, __FILE__, __LINE__, (grid), (block), (shmem), (stream), __VA_ARGS__)
/* KILN_NO_UNROLL before a loop: kept a loop (the vectorised elementwise kernels' four
 * lanes: unrolled, four lanes' values live at once made ptxas spill around the calls of
 * expf and of float division's slow path). */
#define KILN_NO_UNROLL _Pragma("GCC unroll 1")
/* KILN_UNROLL before a loop of a constant count over an array: unrolled, so that the array
 * lives in registers (the fused attention's accumulators; kept in local memory, ptxas
 * spilled them). */
#define KILN_UNROLL _Pragma("GCC unroll 32")

#elif defined(__CUDACC__)

#define KILN_SHARED(type, name, dims) __shared__ type name dims
#define KILN_SHARED_DYNAMIC(type, name)                                    \
    extern __shared__ __align__(16) unsigned char kiln_dyn_smem_##name[]; \
    type *name = reinterpret_cast<type *>(kiln_dyn_smem_##name)
#define KILN_SHFL_DOWN(v, offset) __shfl_down_sync(KILN_FULL_MASK, (v), (offset))
#define KILN_SHFL_UP(v, offset) __shfl_up_sync(KILN_FULL_MASK, (v), (offset))
#define KILN_SHFL_XOR(v, mask) __shfl_xor_sync(KILN_FULL_MASK, (v), (mask))
#define KILN_SHFL_IDX(v, src) __shfl_sync(KILN_FULL_MASK, (v), (src))
#define KILN_LAUNCH_RAW_(kernel, grid, block, shmem, stream, ...) \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define KILN_NO_UNROLL _Pragma("unroll 1")
#define KILN_UNROLL _Pragma("unroll")

#endif /* else: host-only C++ against the real runtime (error helpers below only) */

#if !defined(__CUDACC_RTC__) /* the host side: launches and error checks */

/* KILN_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...): launches and checks the
 * launch; on failure prints the kernel's name and this file:line and runs
 * KILN_CUDA_ON_ERROR(). KILN_LAUNCH_AT(site, ...) adds a description (generated code passes
 * the model line, "model.kiln:12: softmax") to every message about the kernel. A template
 * kernel goes in parentheses: KILN_LAUNCH((k<float, 4>), ...). Kernels take at least one
 * argument. With KILN_CUDA_SYNC=1 in the environment every launch is followed by a stream
 * synchronisation, so that a fault inside the kernel is reported against it (on a GPU
 * faults surface at the next synchronisation; the emulator runs kernels at launch). */
#define KILN_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    KILN_LAUNCH_AT(nullptr, kernel, grid, block, shmem, stream, __VA_ARGS__)
#if (defined(KILN_CUDA_EMU) && defined(KILN_CUDA_BY_NAME)) || (defined(KILN_CUDA_DRIVER) && !defined(__CUDACC__))
#define KILN_CUDA_LAUNCH_BY_NAME_ 1
#endif
#if defined(KILN_CUDA_LAUNCH_BY_NAME_)
/* A generated model.cu (KILN_CUDA_BY_NAME) under the emulator, or its host source in a GPU
 * program whose kernels NVRTC compiled (KILN_CUDA_DRIVER): the kernel is found by its
 * name in the module of the file's kernels (KILN_CUDA_MODULE at its end), once per launch
 * site, and launched through the driver API with its arguments in one buffer, converted to
 * the parameters' types, as a GPU program launches NVRTC's kernels. */
#define KILN_LAUNCH_AT(site, kernel, grid, block, shmem, stream, ...)                                                      \
    do {                                                                                                                  \
        kiln_cuda_last_kernel = #kernel;                                                                                  \
        kiln_cuda_last_site = (site);                                                                                     \
        static CUfunction kiln_cuda_fn_ = nullptr;                                                                        \
        kiln_cuda_launch_by_name(&kiln_cuda_fn_, #kernel, (decltype(&kernel))nullptr, (site), __FILE__, __LINE__, (grid), \
                                 (block), (shmem), (stream), __VA_ARGS__);                                                \
        kiln_cuda_after_launch(#kernel, (site), __FILE__, __LINE__, (stream));                                            \
    } while (0)
#else
#define KILN_LAUNCH_AT(site, kernel, grid, block, shmem, stream, ...)                 \
    do {                                                                             \
        kiln_cuda_last_kernel = #kernel;                                             \
        kiln_cuda_last_site = (site);                                                \
        KILN_LAUNCH_RAW_(kernel, grid, block, shmem, stream, __VA_ARGS__);           \
        kiln_cuda_after_launch(#kernel, (site), __FILE__, __LINE__, (stream));       \
    } while (0)
#endif

/* ---- error checks ------------------------------------------------------------------ */

/* What a failed check does after printing: the generated program stops (exit status 1);
 * a program that wants to clean up defines this before including the header. */
#ifndef KILN_CUDA_ON_ERROR
#define KILN_CUDA_ON_ERROR() exit(1)
#endif

/* KILN_CUDA_CHECK(cudaMemcpy(...)): a runtime call's status; KILN_CUBLAS_CHECK likewise for
 * cuBLAS and cuBLASLt. A failure names the call, the file:line and the last kernel
 * launched (an asynchronous fault is reported by whatever call comes next). */
#define KILN_CUDA_CHECK(call) kiln_cuda_check((call), #call, __FILE__, __LINE__)
#define KILN_CUBLAS_CHECK(call) kiln_cublas_check((call), #call, __FILE__, __LINE__)
/* Synchronises a stream and checks for faults of the kernels before. */
#define KILN_CUDA_SYNC(stream) kiln_cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", __FILE__, __LINE__)

inline const char *kiln_cuda_last_kernel = nullptr;
inline const char *kiln_cuda_last_site = nullptr;

static inline int kiln_cuda_sync_launches(void)
{
    static int sync = -1;
    if (sync < 0) {
        const char *s = getenv("KILN_CUDA_SYNC");
        sync = s && *s && *s != '0';
    }
    return sync;
}

static inline void kiln_cuda_print_last_kernel(void)
{
    if (!kiln_cuda_last_kernel) return;
    fprintf(stderr, " (last kernel launched: %s%s%s%s)", kiln_cuda_last_kernel, kiln_cuda_last_site ? ", " : "",
            kiln_cuda_last_site ? kiln_cuda_last_site : "",
            kiln_cuda_sync_launches() ? "" : "; KILN_CUDA_SYNC=1 pins a fault to its kernel");
}

static inline void kiln_cuda_check(cudaError_t err, const char *call, const char *file, int line)
{
    if (err == cudaSuccess) return;
    fprintf(stderr, "%s:%d: error: %s: %s (%s)", file, line, call, cudaGetErrorString(err), cudaGetErrorName(err));
    kiln_cuda_print_last_kernel();
    fputc('\n', stderr);
    KILN_CUDA_ON_ERROR();
}

static inline void kiln_cublas_check(cublasStatus_t status, const char *call, const char *file, int line)
{
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: error: %s: %s (status %d)", file, line, call, cublasGetStatusString(status), (int)status);
    kiln_cuda_print_last_kernel();
    fputc('\n', stderr);
    KILN_CUDA_ON_ERROR();
}

static inline void kiln_cuda_after_launch(const char *kernel, const char *site, const char *file, int line,
                                          cudaStream_t stream)
{
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && kiln_cuda_sync_launches()) err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess) return;
    fprintf(stderr, "%s:%d: error: kernel '%s'%s%s%s failed: %s (%s)\n", file, line, kernel, site ? " (" : "",
            site ? site : "", site ? ")" : "", cudaGetErrorString(err), cudaGetErrorName(err));
    KILN_CUDA_ON_ERROR();
}

/* ---- model.cu's kernels as a module, launched by name -------------------------------- */

/* KILN_CUDA_MODULE(LIST);  at the end of a file whose kernels are launched by name, LIST(X)
 * naming each kernel X(name): under the emulator, the file's kernels registered with it
 * (kemu_driver.h), which a cuda-emu program's modules find them among; in a GPU
 * program's host source (KILN_CUDA_DRIVER), nothing: the kernels are NVRTC's, in the
 * program's CUBINs (kiln_cuda_embedded.h); for nvcc, nothing either (its launches are
 * <<<>>>'s). Either way a launch finds its kernel through kiln_cuda_function
 * (modules.cpp), which loads the modules for the GPU that is there. */
#if defined(KILN_CUDA_LAUNCH_BY_NAME_)
#include <cstring>
#include <utility>

#include "kiln_cuda_embedded.h"
#include "kiln_cuda_params.h"
#endif

#if defined(KILN_CUDA_EMU) && defined(KILN_CUDA_BY_NAME)
#define KILN_CUDA_MODULE_ENTRY_(kernel) kemu::kernel_entry(kernel, #kernel),
#define KILN_CUDA_MODULE(list)                                                                                       \
    static const kemu_kernel kiln_cuda_module_kernels_[] = {list(KILN_CUDA_MODULE_ENTRY_)};                           \
    [[maybe_unused]] static const int kiln_cuda_module_registered_ =                                                 \
        kemu_register_kernels(kiln_cuda_module_kernels_, (int)(sizeof kiln_cuda_module_kernels_ / sizeof *kiln_cuda_module_kernels_))
#elif defined(KILN_CUDA_LAUNCH_BY_NAME_)
#define KILN_CUDA_MODULE(list) static_assert(true, "the kernels: NVRTC's, in the program's CUBINs")
#endif

#if defined(KILN_CUDA_LAUNCH_BY_NAME_)
/* One argument converted to its parameter's type, at its offset in the buffer. */
template <typename P, typename A> __attribute__((always_inline)) static inline void kiln_cuda_put_(unsigned char *at, A &&a)
{
    const typename std::decay<P>::type v(std::forward<A>(a));
    std::memcpy(at, &v, sizeof v);
}

/* The kernel launched as `name` (a template's in parentheses): found once (*fn caches it). */
__attribute__((noinline)) static CUresult kiln_cuda_find_(CUfunction *fn, const char *name)
{
    if (*fn) return CUDA_SUCCESS;
    char bare[256]; /* the name as the module lists it: a template's without the parentheses around it */
    size_t n = strlen(name);
    if (n >= 2 && name[0] == '(' && name[n - 1] == ')') name++, n -= 2;
    snprintf(bare, sizeof bare, "%.*s", (int)n, name);
    void *f = nullptr;
    const CUresult r = (CUresult)kiln_cuda_function(&f, bare);
    *fn = (CUfunction)f;
    return r;
}

__attribute__((noinline)) static CUresult kiln_cuda_launch_buffer_(CUfunction fn, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, void *buf, size_t size)
{
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    return (CUresult)kiln_cuda_launch((void *)fn, g, b, (unsigned)shmem, (void *)stream, extra);
}

__attribute__((noinline, cold)) static void kiln_cuda_launch_failed_(CUresult r, const char *name, const char *site, const char *file, int line)
{
    const char *text = "", *code = "";
    kiln_cuda_error_text(r, &code, &text);
    const char *unloaded = kiln_cuda_modules_load(nullptr); /* the reason no module is there */
    fprintf(stderr, "%s:%d: error: kernel '%s'%s%s%s failed: %s (%s)\n", file, line, name, site ? " (" : "", site ? site : "", site ? ")" : "",
            unloaded ? unloaded : text ? text : "", code ? code : "");
    KILN_CUDA_ON_ERROR();
}

/* Finds the kernel (once: *fn caches it), packs the arguments as its parameters' types
 * into one buffer and launches it; a failure names the kernel and the model line. All but
 * the packing is out of the template: a model.cu launches a few hundred kernels. */
template <typename... P, typename... A>
static inline void kiln_cuda_launch_by_name(CUfunction *fn, const char *name, void (*)(P...), const char *site, const char *file, int line, dim3 grid,
                                            dim3 block, size_t shmem, cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "KILN_LAUNCH: wrong number of kernel arguments");
    CUresult r = kiln_cuda_find_(fn, name);
    if (r == CUDA_SUCCESS) {
        using L = kiln_cuda_params<P...>;
        alignas(16) unsigned char buf[L::bytes ? L::bytes : 1];
        std::size_t i = 0;
        (void)i;
        (kiln_cuda_put_<P>(buf + L::offsets[i++], std::forward<A>(args)), ...);
        r = kiln_cuda_launch_buffer_(*fn, grid, block, shmem, stream, buf, L::bytes);
    }
    if (r != CUDA_SUCCESS) kiln_cuda_launch_failed_(r, name, site, file, line);
}
#elif !defined(KILN_CUDA_MODULE)
#define KILN_CUDA_MODULE(list) static_assert(true, "model.cu's kernels: launched directly")
#endif

#endif /* the host side */

#endif
