/* runtime.c — the CUDA runtime API of the emulator: one device whose memory is host
 * memory, streams and events that run everything at once, CUDA's error conventions.
 *
 * Where a real GPU would fail or misbehave later (a copy in the wrong direction, a copy
 * past the end of an allocation, freeing host memory with cudaFree), this fails now, with
 * a message that says what was wrong: the emulator is where generated CUDA is debugged.
 * Allocations are kept in a table sorted by address so that any pointer can be classified
 * (device, pinned host, neither). Thread-safe: one mutex around the table and the state. */
#define _DEFAULT_SOURCE /* _SC_AVPHYS_PAGES */

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kemu_internal.h"

/* ---- errors ------------------------------------------------------------------------ */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cudaError_t last_error = cudaSuccess;
static cudaError_t sticky_error = cudaSuccess;
static char last_message[4096];
static int quiet;

cudaError_t kemu_set_error(cudaError_t err)
{
    if (err != cudaSuccess) {
        pthread_mutex_lock(&lock);
        last_error = err;
        pthread_mutex_unlock(&lock);
    }
    return err;
}

cudaError_t kemu_fail(cudaError_t err, int sticky, const char *fmt, ...)
{
    char text[sizeof last_message - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&lock);
    last_error = err;
    if (sticky && sticky_error == cudaSuccess) sticky_error = err;
    snprintf(last_message, sizeof last_message, "kiln cuda-emu: error: %s", text);
    int q = quiet;
    pthread_mutex_unlock(&lock);
    if (!q) fprintf(stderr, "kiln cuda-emu: error: %s\n", text);
    return err;
}

cudaError_t kemu_sticky_error(void)
{
    pthread_mutex_lock(&lock);
    cudaError_t e = sticky_error;
    pthread_mutex_unlock(&lock);
    return e;
}

const char *kemu_last_error_message(void) { return last_message; }
void kemu_set_quiet(int q) { quiet = q; }

cudaError_t cudaGetLastError(void)
{
    pthread_mutex_lock(&lock);
    cudaError_t e = last_error;
    last_error = sticky_error; /* a sticky error stays */
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    pthread_mutex_lock(&lock);
    cudaError_t e = last_error;
    pthread_mutex_unlock(&lock);
    return e;
}

#define KEMU_ERRORS(X)                                                                                     \
    X(cudaSuccess, "no error")                                                                             \
    X(cudaErrorInvalidValue, "invalid argument")                                                           \
    X(cudaErrorMemoryAllocation, "out of memory")                                                          \
    X(cudaErrorInitializationError, "initialization error")                                                \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                                     \
    X(cudaErrorInvalidSymbol, "invalid device symbol")                                                     \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                             \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                                \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version")          \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")                                           \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                             \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                                    \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                           \
    X(cudaErrorNotReady, "device not ready")                                                               \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                                 \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")                            \
    X(cudaErrorAssert, "device-side assert triggered")                                                     \
    X(cudaErrorIllegalInstruction, "an illegal instruction was encountered")                               \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                                \
    X(cudaErrorNotSupported, "operation not supported")                                                    \
    X(cudaErrorUnknown, "unknown error")

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
#define KEMU_STRING(code, text) \
    case code: return text;
        KEMU_ERRORS(KEMU_STRING)
#undef KEMU_STRING
    }
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
#define KEMU_NAME(code, text) \
    case code: return #code;
        KEMU_ERRORS(KEMU_NAME)
#undef KEMU_NAME
    }
    return "cudaErrorUnknown";
}

/* ---- configuration ------------------------------------------------------------------- */

static int order_set;
static kemu_order order_mode = KEMU_ORDER_FORWARD;
static uint64_t order_seed = 1;

void kemu_set_order(kemu_order order, uint64_t seed)
{
    pthread_mutex_lock(&lock);
    order_mode = order;
    order_seed = seed;
    order_set = 1;
    pthread_mutex_unlock(&lock);
}

