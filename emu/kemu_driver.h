/* kemu_driver.h — the CUDA driver API subset of Kiln's CUDA emulator (cuda-emu): modules,
 * their functions and launches (cuda.h's cuModuleLoadData, cuModuleGetFunction,
 * cuLaunchKernel), so that a cuda-emu program runs the launch path of a GPU program whose
 * kernels NVRTC compiled: a kernel found by its name in a module, its arguments given as an
 * array of pointers or as one buffer.
 *
 * Where a GPU program's module is a CUBIN, a cuda-emu program's is the table of the kernels
 * compiled into it, a kemu_module_image (kemu_device.h's kemu::kernel_entry makes its
 * entries from the kernels' own types). A launch is checked as a GPU checks it and more: an
 * unknown name, an image that is not a module, a parameter buffer whose size is not the
 * kernel's, a pointer argument to memory a GPU cannot read, a block or grid out of range;
 * each is an error code and a message naming the kernel (kemu_last_error_message). The
 * names, types and values are cuda.h's (only those the emulator implements). */
#ifndef KEMU_DRIVER_H
#define KEMU_DRIVER_H

#include <stddef.h>

#include "kemu_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream; /* the runtime's cudaStream_t */

#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
                        unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                        void **extra);
CUresult cuGetErrorName(CUresult error, const char **name);
CUresult cuGetErrorString(CUresult error, const char **text);

/* ---- Kiln additions: the emulator's module image ---- */

/* A kernel of a module: its name (as NVRTC's name expressions spell it, "sum<float>"), its
 * function, its parameters' layout in a launch's buffer (each at a multiple of its
 * alignment, as CUDA lays them out), and the launcher that calls it with params[i]
 * pointing at parameter i's value. */
typedef struct {
    const char *name;
    const void *kernel;
    int nparams;
    const size_t *sizes, *offsets;
    size_t bytes;
    cudaError_t (*launch)(const void *kernel, const char *name, void *const *params, dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream);
} kemu_kernel;

#define KEMU_MODULE_MAGIC "KEMUMOD1"
typedef struct {
    char magic[8]; /* KEMU_MODULE_MAGIC, without its NUL */
    int count;
    const kemu_kernel *kernels;
} kemu_module_image;

/* A file's kernels launched by name (kiln_cuda.h's KILN_CUDA_MODULE, at the program's
 * start): registered, so that the program's modules can hold them. Returns count. */
int kemu_register_kernels(const kemu_kernel *kernels, int count);

/* The image of a module of every registered kernel: what a cuda-emu program loads for
 * its CUBINs. A real CUBIN (an ELF image, as NVRTC makes for a GPU the program has no
 * CUBIN for) loads too: a module of the registered kernels among its functions, by the
 * names the CUBIN gives them (mangled; a template's arguments must demangle as its name
 * spells them). */
#define KEMU_ALL_MODULE_MAGIC "KEMUALL1"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif
