/* kiln_cuda_embedded.h — the device code a CUDA program carries, and how it finds its
 * kernels (modules.cpp). C and C++.
 *
 * kiln build --target cuda compiles the kernels of model.cu, of the runtime's device.cu
 * and (--distributed) of dist_nccl.cu with NVRTC, in pieces, for sm_80 and sm_90, and
 * writes beside the host code a table (kiln_cuda_embedded_code) of the CUBINs, the
 * compute_80 PTX of the same compile, each kernel's name as the host launches it with the
 * name NVRTC gave it in its piece, and each file's device source whole, its headers
 * inlined. At its first launch (or when the device opens) the program loads the modules
 * for the GPU that is there: the CUBINs of its compute capability; for any other GPU (or
 * with KILN_CUDA_JIT=1) the sources compiled by NVRTC for exactly that architecture, once,
 * cached in $XDG_CACHE_HOME/kiln/cuda-jit (~/.cache/kiln/cuda-jit); without NVRTC, the
 * PTX, compiled by the driver. A cuda-emu program carries the same table, its images the
 * emulator's tables of the kernels compiled into it. */
#ifndef KILN_CUDA_EMBEDDED_H
#define KILN_CUDA_EMBEDDED_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One module image: a piece of a file's kernels for one architecture. */
typedef struct {
    int unit, piece; /* -1: every file's, every piece's (the emulator's table) */
    int sm; /* 80, 90: a CUBIN for sm_80, sm_90; -80: PTX for compute_80; 0: the emulator's table */
    const unsigned char *begin, *end;
} kiln_cuda_image;

/* A kernel: its name as the host launches it ("train_fc1_fwd", "kiln_sum_parts<float>"),
 * and as its piece's image names it (mangled; NULL in a cuda-emu program). */
typedef struct {
    const char *name;
    const char *lowered;
    int unit, piece;
} kiln_cuda_kernel;

/* A file's device code whole, for NVRTC at run time. */
typedef struct {
    const char *file;    /* "model.cu" */
    const char *options; /* NVRTC's options besides the architecture, space-separated ("--fmad=false") */
    const char *source;  /* NUL-terminated, its #include "..." files inlined */
} kiln_cuda_unit;

typedef struct {
    int nunits;
    const kiln_cuda_unit *units;
    int nimages;
    const kiln_cuda_image *images;
    int nkernels;
    const kiln_cuda_kernel *kernels;
    const char *compiler; /* "NVRTC 13.0": what compiled the images */
} kiln_cuda_embedded;

/* Written by kiln build into every program that launches kernels by name. */
extern const kiln_cuda_embedded kiln_cuda_embedded_code;

/* Loads the modules for the current device (once; later calls return what the first did).
 * NULL when all is well, with *note set to a line to print when the kernels did not come
 * from the program's CUBINs ("the kernels compiled for sm_86 by NVRTC ..."), else NULL;
 * or the reason they cannot be loaded. */
const char *kiln_cuda_modules_load(const char **note);
/* The kernel launched as `name`: its function in the loaded modules (a CUresult). */
int kiln_cuda_function(void **function, const char *name);
/* cuLaunchKernel with the arguments in one buffer (extra), and a CUresult's name and text:
 * the driver's, which a GPU program finds at run time rather than linking libcuda. */
int kiln_cuda_launch(void *function, const unsigned grid[3], const unsigned block[3], unsigned shared_bytes, void *stream, void **extra);
void kiln_cuda_error_text(int code, const char **name, const char **text);

#ifdef __cplusplus
}
#endif

#endif