kemu_order kemu_order_now(uint64_t *seed)
{
    pthread_mutex_lock(&lock);
    if (!order_set) {
        order_set = 1;
        const char *o = getenv("KILN_CUDA_EMU_ORDER");
        if (o && strcmp(o, "reverse") == 0)
            order_mode = KEMU_ORDER_REVERSE;
        else if (o && strcmp(o, "shuffle") == 0)
            order_mode = KEMU_ORDER_SHUFFLE;
        else if (o && *o && strcmp(o, "forward") != 0)
            fprintf(stderr, "kiln cuda-emu: warning: KILN_CUDA_EMU_ORDER=%s is not forward, reverse or "
                            "shuffle; using forward\n", o);
        const char *s = getenv("KILN_CUDA_EMU_SEED");
        if (s && *s) order_seed = strtoull(s, NULL, 10);
    }
    kemu_order o = order_mode;
    *seed = order_seed;
    pthread_mutex_unlock(&lock);
    return o;
}

kemu_order kemu_get_order(void)
{
    uint64_t seed;
    return kemu_order_now(&seed);
}

static kemu_stats stats;

void kemu_stats_add(uint64_t blocks, uint64_t threads, uint64_t barriers, uint64_t shuffles, uint64_t switches)
{
    pthread_mutex_lock(&lock);
    stats.launches++;
    stats.blocks += blocks;
    stats.threads += threads;
    stats.barriers += barriers;
    stats.shuffles += shuffles;
    stats.switches += switches;
    pthread_mutex_unlock(&lock);
}

kemu_stats kemu_get_stats(void)
{
    pthread_mutex_lock(&lock);
    kemu_stats s = stats;
    pthread_mutex_unlock(&lock);
    return s;
}

/* Per-kernel dynamic shared memory limits (cudaFuncSetAttribute); a kernel program has a
 * few dozen kernels at most. */
typedef struct {
    const void *kernel;
    size_t limit;
} KernelAttr;
static KernelAttr *attrs;
static size_t nattrs, capattrs;

size_t kemu_kernel_dynamic_limit(const void *kernel)
{
    size_t limit = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nattrs; i++)
        if (attrs[i].kernel == kernel) limit = attrs[i].limit;
    pthread_mutex_unlock(&lock);
    return limit;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (kemu_sticky_error()) return kemu_set_error(kemu_sticky_error());
    if (!func) return kemu_set_error(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return kemu_fail(cudaErrorNotSupported, 0, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
    if (value < 0 || (unsigned)value > KEMU_SHARED_OPTIN_LIMIT)
        return kemu_fail(cudaErrorInvalidValue, 0,
                         "cudaFuncSetAttribute: %d bytes of dynamic shared memory, over the device's %u", value,
                         KEMU_SHARED_OPTIN_LIMIT);
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < nattrs && attrs[i].kernel != func) i++;
    if (i == nattrs) {
        if (nattrs == capattrs) {
            size_t cap = capattrs ? 2 * capattrs : 16;
            KernelAttr *a = realloc(attrs, cap * sizeof *a);
            if (!a) {
                pthread_mutex_unlock(&lock);
                return kemu_set_error(cudaErrorMemoryAllocation);
            }
            attrs = a;
            capattrs = cap;
        }
        attrs[nattrs].kernel = func;
        nattrs++;
    }
    attrs[i].limit = (size_t)value;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* ---- device ------------------------------------------------------------------------ */

static int current_device;

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return kemu_set_error(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device != 0) return kemu_set_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return kemu_set_error(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

static size_t device_bytes; /* live cudaMalloc bytes (under lock) */

/* KILN_CUDA_EMU_MEMORY=8G (or bytes, K, M, G): the emulated device has that much memory, as a
 * small GPU would, instead of the host's: cudaMemGetInfo reports it and cudaMalloc fails past
 * it. 0 when unset. */
static size_t device_limit(void)
{
    static size_t limit = (size_t)-1;
    if (limit == (size_t)-1) {
        const char *v = getenv("KILN_CUDA_EMU_MEMORY");
        char *end = NULL;
        double x = v && *v ? strtod(v, &end) : 0;
        double unit = 1;
        if (end && (*end == 'K' || *end == 'k')) unit = 1024.0;
        if (end && (*end == 'M' || *end == 'm')) unit = 1024.0 * 1024.0;
        if (end && (*end == 'G' || *end == 'g')) unit = 1024.0 * 1024.0 * 1024.0;
        limit = x > 0 ? (size_t)(x * unit) : 0;
    }
    return limit;
}

static size_t host_memory(int available)
{
    size_t limit = device_limit();
    if (limit) {
        pthread_mutex_lock(&lock);
        size_t used = device_bytes;
        pthread_mutex_unlock(&lock);
        return available ? (used < limit ? limit - used : 0) : limit;
    }
    long pages = sysconf(available ? _SC_AVPHYS_PAGES : _SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return (size_t)16 << 30;
    return (size_t)pages * (size_t)page;
}

/* The emulated device: memory is the host's (its size and what is free now), the limits are
 * those both targets (sm_80 and sm_90) share, so that a program that runs here launches
 * there. multiProcessorCount is small because the emulator runs one block at a time: code
 * that sizes grids by it gets few, long blocks, which emulate faster. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p) return kemu_set_error(cudaErrorInvalidValue);
    if (device != 0) return kemu_set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Kiln CUDA emulator (host CPU)");
    p->totalGlobalMem = host_memory(0);
    p->sharedMemPerBlock = KEMU_SHARED_DEFAULT_LIMIT;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = (int)KEMU_MAX_THREADS_PER_BLOCK;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 8;
    p->minor = 0;
    /* KILN_CUDA_EMU_ARCH=sm_86: the emulator plays a GPU of that compute capability (one a
     * program has no CUBIN for, to run its NVRTC path) */
    const char *arch = getenv("KILN_CUDA_EMU_ARCH");
    int sm = 0;
    if (arch && sscanf(arch, "sm_%d", &sm) == 1 && sm >= 30 && sm < 1000) p->major = sm / 10, p->minor = sm % 10;
    p->multiProcessorCount = 8;
    p->integrated = 0;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 40 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 167936;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 0;
    p->sharedMemPerBlockOptin = KEMU_SHARED_OPTIN_LIMIT;
    p->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    struct cudaDeviceProp p;
    if (!value) return kemu_set_error(cudaErrorInvalidValue);
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return kemu_set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes) return kemu_set_error(cudaErrorInvalidValue);
    *total_bytes = host_memory(0);
    *free_bytes = host_memory(1);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = kemu_sticky_error();
    return e ? kemu_set_error(e) : cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version) return kemu_set_error(cudaErrorInvalidValue);
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) { return cudaDriverGetVersion(version); }

