/* kemu_runtime.h — the CUDA runtime API subset of Kiln's CUDA emulator (cuda-emu).
 *
 * A program written in Kiln's CUDA dialect (runtime/cuda/kiln_cuda.h) compiles either with
 * nvcc against the real CUDA headers or with the host compiler against this header, which
 * must therefore declare the same names with the same types, and enum values equal to the
 * real ones (tests/cuda/api_compat.cu checks both ways). Device memory is host memory,
 * streams and events run everything synchronously, in order. Usable from C and C++; the
 * real CUDA headers must not be included beside it.
 *
 * Kiln's own additions are prefixed kemu_ (configuration, the launch entry point used by
 * kemu_device.h, the text of the last misuse report). */
#ifndef KEMU_RUNTIME_H
#define KEMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: the real values (driver_types.h), so that a status printed by either build
 * means the same. Only the codes the emulator can return, and a few that host code tests. */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorAssert = 710,
    cudaErrorIllegalInstruction = 715,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

#define cudaHostAllocDefault 0x00
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

/* Index and vector types (vector_types.h). dim3 has the real constructors in C++ so that
 * `dim3 g(n)` and passing an int where a dim3 is expected work as with nvcc. */
struct uint3 { unsigned int x, y, z; };
typedef struct uint3 uint3;
#ifdef __cplusplus
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
#define KEMU_ALIGN(n) alignas(n)
#else
struct dim3 { unsigned int x, y, z; };
#define KEMU_ALIGN(n) _Alignas(n)
#endif
typedef struct dim3 dim3;

typedef struct { KEMU_ALIGN(8) float x; float y; } float2;
typedef struct { KEMU_ALIGN(16) float x; float y, z, w; } float4;
typedef struct { KEMU_ALIGN(8) int x; int y; } int2;
typedef struct { KEMU_ALIGN(16) int x; int y, z, w; } int4;
typedef struct { KEMU_ALIGN(8) unsigned int x; unsigned int y; } uint2;
typedef struct { KEMU_ALIGN(16) unsigned int x; unsigned int y, z, w; } uint4;
typedef struct { KEMU_ALIGN(16) double x; double y; } double2;
static inline float2 make_float2(float x, float y) { float2 v; v.x = x; v.y = y; return v; }
static inline float4 make_float4(float x, float y, float z, float w)
{ float4 v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
static inline int2 make_int2(int x, int y) { int2 v; v.x = x; v.y = y; return v; }
static inline int4 make_int4(int x, int y, int z, int w)
{ int4 v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z)
{ uint3 v; v.x = x; v.y = y; v.z = z; return v; }

/* The device's description: the real struct's field names, a subset of its fields (code
 * that reads another field does not compile under cuda-emu, which is the point: it would
 * read a value the emulator never thought about). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int concurrentKernels;
    int ECCEnabled;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    size_t sharedMemPerBlockOptin;
    int maxBlocksPerMultiProcessor;
};

/* Device management. One emulated device, number 0. */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);

/* Errors. A failed kernel (a misuse the emulator detected) is sticky, as a device fault
 * is on a GPU: every later call returns it until cudaDeviceReset. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* Memory. "Device" memory is host memory allocated 256-byte aligned (as cudaMalloc's) and
 * filled with 0xFF bytes (float NaN) so that reading memory the program never wrote shows;
 * the emulator keeps the list of allocations to check copies, sets and kernel pointer
 * arguments against it. */
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream);

/* Streams and events. Work runs when it is issued, so synchronising only checks handles;
 * an event's time is the host clock when it was recorded. */
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* Kernels: the per-kernel limit of dynamic shared memory (the only attribute). */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* ---- Kiln additions ---------------------------------------------------------------- */

/* The order in which a block's threads run between two synchronisation points (and the
 * order of the blocks of a grid). FORWARD is thread 0 first; REVERSE and SHUFFLE (seeded,
 * reproducible) exist to expose a missing __syncthreads or a race: a correct kernel gives
 * the same result in every order. Default from KILN_CUDA_EMU_ORDER=forward|reverse|shuffle
 * and KILN_CUDA_EMU_SEED, read at the first launch. */
typedef enum { KEMU_ORDER_FORWARD, KEMU_ORDER_REVERSE, KEMU_ORDER_SHUFFLE } kemu_order;
void kemu_set_order(kemu_order order, uint64_t seed);
kemu_order kemu_get_order(void);

/* The full text of the last error the emulator reported (also printed to stderr when it
 * happened, unless kemu_set_quiet(1)): what was misused, in which kernel, block and
 * threads, at which line. Empty when there was none since the last cudaDeviceReset. */
const char *kemu_last_error_message(void);
void kemu_set_quiet(int quiet);

/* Counters since the start (or cudaDeviceReset), for tests and for the curious. */
typedef struct {
    uint64_t launches, blocks, threads, barriers, shuffles, switches;
} kemu_stats;
kemu_stats kemu_get_stats(void);

/* The launch entry point behind KILN_LAUNCH (kemu_device.h packs the kernel's arguments
 * into ctx and a body that calls the kernel with them). kernel identifies the function
 * for cudaFuncSetAttribute; name, file and line are for messages. */
typedef void (*kemu_body_fn)(void *ctx);
cudaError_t kemu_launch(const void *kernel, const char *name, const char *file, int line, dim3 grid,
                        dim3 block, size_t shared_bytes, cudaStream_t stream, kemu_body_fn body,
                        void *ctx);
/* Checks a pointer argument of a launch: NULL, or inside (or one past the end of) memory
 * from cudaMalloc or cudaMallocHost. A host pointer given to a kernel works on the CPU and
 * faults on the GPU, so the emulator refuses it. Returns 0 when it is fine. */
int kemu_check_kernel_pointer(const void *ptr);
/* Reports an error found by the header side of a launch (bad pointer argument): records
 * it as the last error of the launch. */
void kemu_report_launch_error(cudaError_t error, const char *name, const char *file, int line,
                              const char *what);

#ifdef __cplusplus
} /* extern "C" */

/* The real header's C++ conveniences: typed pointers for the allocation functions and
 * kernel pointers for cudaFuncSetAttribute. */
template <class T> static inline cudaError_t cudaMalloc(T **ptr, size_t size)
{
    return cudaMalloc(reinterpret_cast<void **>(ptr), size);
}
template <class T> static inline cudaError_t cudaMallocHost(T **ptr, size_t size)
{
    return cudaMallocHost(reinterpret_cast<void **>(ptr), size);
}
template <class T> static inline cudaError_t cudaHostAlloc(T **ptr, size_t size, unsigned int flags)
{
    return cudaHostAlloc(reinterpret_cast<void **>(ptr), size, flags);
}
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}
#endif

#endif
