/* driver.c — kemu_driver.h: modules, their functions and launches through the driver API.
 * A module is a copy of the image's table (the image may go away after the load), on a
 * list of the loaded ones that handles are checked against; a function is a pointer to one
 * of its module's kernels. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kemu_driver.h"
#include "kemu_internal.h"

struct CUmod_st {
    int count;
    kemu_kernel *kernels;
    struct CUmod_st *next; /* the loaded modules, a list: a handle is checked against it */
};

static struct CUmod_st *loaded;
static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER;

/* The runtime's last error back to what it was before a driver call reported one (kemu_fail
 * records its message that way); a sticky error stays whatever it was. */
static void restore_last_error(cudaError_t pending)
{
    cudaGetLastError();
    if (pending != cudaSuccess) kemu_set_error(pending);
}

/* A failed driver call: the message recorded and printed as the emulator's others are
 * (kemu_last_error_message), but not left as the runtime's last error (cudaGetLastError),
 * which the driver API does not set; a sticky error stays. Returns code. */
static CUresult fail(CUresult code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult fail(CUresult code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const cudaError_t pending = cudaPeekAtLastError();
    kemu_fail(cudaErrorInvalidValue, 0, "%s", text);
    restore_last_error(pending);
    return code;
}

/* The driver's code for a runtime error the emulator reported (the values that differ). */
static CUresult driver_code(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorIllegalAddress: return CUDA_ERROR_ILLEGAL_ADDRESS;
    case cudaErrorLaunchOutOfResources: return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    case cudaErrorLaunchFailure: return CUDA_ERROR_LAUNCH_FAILED;
    case cudaErrorNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: NULL module");
    *module = NULL;
    const kemu_module_image *im = image;
    if (!im || memcmp(im->magic, KEMU_MODULE_MAGIC, 8) || im->count < 0 || (im->count && !im->kernels)) {
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: the image is not an emulator module (a cuda-emu program loads the table "
                                             "of the kernels compiled into it; a CUBIN is for a GPU)");
    }
    for (int i = 0; i < im->count; i++) {
        const kemu_kernel *k = &im->kernels[i];
        if (!k->name || !k->kernel || !k->launch || k->nparams < 0 || (k->nparams && (!k->sizes || !k->offsets))) {
            return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: entry %d of the module is incomplete", i);
        }
    }
    struct CUmod_st *m = calloc(1, sizeof *m);
    kemu_kernel *copy = calloc((size_t)im->count + 1, sizeof *copy);
    if (!m || !copy) {
        free(m);
        free(copy);
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadData: out of host memory");
    }
    memcpy(copy, im->kernels, (size_t)im->count * sizeof *copy);
    m->count = im->count;
    m->kernels = copy;
    pthread_mutex_lock(&loaded_lock);
    m->next = loaded;
    loaded = m;
    pthread_mutex_unlock(&loaded_lock);
    *module = m;
    return CUDA_SUCCESS;
}

/* Whether m is a loaded module (compared, never read, so that any handle can be asked). */
static int module_valid(CUmodule m)
{
    pthread_mutex_lock(&loaded_lock);
    const struct CUmod_st *p = loaded;
    while (p && p != m) p = p->next;
    pthread_mutex_unlock(&loaded_lock);
    return p != NULL;
}

CUresult cuModuleUnload(CUmodule module)
{
    pthread_mutex_lock(&loaded_lock);
    struct CUmod_st **p = &loaded;
    while (*p && *p != module) p = &(*p)->next;
    const int found = *p != NULL;
    if (found) *p = module->next;
    pthread_mutex_unlock(&loaded_lock);
    if (!found) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload: not a loaded module (unloaded already?)");
    free(module->kernels);
    free(module);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    if (!function || !name) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: NULL %s", function ? "name" : "function");
    *function = NULL;
    if (!module_valid(module)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction('%s'): not a loaded module", name);
    for (int i = 0; i < module->count; i++)
        if (!strcmp(module->kernels[i].name, name)) {
            *function = (CUfunction)(void *)&module->kernels[i];
            return CUDA_SUCCESS;
        }
    return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction: no kernel '%s' in the module (it has %d)", name, module->count);
}

/* The kernel a function handle points to: one of a live module's. */
static const kemu_kernel *function_kernel(CUfunction f)
{
    return (const kemu_kernel *)(void *)f;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
                        unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                        void **extra)
{
    const kemu_kernel *k = function_kernel(f);
    if (!k) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: NULL function");
    if (!kernelParams == !extra)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): give the arguments either as kernelParams or in extra, %s",
                                     k->name, kernelParams ? "not both" : "one of them");
    void *local[64];
    void **params = kernelParams;
    if (extra) { /* one buffer: CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END */
        char *buf = NULL;
        size_t *size = NULL;
        for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = extra[i + 1];
            else return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): an unknown key in extra", k->name);
        }
        if (!buf || !size)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): extra without the buffer's %s", k->name, buf ? "size" : "pointer");
        if (*size != k->bytes)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): the parameter buffer has %zu bytes, the kernel's %d parameters take %zu",
                        k->name, *size, k->nparams, k->bytes);
        if (k->nparams > (int)(sizeof local / sizeof *local))
            return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel('%s'): over 64 parameters", k->name);
        for (int i = 0; i < k->nparams; i++) local[i] = buf + k->offsets[i];
        params = local;
    } else {
        for (int i = 0; i < k->nparams; i++)
            if (!params[i])
                return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): kernelParams[%d] is NULL (the kernel has %d parameters)",
                                             k->name, i, k->nparams);
    }
    dim3 grid = {gridDimX, gridDimY, gridDimZ}, block = {blockDimX, blockDimY, blockDimZ};
    const cudaError_t pending = cudaPeekAtLastError();
    const cudaError_t e = k->launch(k->kernel, k->name, params, grid, block, sharedMemBytes, (cudaStream_t)hStream);
    if (e != cudaSuccess) restore_last_error(pending); /* the driver's error, not the runtime's (a sticky one stays) */
    return driver_code(e);
}

static const struct {
    CUresult code;
    const char *name, *text;
} codes[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult describe(CUresult error, const char **out, int text)
{
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        if (codes[i].code == error) {
            *out = text ? codes[i].text : codes[i].name;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **name) { return describe(error, name, 0); }
CUresult cuGetErrorString(CUresult error, const char **text) { return describe(error, text, 1); }