/* ---- memory ------------------------------------------------------------------------- */

typedef struct {
    uintptr_t base;
    size_t size;
    int kind;
} Alloc;
static Alloc *allocs; /* sorted by base */
static size_t nallocs, capallocs;

/* Index of the first allocation whose base is > p. Caller holds the lock. */
static size_t upper(uintptr_t p)
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int kemu_memory_kind(const void *ptr, size_t size)
{
    uintptr_t p = (uintptr_t)ptr;
    int kind = KEMU_MEM_NONE;
    pthread_mutex_lock(&lock);
    size_t i = upper(p);
    if (i > 0) {
        const Alloc *a = &allocs[i - 1];
        if (p - a->base <= a->size && size <= a->size - (p - a->base)) kind = a->kind;
    }
    pthread_mutex_unlock(&lock);
    return kind;
}

int kemu_check_kernel_pointer(const void *ptr) { return ptr && kemu_memory_kind(ptr, 0) == KEMU_MEM_NONE; }

static cudaError_t add_alloc(void **ptr, size_t size, int kind)
{
    if (!ptr) return kemu_set_error(cudaErrorInvalidValue);
    cudaError_t st = kemu_sticky_error();
    if (st) return kemu_set_error(st);
    *ptr = NULL;
    if (size == 0) return cudaSuccess; /* as cudaMalloc: no allocation, NULL */
    if (kind == KEMU_MEM_DEVICE && device_limit()) {
        pthread_mutex_lock(&lock);
        int over = device_bytes + size > device_limit();
        pthread_mutex_unlock(&lock);
        if (over) return kemu_set_error(cudaErrorMemoryAllocation); /* as a full GPU: not sticky */
    }
    void *p = NULL;
    if (posix_memalign(&p, 256, size) != 0)
        return kemu_fail(cudaErrorMemoryAllocation, 0, "%s of %zu bytes: out of host memory",
                         kind == KEMU_MEM_DEVICE ? "cudaMalloc" : "cudaMallocHost", size);
    memset(p, 0xFF, size);
    pthread_mutex_lock(&lock);
    if (nallocs == capallocs) {
        size_t cap = capallocs ? 2 * capallocs : 64;
        Alloc *a = realloc(allocs, cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&lock);
            free(p);
            return kemu_set_error(cudaErrorMemoryAllocation);
        }
        allocs = a;
        capallocs = cap;
    }
    size_t i = upper((uintptr_t)p);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
    allocs[i].base = (uintptr_t)p;
    allocs[i].size = size;
    allocs[i].kind = kind;
    nallocs++;
    if (kind == KEMU_MEM_DEVICE) device_bytes += size;
    pthread_mutex_unlock(&lock);
    *ptr = p;
    return cudaSuccess;
}

static cudaError_t remove_alloc(void *ptr, int kind, const char *fn)
{
    if (!ptr) return cudaSuccess;
    pthread_mutex_lock(&lock);
    size_t i = upper((uintptr_t)ptr);
    int found = i > 0 && allocs[i - 1].base == (uintptr_t)ptr;
    int right_kind = found && allocs[i - 1].kind == kind;
    if (right_kind) {
        if (kind == KEMU_MEM_DEVICE) device_bytes -= allocs[i - 1].size;
        memmove(&allocs[i - 1], &allocs[i], (nallocs - i) * sizeof *allocs);
        nallocs--;
    }
    pthread_mutex_unlock(&lock);
    if (!right_kind)
        return kemu_fail(cudaErrorInvalidValue, 0, "%s(%p): %s", fn, ptr,
                         found ? (kind == KEMU_MEM_DEVICE ? "pinned host memory, free it with cudaFreeHost"
                                                          : "device memory, free it with cudaFree")
                               : "not the start of a live allocation (freed twice, or never allocated)");
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) { return add_alloc(ptr, size, KEMU_MEM_DEVICE); }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return add_alloc(ptr, size, KEMU_MEM_PINNED); }
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags;
    return add_alloc(ptr, size, KEMU_MEM_PINNED);
}
cudaError_t cudaFree(void *ptr) { return remove_alloc(ptr, KEMU_MEM_DEVICE, "cudaFree"); }
cudaError_t cudaFreeHost(void *ptr) { return remove_alloc(ptr, KEMU_MEM_PINNED, "cudaFreeHost"); }

/* ---- streams and events --------------------------------------------------------------- */

#define STREAM_MAGIC 0x4B53544Du /* "KSTM" */
#define EVENT_MAGIC 0x4B45564Eu  /* "KEVN" */
#define DEAD_MAGIC 0xDEADDEADu
struct CUstream_st {
    unsigned magic, flags;
};
struct CUevent_st {
    unsigned magic, flags;
    int recorded;
    double ms;
};

/* A freed handle's memory is kept (and marked dead) so that using it after destroying it
 * is reported instead of reading freed memory; handles are few. */
int kemu_stream_valid(cudaStream_t stream) { return !stream || stream->magic == STREAM_MAGIC; }
static int event_valid(cudaEvent_t e) { return e && e->magic == EVENT_MAGIC; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    if (!stream) return kemu_set_error(cudaErrorInvalidValue);
    struct CUstream_st *s = malloc(sizeof *s);
    if (!s) return kemu_set_error(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

static void *graveyard[4096];
static size_t ngraves;
/* Marks a handle dead and frees the oldest dead one once many are kept. */
static void bury(unsigned *magic)
{
    *magic = DEAD_MAGIC;
    pthread_mutex_lock(&lock);
    if (ngraves == sizeof graveyard / sizeof *graveyard) {
        free(graveyard[0]);
        memmove(graveyard, graveyard + 1, (ngraves - 1) * sizeof *graveyard);
        ngraves--;
    }
    graveyard[ngraves++] = magic;
    pthread_mutex_unlock(&lock);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream || !kemu_stream_valid(stream)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    bury(&stream->magic);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    if (!kemu_stream_valid(stream)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    return cudaDeviceSynchronize();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    if (!kemu_stream_valid(stream) || !event_valid(event)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event) return kemu_set_error(cudaErrorInvalidValue);
    struct CUevent_st *e = malloc(sizeof *e);
    if (!e) return kemu_set_error(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    e->recorded = 0;
    e->ms = 0;
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event_valid(event)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    bury(&event->magic);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!event_valid(event) || !kemu_stream_valid(stream)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    event->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    event->recorded = 1;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!event_valid(event)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    return cudaDeviceSynchronize();
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms) return kemu_set_error(cudaErrorInvalidValue);
    if (!event_valid(start) || !event_valid(end)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return kemu_set_error(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return kemu_set_error(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

/* ---- copies and sets -------------------------------------------------------------------- */

static const char *kind_name(enum cudaMemcpyKind kind)
{
    switch (kind) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
    }
    return "?";
}

/* Checks one side of a copy: a device side must lie inside one device allocation, a host
 * side must not be device memory. */
static int side_ok(const void *p, size_t count, int want_device)
{
    int kind = kemu_memory_kind(p, count);
    if (want_device) return kind == KEMU_MEM_DEVICE;
    return kemu_memory_kind(p, 0) != KEMU_MEM_DEVICE;
}

static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
                        const char *fn)
{
    cudaError_t st = kemu_sticky_error();
    if (st) return kemu_set_error(st);
    if (!kemu_stream_valid(stream)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    if ((unsigned)kind > cudaMemcpyDefault) return kemu_set_error(cudaErrorInvalidMemcpyDirection);
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return kemu_fail(cudaErrorInvalidValue, 0, "%s: NULL pointer", fn);
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault) {
        if (!side_ok(dst, count, dst_dev))
            return kemu_fail(cudaErrorInvalidValue, 0, "%s(%s, %zu bytes): the destination %p is %s", fn,
                             kind_name(kind), count, dst,
                             dst_dev ? "not inside one cudaMalloc allocation for the whole copy"
                                     : "device memory");
        if (!side_ok(src, count, src_dev))
            return kemu_fail(cudaErrorInvalidValue, 0, "%s(%s, %zu bytes): the source %p is %s", fn,
                             kind_name(kind), count, src,
                             src_dev ? "not inside one cudaMalloc allocation for the whole copy"
                                     : "device memory");
    } else {
        /* Inferred direction: any device side must still hold the whole range. */
        if (kemu_memory_kind(dst, 0) == KEMU_MEM_DEVICE && kemu_memory_kind(dst, count) != KEMU_MEM_DEVICE)
            return kemu_fail(cudaErrorInvalidValue, 0, "%s: %zu bytes to %p run past the end of its allocation",
                             fn, count, dst);
        if (kemu_memory_kind(src, 0) == KEMU_MEM_DEVICE && kemu_memory_kind(src, count) != KEMU_MEM_DEVICE)
            return kemu_fail(cudaErrorInvalidValue, 0, "%s: %zu bytes from %p run past the end of its allocation",
                             fn, count, src);
    }
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return copy(dst, src, count, kind, NULL, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy(dst, src, count, kind, stream, "cudaMemcpyAsync");
}

static cudaError_t set(void *ptr, int value, size_t count, cudaStream_t stream, const char *fn)
{
    cudaError_t st = kemu_sticky_error();
    if (st) return kemu_set_error(st);
    if (!kemu_stream_valid(stream)) return kemu_set_error(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (kemu_memory_kind(ptr, count) != KEMU_MEM_DEVICE)
        return kemu_fail(cudaErrorInvalidValue, 0, "%s(%p, %d, %zu bytes): not inside one cudaMalloc allocation",
                         fn, ptr, value, count);
    memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) { return set(ptr, value, count, NULL, "cudaMemset"); }

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    return set(ptr, value, count, stream, "cudaMemsetAsync");
}

/* Frees every allocation and forgets errors, settings and counters, as cudaDeviceReset
 * destroys the context. */
cudaError_t cudaDeviceReset(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nallocs; i++) free((void *)allocs[i].base);
    free(allocs);
    allocs = NULL;
    nallocs = capallocs = 0;
    free(attrs);
    attrs = NULL;
    nattrs = capattrs = 0;
    last_error = sticky_error = cudaSuccess;
    last_message[0] = 0;
    memset(&stats, 0, sizeof stats);
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

void kemu_stats_reset(void)
{
    pthread_mutex_lock(&lock);
    memset(&stats, 0, sizeof stats);
    pthread_mutex_unlock(&lock);
}
